package e2e

import (
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
}
