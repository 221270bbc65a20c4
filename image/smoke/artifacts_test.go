package smoke

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image"
)

var (
	fixtureOnce sync.Once
	fixtureDir  string
	fixtureErr  error
)

// builtFixture builds image/testdata/kernel (a small kernel with valid
// headers) with the real MBR loader once per test binary and returns the
// output directory. Callers copy it before changing anything.
func builtFixture(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("nasm"); err != nil {
		t.Skip("nasm not installed (apt-get install nasm)")
	}
	fixtureOnce.Do(func() {
		m := fstest.MapFS{}
		for name, file := range map[string]string{
			"kernel.asm":   "../testdata/kernel/kernel.asm",
			"version.inc":  "../testdata/kernel/version.inc",
			"boot/mbr.asm": "../../kernel/boot/mbr.asm",
		} {
			b, err := os.ReadFile(file)
			if err != nil {
				fixtureErr = err
				return
			}
			m[name] = &fstest.MapFile{Data: b, Mode: 0o644}
		}
		if fixtureDir, fixtureErr = os.MkdirTemp("", "dpxe-smoke-test-"); fixtureErr != nil {
			return
		}
		_, fixtureErr = image.Build(context.Background(), image.Options{Sources: m, OutDir: fixtureDir})
	})
	if fixtureErr != nil {
		t.Fatal(fixtureErr)
	}
	return fixtureDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if fixtureDir != "" {
		os.RemoveAll(fixtureDir)
	}
	os.Exit(code)
}

// copyOut copies an output directory for a test to change.
func copyOut(t *testing.T, from string) string {
	t.Helper()
	to := t.TempDir()
	for _, name := range []string{image.KernelFile, image.ManifestFile, image.USBImageFile,
		filepath.Join(image.NetbootDir, image.KernelFile), image.IPXETemplateFile} {
		os.MkdirAll(filepath.Dir(filepath.Join(to, name)), 0o755)
		if err := copyFile(filepath.Join(from, name), filepath.Join(to, name)); err != nil {
			t.Fatal(err)
		}
	}
	return to
}

func editFile(t *testing.T, name string, edit func([]byte) []byte) {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, edit(b), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoadArtifacts(t *testing.T) {
	fixture := builtFixture(t)
	a := loadArtifacts(fixture, "")
	if a.kernelErr != nil || a.netbootErr != nil || a.usbErr != nil {
		t.Fatalf("pristine build refused: kernel %v, netboot %v, usb %v", a.kernelErr, a.netbootErr, a.usbErr)
	}
	if a.version != "0.0.1-fixture" || !strings.Contains(a.template, "{{.KernelURL}}") {
		t.Errorf("version %q, template %.40q", a.version, a.template)
	}
	if a := loadArtifacts(fixture, "0.0.1-fixture"); a.kernelErr != nil {
		t.Errorf("the right --kernel-version refused: %v", a.kernelErr)
	}

	for _, tc := range []struct {
		name              string
		edit              func(t *testing.T, out string)
		version           string
		kernel, netb, usb string // substrings of each medium's error; "" = no error
		usbIs             error
	}{
		{"no manifest", func(t *testing.T, out string) { os.Remove(filepath.Join(out, image.ManifestFile)) }, "",
			"manifest.json: build the artifacts first (make image", "make image", "make image", nil},
		{"pinned version differs", func(*testing.T, string) {}, "9.9.9",
			"says kernel 0.0.1-fixture, want 9.9.9 (--kernel-version)", "want 9.9.9", "want 9.9.9", nil},
		{"kernel.bin changed", func(t *testing.T, out string) {
			editFile(t, filepath.Join(out, image.KernelFile), func(b []byte) []byte { b[300] ^= 1; return b })
		}, "", "kernel.bin is ", "", "kernel.bin is ", nil},
		{"boot script template changed", func(t *testing.T, out string) {
			editFile(t, filepath.Join(out, image.IPXETemplateFile), func(b []byte) []byte { return append(b, '#') })
		}, "", "", "boot.ipxe.tmpl is ", "", nil},
		{"kernel copy inside usb.img corrupted", func(t *testing.T, out string) {
			editFile(t, filepath.Join(out, image.USBImageFile), func(b []byte) []byte { b[image.KernelLBA*image.SectorSize+100] ^= 0xff; return b })
		}, "", "", "", "the BIOS copy in the MBR gap differs at byte 100 of kernel.bin", image.ErrKernelCopy},
		{"bad DPXE.CFG", func(t *testing.T, out string) {
			writeRawConfig(t, filepath.Join(out, image.USBImageFile), "node=rack-1 bogus=1")
		}, "",
			"", "", `DPXE.CFG: boot config: byte 12: key "bogus": unknown key`, nil},
		{"not a DPXE image", func(t *testing.T, out string) {
			editFile(t, filepath.Join(out, image.USBImageFile), func(b []byte) []byte { copy(b[0x198:], "XXXX"); return b })
		}, "", "", "", "not a Discord-PXE USB image", image.ErrNotDPXEImage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := copyOut(t, fixture)
			tc.edit(t, out)
			a := loadArtifacts(out, tc.version)
			for _, m := range []struct {
				what string
				err  error
				want string
			}{{"kernel", a.kernelErr, tc.kernel}, {"netboot", a.netbootErr, tc.netb}, {"usb", a.usbErr, tc.usb}} {
				switch {
				case m.want == "" && m.err != nil:
					t.Errorf("%s: unexpected error %v", m.what, m.err)
				case m.want != "" && (m.err == nil || !strings.Contains(m.err.Error(), m.want)):
					t.Errorf("%s: error %v, want one with %q", m.what, m.err, m.want)
				}
			}
			if tc.usbIs != nil && !errors.Is(a.usbErr, tc.usbIs) {
				t.Errorf("usb error %v is not %v", a.usbErr, tc.usbIs)
			}
		})
	}
}

// writeRawConfig writes text as DPXE.CFG without the checks of
// image.WriteUSBConfig (which refuses a bad config), the way a broken
// editor or a bad flash would.
func writeRawConfig(t *testing.T, img, text string) {
	t.Helper()
	loc, err := image.ReadUSBConfig(img)
	if err != nil {
		t.Fatal(err)
	}
	raw := make([]byte, appliance.MaxBootConfigLen)
	copy(raw, text)
	f, err := os.OpenFile(img, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(raw, loc.Offset); err != nil {
		t.Fatal(err)
	}
}

func TestUSBCopy(t *testing.T) {
	out := copyOut(t, builtFixture(t))
	raw, err := image.RenderConfig(appliance.BootConfig{NodeID: "rack-7", Controller: "http://10.1.2.3:8080", TCPTest: "10.0.0.1:9"})
	if err != nil {
		t.Fatal(err)
	}
	if err := image.WriteUSBConfig(filepath.Join(out, image.USBImageFile), raw); err != nil {
		t.Fatal(err)
	}
	a := loadArtifacts(out, "")
	if a.usbErr != nil {
		t.Fatal(a.usbErr)
	}
	p, err := a.usbCopy(t.TempDir(), 99)
	if err != nil {
		t.Fatal(err)
	}
	got, err := image.ReadUSBConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	c, err := appliance.ParseBootConfig(got.Raw)
	if err != nil {
		t.Fatal(err)
	}
	want := appliance.BootConfig{NodeID: "rack-7", Controller: "http://10.1.2.3:8080", SelfTest: true, Seed: 99, HasSeed: true}
	if c != want {
		t.Errorf("smoke config %+v, want the image's own with selftest and seed and without tcptest: %+v", c, want)
	}
	orig, _ := os.ReadFile(filepath.Join(out, image.USBImageFile))
	cp, _ := os.ReadFile(p)
	if len(orig) != len(cp) || bytes.Equal(orig, cp) {
		t.Error("the copy is not usb.img with another DPXE.CFG")
	}
	if again, err := a.usbCopy(t.TempDir(), 99); err != nil || again != p {
		t.Errorf("a second usbCopy made another copy: %s %v", again, err)
	}
	if a := loadArtifacts(copyOut(t, builtFixture(t)), ""); a.smokeConfig(1).NodeID != "smoke" {
		t.Error("an image without a node ID does not boot as node smoke")
	}
}

func TestCopyFileSparse(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "a")
	data := make([]byte, 300<<10)
	data[5] = 1
	data[len(data)-1] = 2
	os.WriteFile(src, data, 0o644)
	if err := copyFile(src, filepath.Join(dir, "b")); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(filepath.Join(dir, "b"))
	if !bytes.Equal(got, data) {
		t.Error("copy differs")
	}
}
