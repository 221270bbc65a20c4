package pe

import (
	"encoding/binary"
	"errors"
	"testing"
)

// spec describes a test image laid out like kernel.bin: headers in the first
// page, .text at 0x1000, .reloc at 0x2000.
type spec struct {
	lfanew uint32
	fh     fileHeader
	oh     optionalHeader64
	dirs   []DataDirectory
	secs   []sectionHeader
	reloc  []byte // at RVA 0x2000
	size   int
}

func goodSpec() *spec {
	s := &spec{lfanew: 0x40, size: 0x3000}
	s.fh = fileHeader{Machine: MachineAMD64, NumberOfSections: 2, SizeOfOptionalHeader: 112 + 16*8, Characteristics: 0x22}
	s.oh = optionalHeader64{Magic: MagicPE32Plus, AddressOfEntryPoint: 0x1010, BaseOfCode: 0x1000, ImageBase: 0x100000,
		SectionAlignment: PageSize, FileAlignment: PageSize, SizeOfImage: 0x3000, SizeOfHeaders: 0x1000,
		Subsystem: SubsystemEFIApp, NumberOfRvaAndSizes: 16}
	s.dirs = make([]DataDirectory, 16)
	s.dirs[dirBaseReloc] = DataDirectory{0x2000, 12}
	s.secs = []sectionHeader{
		{Name: [8]byte{'.', 't', 'e', 'x', 't'}, VirtualSize: 0x100, VirtualAddress: 0x1000, SizeOfRawData: 0x1000, PointerToRawData: 0x1000, Characteristics: 0x60000020},
		{Name: [8]byte{'.', 'r', 'e', 'l', 'o', 'c'}, VirtualSize: 12, VirtualAddress: 0x2000, SizeOfRawData: 0x1000, PointerToRawData: 0x2000, Characteristics: 0x42000040},
	}
	s.reloc = block(0x1000, 0, 0)
	return s
}

// block encodes one relocation block with the given entries.
func block(page uint32, entries ...uint16) []byte {
	b := binary.LittleEndian.AppendUint32(nil, page)
	b = binary.LittleEndian.AppendUint32(b, uint32(8+2*len(entries)))
	for _, e := range entries {
		b = binary.LittleEndian.AppendUint16(b, e)
	}
	return b
}

func (s *spec) bytes() []byte {
	b := make([]byte, s.size)
	copy(b, "MZ")
	binary.LittleEndian.PutUint32(b[lfanewOffset:], s.lfanew)
	if int(s.lfanew)+4 > len(b) {
		return b
	}
	copy(b[s.lfanew:], "PE\x00\x00")
	var out []byte
	for _, v := range []any{s.fh, s.oh, s.dirs, s.secs} {
		var err error
		if out, err = binary.Append(out, binary.LittleEndian, v); err != nil {
			panic(err)
		}
	}
	copy(b[s.lfanew+4:], out)
	if len(b) >= 0x2000+len(s.reloc) {
		copy(b[0x2000:], s.reloc)
	}
	return b
}

func TestParseGood(t *testing.T) {
	s := goodSpec()
	s.reloc = append(block(0x1000, 0xA000|0x10, 0), block(0x2000, 0xA000, 0)...)
	s.dirs[dirBaseReloc].Size = uint32(len(s.reloc))
	img, err := Parse(s.bytes())
	if err != nil {
		t.Fatal(err)
	}
	if img.ImageBase != 0x100000 || img.EntryRVA != 0x1010 || len(img.Sections) != 2 || img.RelocBlocks != 2 || img.Sections[1].Name != ".reloc" {
		t.Errorf("got %+v", img)
	}
}

func TestParseRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(s *spec)
		raw  func(b []byte) []byte
		want error
	}{
		{name: "empty", raw: func([]byte) []byte { return nil }, want: ErrTruncated},
		{name: "no MZ", raw: func(b []byte) []byte { b[0] = 'Z'; return b }, want: ErrNoMZ},
		{name: "lfanew past end", mod: func(s *spec) { s.lfanew = 0x5000 }, want: ErrLfanew},
		{name: "lfanew inside DOS header", raw: func(b []byte) []byte { binary.LittleEndian.PutUint32(b[lfanewOffset:], 0x10); return b }, want: ErrLfanew},
		{name: "no PE signature", raw: func(b []byte) []byte { b[0x41] = 'X'; return b }, want: ErrNoPE},
		{name: "i386", mod: func(s *spec) { s.fh.Machine = 0x14c }, want: ErrMachine},
		{name: "PE32", mod: func(s *spec) { s.oh.Magic = 0x10b }, want: ErrNotPE32Plus},
		{name: "console subsystem", mod: func(s *spec) { s.oh.Subsystem = 3 }, want: ErrSubsystem},
		{name: "boot service driver", mod: func(s *spec) { s.oh.Subsystem = 11 }, want: ErrSubsystem},
		{name: "file alignment 0x200", mod: func(s *spec) { s.oh.FileAlignment = 0x200 }, want: ErrAlignment},
		{name: "section alignment 0x2000", mod: func(s *spec) { s.oh.SectionAlignment = 0x2000 }, want: ErrAlignment},
		{name: "five directories", mod: func(s *spec) {
			s.oh.NumberOfRvaAndSizes = 5
			s.dirs = s.dirs[:5]
			s.fh.SizeOfOptionalHeader = 112 + 5*8
		}, want: ErrNoReloc},
		{name: "optional header size", mod: func(s *spec) { s.fh.SizeOfOptionalHeader += 8 }, want: ErrOptionalSize},
		{name: "no sections", mod: func(s *spec) { s.fh.NumberOfSections = 0; s.secs = nil }, want: ErrSection},
		{name: "offset != RVA", mod: func(s *spec) { s.secs[0].PointerToRawData = 0x400 }, want: ErrSection},
		{name: "section past file", mod: func(s *spec) { s.secs[1].SizeOfRawData = 0x2000 }, want: ErrSection},
		{name: "raw size not aligned", mod: func(s *spec) { s.secs[0].SizeOfRawData = 0x100 }, want: ErrSection},
		{name: "section past SizeOfImage", mod: func(s *spec) { s.oh.SizeOfImage = 0x2800 }, want: ErrSection},
		{name: "section in headers", mod: func(s *spec) {
			s.secs[0].VirtualAddress, s.secs[0].PointerToRawData = 0, 0
		}, want: ErrSection},
		{name: "overlapping sections", mod: func(s *spec) { s.secs[0].VirtualSize = 0x1800 }, want: ErrSection},
		{name: "headers past file", mod: func(s *spec) { s.oh.SizeOfHeaders = 0x4000 }, want: ErrTruncated},
		{name: "entry in headers", mod: func(s *spec) { s.oh.AddressOfEntryPoint = 0x100 }, want: ErrEntry},
		{name: "entry in .reloc", mod: func(s *spec) { s.oh.AddressOfEntryPoint = 0x2004 }, want: ErrEntry},
		{name: "entry not executable", mod: func(s *spec) { s.secs[0].Characteristics = 0x40000040 }, want: ErrEntry},
		{name: "entry past image", mod: func(s *spec) { s.oh.AddressOfEntryPoint = 0x9000 }, want: ErrEntry},
		{name: "no reloc directory", mod: func(s *spec) { s.dirs[dirBaseReloc] = DataDirectory{} }, want: ErrNoReloc},
		{name: "reloc directory past section", mod: func(s *spec) { s.dirs[dirBaseReloc] = DataDirectory{0x2FF8, 16} }, want: ErrRelocBlock},
		{name: "reloc block size 4", mod: func(s *spec) { binary.LittleEndian.PutUint32(s.reloc[4:], 4) }, want: ErrRelocBlock},
		{name: "reloc block size odd", mod: func(s *spec) { binary.LittleEndian.PutUint32(s.reloc[4:], 10) }, want: ErrRelocBlock},
		{name: "reloc block past directory", mod: func(s *spec) { s.dirs[dirBaseReloc].Size = 8 }, want: ErrRelocBlock},
		{name: "reloc stray bytes", mod: func(s *spec) { s.dirs[dirBaseReloc].Size = 16 }, want: ErrRelocBlock},
		{name: "reloc page unaligned", mod: func(s *spec) { s.reloc = block(0x1004, 0, 0) }, want: ErrRelocBlock},
		{name: "reloc HIGHLOW entry", mod: func(s *spec) { s.reloc = block(0x1000, 0x3000, 0) }, want: ErrRelocBlock},
		{name: "reloc DIR64 past image", mod: func(s *spec) { s.reloc = block(0x2000, 0xAFFC, 0) }, want: ErrRelocBlock},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := goodSpec()
			if tc.mod != nil {
				tc.mod(s)
			}
			b := s.bytes()
			if tc.raw != nil {
				b = tc.raw(b)
			}
			_, err := Parse(b)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Parse: %v, want %v", err, tc.want)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	f.Add(goodSpec().bytes())
	s := goodSpec()
	s.reloc = append(block(0x1000, 0xA010, 0), block(0x2000, 0xA000, 0)...)
	s.dirs[dirBaseReloc].Size = uint32(len(s.reloc))
	f.Add(s.bytes())
	f.Add(goodSpec().bytes()[:0x200])
	f.Fuzz(func(t *testing.T, b []byte) {
		img, err := Parse(b)
		if err != nil {
			return
		}
		// Whatever Parse accepts, a firmware can map with offset == RVA.
		for _, s := range img.Sections {
			if uint64(s.RVA)+uint64(s.RawSize) > uint64(len(b)) {
				t.Fatalf("section %q past the file", s.Name)
			}
		}
		if sec := img.sectionAt(img.EntryRVA, 1); sec == nil || !sec.Executable() {
			t.Fatalf("entry %#x accepted outside code", img.EntryRVA)
		}
		if img.RelocBlocks == 0 || uint64(img.Reloc.VirtualAddress)+uint64(img.Reloc.Size) > uint64(len(b)) {
			t.Fatalf("relocations accepted: %+v", img.Reloc)
		}
	})
}
