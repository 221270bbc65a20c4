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

// TestKernelTCPSelfTest boots the kernel with selftest=1: the TCP
// self-tests (sequence comparisons across the wrap, build then parse,
// malformed segments) must pass, and the "tcpseg" digest over random
// segments must equal appliance.TCPSegmentDigest.
func TestKernelTCPSelfTest(t *testing.T) {
	needQEMU(t, qemu.SeaBIOS)
	cfg := appliance.BootConfig{NodeID: "tcp-selftest", SelfTest: true, Seed: selfTestSeed, HasSeed: true}
	res, err := qemu.Run(context.Background(), qemu.Options{
		Firmware: qemu.SeaBIOS,
		Kernel:   filepath.Join(outDir(t), image.KernelFile),
		Append:   cfg.String(),
		Timeout:  60 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	failed := false
	fail := func(format string, args ...any) {
		failed = true
		t.Errorf(format, args...)
	}
	defer func() {
		if failed {
			t.Logf("serial console:\n%s", res.Serial)
		}
	}()
	if !res.Passed() {
		fail("QEMU exit status %d, want %d (self-test pass)", res.ExitCode, qemu.ExitPass)
	}
	if strings.Contains(res.Serial, "selftest net FAIL tcp") {
		fail("a TCP self-test failed")
	}
	rep, err := appliance.ParseSelfTestReport(res.Serial)
	if err != nil {
		fail("%v", err)
		return
	}
	got, ok := rep.Digests["tcpseg"]
	if !ok {
		fail("no \"selftest digest tcpseg\" line: the TCP self-test did not run")
		return
	}
	if want := appliance.TCPSegmentDigest(selfTestSeed); got != want {
		fail("TCP segment digest (seed %d): kernel %016x, Go %016x", selfTestSeed, got, want)
	}
}
