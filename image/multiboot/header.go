// Package multiboot finds and validates the Multiboot v1 header of a kernel
// image that uses the a.out kludge (header flag bit 16), the form every
// Discord-PXE boot loader relies on: iPXE and QEMU on BIOS, and our MBR loader.
//
// The rules are those of the Multiboot Specification version 0.6.96,
// section 3.1 ("OS image format"), plus the restrictions of our loaders: no
// flags other than page alignment, memory information and the address
// fields, and a load image that starts at file offset 0 and lies inside the
// file.
package multiboot

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Magic is the header magic number (spec 3.1.2).
const Magic = 0x1BADB002

// BootloaderMagic is the value a Multiboot loader leaves in EAX (spec 3.2).
const BootloaderMagic = 0x2BADB002

// SearchLimit is how far into the file the header must lie, completely
// (spec 3.1.1: "within the first 8192 bytes").
const SearchLimit = 8192

// HeaderSize is the size of a header with the address fields (flag bit 16)
// and without the video fields (flag bit 2): magic through entry_addr.
const HeaderSize = 32

// Header flags (spec 3.1.2).
const (
	FlagPageAlign  = 1 << 0  // modules aligned on 4 KiB pages
	FlagMemInfo    = 1 << 1  // the loader must pass mem_lower/mem_upper
	FlagVideoMode  = 1 << 2  // video mode fields present: not supported here
	FlagAoutKludge = 1 << 16 // address fields present: load the file raw

	// SupportedFlags are the flags every Discord-PXE loader honours.
	SupportedFlags = FlagPageAlign | FlagMemInfo | FlagAoutKludge
)

// Errors returned by Find; each is wrapped with the offending values.
var (
	// ErrHeaderNotFound means no magic number at a 4-byte-aligned offset
	// within the first SearchLimit bytes.
	ErrHeaderNotFound = errors.New("multiboot: no header (magic 0x1BADB002) in the first 8192 bytes")
	// ErrChecksum means magic + flags + checksum is not zero modulo 2^32.
	ErrChecksum = errors.New("multiboot: header checksum does not cancel magic + flags")
	// ErrFlags means the header asks for something our loaders do not do.
	ErrFlags = errors.New("multiboot: unsupported header flags")
	// ErrNoAddresses means flag bit 16 is clear: the kernel would have to be
	// an ELF32 file, which kernel.bin is not.
	ErrNoAddresses = errors.New("multiboot: header flag bit 16 (address fields) is clear")
	// ErrHeaderAddr means header_addr - load_addr is not the header's file offset.
	ErrHeaderAddr = errors.New("multiboot: header_addr - load_addr is not the header's file offset")
	// ErrLoadEnd means load_end_addr is before load_addr or past the end of the file.
	ErrLoadEnd = errors.New("multiboot: load_end_addr outside the file")
	// ErrBSSEnd means bss_end_addr is below the end of the loaded image.
	ErrBSSEnd = errors.New("multiboot: bss_end_addr below load_end_addr")
	// ErrEntry means entry_addr is not inside the loaded image.
	ErrEntry = errors.New("multiboot: entry_addr outside the loaded image")
)

// Header is a Multiboot v1 header with the a.out-kludge address fields, as
// stored in the file (spec 3.1.1, offsets 0..28).
type Header struct {
	Magic       uint32
	Flags       uint32
	Checksum    uint32
	HeaderAddr  uint32
	LoadAddr    uint32
	LoadEndAddr uint32 // 0 = load the whole file
	BSSEndAddr  uint32 // 0 = no BSS
	EntryAddr   uint32
}

// Image is a validated header and where the loader puts the kernel.
type Image struct {
	Header
	Offset  int    // file offset of the header
	LoadLen uint32 // bytes loaded from file offset 0 to LoadAddr
	MemEnd  uint32 // end of the image in memory, BSS included
}

// Find searches kernel for a Multiboot v1 header and validates it against the
// file. The first header with a correct checksum wins, as in GRUB and iPXE.
func Find(kernel []byte) (*Image, error) {
	limit := min(len(kernel), SearchLimit)
	firstBad := -1
	for off := 0; off+HeaderSize <= limit; off += 4 {
		if binary.LittleEndian.Uint32(kernel[off:]) != Magic {
			continue
		}
		var h Header
		if _, err := binary.Decode(kernel[off:off+HeaderSize], binary.LittleEndian, &h); err != nil {
			return nil, fmt.Errorf("multiboot: decoding header at offset %#x: %w", off, err)
		}
		if h.Magic+h.Flags+h.Checksum != 0 {
			if firstBad < 0 {
				firstBad = off
			}
			continue
		}
		return validate(h, off, len(kernel))
	}
	if firstBad >= 0 {
		return nil, fmt.Errorf("%w (header at offset %#x)", ErrChecksum, firstBad)
	}
	return nil, ErrHeaderNotFound
}

// validate checks a header with a correct checksum found at file offset off
// of a file of fileLen bytes.
func validate(h Header, off, fileLen int) (*Image, error) {
	if h.Flags&FlagAoutKludge == 0 {
		return nil, fmt.Errorf("%w (flags %#08x)", ErrNoAddresses, h.Flags)
	}
	if bad := h.Flags &^ SupportedFlags; bad != 0 {
		return nil, fmt.Errorf("%w: %#08x (supported: page align, memory info, address fields)", ErrFlags, bad)
	}
	if h.HeaderAddr < h.LoadAddr || uint64(h.HeaderAddr-h.LoadAddr) != uint64(off) {
		return nil, fmt.Errorf("%w: header_addr %#x - load_addr %#x != offset %#x",
			ErrHeaderAddr, h.HeaderAddr, h.LoadAddr, off)
	}
	img := &Image{Header: h, Offset: off}
	switch {
	case h.LoadEndAddr == 0:
		img.LoadLen = uint32(fileLen)
	case h.LoadEndAddr <= h.HeaderAddr || uint64(h.LoadEndAddr-h.LoadAddr) > uint64(fileLen):
		return nil, fmt.Errorf("%w: load_end_addr %#x, load_addr %#x, file %d bytes",
			ErrLoadEnd, h.LoadEndAddr, h.LoadAddr, fileLen)
	default:
		img.LoadLen = h.LoadEndAddr - h.LoadAddr
	}
	if uint64(h.LoadAddr)+uint64(img.LoadLen) > 1<<32 {
		return nil, fmt.Errorf("%w: image of %d bytes at %#x passes 4 GiB", ErrLoadEnd, img.LoadLen, h.LoadAddr)
	}
	loadEnd := h.LoadAddr + img.LoadLen
	img.MemEnd = loadEnd
	if h.BSSEndAddr != 0 {
		if h.BSSEndAddr < loadEnd {
			return nil, fmt.Errorf("%w: bss_end_addr %#x < end of image %#x", ErrBSSEnd, h.BSSEndAddr, loadEnd)
		}
		img.MemEnd = h.BSSEndAddr
	}
	if h.EntryAddr < h.LoadAddr || h.EntryAddr >= loadEnd {
		return nil, fmt.Errorf("%w: entry_addr %#x not in [%#x, %#x)", ErrEntry, h.EntryAddr, h.LoadAddr, loadEnd)
	}
	return img, nil
}

// EntryOffset returns the file offset of the entry point.
func (m *Image) EntryOffset() uint32 { return m.EntryAddr - m.LoadAddr }
