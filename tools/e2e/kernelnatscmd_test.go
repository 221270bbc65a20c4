package e2e

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/events"
)

// TestKernelCommandCheck boots the kernel with selftest=1 and a module
// carrying events.CommandCorpus: command bodies (every rule's edge, JSON
// edge cases and random mutations of them) under shard views (owned or
// not, ready or not, send logs full, at the edge, stamped in the future,
// heartbeats too fast for any command). The kernel's mirror of
// events.CheckCommand (kernel/node/natscmd.inc, cmd_check) prints the reply
// JSON it would publish for each; every line must equal Go's reply, byte
// for byte.
func TestKernelCommandCheck(t *testing.T) {
	corpus := events.CommandCorpus(int64(selfTestSeed))
	module := writeCaseModule(t, nil, appliance.ModuleSection{Tag: events.CommandModuleTag, Payload: events.CommandSection(corpus)})
	res := bootSelfTest(t, "cmdck-selftest", module, 180*time.Second)
	logSerialOnFailure(t, res)
	if strings.Contains(res.Serial, "cmdck FAIL") {
		t.Fatal("kernel: cmdck FAIL (the module section did not parse)")
	}
	var lines []string
	for _, l := range strings.Split(res.Serial, "\n") {
		l = strings.TrimRight(l, "\r")
		if rest, ok := strings.CutPrefix(l, "cmdck case "); ok {
			num, tail, _ := strings.Cut(rest, " ")
			if num != strconv.Itoa(len(lines)) {
				t.Fatalf("line %q out of order", l)
			}
			lines = append(lines, tail)
		}
	}
	if len(lines) != len(corpus) {
		t.Fatalf("kernel printed %d case lines, sent %d", len(lines), len(corpus))
	}
	bad := 0
	codes := map[string]int{}
	for i, c := range corpus {
		want := events.CommandLine(c)
		codes[want[len(`{"status":"`):strings.IndexByte(want[len(`{"status":"`):], '"')+len(`{"status":"`)]]++
		if lines[i] != want {
			bad++
			if bad <= 10 {
				t.Errorf("case %d body %.160q:\n kernel %s\n Go     %s", i, c.Body, lines[i], want)
			}
		}
	}
	t.Logf("%d cases %v, %d differ from events.CheckCommand", len(corpus), codes, bad)
}
