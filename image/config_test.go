package image

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image/mbrloader"
)

// imageCopy returns a private copy of the fixture's usb.img.
func imageCopy(t *testing.T) string {
	t.Helper()
	dir, _ := builtFixture(t)
	b, err := os.ReadFile(filepath.Join(dir, USBImageFile))
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "usb.img")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Sparse, like the original: only blocks holding data are written, so
	// a dozen copies cost a few MiB of disk, not 64 MiB each.
	if err := f.Truncate(int64(len(b))); err != nil {
		t.Fatal(err)
	}
	const block = 64 << 10
	zero := make([]byte, block)
	for off := 0; off < len(b); off += block {
		chunk := b[off:min(off+block, len(b))]
		if bytes.Equal(chunk, zero[:len(chunk)]) {
			continue
		}
		if _, err := f.WriteAt(chunk, int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestConfigTemplate(t *testing.T) {
	tmpl := ConfigTemplate()
	if len(tmpl) != appliance.MaxBootConfigLen {
		t.Fatalf("template is %d bytes", len(tmpl))
	}
	c, err := appliance.ParseBootConfig(tmpl)
	if err != nil || c != (appliance.BootConfig{}) {
		t.Fatalf("template parses to %+v, %v; want nothing set", c, err)
	}
	text := ConfigText(tmpl)
	for _, k := range appliance.BootConfigKeys() {
		if !bytes.Contains(text, []byte("#   "+k+" ")) {
			t.Errorf("template does not document key %q", k)
		}
	}
	if !bytes.Equal(tmpl[len(text):], make([]byte, len(tmpl)-len(text))) {
		t.Error("template is not NUL-padded")
	}
}

func TestRenderConfigFull(t *testing.T) {
	var c appliance.BootConfig
	if err := c.Set("node="+strings.Repeat("n", 64), "controller=http://"+strings.Repeat("h", 150)+":65535/x",
		"cred="+strings.Repeat("c", 128), "shards=128", "total_shards=131072", "capacity=128", "selftest=1", "seed=4294967295"); err != nil {
		t.Fatal(err)
	}
	raw, err := RenderConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	back, err := appliance.ParseBootConfig(raw)
	if err != nil || back != c {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
}

func TestConfigSetRoundTrip(t *testing.T) {
	path := imageCopy(t)
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	orig, err := ReadUSBConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	var c appliance.BootConfig
	if err := c.Set("node=rack1-n07", "controller=http://10.0.0.1:8080", "cred=abcdefghijklmnop1234", "shards=8"); err != nil {
		t.Fatal(err)
	}
	raw, err := RenderConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteUSBConfig(path, raw); err != nil {
		t.Fatal(err)
	}
	got, err := ReadUSBConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	back, err := appliance.ParseBootConfig(got.Raw)
	if err != nil || back != c {
		t.Fatalf("read back %+v, %v", back, err)
	}
	// In place: same sectors, and nothing else in the image changed.
	if got.LBA != orig.LBA {
		t.Errorf("DPXE.CFG moved from LBA %d to %d", orig.LBA, got.LBA)
	}
	after, _ := os.ReadFile(path)
	off := int(got.Offset)
	if !bytes.Equal(before[:off], after[:off]) || !bytes.Equal(before[off+4096:], after[off+4096:]) {
		t.Error("bytes outside DPXE.CFG changed")
	}
	if !bytes.Equal(after[off:off+4096], raw) {
		t.Error("DPXE.CFG sectors do not hold the new config")
	}
}

func TestConfigRejects(t *testing.T) {
	path := imageCopy(t)
	before, _ := os.ReadFile(path)
	bad := make([]byte, appliance.MaxBootConfigLen)
	copy(bad, "node=n1 bogus=1\n")
	var ce *appliance.ConfigError
	if err := WriteUSBConfig(path, bad); !errors.As(err, &ce) || ce.Key != "bogus" {
		t.Errorf("unknown key: %v", err)
	}
	if err := WriteUSBConfig(path, []byte("node=n1")); err == nil {
		t.Error("short config accepted")
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Error("a rejected config changed the image")
	}
	var c appliance.BootConfig
	for _, a := range []string{"shards=0", "node=bad/name", "controller=ftp://x", "controller_pin=ABC", "cred=short", "color=blue"} {
		if err := c.Set(a); err == nil {
			t.Errorf("Set(%q) accepted", a)
		}
	}
}

func TestReadUSBConfigRejects(t *testing.T) {
	dir, _ := builtFixture(t)
	for _, tc := range []struct {
		name string
		edit func(t *testing.T, img []byte) []byte
		want error
	}{
		{"kernel.bin, not an image", func(t *testing.T, _ []byte) []byte {
			b, _ := os.ReadFile(filepath.Join(dir, KernelFile))
			return b
		}, ErrNotDPXEImage},
		{"other boot code", func(t *testing.T, img []byte) []byte {
			copy(img[mbrloader.PatchOffset:], "XXXX")
			return img
		}, ErrNotDPXEImage},
		{"partition not active", func(t *testing.T, img []byte) []byte { img[446] = 0; return img }, ErrNotDPXEImage},
		{"partition type 0x0c", func(t *testing.T, img []byte) []byte { img[446+4] = 0x0c; return img }, ErrNotDPXEImage},
		{"loader points elsewhere", func(t *testing.T, img []byte) []byte {
			lba := binary.LittleEndian.Uint32(img[0x1A8:])
			binary.LittleEndian.PutUint32(img[0x1A8:], lba+1)
			return img
		}, ErrPatchMismatch},
		{"loader reads 7 sectors", func(t *testing.T, img []byte) []byte {
			binary.LittleEndian.PutUint16(img[0x1AC:], 7)
			return img
		}, ErrPatchMismatch},
		{"DPXE.CFG fragmented", fragmentConfig, ErrFragmented},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img, err := os.ReadFile(filepath.Join(dir, USBImageFile))
			if err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(t.TempDir(), "x.img")
			if err := os.WriteFile(p, tc.edit(t, img), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := ReadUSBConfig(p); !errors.Is(err, tc.want) {
				t.Fatalf("ReadUSBConfig: %v, want %v", err, tc.want)
			}
			raw := ConfigTemplate()
			if err := WriteUSBConfig(p, raw); !errors.Is(err, tc.want) {
				t.Fatalf("WriteUSBConfig: %v, want %v", err, tc.want)
			}
		})
	}
}

// fragmentConfig moves the last cluster of DPXE.CFG's chain to a free
// cluster further on, in both FATs, so the file is no longer contiguous.
func fragmentConfig(t *testing.T, img []byte) []byte {
	t.Helper()
	part := img[PartitionStartLBA*SectorSize:]
	reserved := int(binary.LittleEndian.Uint16(part[14:]))
	fatSz := int(binary.LittleEndian.Uint32(part[36:]))
	dataStart := (reserved + 2*fatSz) * SectorSize
	// DPXE.CFG's first cluster, from its root directory entry.
	root := part[dataStart:]
	first := uint32(0)
	for off := 0; off < SectorSize; off += 32 {
		if string(root[off:off+11]) == "DPXE    CFG" {
			first = uint32(binary.LittleEndian.Uint16(root[off+20:]))<<16 | uint32(binary.LittleEndian.Uint16(root[off+26:]))
		}
	}
	if first < 3 {
		t.Fatal("DPXE.CFG entry not found")
	}
	for _, fat := range []int{reserved, reserved + fatSz} {
		fb := part[fat*SectorSize:]
		entry := func(c uint32) []byte { return fb[4*c : 4*c+4] }
		last, prev := first, uint32(0)
		for v := binary.LittleEndian.Uint32(entry(last)) & 0x0FFFFFFF; v < 0x0FFFFFF8; v = binary.LittleEndian.Uint32(entry(last)) & 0x0FFFFFFF {
			prev, last = last, v
		}
		free := uint32(5000) // well past the files of a fresh image
		if binary.LittleEndian.Uint32(entry(free)) != 0 {
			t.Fatal("cluster 5000 is not free")
		}
		binary.LittleEndian.PutUint32(entry(prev), free)
		binary.LittleEndian.PutUint32(entry(free), 0x0FFFFFFF)
		binary.LittleEndian.PutUint32(entry(last), 0)
	}
	return img
}
