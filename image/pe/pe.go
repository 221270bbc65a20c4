// Package pe validates the PE32+ side of kernel.bin: the headers an UEFI
// firmware reads before it runs the kernel as an EFI application.
//
// It checks the rules of the Microsoft "PE Format" specification (sections
// 2-6) that UEFI loaders such as EDK2's BasePeCoff.c enforce, plus the
// layout Discord-PXE relies on: SectionAlignment == FileAlignment == 4 KiB so
// that every file offset equals its RVA (the same file then works as a
// Multiboot a.out-kludge image), and a base-relocation directory, because
// the firmware may load the image away from its ImageBase.
package pe

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Constants from the PE Format specification.
const (
	dosMagic        = 0x5A4D     // "MZ", MS-DOS header (section 2)
	lfanewOffset    = 0x3C       // e_lfanew: file offset of the PE signature (section 2)
	peSignature     = 0x00004550 // "PE\0\0" (section 2)
	MachineAMD64    = 0x8664     // IMAGE_FILE_MACHINE_AMD64 (3.3.1)
	MagicPE32Plus   = 0x020B     // optional header magic (3.4)
	SubsystemEFIApp = 10         // IMAGE_SUBSYSTEM_EFI_APPLICATION (3.4.2)
	PageSize        = 0x1000     // required SectionAlignment and FileAlignment
	dirBaseReloc    = 5          // data directory index of the base relocation table (3.4.3)
	scnCntCode      = 0x00000020 // IMAGE_SCN_CNT_CODE (4.1)
	scnMemExecute   = 0x20000000 // IMAGE_SCN_MEM_EXECUTE (4.1)
	relBasedAbs     = 0          // IMAGE_REL_BASED_ABSOLUTE: padding entry (6.6.2)
	relBasedDir64   = 10         // IMAGE_REL_BASED_DIR64 (6.6.2)
	relBlockHdrLen  = 8          // page RVA + block size (6.6.1)
	maxSections     = 96         // the PE loader limit (3.3)
)

// Errors returned by Parse; each is wrapped with the offending values.
var (
	// ErrTruncated means the file ends inside a header or table.
	ErrTruncated = errors.New("pe: file too short for its headers")
	// ErrNoMZ means the file does not start with the MS-DOS signature.
	ErrNoMZ = errors.New("pe: no MZ signature at offset 0")
	// ErrLfanew means e_lfanew points into the DOS header or past the file.
	ErrLfanew = errors.New("pe: e_lfanew points outside the file")
	// ErrNoPE means no PE signature where e_lfanew points.
	ErrNoPE = errors.New(`pe: no "PE\0\0" signature at e_lfanew`)
	// ErrMachine means the image is not for x86-64.
	ErrMachine = errors.New("pe: machine is not AMD64 (0x8664)")
	// ErrNotPE32Plus means a 32-bit (PE32) or unknown optional header.
	ErrNotPE32Plus = errors.New("pe: optional header is not PE32+ (magic 0x20B)")
	// ErrSubsystem means the firmware would not start it as an application.
	ErrSubsystem = errors.New("pe: subsystem is not EFI application (10)")
	// ErrAlignment means file offsets could differ from RVAs.
	ErrAlignment = errors.New("pe: SectionAlignment and FileAlignment must both be 0x1000")
	// ErrSection means a section the loader could not map with offset == RVA.
	ErrSection = errors.New("pe: section outside the file or not at file offset == RVA")
	// ErrEntry means AddressOfEntryPoint is not in code.
	ErrEntry = errors.New("pe: entry point not inside an executable section")
	// ErrNoReloc means there is no base relocation directory: a firmware
	// that loads the image away from ImageBase would have nothing to apply.
	ErrNoReloc = errors.New("pe: no base relocation directory")
	// ErrRelocBlock means the relocation table is malformed.
	ErrRelocBlock = errors.New("pe: malformed base relocation block")
	// ErrOptionalSize means SizeOfOptionalHeader disagrees with the
	// number of data directories.
	ErrOptionalSize = errors.New("pe: SizeOfOptionalHeader does not fit the data directories")
)

// fileHeader is the COFF file header (3.3).
type fileHeader struct {
	Machine              uint16
	NumberOfSections     uint16
	TimeDateStamp        uint32
	PointerToSymbolTable uint32
	NumberOfSymbols      uint32
	SizeOfOptionalHeader uint16
	Characteristics      uint16
}

// optionalHeader64 is the fixed part of the PE32+ optional header (3.4).
type optionalHeader64 struct {
	Magic                       uint16
	MajorLinkerVersion          uint8
	MinorLinkerVersion          uint8
	SizeOfCode                  uint32
	SizeOfInitializedData       uint32
	SizeOfUninitializedData     uint32
	AddressOfEntryPoint         uint32
	BaseOfCode                  uint32
	ImageBase                   uint64
	SectionAlignment            uint32
	FileAlignment               uint32
	MajorOperatingSystemVersion uint16
	MinorOperatingSystemVersion uint16
	MajorImageVersion           uint16
	MinorImageVersion           uint16
	MajorSubsystemVersion       uint16
	MinorSubsystemVersion       uint16
	Win32VersionValue           uint32
	SizeOfImage                 uint32
	SizeOfHeaders               uint32
	CheckSum                    uint32
	Subsystem                   uint16
	DllCharacteristics          uint16
	SizeOfStackReserve          uint64
	SizeOfStackCommit           uint64
	SizeOfHeapReserve           uint64
	SizeOfHeapCommit            uint64
	LoaderFlags                 uint32
	NumberOfRvaAndSizes         uint32
}

// DataDirectory is one entry of the optional header's directory table (3.4.3).
type DataDirectory struct {
	VirtualAddress uint32
	Size           uint32
}

// sectionHeader is one entry of the section table (4.1).
type sectionHeader struct {
	Name                 [8]byte
	VirtualSize          uint32
	VirtualAddress       uint32
	SizeOfRawData        uint32
	PointerToRawData     uint32
	PointerToRelocations uint32
	PointerToLinenumbers uint32
	NumberOfRelocations  uint16
	NumberOfLinenumbers  uint16
	Characteristics      uint32
}

// Section is a validated section.
type Section struct {
	Name            string
	RVA             uint32 // also the file offset
	VirtualSize     uint32
	RawSize         uint32
	Characteristics uint32
}

// Executable reports whether the section holds code the entry may run.
func (s Section) Executable() bool {
	return s.Characteristics&(scnMemExecute|scnCntCode) != 0
}

// Image is the validated PE32+ view of a kernel.
type Image struct {
	ImageBase   uint64
	EntryRVA    uint32
	SizeOfImage uint32
	Sections    []Section
	Reloc       DataDirectory // the base relocation table
	RelocBlocks int           // number of relocation blocks
}

// Parse validates b as a PE32+ EFI application laid out with file offset ==
// RVA, and returns its headers.
func Parse(b []byte) (*Image, error) {
	if len(b) < lfanewOffset+4 {
		return nil, fmt.Errorf("%w: %d bytes", ErrTruncated, len(b))
	}
	if m := binary.LittleEndian.Uint16(b); m != dosMagic {
		return nil, fmt.Errorf("%w (found %#04x)", ErrNoMZ, m)
	}
	lfanew := binary.LittleEndian.Uint32(b[lfanewOffset:])
	if uint64(lfanew)+4 > uint64(len(b)) || lfanew < lfanewOffset+4 {
		return nil, fmt.Errorf("%w: e_lfanew %#x, file %d bytes", ErrLfanew, lfanew, len(b))
	}
	if s := binary.LittleEndian.Uint32(b[lfanew:]); s != peSignature {
		return nil, fmt.Errorf("%w (found %#08x at %#x)", ErrNoPE, s, lfanew)
	}
	off := int(lfanew) + 4
	var fh fileHeader
	n, err := binary.Decode(b[off:], binary.LittleEndian, &fh)
	if err != nil {
		return nil, fmt.Errorf("%w: COFF header at %#x", ErrTruncated, off)
	}
	off += n
	if fh.Machine != MachineAMD64 {
		return nil, fmt.Errorf("%w (found %#04x)", ErrMachine, fh.Machine)
	}
	optStart := off
	var oh optionalHeader64
	if len(b)-off < 2 {
		return nil, fmt.Errorf("%w: optional header at %#x", ErrTruncated, off)
	}
	if m := binary.LittleEndian.Uint16(b[off:]); m != MagicPE32Plus {
		return nil, fmt.Errorf("%w (found %#04x)", ErrNotPE32Plus, m)
	}
	n, err = binary.Decode(b[off:], binary.LittleEndian, &oh)
	if err != nil {
		return nil, fmt.Errorf("%w: optional header at %#x", ErrTruncated, off)
	}
	off += n
	if oh.Subsystem != SubsystemEFIApp {
		return nil, fmt.Errorf("%w (found %d)", ErrSubsystem, oh.Subsystem)
	}
	if oh.SectionAlignment != PageSize || oh.FileAlignment != PageSize {
		return nil, fmt.Errorf("%w (found %#x and %#x)", ErrAlignment, oh.SectionAlignment, oh.FileAlignment)
	}
	if oh.NumberOfRvaAndSizes <= dirBaseReloc {
		return nil, fmt.Errorf("%w (%d data directories)", ErrNoReloc, oh.NumberOfRvaAndSizes)
	}
	dirBytes := uint64(oh.NumberOfRvaAndSizes) * 8
	if uint64(n)+dirBytes != uint64(fh.SizeOfOptionalHeader) {
		return nil, fmt.Errorf("%w: %d bytes for %d directories", ErrOptionalSize, fh.SizeOfOptionalHeader, oh.NumberOfRvaAndSizes)
	}
	if uint64(off)+dirBytes > uint64(len(b)) {
		return nil, fmt.Errorf("%w: data directories at %#x", ErrTruncated, off)
	}
	var reloc DataDirectory
	if _, err := binary.Decode(b[off+dirBaseReloc*8:], binary.LittleEndian, &reloc); err != nil {
		return nil, fmt.Errorf("%w: data directories", ErrTruncated)
	}
	off = optStart + int(fh.SizeOfOptionalHeader)

	if fh.NumberOfSections == 0 || fh.NumberOfSections > maxSections {
		return nil, fmt.Errorf("%w: %d sections", ErrSection, fh.NumberOfSections)
	}
	img := &Image{ImageBase: oh.ImageBase, EntryRVA: oh.AddressOfEntryPoint, SizeOfImage: oh.SizeOfImage, Reloc: reloc}
	if uint64(oh.SizeOfHeaders) > uint64(len(b)) || uint64(oh.SizeOfHeaders) < uint64(off)+uint64(fh.NumberOfSections)*40 {
		return nil, fmt.Errorf("%w: SizeOfHeaders %#x", ErrTruncated, oh.SizeOfHeaders)
	}
	for i := 0; i < int(fh.NumberOfSections); i++ {
		var sh sectionHeader
		if _, err := binary.Decode(b[off:], binary.LittleEndian, &sh); err != nil {
			return nil, fmt.Errorf("%w: section header %d", ErrTruncated, i)
		}
		off += 40
		s := Section{Name: cString(sh.Name[:]), RVA: sh.VirtualAddress, VirtualSize: sh.VirtualSize,
			RawSize: sh.SizeOfRawData, Characteristics: sh.Characteristics}
		switch {
		case sh.PointerToRawData != sh.VirtualAddress:
			return nil, fmt.Errorf("%w: %q at file offset %#x but RVA %#x", ErrSection, s.Name, sh.PointerToRawData, sh.VirtualAddress)
		case sh.SizeOfRawData%PageSize != 0:
			return nil, fmt.Errorf("%w: %q SizeOfRawData %#x is not a multiple of FileAlignment", ErrSection, s.Name, sh.SizeOfRawData)
		case sh.VirtualAddress%PageSize != 0 || sh.VirtualAddress < oh.SizeOfHeaders:
			return nil, fmt.Errorf("%w: %q at RVA %#x (headers end at %#x, alignment %#x)", ErrSection, s.Name, sh.VirtualAddress, oh.SizeOfHeaders, PageSize)
		case uint64(sh.PointerToRawData)+uint64(sh.SizeOfRawData) > uint64(len(b)):
			return nil, fmt.Errorf("%w: %q ends at %#x, file is %#x bytes", ErrSection, s.Name, uint64(sh.PointerToRawData)+uint64(sh.SizeOfRawData), len(b))
		case uint64(sh.VirtualAddress)+uint64(max(sh.VirtualSize, sh.SizeOfRawData)) > uint64(oh.SizeOfImage):
			return nil, fmt.Errorf("%w: %q ends past SizeOfImage %#x", ErrSection, s.Name, oh.SizeOfImage)
		}
		if n := len(img.Sections); n > 0 {
			prev := img.Sections[n-1]
			if uint64(prev.RVA)+uint64(max(prev.VirtualSize, prev.RawSize)) > uint64(s.RVA) {
				return nil, fmt.Errorf("%w: %q overlaps %q or is out of order", ErrSection, s.Name, prev.Name)
			}
		}
		img.Sections = append(img.Sections, s)
	}
	if sec := img.sectionAt(img.EntryRVA, 1); sec == nil || !sec.Executable() {
		return nil, fmt.Errorf("%w: AddressOfEntryPoint %#x", ErrEntry, img.EntryRVA)
	}
	blocks, err := checkRelocs(b, img)
	if err != nil {
		return nil, err
	}
	img.RelocBlocks = blocks
	return img, nil
}

// sectionAt returns the section holding the n bytes at rva, or nil.
func (img *Image) sectionAt(rva, n uint32) *Section {
	for i := range img.Sections {
		s := &img.Sections[i]
		if rva >= s.RVA && uint64(rva)+uint64(n) <= uint64(s.RVA)+uint64(max(s.VirtualSize, s.RawSize)) {
			return s
		}
	}
	return nil
}

// checkRelocs validates the base relocation table (section 6.6): it lies in
// the file inside one section, is a sequence of blocks whose sizes add up to
// the directory size, each at least a header and a multiple of 4 bytes, with
// entries of type ABSOLUTE or DIR64 whose targets lie inside the image.
func checkRelocs(b []byte, img *Image) (int, error) {
	d := img.Reloc
	if d.VirtualAddress == 0 || d.Size == 0 {
		return 0, ErrNoReloc
	}
	if s := img.sectionAt(d.VirtualAddress, d.Size); s == nil || uint64(d.VirtualAddress)+uint64(d.Size) > uint64(s.RVA)+uint64(s.RawSize) {
		return 0, fmt.Errorf("%w: directory [%#x, +%#x) not inside a section's file data", ErrRelocBlock, d.VirtualAddress, d.Size)
	}
	table := b[d.VirtualAddress : d.VirtualAddress+d.Size]
	blocks := 0
	for len(table) > 0 {
		if len(table) < relBlockHdrLen {
			return 0, fmt.Errorf("%w: %d stray bytes after block %d", ErrRelocBlock, len(table), blocks)
		}
		page := binary.LittleEndian.Uint32(table)
		size := binary.LittleEndian.Uint32(table[4:])
		if size < relBlockHdrLen || size%4 != 0 || uint64(size) > uint64(len(table)) {
			return 0, fmt.Errorf("%w: block %d has size %d (%d bytes left)", ErrRelocBlock, blocks, size, len(table))
		}
		if page%PageSize != 0 || page >= img.SizeOfImage {
			return 0, fmt.Errorf("%w: block %d page RVA %#x", ErrRelocBlock, blocks, page)
		}
		for e := relBlockHdrLen; e < int(size); e += 2 {
			v := binary.LittleEndian.Uint16(table[e:])
			typ, off := v>>12, uint32(v&0x0FFF)
			switch typ {
			case relBasedAbs:
			case relBasedDir64:
				if uint64(page)+uint64(off)+8 > uint64(img.SizeOfImage) {
					return 0, fmt.Errorf("%w: block %d DIR64 fixup at %#x past the image", ErrRelocBlock, blocks, page+off)
				}
			default:
				return 0, fmt.Errorf("%w: block %d entry type %d (want 0 or 10)", ErrRelocBlock, blocks, typ)
			}
		}
		table = table[size:]
		blocks++
	}
	return blocks, nil
}

func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
