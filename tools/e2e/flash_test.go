package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/image/flash"
	"github.com/discord-pxe/dpxe/image/qemu"
)

// TestFlashedImageBoots flashes usb.img for a named node with image/flash
// (what `dpxe flash` runs) and boots the result: the kernel must print the
// identity from the flashed DPXE.CFG on each firmware path. The loop-device
// case flashes a loop device and boots its backing file.
func TestFlashedImageBoots(t *testing.T) {
	src := filepath.Join(outDir(t), image.USBImageFile)
	for _, tc := range []struct {
		name   string
		fw     qemu.Firmware
		usb    bool
		onLoop bool
	}{
		{"file-seabios-disk", qemu.SeaBIOS, false, false},
		{"file-ovmf-disk", qemu.OVMF, false, false},
		{"file-ovmf-usb", qemu.OVMF, true, false},
		{"loop-seabios-usb", qemu.SeaBIOS, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			needQEMU(t, tc.fw)
			node := "flashed-" + tc.name
			const ctrl = "http://10.250.0.1:8080"
			cred, err := controller.NewCredential()
			if err != nil {
				t.Fatal(err)
			}
			raw, err := image.RenderConfig(appliance.BootConfig{NodeID: node, Controller: ctrl, Credential: cred})
			if err != nil {
				t.Fatal(err)
			}
			target := filepath.Join(t.TempDir(), "flashed.img")
			bootFile := target
			force := false
			if tc.onLoop {
				target, bootFile = e2eLoop(t)
				force = true // loop devices are not removable
			}
			if _, err := flash.Flash(context.Background(), flash.Options{Image: src, Config: raw, Target: target, Force: force, TempDir: t.TempDir()}); err != nil {
				t.Fatal(err)
			}
			if tc.onLoop {
				// QEMU opens the backing file; detach first so nothing
				// else holds it.
				detachLoop(t, target, bootFile)
			}
			want := "config: from=DPXE.CFG node=" + node + " controller=" + ctrl + " cred=set"
			o := qemu.Options{Firmware: tc.fw, Drives: []qemu.Drive{{Path: bootFile, USB: tc.usb, Snapshot: true}}, Timeout: 120 * time.Second,
				Until: func(serial string) bool { return strings.Contains(serial, want) }}
			res, err := qemu.Run(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(res.Serial, want) {
				t.Fatalf("no %q on the console (exit %d, timed out %v):\n%s", want, res.ExitCode, res.TimedOut, res.Serial)
			}
			if strings.Contains(res.Serial, cred) {
				t.Error("the kernel printed the credential")
			}
			t.Logf("%s: identity on the console after %v", tc.name, res.Elapsed.Round(time.Millisecond))
		})
	}
}

// e2eLoop attaches a 64 MiB loop device backed by a file in t.TempDir()
// (skipping without root or losetup) and returns both.
func e2eLoop(t *testing.T) (dev, backing string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("loop devices need root")
	}
	if _, err := exec.LookPath("losetup"); err != nil {
		t.Skip("losetup not installed")
	}
	backing = filepath.Join(t.TempDir(), "loop-backing.img")
	if err := os.WriteFile(backing, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(backing, image.USBImageSize); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", backing).CombinedOutput()
	if err != nil {
		t.Skipf("losetup: %v: %s", err, out)
	}
	dev = strings.TrimSpace(string(out))
	t.Cleanup(func() { detachLoop(t, dev, backing) })
	return dev, backing
}

// detachLoop detaches dev if it is still attached to backing (after an
// early detach the number may belong to someone else's loop device).
func detachLoop(t *testing.T, dev, backing string) {
	b, err := os.ReadFile("/sys/block/" + filepath.Base(dev) + "/loop/backing_file")
	if err != nil || strings.TrimSpace(string(b)) != backing {
		return
	}
	if out, err := exec.Command("losetup", "--detach", dev).CombinedOutput(); err != nil {
		t.Errorf("losetup --detach %s: %v: %s", dev, err, out)
	}
}
