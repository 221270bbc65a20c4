package image

import (
	"bytes"
	"context"
	"errors"
	"io"
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
	cmd := exec.CommandContext(ctx, qemu, qemuBIOSArgs(path)...)
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

// qemuBIOSArgs boots the raw disk image path under SeaBIOS with COM1 on
// stdout, the isa-debug-exit device, and no reboot (a reset ends QEMU). It
// uses TCG: for a boot this small it starts faster than KVM (measured 0.1 s
// against 2.6 s on the development machine) and behaves the same everywhere.
func qemuBIOSArgs(path string) []string {
	return []string{
		"-machine", "pc", "-accel", "tcg", "-m", "128",
		"-drive", "file=" + path + ",format=raw,if=ide",
		"-serial", "stdio", "-display", "none", "-monitor", "none", "-no-reboot",
		"-device", "isa-debug-exit,iobase=0xf4,iosize=0x04",
	}
}

// TestQEMUBIOSLoaderFailures breaks the image in ways the MBR loader must
// report on the console and COM1, then halt: QEMU must still be running a
// moment after the message (with -no-reboot a reset would end it).
func TestQEMUBIOSLoaderFailures(t *testing.T) {
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("qemu-system-x86_64 not installed (apt-get install qemu-system-x86)")
	}
	for _, tc := range []struct {
		name string
		edit func(img *os.File) error
		want string
	}{
		{"stage 2 missing", func(img *os.File) error {
			_, err := img.WriteAt(make([]byte, 2*SectorSize), 2046*SectorSize)
			return err
		}, "dpxe-mbr: stage 2 missing"},
		{"kernel past the disk", func(img *os.File) error {
			_, err := img.WriteAt([]byte{0x00, 0x00, 0x00, 0x7F}, 0x1A4) // kernel_lba far beyond 64 MiB
			return err
		}, "dpxe-mbr: disk read error"},
		{"loader not patched", func(img *os.File) error {
			_, err := img.WriteAt([]byte{0, 0}, 0x1A2) // kernel_sectors = 0
			return err
		}, "dpxe-mbr: loader not patched for this kernel (rebuild the image)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := imageCopy(t)
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := tc.edit(f); err != nil {
				t.Fatal(err)
			}
			f.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, qemu, qemuBIOSArgs(path)...)
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			found := make(chan string, 1)
			go func() {
				var seen bytes.Buffer
				buf := make([]byte, 256)
				for {
					n, err := out.Read(buf)
					seen.Write(buf[:n])
					if strings.Contains(seen.String(), tc.want+"\r\n") || err != nil {
						found <- seen.String()
						io.Copy(io.Discard, out)
						return
					}
				}
			}()
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			var serial string
			select {
			case serial = <-found:
			case <-ctx.Done():
				t.Fatal("timed out waiting for the loader's message")
			}
			if !strings.Contains(serial, tc.want) {
				cmd.Process.Kill()
				t.Fatalf("serial output lacks %q:\n%s", tc.want, serial)
			}
			select {
			case err := <-exited:
				t.Fatalf("QEMU ended after the message (%v): the loader reset or rebooted instead of halting\n%s", err, serial)
			case <-time.After(time.Second):
			}
			cmd.Process.Kill()
			<-exited
		})
	}
}
