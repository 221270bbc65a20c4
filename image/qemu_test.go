package image

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image/mbrloader"
)

// qemuExitPass is QEMU's exit status when the guest writes 0x10 to the
// isa-debug-exit port: (0x10 << 1) | 1.
const qemuExitPass = 33

// bootResult is what a BIOS boot of a test image showed.
type bootResult struct {
	serial string // COM1 output
	exited bool   // QEMU ended by itself
	code   int    // its exit status, when exited
	stderr string // QEMU's own messages
}

// bootBIOS boots the raw disk image path under SeaBIOS (TCG: for a boot this
// small it starts faster than KVM, 0.1 s against 2.6 s on the development
// machine, and behaves the same everywhere), with COM1 on a pipe, the
// isa-debug-exit device and -no-reboot (a reset ends QEMU).
//
// With until == "" it waits for QEMU to exit. Otherwise it waits until the
// serial output contains until followed by CRLF, then gives QEMU one more
// second to prove it stays halted (exited = false), and kills it.
func bootBIOS(t *testing.T, path, until string) bootResult {
	t.Helper()
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("qemu-system-x86_64 not installed (apt-get install qemu-system-x86)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, qemu,
		"-machine", "pc", "-accel", "tcg", "-m", "128",
		"-drive", "file="+strings.ReplaceAll(path, ",", ",,")+",format=raw,if=ide", // QEMU escapes ',' as ',,'

		"-serial", "stdio", "-display", "none", "-monitor", "none", "-no-reboot",
		"-device", "isa-debug-exit,iobase=0xf4,iosize=0x04")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var serial bytes.Buffer
	found := make(chan bool, 1)
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		buf := make([]byte, 512)
		for {
			n, err := out.Read(buf)
			serial.Write(buf[:n])
			if until != "" && bytes.Contains(serial.Bytes(), []byte(until+"\r\n")) {
				found <- true
				io.Copy(io.Discard, out)
				return
			}
			if err != nil {
				return
			}
		}
	}()
	exited := make(chan error, 1)
	go func() {
		<-readDone // Wait closes the pipe: read it to the end first
		exited <- cmd.Wait()
	}()
	result := func(err error) bootResult {
		r := bootResult{serial: serial.String(), exited: true, stderr: stderr.String()}
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			r.code = exit.ExitCode()
		}
		if ctx.Err() != nil {
			t.Fatalf("QEMU timed out\nserial:\n%s\nstderr:\n%s", r.serial, stderr.String())
		}
		return r
	}
	if until == "" {
		return result(<-exited)
	}
	select {
	case err := <-exited:
		return result(err)
	case <-found:
	case <-ctx.Done():
		cmd.Process.Kill()
		<-exited
		t.Fatalf("timed out waiting for %q\nserial:\n%s", until, serial.String())
	}
	select {
	case err := <-exited:
		return result(err)
	case <-time.After(time.Second):
	}
	cmd.Process.Kill()
	<-exited
	return bootResult{serial: serial.String()}
}

// TestQEMUBootBIOS boots the fixture usb.img under SeaBIOS: the MBR loader
// must load the kernel from the MBR gap, read DPXE.CFG by LBA and hand both
// over through Multiboot. The fixture kernel prints what it received on COM1.
func TestQEMUBootBIOS(t *testing.T) {
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
	start := time.Now()
	r := bootBIOS(t, path, "")
	if r.code != qemuExitPass {
		t.Fatalf("QEMU exit status %d, want %d\nserial:\n%s", r.code, qemuExitPass, r.serial)
	}
	for _, want := range []string{
		"dpxe-mbr: loading\r\n",
		"dpxe-mbr: starting kernel\r\n",
		"fixture: magic=ok loader=dpxe-mbr cmdline=# Discord-PXE node boot config",
		"|node=qemu-node-1|controller=http://10.0.2.2:8080|",
		" drive=128\r\n",
		"fixture: pattern=ok\r\n", // 96 KiB of the kernel read in several 64-sector chunks, byte exact
	} {
		if !strings.Contains(r.serial, want) {
			t.Errorf("serial output lacks %q:\n%s", want, r.serial)
		}
	}
	if !strings.Contains(r.serial, " mmap=") || strings.Contains(r.serial, " mmap=0 ") || strings.Contains(r.serial, " upper=0 ") {
		t.Errorf("no memory map or mem_upper handed over:\n%s", r.serial)
	}
	t.Logf("QEMU start to fixture exit: %v", time.Since(start))
}

// TestQEMUBIOSFullConfig fills all 4096 bytes of DPXE.CFG with text: the
// loader must still hand over a NUL-terminated command line of exactly that.
func TestQEMUBIOSFullConfig(t *testing.T) {
	path := imageCopy(t)
	raw := []byte("node=full-cfg\n#")
	raw = append(raw, bytes.Repeat([]byte("x"), 4096-len(raw)-1)...)
	raw = append(raw, '\n')
	if err := WriteUSBConfig(path, raw); err != nil {
		t.Fatal(err)
	}
	r := bootBIOS(t, path, "")
	want := "cmdline=node=full-cfg|#" + strings.Repeat("x", 4096-len("node=full-cfg\n#")-1) + "| mmap="
	if r.code != qemuExitPass || !strings.Contains(r.serial, want) {
		t.Fatalf("QEMU exit status %d; serial output lacks the 4096-byte command line:\n%s", r.code, r.serial)
	}
}

// TestQEMUBIOSLoaderFailures breaks the image in ways the MBR loader must
// report on the console and COM1, then halt: QEMU must still be running a
// moment after the message (with -no-reboot a reset would end it).
func TestQEMUBIOSLoaderFailures(t *testing.T) {
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
			editImage(t, path, tc.edit)
			r := bootBIOS(t, path, tc.want)
			if r.exited {
				t.Fatalf("QEMU ended (status %d): the loader reset or rebooted instead of halting\n%s", r.code, r.serial)
			}
		})
	}
}

// TestQEMUBIOSDriveNumber starts the loader through a test chainloader that
// passes a chosen boot drive number in DL, as some BIOSes do wrongly.
func TestQEMUBIOSDriveNumber(t *testing.T) {
	needNASM(t)
	const stage1Copy = 2045 // a free sector of the MBR gap of the fixture image
	for _, tc := range []struct {
		name, dl string
		want     string // "" = boots
	}{
		{"DL 0x00 (floppy) is forced to 0x80", "0x00", ""},
		{"DL 0xFF is forced to 0x80", "0xFF", ""},
		{"DL 0x81 names no disk", "0x81", "dpxe-mbr: BIOS lacks INT 13h extensions"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := imageCopy(t)
			chain := filepath.Join(t.TempDir(), "chain.bin")
			cmd := exec.Command("nasm", "-f", "bin", "-DDRIVE="+tc.dl, "-DSTAGE1_LBA=2045", "-o", chain, "testdata/chain.asm")
			if msg, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("nasm: %v\n%s", err, msg)
			}
			code, err := os.ReadFile(chain)
			if err != nil || len(code) != mbrloader.BootCodeSize {
				t.Fatalf("chain.bin: %d bytes, %v", len(code), err)
			}
			editImage(t, path, func(img *os.File) error {
				stage1 := make([]byte, SectorSize)
				if _, err := img.ReadAt(stage1, 0); err != nil {
					return err
				}
				if _, err := img.WriteAt(stage1, stage1Copy*SectorSize); err != nil {
					return err
				}
				_, err := img.WriteAt(code, 0)
				return err
			})
			if tc.want != "" {
				if r := bootBIOS(t, path, tc.want); r.exited {
					t.Fatalf("QEMU ended (status %d) instead of halting\nserial: %q\nstderr: %s", r.code, r.serial, r.stderr)
				}
				return
			}
			r := bootBIOS(t, path, "")
			if r.code != qemuExitPass || !strings.Contains(r.serial, " drive=128\r\n") {
				t.Fatalf("QEMU exit status %d, want %d and drive=128\nserial:\n%s", r.code, qemuExitPass, r.serial)
			}
		})
	}
}

// editImage opens the image at path for writing and applies edit.
func editImage(t *testing.T, path string, edit func(*os.File) error) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := edit(f); err != nil {
		t.Fatal(err)
	}
}
