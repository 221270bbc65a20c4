package e2e

import (
	"regexp"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
)

// TestKernelGatewayScan boots the kernel with selftest=1 and a module
// carrying appliance.GatewayScanCorpus: Gateway messages of every shape,
// field edge cases and mutations of them all. The kernel scans each whole
// and again in random pieces (the two must agree, or it prints "gwscan
// FAIL"), and every verdict, refusal place and field digest must equal
// appliance.ScanMessage's.
func TestKernelGatewayScan(t *testing.T) {
	corpus := appliance.GatewayScanCorpus(int64(selfTestSeed))
	module := writeCaseModule(t, nil, appliance.ModuleSection{Tag: appliance.GatewayScanModuleTag, Payload: appliance.GatewayScanSection(corpus)})
	res := bootSelfTest(t, "gwscan-selftest", module, 120*time.Second)
	t.Logf("%d cases; QEMU start to exit %v", len(corpus), res.Elapsed.Round(time.Millisecond))
	logSerialOnFailure(t, res)
	lines, fails, err := appliance.ParseGatewayScanLines(res.Serial)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fails {
		t.Errorf("kernel: gwscan FAIL %s", f)
	}
	if len(lines) != len(corpus) {
		t.Fatalf("kernel printed %d case lines, sent %d", len(lines), len(corpus))
	}
	bad, oks := 0, 0
	for i, m := range corpus {
		want, _ := appliance.ScanMessage(m, nil)
		if want.OK {
			oks++
		}
		if lines[i] != want.Line() {
			bad++
			if bad <= 10 {
				t.Errorf("case %d %.120q: kernel %q, Go %q", i, m, lines[i], want.Line())
			}
		}
	}
	t.Logf("%d cases (%d accepted), %d differ from appliance.ScanMessage", len(corpus), oks, bad)
	if m := regexp.MustCompile(`gwscan throughput .*`).FindString(res.Serial); m != "" {
		t.Logf("kernel (qemu64 under TCG): %s", m)
	} else {
		t.Error("no gwscan throughput line")
	}
}
