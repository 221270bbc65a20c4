// Package e2e holds the end-to-end tests: the shard kernel booted in QEMU on
// every firmware path, netboot inside network namespaces, and the whole
// system together. They need the built images; `make test` builds them
// once into $DPXE_OUT and every test here shares that one build.
package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/image/qemu"
	"github.com/discord-pxe/dpxe/kernel"
)

var (
	imagesOnce sync.Once
	imagesDir  string
	imagesErr  error
)

// outDir returns a directory holding kernel.bin, usb.img and the netboot
// tree: $DPXE_OUT when it has them (make test), else one build made by
// this test process in a temporary directory and shared by every test.
func outDir(t testing.TB) string {
	t.Helper()
	imagesOnce.Do(func() {
		if d := os.Getenv("DPXE_OUT"); d != "" {
			if _, err := os.Stat(filepath.Join(d, image.KernelFile)); err == nil {
				imagesDir = d
				return
			}
		}
		dir, err := os.MkdirTemp("", "dpxe-e2e-images-")
		if err != nil {
			imagesErr = err
			return
		}
		_, imagesErr = image.Build(context.Background(), image.Options{Sources: kernel.Sources, OutDir: dir})
		imagesDir = dir
	})
	if imagesErr != nil {
		t.Fatalf("building images: %v", imagesErr)
	}
	return imagesDir
}

var (
	dpxeOnce sync.Once
	dpxeDir  string
	dpxeErr  error
)

// dpxeBinary returns the dpxe command built from this module, once per
// test process (a link takes seconds, and some thirty tests start dpxe
// serve). Tests only run it; its directory goes at the end of TestMain.
func dpxeBinary(t testing.TB) string {
	t.Helper()
	dpxeOnce.Do(func() {
		if dpxeDir, dpxeErr = os.MkdirTemp("", "dpxe-e2e-bin-"); dpxeErr != nil {
			return
		}
		if b, err := exec.Command("go", "build", "-o", filepath.Join(dpxeDir, "dpxe"), "github.com/discord-pxe/dpxe/cmd/dpxe").CombinedOutput(); err != nil {
			dpxeErr = fmt.Errorf("go build: %v\n%s", err, b)
		}
	})
	if dpxeErr != nil {
		t.Fatalf("building dpxe: %v", dpxeErr)
	}
	return filepath.Join(dpxeDir, "dpxe")
}

func TestMain(m *testing.M) {
	code := m.Run()
	if dpxeDir != "" {
		os.RemoveAll(dpxeDir)
	}
	os.Exit(code)
}

// bootSelfTest boots kernel.bin under SeaBIOS with selftest=1, node ID id,
// the shared seed and the optional initrd (boot-config cases), and wants
// QEMU to end with the self-test pass status. The caller reads the console.
func bootSelfTest(t *testing.T, id, initrd string, timeout time.Duration) *qemu.Result {
	t.Helper()
	needQEMU(t, qemu.SeaBIOS)
	cfg := appliance.BootConfig{NodeID: id, SelfTest: true, Seed: selfTestSeed, HasSeed: true}
	res, err := qemu.Run(context.Background(), qemu.Options{
		Firmware: qemu.SeaBIOS,
		Kernel:   filepath.Join(outDir(t), image.KernelFile),
		Append:   cfg.String(),
		Initrd:   initrd,
		Timeout:  timeout,
	})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Passed() {
		t.Errorf("QEMU exit status %d (timed out: %v), want %d (self-test pass)", res.ExitCode, res.TimedOut, qemu.ExitPass)
	}
	return res
}

// logSerialOnFailure logs a QEMU run's serial console once, at the end of
// the test, if the test failed.
func logSerialOnFailure(t testing.TB, res *qemu.Result) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("serial console:\n%s", res.Serial)
		}
	})
}
