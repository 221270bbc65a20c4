package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/tools/qemu"
)

// TestKernelLibSelfTest boots the kernel with selftest=1: the known answers
// of kernel/lib (SHA-1, base64, WebSocket) must pass, and every lib digest
// over random cases must equal appliance.LibDigests.
func TestKernelLibSelfTest(t *testing.T) {
	needQEMU(t, qemu.SeaBIOS)
	t.Logf("self-test seed %d (set DPXE_SELFTEST_SEED to repeat)", selfTestSeed)
	cfg := appliance.BootConfig{NodeID: "lib-selftest", SelfTest: true, Seed: selfTestSeed, HasSeed: true}
	res, err := qemu.Run(context.Background(), qemu.Options{
		Firmware: qemu.SeaBIOS,
		Kernel:   filepath.Join(outDir(t), image.KernelFile),
		Append:   cfg.String(),
		Timeout:  90 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	fail := t.Errorf
	logSerialOnFailure(t, res)
	if !res.Passed() {
		fail("QEMU exit status %d (timed out: %v), want %d (self-test pass)", res.ExitCode, res.TimedOut, qemu.ExitPass)
	}
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
