package e2e

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
)

// TestKernelNATS boots the kernel with selftest=1 and a module carrying
// appliance.NATSCorpus: server streams of every operation (INFO, PING,
// PONG, +OK, -ERR, MSG and HMSG with header blocks, PubAcks), the edge of
// every refusal and mutations of them. The kernel's reader
// (kernel/lib/nats.inc) reads each whole and again in random pieces (the
// two must agree, or it prints "nats FAIL"), and every verdict, refusal
// byte and operations digest must equal appliance.NATSLine's.
func TestKernelNATS(t *testing.T) {
	corpus := appliance.NATSCorpus(int64(selfTestSeed))
	module := writeCaseModule(t, nil, appliance.ModuleSection{Tag: appliance.NATSModuleTag, Payload: appliance.NATSSection(corpus)})
	res := bootSelfTest(t, "nats-selftest", module, 120*time.Second)
	t.Logf("%d cases; QEMU start to exit %v", len(corpus), res.Elapsed.Round(time.Millisecond))
	logSerialOnFailure(t, res)
	lines, fails, err := appliance.ParseNATSLines(res.Serial)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fails {
		t.Errorf("kernel: nats FAIL %s", f)
	}
	if len(lines) != len(corpus) {
		t.Fatalf("kernel printed %d case lines, sent %d", len(lines), len(corpus))
	}
	bad, oks := 0, 0
	for i, c := range corpus {
		want := appliance.NATSLine(c)
		if want[:2] == "ok" {
			oks++
		}
		if lines[i] != want {
			bad++
			if bad <= 10 {
				t.Errorf("case %d %.120q: kernel %q, Go %q", i, c, lines[i], want)
			}
		}
	}
	t.Logf("%d cases (%d accepted), %d differ from appliance.NATSLine", len(corpus), oks, bad)
	if m := regexp.MustCompile(`nats throughput .*`).FindString(res.Serial); m != "" {
		t.Logf("kernel (qemu64 under TCG): %s", m)
	} else {
		t.Error("no nats throughput line")
	}
}

// TestKernelNATSWriters: the kernel's CONNECT, SUB and HPUB/PUB writers
// (kernel/lib/nats.inc) write exactly appliance.NATSConnect's, NATSSub's
// and NATSHPub's bytes for every case of appliance.NATSWriterCorpus, and
// refuse the same field where Go does.
func TestKernelNATSWriters(t *testing.T) {
	cases := appliance.NATSWriterCorpus(int64(selfTestSeed))
	module := writeCaseModule(t, nil, appliance.ModuleSection{Tag: appliance.NATSWriterModuleTag, Payload: appliance.NATSWriterSection(cases)})
	res := bootSelfTest(t, "natsw-selftest", module, 120*time.Second)
	logSerialOnFailure(t, res)
	var lines []string
	for _, l := range strings.Split(res.Serial, "\n") {
		l = strings.TrimRight(l, "\r")
		if rest, ok := strings.CutPrefix(l, "natsw case "); ok {
			num, tail, _ := strings.Cut(rest, " ")
			if num != strconv.Itoa(len(lines)) {
				t.Fatalf("line %q out of order", l)
			}
			lines = append(lines, tail)
		}
	}
	if len(lines) != len(cases) {
		t.Fatalf("kernel printed %d writer lines, sent %d", len(lines), len(cases))
	}
	bad, refused := 0, 0
	for i, c := range cases {
		want := appliance.NATSWriterLine(c)
		if strings.HasPrefix(want, "error") {
			refused++
		}
		if lines[i] != want {
			bad++
			if bad <= 10 {
				t.Errorf("case %d %+.200v: kernel %q, Go %q", i, c, lines[i], want)
			}
		}
	}
	t.Logf("%d writer cases (%d refused), %d differ from Go", len(cases), refused, bad)
}
