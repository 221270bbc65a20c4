package mbrloader

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// synthetic returns a loader image with the layout Parse expects (no
// nasm needed): sector 0 with a patch block, stage 2 of n sectors.
func synthetic(n uint16, p Patch) []byte {
	bin := make([]byte, SectorSize+int(n)*SectorSize)
	p.Magic, p.Stage2Sectors = Magic, n
	if _, err := binary.Encode(bin[PatchOffset:BootCodeSize], binary.LittleEndian, p); err != nil {
		panic(err)
	}
	copy(bin[SectorSize:], Stage2Magic[:])
	return bin
}

// FuzzParse: Parse never panics; what it accepts has the parts it
// promises (stage 1 is the first 440 bytes, stage 2 the declared sectors
// starting with DPX2), its patch block reads back, and patching it with
// valid values round-trips through ReadPatch. Refusals wrap ErrNotLoader.
func FuzzParse(f *testing.F) {
	good := Patch{Stage2LBA: 2046, KernelSectors: 100, KernelLBA: 1, ConfigLBA: 4000, ConfigSectors: 8,
		LoadAddr: MinLoadAddr, EntryAddr: MinLoadAddr + 0x20}
	f.Add(synthetic(1, good))
	f.Add(synthetic(3, Patch{Stage2LBA: 2046}))
	short := synthetic(2, good)
	f.Add(short[:len(short)-1])
	bad := synthetic(1, good)
	bad[SectorSize] = 'X'
	f.Add(bad)
	f.Add(make([]byte, SectorSize))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, bin []byte) {
		l, err := Parse(bin)
		if err != nil {
			if !errors.Is(err, ErrNotLoader) {
				t.Fatalf("refusal %v does not wrap ErrNotLoader", err)
			}
			return
		}
		p := l.Patch()
		if p.Magic != Magic || p.Stage2Sectors == 0 || len(l.Stage2) != int(p.Stage2Sectors)*SectorSize ||
			!bytes.Equal(l.Stage1[:], bin[:BootCodeSize]) || !bytes.HasPrefix(l.Stage2, Stage2Magic[:]) {
			t.Fatalf("accepted a loader with inconsistent parts: patch %+v, stage 2 %d bytes", p, len(l.Stage2))
		}
		want := p
		want.KernelSectors, want.KernelLBA, want.ConfigLBA, want.ConfigSectors, want.Reserved = 8, 1, 100, 8, 0
		want.LoadAddr, want.EntryAddr = MinLoadAddr, MinLoadAddr
		if want.Validate() != nil {
			return
		}
		out, err := l.Patched(want)
		if err != nil {
			t.Fatalf("Patched(%+v): %v", want, err)
		}
		got, err := ReadPatch(out[:])
		if err != nil || got != want {
			t.Fatalf("patched block reads back %+v, %v; want %+v", got, err, want)
		}
	})
}
