package mbrloader

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// assembled returns kernel/boot/mbr.asm assembled by nasm.
func assembled(t *testing.T) []byte {
	t.Helper()
	if _, err := exec.LookPath("nasm"); err != nil {
		t.Skip("nasm not installed (apt-get install nasm)")
	}
	out := filepath.Join(t.TempDir(), "mbr.bin")
	cmd := exec.Command("nasm", "-f", "bin", "-o", out, filepath.Join("..", "..", "kernel", "boot", "mbr.asm"))
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nasm: %v\n%s", err, msg)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func goodPatch(l *Loader) Patch {
	p := l.Patch()
	p.KernelSectors, p.KernelLBA = 24, 1
	p.ConfigLBA, p.ConfigSectors = 4000, 8
	p.LoadAddr, p.EntryAddr = 0x100000, 0x101000
	return p
}

func TestAssembledLayout(t *testing.T) {
	bin := assembled(t)
	l, err := Parse(bin)
	if err != nil {
		t.Fatal(err)
	}
	p := l.Patch()
	// The assembled defaults sit at the offsets this package decodes.
	if p.Stage2LBA != 2046 || p.Stage2Sectors != 2 || p.KernelLBA != 1 || p.KernelSectors != 0 || p.ConfigSectors != 0 {
		t.Errorf("assembled patch block %+v", p)
	}
	if len(l.Stage2) != 2*SectorSize {
		t.Errorf("stage 2 is %d bytes", len(l.Stage2))
	}
	// The unpatched loader is not bootable, and says so.
	if err := p.Validate(); !errors.Is(err, ErrBadPatch) {
		t.Errorf("unpatched loader validates: %v", err)
	}
	// Stage 1 starts with a short jump over a zeroed BPB area.
	if bin[0] != 0xEB || bin[2] != 0x90 || int(bin[1])+2 != 0x5A {
		t.Errorf("stage 1 starts % x", bin[:3])
	}
	for i := 3; i < 0x5A; i++ {
		if bin[i] != 0 {
			t.Fatalf("BPB area byte %#x is %#x, want 0", i, bin[i])
		}
	}
}

func TestPatchRoundTrip(t *testing.T) {
	l, err := Parse(assembled(t))
	if err != nil {
		t.Fatal(err)
	}
	want := goodPatch(l)
	code, err := l.Patched(want)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ReadPatch(code[:])
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("read back %+v, want %+v", got, want)
	}
	if string(code[:PatchOffset]) != string(l.Stage1[:PatchOffset]) {
		t.Error("patching changed code in front of the patch block")
	}
}

func TestPatchRejects(t *testing.T) {
	l, err := Parse(assembled(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		mod  func(p *Patch)
	}{
		{"no kernel", func(p *Patch) { p.KernelSectors = 0 }},
		{"kernel over 512 KiB", func(p *Patch) { p.KernelSectors = MaxKernelSectors + 1 }},
		{"kernel at LBA 0", func(p *Patch) { p.KernelLBA = 0 }},
		{"kernel over stage 2", func(p *Patch) { p.KernelLBA = 2040 }},
		{"config of 9 sectors", func(p *Patch) { p.ConfigSectors = 9 }},
		{"config at LBA 0", func(p *Patch) { p.ConfigLBA = 0 }},
		{"load below 1 MiB", func(p *Patch) { p.LoadAddr, p.EntryAddr = 0x8000, 0x8000 }},
		{"entry below load", func(p *Patch) { p.EntryAddr = 0xFFFFF }},
		{"entry past kernel", func(p *Patch) { p.EntryAddr = 0x100000 + 24*512 }},
		{"passes 4 GiB", func(p *Patch) { p.LoadAddr, p.EntryAddr = 0xFFFFF000, 0xFFFFF000 }},
		{"reserved", func(p *Patch) { p.Reserved = 1 }},
		{"stage 2 moved", func(p *Patch) { p.Stage2LBA = 100 }},
		{"magic", func(p *Patch) { p.Magic[0] = 'X' }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := goodPatch(l)
			tc.mod(&p)
			if _, err := l.Patched(p); !errors.Is(err, ErrBadPatch) {
				t.Fatalf("Patched: %v, want ErrBadPatch", err)
			}
		})
	}
}

func TestParseRejects(t *testing.T) {
	bin := assembled(t)
	for _, tc := range []struct {
		name string
		mod  func(b []byte) []byte
	}{
		{"short", func(b []byte) []byte { return b[:300] }},
		{"no magic", func(b []byte) []byte { b[PatchOffset] = 0; return b }},
		{"partition table bytes", func(b []byte) []byte { b[446] = 0x80; return b }},
		{"stage 2 truncated", func(b []byte) []byte { return b[:len(b)-SectorSize] }},
		{"stage 2 magic", func(b []byte) []byte { b[SectorSize] = 0; return b }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.mod(append([]byte(nil), bin...))
			if _, err := Parse(b); !errors.Is(err, ErrNotLoader) {
				t.Fatalf("Parse: %v, want ErrNotLoader", err)
			}
		})
	}
}
