// Package mbrloader owns the layout of the Discord-PXE BIOS loader
// (kernel/boot/mbr.asm) as the image builder sees it: the two stages of the
// assembled mbr.bin and the patch block in front of the disk signature.
//
// The offsets here mirror the patch block of kernel/boot/mbr.asm; the tests
// assemble that file and check that they agree.
package mbrloader

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// Layout of the master boot record (the de-facto MBR format: 440 bytes of
// boot code, a 4-byte disk signature, 2 reserved bytes, four 16-byte
// partition entries at 446 and the 0x55AA signature at 510).
const (
	SectorSize      = 512
	BootCodeSize    = 440 // bytes 0..439 are ours; 440..511 belong to the partition table
	DiskSignatureAt = 440

	// PatchOffset is where the patch block starts in sector 0.
	PatchOffset = 0x198
	// PatchSize is the size of Patch in bytes; the block ends at BootCodeSize.
	PatchSize = BootCodeSize - PatchOffset

	// MinLoadAddr is the lowest load_addr the loader accepts: it keeps its
	// own data and the staging buffer below 1 MiB.
	MinLoadAddr = 0x100000
	// MaxKernelSectors is the largest kernel the loader stages below 640 KiB
	// (0x10000..0x90000 = 512 KiB).
	MaxKernelSectors = 1024
	// MaxConfigSectors is the most the loader reads for DPXE.CFG (4096 bytes).
	MaxConfigSectors = 8
)

// Magic marks sector 0 as our loader; Stage2Magic starts stage 2.
var (
	Magic       = [4]byte{'D', 'P', 'X', 'B'}
	Stage2Magic = [4]byte{'D', 'P', 'X', '2'}
)

// Errors of this package.
var (
	// ErrNotLoader means the bytes are not an assembled Discord-PXE loader.
	ErrNotLoader = errors.New("mbrloader: not a Discord-PXE MBR loader (no DPXB patch block)")
	// ErrBadPatch means patch values the loader would refuse or mis-handle.
	ErrBadPatch = errors.New("mbrloader: invalid patch values")
)

// Patch is the patch block at PatchOffset, in the order of mbr.asm. The
// builder fills it from the Multiboot header of kernel.bin and from the FAT;
// Stage2LBA and Stage2Sectors are assembled into the loader and only read.
type Patch struct {
	Magic         [4]byte // "DPXB"
	Stage2LBA     uint32  // where stage 2 lives (assembled: 2046, the end of the MBR gap)
	Stage2Sectors uint16  // stage 2 length (assembled)
	KernelSectors uint16  // sectors of kernel.bin to load: ceil(load length / 512)
	KernelLBA     uint32  // first sector of kernel.bin (1)
	ConfigLBA     uint32  // first sector of \DPXE.CFG
	ConfigSectors uint16  // sectors of \DPXE.CFG (8); 0 = no config
	Reserved      uint16  // zero
	LoadAddr      uint32  // Multiboot load_addr
	EntryAddr     uint32  // Multiboot entry_addr
}

// Loader is an assembled mbr.bin split into its parts.
type Loader struct {
	Stage1 [BootCodeSize]byte // boot code for sector 0, patch block included
	Stage2 []byte             // Stage2Sectors sectors for Stage2LBA
}

// Parse splits the output of `nasm -f bin kernel/boot/mbr.asm`.
func Parse(bin []byte) (*Loader, error) {
	if len(bin) < SectorSize {
		return nil, fmt.Errorf("%w: %d bytes", ErrNotLoader, len(bin))
	}
	p, err := ReadPatch(bin)
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(bin[BootCodeSize:SectorSize], make([]byte, SectorSize-BootCodeSize)) {
		return nil, fmt.Errorf("%w: bytes 440..511 are not zero", ErrNotLoader)
	}
	want := SectorSize + int(p.Stage2Sectors)*SectorSize
	if p.Stage2Sectors == 0 || len(bin) != want {
		return nil, fmt.Errorf("%w: %d bytes, want %d for %d stage-2 sectors", ErrNotLoader, len(bin), want, p.Stage2Sectors)
	}
	if !bytes.Equal(bin[SectorSize:SectorSize+4], Stage2Magic[:]) {
		return nil, fmt.Errorf("%w: stage 2 does not start with DPX2", ErrNotLoader)
	}
	l := &Loader{Stage2: bin[SectorSize:]}
	copy(l.Stage1[:], bin)
	return l, nil
}

// Patch returns the patch block as assembled.
func (l *Loader) Patch() Patch {
	p, err := ReadPatch(l.Stage1[:])
	if err != nil {
		panic(err) // Parse checked it
	}
	return p
}

// Patched returns the boot code with p written into its patch block. The
// read-only fields of p must match the assembled ones.
func (l *Loader) Patched(p Patch) ([BootCodeSize]byte, error) {
	orig := l.Patch()
	if p.Magic != Magic || p.Stage2LBA != orig.Stage2LBA || p.Stage2Sectors != orig.Stage2Sectors {
		return l.Stage1, fmt.Errorf("%w: magic and stage-2 fields are fixed by the loader", ErrBadPatch)
	}
	if err := p.Validate(); err != nil {
		return l.Stage1, err
	}
	out := l.Stage1
	if _, err := binary.Encode(out[PatchOffset:], binary.LittleEndian, p); err != nil {
		return l.Stage1, err
	}
	return out, nil
}

// ReadPatch decodes the patch block of sector 0 (at least 440 bytes).
func ReadPatch(sector0 []byte) (Patch, error) {
	var p Patch
	if len(sector0) < BootCodeSize {
		return p, fmt.Errorf("%w: %d bytes", ErrNotLoader, len(sector0))
	}
	if _, err := binary.Decode(sector0[PatchOffset:BootCodeSize], binary.LittleEndian, &p); err != nil {
		return p, err
	}
	if p.Magic != Magic {
		return p, ErrNotLoader
	}
	return p, nil
}

// Validate checks the values the loader relies on: a kernel of 1..1024
// sectors after sector 0 that does not overlap stage 2, loaded at or above
// 1 MiB with its entry inside it, and a config of at most 8 sectors.
func (p Patch) Validate() error {
	switch {
	case p.KernelSectors == 0 || p.KernelSectors > MaxKernelSectors:
		return fmt.Errorf("%w: kernel of %d sectors (1..%d, i.e. at most 512 KiB, for the BIOS path)", ErrBadPatch, p.KernelSectors, MaxKernelSectors)
	case p.KernelLBA == 0:
		return fmt.Errorf("%w: kernel at LBA 0 would overwrite the MBR", ErrBadPatch)
	case overlaps(p.KernelLBA, uint32(p.KernelSectors), p.Stage2LBA, uint32(p.Stage2Sectors)):
		return fmt.Errorf("%w: kernel sectors %d+%d overlap stage 2 at %d+%d", ErrBadPatch, p.KernelLBA, p.KernelSectors, p.Stage2LBA, p.Stage2Sectors)
	case p.ConfigSectors > MaxConfigSectors:
		return fmt.Errorf("%w: config of %d sectors (at most %d)", ErrBadPatch, p.ConfigSectors, MaxConfigSectors)
	case p.ConfigSectors > 0 && p.ConfigLBA == 0:
		return fmt.Errorf("%w: config at LBA 0", ErrBadPatch)
	case p.LoadAddr < MinLoadAddr:
		return fmt.Errorf("%w: load_addr %#x below 1 MiB", ErrBadPatch, p.LoadAddr)
	case uint64(p.LoadAddr)+uint64(p.KernelSectors)*SectorSize > 1<<32:
		return fmt.Errorf("%w: kernel at %#x passes 4 GiB", ErrBadPatch, p.LoadAddr)
	case p.EntryAddr < p.LoadAddr || uint64(p.EntryAddr) >= uint64(p.LoadAddr)+uint64(p.KernelSectors)*SectorSize:
		return fmt.Errorf("%w: entry_addr %#x outside the loaded kernel", ErrBadPatch, p.EntryAddr)
	case p.Reserved != 0:
		return fmt.Errorf("%w: reserved field is %#x", ErrBadPatch, p.Reserved)
	}
	return nil
}

func overlaps(a, an, b, bn uint32) bool {
	return uint64(a) < uint64(b)+uint64(bn) && uint64(b) < uint64(a)+uint64(an)
}
