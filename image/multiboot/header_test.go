package multiboot

import (
	"encoding/binary"
	"errors"
	"testing"
)

const (
	testLoad   = 0x100000
	testOffset = 0x198
	testSize   = 0x3000
)

// kernelWith returns a testSize-byte file with a header at testOffset,
// edited by mod before the checksum is computed (unless mod sets it).
func kernelWith(mod func(h *Header)) []byte {
	h := Header{
		Magic:       Magic,
		Flags:       FlagMemInfo | FlagAoutKludge,
		HeaderAddr:  testLoad + testOffset,
		LoadAddr:    testLoad,
		LoadEndAddr: testLoad + testSize,
		BSSEndAddr:  testLoad + testSize + 0x1000,
		EntryAddr:   testLoad + 0x1000,
	}
	h.Checksum = -(h.Magic + h.Flags)
	if mod != nil {
		mod(&h)
	}
	b := make([]byte, testSize)
	if _, err := binary.Encode(b[testOffset:], binary.LittleEndian, h); err != nil {
		panic(err)
	}
	return b
}

func fixSum(h *Header) { h.Checksum = -(h.Magic + h.Flags) }

func TestFindGood(t *testing.T) {
	img, err := Find(kernelWith(nil))
	if err != nil {
		t.Fatal(err)
	}
	if img.Offset != testOffset || img.LoadLen != testSize || img.MemEnd != testLoad+testSize+0x1000 || img.EntryOffset() != 0x1000 {
		t.Errorf("got %+v", img)
	}
	// load_end_addr = 0 and bss_end_addr = 0 mean "whole file" and "no BSS".
	img, err = Find(kernelWith(func(h *Header) { h.LoadEndAddr, h.BSSEndAddr = 0, 0 }))
	if err != nil {
		t.Fatal(err)
	}
	if img.LoadLen != testSize || img.MemEnd != testLoad+testSize {
		t.Errorf("zero fields: got %+v", img)
	}
}

func TestFindRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		file []byte
		want error
	}{
		{"empty", nil, ErrHeaderNotFound},
		{"no magic", make([]byte, testSize), ErrHeaderNotFound},
		{"beyond 8 KiB", func() []byte {
			b := make([]byte, 3*SearchLimit)
			copy(b[SearchLimit:], kernelWith(nil)[testOffset:testOffset+HeaderSize])
			return b
		}(), ErrHeaderNotFound},
		{"straddles 8 KiB", func() []byte {
			b := make([]byte, 3*SearchLimit)
			copy(b[SearchLimit-8:], kernelWith(nil)[testOffset:testOffset+HeaderSize])
			return b
		}(), ErrHeaderNotFound},
		{"unaligned", func() []byte {
			b := make([]byte, testSize)
			copy(b[testOffset+2:], kernelWith(nil)[testOffset:testOffset+HeaderSize])
			return b
		}(), ErrHeaderNotFound},
		{"checksum", kernelWith(func(h *Header) { h.Checksum++ }), ErrChecksum},
		{"no address fields", kernelWith(func(h *Header) { h.Flags = FlagMemInfo; fixSum(h) }), ErrNoAddresses},
		{"video mode", kernelWith(func(h *Header) { h.Flags |= FlagVideoMode; fixSum(h) }), ErrFlags},
		{"unknown flag", kernelWith(func(h *Header) { h.Flags |= 1 << 20; fixSum(h) }), ErrFlags},
		{"header_addr off by 4", kernelWith(func(h *Header) { h.HeaderAddr += 4 }), ErrHeaderAddr},
		{"header_addr below load", kernelWith(func(h *Header) { h.HeaderAddr = testLoad - 4 }), ErrHeaderAddr},
		{"load_end past file", kernelWith(func(h *Header) { h.LoadEndAddr = testLoad + testSize + 1 }), ErrLoadEnd},
		{"load_end before header", kernelWith(func(h *Header) { h.LoadEndAddr = testLoad + 4 }), ErrLoadEnd},
		{"load_end below load", kernelWith(func(h *Header) { h.LoadEndAddr = testLoad - 0x1000 }), ErrLoadEnd},
		{"bss_end below load_end", kernelWith(func(h *Header) { h.BSSEndAddr = testLoad + 0x2000 }), ErrBSSEnd},
		{"entry below load", kernelWith(func(h *Header) { h.EntryAddr = testLoad - 1 }), ErrEntry},
		{"entry at load_end", kernelWith(func(h *Header) { h.EntryAddr = testLoad + testSize }), ErrEntry},
		{"entry in BSS", kernelWith(func(h *Header) { h.EntryAddr = testLoad + testSize + 0x10 }), ErrEntry},
		{"image passes 4 GiB", kernelWith(func(h *Header) {
			h.LoadAddr = 0xFFFFF000
			h.HeaderAddr = h.LoadAddr + testOffset
			h.LoadEndAddr, h.BSSEndAddr, h.EntryAddr = 0, 0, h.LoadAddr+0x100
		}), ErrLoadEnd},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Find(tc.file)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Find: %v, want %v", err, tc.want)
			}
		})
	}
}

// A header with a bad checksum is skipped when a good one follows.
func TestFindSkipsBadChecksum(t *testing.T) {
	b := kernelWith(nil)
	bad := make([]byte, HeaderSize)
	copy(bad, b[testOffset:])
	bad[8]++ // checksum
	copy(b[0x100:], bad)
	img, err := Find(b)
	if err != nil {
		t.Fatal(err)
	}
	if img.Offset != testOffset {
		t.Errorf("offset %#x, want %#x", img.Offset, testOffset)
	}
}

func FuzzFind(f *testing.F) {
	f.Add(kernelWith(nil))
	f.Add(kernelWith(func(h *Header) { h.LoadEndAddr, h.BSSEndAddr = 0, 0 }))
	f.Add(kernelWith(func(h *Header) { h.Checksum++ })[:testOffset+HeaderSize])
	f.Fuzz(func(t *testing.T, b []byte) {
		img, err := Find(b)
		if err != nil {
			return
		}
		// Whatever Find accepts, a loader can load safely.
		if img.Offset%4 != 0 || img.Offset+HeaderSize > SearchLimit || img.Offset+HeaderSize > len(b) {
			t.Fatalf("header at %#x in %d bytes", img.Offset, len(b))
		}
		if img.Magic+img.Flags+img.Checksum != 0 || img.Flags&^SupportedFlags != 0 || img.Flags&FlagAoutKludge == 0 {
			t.Fatalf("bad header accepted: %+v", img.Header)
		}
		if int(img.LoadLen) > len(b) || img.LoadLen <= uint32(img.Offset) {
			t.Fatalf("load length %d of %d-byte file, header at %#x", img.LoadLen, len(b), img.Offset)
		}
		if img.EntryOffset() >= img.LoadLen || img.MemEnd < img.LoadAddr+img.LoadLen {
			t.Fatalf("entry/mem end wrong: %+v", img)
		}
	})
}
