package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
)

// TestKernelLibSelfTest boots the kernel with selftest=1: the known answers
// of kernel/lib (SHA-1, base64, WebSocket) must pass, and every lib digest
// over random cases must equal appliance.LibDigests.
func TestKernelLibSelfTest(t *testing.T) {
	t.Logf("self-test seed %d (set DPXE_SELFTEST_SEED to repeat)", selfTestSeed)
	res := bootSelfTest(t, "lib-selftest", "", 90*time.Second)
	fail := t.Errorf
	logSerialOnFailure(t, res)
	for _, line := range strings.Split(res.Serial, "\n") {
		if strings.HasPrefix(line, "selftest lib FAIL") {
			fail("%s", strings.TrimSpace(line))
		}
	}
	rep, err := appliance.ParseSelfTestReport(res.Serial)
	if err != nil {
		fail("%v", err)
		return
	}
	want := appliance.LibDigests(selfTestSeed)
	for _, name := range appliance.LibDigestNames {
		got, ok := rep.Digests[name]
		if !ok {
			fail("no \"selftest digest %s\" line: the lib self-test did not run", name)
			continue
		}
		if got != want[name] {
			fail("digest %s (seed %d): kernel %016x, Go %016x", name, selfTestSeed, got, want[name])
			continue
		}
		t.Logf("digest %s: %016x, as Go", name, got)
	}
}
