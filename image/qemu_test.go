package image

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
)

// qemuExitPass is QEMU's exit status when the guest writes 0x10 to the
// isa-debug-exit port: (0x10 << 1) | 1.
const qemuExitPass = 33

// TestQEMUBootBIOS boots the fixture usb.img under SeaBIOS: the MBR loader
// must load the kernel from the MBR gap, read DPXE.CFG by LBA and hand both
// over through Multiboot. The fixture kernel prints what it received on COM1.
func TestQEMUBootBIOS(t *testing.T) {
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("qemu-system-x86_64 not installed (apt-get install qemu-system-x86)")
	}
	path := imageCopy(t)
	var c appliance.BootConfig
	if err := c.Set("node=qemu-node-1", "controller=http://10.0.2.2:8080"); err != nil {
		t.Fatal(err)
	}
	raw, err := RenderConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteUSBConfig(path, raw); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	args := []string{
		"-machine", "pc", "-m", "128",
		"-drive", "file=" + path + ",format=raw,if=ide",
		"-serial", "stdio", "-display", "none", "-monitor", "none", "-no-reboot",
		"-device", "isa-debug-exit,iobase=0xf4,iosize=0x04",
	}
	if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err == nil {
		f.Close()
		args = append(args, "-accel", "kvm", "-accel", "tcg") // TCG if KVM fails to start
	} else {
		args = append(args, "-accel", "tcg")
	}
	cmd := exec.CommandContext(ctx, qemu, args...)
	var serial, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &serial, &stderr
	start := time.Now()
	err = cmd.Run()
	elapsed := time.Since(start)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != qemuExitPass {
		t.Fatalf("qemu: %v (want exit status %d) after %v\nserial:\n%s\nstderr:\n%s", err, qemuExitPass, elapsed, serial.String(), stderr.String())
	}
	out := serial.String()
	for _, want := range []string{
		"dpxe-mbr: loading",
		"dpxe-mbr: starting kernel",
		"fixture: magic=ok loader=dpxe-mbr cmdline=# Discord-PXE node boot config",
		"|node=qemu-node-1|controller=http://10.0.2.2:8080|",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("serial output lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(out, " mmap=") || strings.Contains(out, " mmap=0 ") || strings.Contains(out, " upper=0\r") {
		t.Errorf("no memory map or mem_upper handed over:\n%s", out)
	}
	t.Logf("BIOS boot to fixture exit in %v", elapsed)
}
