package flash

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/kernel"
)

var (
	imgOnce sync.Once
	imgPath string
	imgErr  error
	imgTmp  string
)

// sourceImage returns a usb.img to flash from: $DPXE_OUT/usb.img when make
// test built one, else one build of the embedded kernel per test binary.
// Tests must not modify it (flash never does, and tests check that).
func sourceImage(t testing.TB) string {
	t.Helper()
	imgOnce.Do(func() {
		if d := os.Getenv("DPXE_OUT"); d != "" {
			p := filepath.Join(d, image.USBImageFile)
			if _, err := os.Stat(p); err == nil {
				imgPath = p
				return
			}
		}
		if _, err := exec.LookPath("nasm"); err != nil {
			imgErr = errors.New("skip")
			return
		}
		imgTmp, imgErr = os.MkdirTemp("", "dpxe-flash-test-")
		if imgErr != nil {
			return
		}
		_, imgErr = image.Build(context.Background(), image.Options{Sources: kernel.Sources, OutDir: imgTmp})
		imgPath = filepath.Join(imgTmp, image.USBImageFile)
	})
	if imgErr != nil && imgErr.Error() == "skip" {
		t.Skip("no $DPXE_OUT/usb.img and nasm not installed (apt-get install nasm)")
	}
	if imgErr != nil {
		t.Fatalf("building usb.img: %v", imgErr)
	}
	return imgPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if imgTmp != "" {
		os.RemoveAll(imgTmp)
	}
	os.Exit(code)
}

func fileSum(t testing.TB, p string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// testConfig renders a personalised DPXE.CFG.
func testConfig(t testing.TB, node string) []byte {
	t.Helper()
	raw, err := image.RenderConfig(appliance.BootConfig{NodeID: node, Controller: "http://10.9.8.7:8080", Credential: "abcdefghijklmnopqrstuvwxyz_-0123456789ABCDE"})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// checkFlashed checks that the target holds the source image with only
// DPXE.CFG changed, and that DPXE.CFG names node.
func checkFlashed(t *testing.T, src, target, node string) {
	t.Helper()
	cfg, err := image.ReadUSBConfig(target)
	if err != nil {
		t.Fatalf("reading DPXE.CFG back from %s: %v", target, err)
	}
	c, err := appliance.ParseBootConfig(cfg.Raw)
	if err != nil {
		t.Fatal(err)
	}
	if c.NodeID != node || c.Controller != "http://10.9.8.7:8080" || c.Credential == "" {
		t.Errorf("DPXE.CFG on %s: %+v", target, c)
	}
	want, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	f, err := os.Open(target)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	lo, hi := int(cfg.Offset), int(cfg.Offset)+appliance.MaxBootConfigLen
	if !bytes.Equal(got[:lo], want[:lo]) || !bytes.Equal(got[hi:], want[hi:]) {
		t.Errorf("%s differs from the source outside DPXE.CFG", target)
	}
}

func TestFlashRegularFile(t *testing.T) {
	src := sourceImage(t)
	before := fileSum(t, src)
	dir := t.TempDir()
	for _, tc := range []struct {
		name    string
		prepare func(p string)
	}{
		{"new file", func(string) {}},
		{"larger file full of data", func(p string) {
			if err := os.WriteFile(p, bytes.Repeat([]byte{0xA5}, 80<<20), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".img")
			tc.prepare(target)
			var progress bytes.Buffer
			confirmed := false
			res, err := Flash(context.Background(), Options{
				Image: src, Config: testConfig(t, "file-node-1"), Target: target, TempDir: dir,
				Progress: &progress, Confirm: func(*Target) error { confirmed = true; return nil },
			})
			if err != nil {
				t.Fatal(err)
			}
			if !confirmed {
				t.Error("Confirm was not called")
			}
			checkFlashed(t, src, target, "file-node-1")
			st, err := os.Stat(target)
			if err != nil {
				t.Fatal(err)
			}
			if st.Size() != res.Size {
				t.Errorf("target is %d bytes, image %d", st.Size(), res.Size)
			}
			// Sparse: the zero blocks were seeked over, not written.
			if alloc := st.Sys().(*syscall.Stat_t).Blocks * 512; alloc > res.Size/4 || res.Skipped < res.Size/2 {
				t.Errorf("not sparse: %d bytes allocated, %d written, %d skipped of %d", alloc, res.Written, res.Skipped, res.Size)
			}
			if res.SHA256 != fileSum(t, target) {
				t.Error("Result.SHA256 is not the target's hash")
			}
			for _, want := range []string{"write ", "verify ", "64.0 MiB", "MB/s", "done in"} {
				if !strings.Contains(progress.String(), want) {
					t.Errorf("progress output lacks %q:\n%s", want, progress.String())
				}
			}
			t.Logf("wrote %d, skipped %d, write %v, verify %v (O_DIRECT %v)", res.Written, res.Skipped, res.WriteTime, res.VerifyTime, res.VerifyDirect)
		})
	}
	if fileSum(t, src) != before {
		t.Fatal("the source image changed")
	}
	// No personalised copies are left behind.
	if m, _ := filepath.Glob(filepath.Join(dir, "dpxe-flash-*")); len(m) != 0 {
		t.Errorf("temporary copies left: %v", m)
	}
}

// flipByte is a BeforeVerify hook that corrupts one byte of the target.
func flipByte(off int64) func(string) error {
	return func(p string) error {
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		b := make([]byte, 1)
		if _, err := f.ReadAt(b, off); err != nil {
			return err
		}
		b[0] ^= 0x40
		if _, err := f.WriteAt(b, off); err != nil {
			return err
		}
		return f.Sync()
	}
}

func TestVerifyCatchesFlippedByte(t *testing.T) {
	src := sourceImage(t)
	dir := t.TempDir()
	for _, off := range []int64{0, 1234567, 40<<20 + 3, 64<<20 - 1} {
		target := filepath.Join(dir, "t.img")
		_, err := Flash(context.Background(), Options{Image: src, Config: testConfig(t, "n"), Target: target, TempDir: dir, BeforeVerify: flipByte(off)})
		if !errors.Is(err, ErrVerify) {
			t.Fatalf("flip at %d: err %v, want ErrVerify", off, err)
		}
		blk := off / 512 * 512
		if want := "offset " + strconv.FormatInt(blk, 10) + " "; !strings.Contains(err.Error(), want) {
			t.Errorf("flip at %d: %v; want the block offset %d", off, err, blk)
		}
	}
}

func TestFlashRefusesSourceAsTarget(t *testing.T) {
	src := sourceImage(t)
	before := fileSum(t, src)
	_, err := Flash(context.Background(), Options{Image: src, Config: testConfig(t, "n"), Target: src})
	if !errors.Is(err, ErrSameFile) {
		t.Fatalf("err %v, want ErrSameFile", err)
	}
	if fileSum(t, src) != before {
		t.Fatal("the source image changed")
	}
}

func TestFlashAborted(t *testing.T) {
	src := sourceImage(t)
	target := filepath.Join(t.TempDir(), "keep.img")
	if err := os.WriteFile(target, []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Flash(context.Background(), Options{Image: src, Config: testConfig(t, "n"), Target: target,
		Confirm: func(*Target) error { return ErrAborted }})
	if !errors.Is(err, ErrAborted) {
		t.Fatalf("err %v", err)
	}
	if b, _ := os.ReadFile(target); string(b) != "precious" {
		t.Fatal("target written although the operator said no")
	}
}

func TestFlashRefusesBadConfig(t *testing.T) {
	src := sourceImage(t)
	target := filepath.Join(t.TempDir(), "t.img")
	bad := make([]byte, appliance.MaxBootConfigLen)
	copy(bad, "colour=blue")
	if _, err := Flash(context.Background(), Options{Image: src, Config: bad, Target: target}); err == nil || !strings.Contains(err.Error(), "colour") {
		t.Fatalf("err %v, want the parser's reason", err)
	}
	if _, err := os.Stat(target); !errors.Is(err, os.ErrNotExist) {
		t.Error("target created although the config was refused")
	}
}

func TestFlashRefusesChangedTarget(t *testing.T) {
	src := sourceImage(t)
	dir := t.TempDir()
	target := filepath.Join(dir, "t.img")
	if err := os.WriteFile(target, []byte("12345"), 0o644); err != nil {
		t.Fatal(err)
	}
	seen, err := System().Inspect(target)
	if err != nil {
		t.Fatal(err)
	}
	// Changed between the operator's look and the flash.
	os.WriteFile(target, []byte("123456789"), 0o644)
	_, err = Flash(context.Background(), Options{Image: src, Config: testConfig(t, "n"), Target: target, TempDir: dir, Expect: seen})
	if !errors.Is(err, ErrChanged) {
		t.Fatalf("err %v, want ErrChanged", err)
	}
	// Changed while the prompt waited.
	_, err = Flash(context.Background(), Options{Image: src, Config: testConfig(t, "n"), Target: target, TempDir: dir,
		Confirm: func(*Target) error { return os.WriteFile(target, []byte("1"), 0o644) }})
	if !errors.Is(err, ErrChanged) || !strings.Contains(err.Error(), "while waiting for the answer") {
		t.Fatalf("err %v, want ErrChanged", err)
	}
	if b, _ := os.ReadFile(target); string(b) != "1" {
		t.Fatal("target written")
	}
}
