package image

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	diskfs "github.com/diskfs/go-diskfs"

	"github.com/discord-pxe/dpxe/image/mbrloader"
	"github.com/discord-pxe/dpxe/image/multiboot"
	"github.com/discord-pxe/dpxe/image/pe"
)

// fixtureSources returns the test kernel tree: image/testdata/kernel plus
// the real MBR loader from kernel/boot/mbr.asm, edited by the optional mods
// (file -> function of its text).
func fixtureSources(t *testing.T, mods map[string]func(string) string) fs.FS {
	t.Helper()
	m := fstest.MapFS{}
	for name, file := range map[string]string{
		"kernel.asm":   "testdata/kernel/kernel.asm",
		"version.inc":  "testdata/kernel/version.inc",
		"boot/mbr.asm": "../kernel/boot/mbr.asm",
	} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if f := mods[name]; f != nil {
			b = []byte(f(string(b)))
		}
		m[name] = &fstest.MapFile{Data: b, Mode: 0o644}
	}
	return m
}

func needNASM(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("nasm"); err != nil {
		t.Skip("nasm not installed (apt-get install nasm)")
	}
}

var (
	fixtureOnce sync.Once
	fixtureDir  string
	fixtureMan  *Manifest
	fixtureErr  error
)

// builtFixture builds the fixture once per test binary; callers must not
// modify the files (copy usb.img first).
func builtFixture(t *testing.T) (string, *Manifest) {
	t.Helper()
	needNASM(t)
	fixtureOnce.Do(func() {
		fixtureDir, fixtureErr = os.MkdirTemp("", "dpxe-image-test-")
		if fixtureErr != nil {
			return
		}
		fixtureMan, fixtureErr = Build(context.Background(), Options{Sources: fixtureSources(t, nil), OutDir: fixtureDir})
	})
	if fixtureErr != nil {
		t.Fatal(fixtureErr)
	}
	return fixtureDir, fixtureMan
}

func TestMain(m *testing.M) {
	code := m.Run()
	if fixtureDir != "" {
		os.RemoveAll(fixtureDir)
	}
	os.Exit(code)
}

func TestBuildArtifacts(t *testing.T) {
	dir, m := builtFixture(t)
	if m.KernelVersion != "0.0.1-fixture" || !strings.HasPrefix(m.NASMVersion, "NASM version") || len(m.SourcesSHA256) != 64 {
		t.Errorf("manifest header %+v", m)
	}
	if len(m.Inputs.Sources) != 3 || m.Inputs.Sources[0].Path != "boot/mbr.asm" {
		t.Errorf("manifest sources %+v", m.Inputs.Sources)
	}
	want := []string{"kernel.bin", "netboot/kernel.bin", "netboot/boot.ipxe.tmpl", "usb.img"}
	if len(m.Artifacts) != len(want) {
		t.Fatalf("artifacts %+v", m.Artifacts)
	}
	for i, a := range m.Artifacts {
		d, err := digestFile(filepath.Join(dir, a.Path))
		if err != nil {
			t.Fatal(err)
		}
		if a.Path != want[i] || d.Size != a.Size || d.SHA256 != a.SHA256 {
			t.Errorf("artifact %d: manifest %+v, file %+v", i, a, d)
		}
	}
	k, _ := os.ReadFile(filepath.Join(dir, "kernel.bin"))
	nk, _ := os.ReadFile(filepath.Join(dir, "netboot/kernel.bin"))
	if !bytes.Equal(k, nk) || len(k) == 0 {
		t.Error("netboot/kernel.bin differs from kernel.bin")
	}
	var onDisk Manifest
	js, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(js, &onDisk); err != nil {
		t.Fatal(err)
	}
	if onDisk.USB == nil || onDisk.USB.ConfigLBA != m.USB.ConfigLBA || onDisk.Kernel.EntryAddr != 0x101000 {
		t.Errorf("manifest.json %+v", onDisk)
	}
}

// Two builds from the same sources give the same bytes, artifact by artifact.
func TestBuildReproducible(t *testing.T) {
	dir1, m1 := builtFixture(t)
	dir2 := t.TempDir()
	m2, err := Build(context.Background(), Options{Sources: fixtureSources(t, nil), OutDir: dir2})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{KernelFile, "netboot/kernel.bin", IPXETemplateFile, USBImageFile, ManifestFile} {
		a, err1 := os.ReadFile(filepath.Join(dir1, name))
		b, err2 := os.ReadFile(filepath.Join(dir2, name))
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs between two builds", name)
		}
	}
	if m1.Artifacts[3].SHA256 != m2.Artifacts[3].SHA256 {
		t.Error("usb.img digests differ")
	}
}

func TestBuildRefusesBadKernel(t *testing.T) {
	needNASM(t)
	for _, tc := range []struct {
		name string
		mods map[string]func(string) string
		want error
		text string
	}{
		{"console subsystem", map[string]func(string) string{"kernel.asm": func(s string) string {
			return strings.Replace(s, "PE_SUBSYSTEM_EFI_APP\tequ 10", "PE_SUBSYSTEM_EFI_APP\tequ 3", 1)
		}}, pe.ErrSubsystem, "not a valid EFI application"},
		{"multiboot checksum", map[string]func(string) string{"kernel.asm": func(s string) string {
			return strings.Replace(s, "dd -(MB_MAGIC + MB_FLAGS)", "dd -(MB_MAGIC + MB_FLAGS) + 1", 1)
		}}, multiboot.ErrChecksum, "not a valid Multiboot kernel"},
		{"image base", map[string]func(string) string{"kernel.asm": func(s string) string {
			return strings.Replace(s, "\tdq IMAGE_BASE\n", "\tdq IMAGE_BASE + 0x1000\n", 1)
		}}, ErrBaseMismatch, "ImageBase"},
		{"nasm error", map[string]func(string) string{"kernel.asm": func(s string) string {
			return s + "\n\tbogus_instruction eax\n"
		}}, nil, "error: parser: instruction expected"},
		{"no version", map[string]func(string) string{"version.inc": func(string) string { return "; nothing\n" }}, ErrNoVersion, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := t.TempDir()
			_, err := Build(context.Background(), Options{Sources: fixtureSources(t, tc.mods), OutDir: out})
			if err == nil {
				t.Fatal("Build accepted it")
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("error %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.text) {
				t.Errorf("error %q does not mention %q", err, tc.text)
			}
			if _, err := os.Stat(filepath.Join(out, USBImageFile)); err == nil {
				t.Error("usb.img written for a refused kernel")
			}
		})
	}
}

func TestBuildWithoutNASM(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := Build(context.Background(), Options{Sources: fstest.MapFS{}, OutDir: t.TempDir()})
	if !errors.Is(err, ErrNoNASM) || !strings.Contains(err.Error(), "apt-get install nasm") {
		t.Fatalf("error %v, want ErrNoNASM naming the package", err)
	}
}

func TestUSBLayout(t *testing.T) {
	dir, m := builtFixture(t)
	img, err := os.ReadFile(filepath.Join(dir, USBImageFile))
	if err != nil {
		t.Fatal(err)
	}
	kernel, _ := os.ReadFile(filepath.Join(dir, KernelFile))
	if len(img) != USBImageSize {
		t.Fatalf("usb.img is %d bytes", len(img))
	}
	// Sector 0: our loader, patched from the Multiboot header.
	p, err := mbrloader.ReadPatch(img)
	if err != nil {
		t.Fatal(err)
	}
	mb, err := multiboot.Find(kernel)
	if err != nil {
		t.Fatal(err)
	}
	wantPatch := mbrloader.Patch{Magic: mbrloader.Magic, Stage2LBA: 2046, Stage2Sectors: 2,
		KernelSectors: uint16((mb.LoadLen + 511) / 512), KernelLBA: 1, ConfigLBA: m.USB.ConfigLBA,
		ConfigSectors: 8, LoadAddr: mb.LoadAddr, EntryAddr: mb.EntryAddr}
	if p != wantPatch {
		t.Errorf("patch %+v, want %+v", p, wantPatch)
	}
	if img[0] != 0xEB || img[510] != 0x55 || img[511] != 0xAA {
		t.Errorf("sector 0 starts % x, ends % x", img[:3], img[510:512])
	}
	if sig := binary.LittleEndian.Uint32(img[440:]); sig == 0 {
		t.Error("disk signature is zero")
	}
	// Partition 1: active, 0xEF, LBA 2048 to the end; entries 2-4 empty.
	e := img[446:462]
	if e[0] != 0x80 || e[4] != 0xEF || binary.LittleEndian.Uint32(e[8:]) != 2048 || binary.LittleEndian.Uint32(e[12:]) != USBImageSize/512-2048 {
		t.Errorf("partition entry % x", e)
	}
	if !bytes.Equal(img[462:510], make([]byte, 48)) {
		t.Error("partition entries 2-4 are not empty")
	}
	// The MBR gap: kernel.bin from LBA 1, zeros, then stage 2 at 2046.
	if !bytes.Equal(img[512:512+len(kernel)], kernel) {
		t.Error("LBA 1.. is not kernel.bin")
	}
	if !bytes.Equal(img[512+len(kernel):2046*512], make([]byte, 2046*512-512-len(kernel))) {
		t.Error("MBR gap between kernel and stage 2 is not zero")
	}
	if string(img[2046*512:2046*512+4]) != "DPX2" {
		t.Error("no stage 2 at LBA 2046")
	}
	// FAT32: the files, byte for byte, through go-diskfs.
	d, err := diskfs.Open(filepath.Join(dir, USBImageFile), diskfs.WithOpenMode(diskfs.ReadOnly))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	fsys, err := d.GetFilesystem(1)
	if err != nil {
		t.Fatal(err)
	}
	if fsys.Label() != VolumeLabel {
		t.Errorf("label %q", fsys.Label())
	}
	for name, want := range map[string][]byte{EFIBootPath: kernel, ConfigPath: ConfigTemplate()} {
		f, err := fsys.OpenFile(name, os.O_RDONLY)
		if err != nil {
			t.Fatal(name, err)
		}
		got := make([]byte, len(want)+1)
		n, _ := f.Read(got)
		if !bytes.Equal(got[:n], want) {
			t.Errorf("%s: %d bytes, differs from the source", name, n)
		}
	}
	// DPXE.CFG: the sectors the loader reads are the file.
	if !bytes.Equal(img[int(p.ConfigLBA)*512:int(p.ConfigLBA)*512+4096], ConfigTemplate()) {
		t.Error("the sectors at the loader's config LBA are not DPXE.CFG")
	}
	// Every directory entry carries the fixed timestamp.
	checkFATTimestamps(t, img, time.Unix(fatEpoch, 0))
}

// With SOURCE_DATE_EPOCH set, every FAT entry carries that time instead.
func TestBuildSourceDateEpoch(t *testing.T) {
	needNASM(t)
	t.Setenv("SOURCE_DATE_EPOCH", "1700000000") // 2023-11-14T22:13:20Z
	out := t.TempDir()
	m, err := Build(context.Background(), Options{Sources: fixtureSources(t, nil), OutDir: out})
	if err != nil {
		t.Fatal(err)
	}
	if m.Inputs.SourceDateEpoch != 1700000000 {
		t.Errorf("manifest source_date_epoch %d", m.Inputs.SourceDateEpoch)
	}
	img, err := os.ReadFile(filepath.Join(out, USBImageFile))
	if err != nil {
		t.Fatal(err)
	}
	checkFATTimestamps(t, img, time.Unix(1700000000, 0))
}

// checkFATTimestamps walks every directory of the FAT32 partition by hand
// and checks the create, access and write dates and times of every entry.
func checkFATTimestamps(t *testing.T, img []byte, when time.Time) {
	t.Helper()
	part := img[PartitionStartLBA*512:]
	bps := int(binary.LittleEndian.Uint16(part[11:]))
	spc := int(part[13])
	reserved := int(binary.LittleEndian.Uint16(part[14:]))
	fats := int(part[16])
	fatSz := int(binary.LittleEndian.Uint32(part[36:]))
	root := binary.LittleEndian.Uint32(part[44:])
	fat := part[reserved*bps:]
	dataStart := (reserved + fats*fatSz) * bps
	clusterBytes := bps * spc
	when = when.UTC()
	wantDate := uint16(when.Year()-1980)<<9 | uint16(when.Month())<<5 | uint16(when.Day())
	wantTime := uint16(when.Hour())<<11 | uint16(when.Minute())<<5 | uint16(when.Second()/2)
	seen := 0
	var walk func(cluster uint32, depth int)
	walk = func(cluster uint32, depth int) {
		for c := cluster; c >= 2 && c < 0x0FFFFFF8; c = binary.LittleEndian.Uint32(fat[4*c:]) & 0x0FFFFFFF {
			dirBytes := part[dataStart+int(c-2)*clusterBytes:][:clusterBytes]
			for off := 0; off < len(dirBytes); off += 32 {
				ent := dirBytes[off : off+32]
				if ent[0] == 0 {
					return
				}
				if ent[0] == 0xE5 || ent[11] == 0x0F { // deleted, long-name slot
					continue
				}
				seen++
				ctime, cdate := binary.LittleEndian.Uint16(ent[14:]), binary.LittleEndian.Uint16(ent[16:])
				adate := binary.LittleEndian.Uint16(ent[18:])
				wtime, wdate := binary.LittleEndian.Uint16(ent[22:]), binary.LittleEndian.Uint16(ent[24:])
				name := string(ent[:11])
				if c := uint32(binary.LittleEndian.Uint16(ent[20:]))<<16 | uint32(binary.LittleEndian.Uint16(ent[26:])); name == "..         " && (c == 0 || c == root) {
					// ".." of a first-level directory points at the root,
					// which has no entry; go-diskfs gives it the zero
					// time.Time (a fixed value, not the clock).
					cdate, adate, wdate = wantDate, wantDate, wantDate
				}
				if name == "..         " && ctime == 0 {
					// go-diskfs (v1.9.4) writes a creation time of day of 0
					// into the ".." entry of a second-level directory
					// (observed): a fixed value, not the clock.
					ctime = wantTime
				}
				if ctime != wantTime || cdate != wantDate || adate != wantDate || wtime != wantTime || wdate != wantDate {
					t.Errorf("entry %q: times %#x/%#x/%#x/%#x/%#x, want %v (%#x/%#x)", ent[:11], ctime, cdate, adate, wtime, wdate, when, wantTime, wantDate)
				}
				if ent[11]&0x10 != 0 && name != ".          " && name != "..         " && depth < 4 {
					sub := uint32(binary.LittleEndian.Uint16(ent[20:]))<<16 | uint32(binary.LittleEndian.Uint16(ent[26:]))
					walk(sub, depth+1)
				}
			}
		}
	}
	walk(root, 0)
	// label, DPXE.CFG, EFI; ., .., BOOT; ., .., BOOTX64.EFI
	if seen != 9 {
		t.Errorf("walked %d directory entries, want 9", seen)
	}
}
