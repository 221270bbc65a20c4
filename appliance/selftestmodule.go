package appliance

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// The Multiboot module of a selftest=1 boot (QEMU -initrd), read by
// kernel/selftest/selftest.inc:
//
//	"DPXECFG1"
//	boot-config cases: u32 little-endian length, that many bytes; repeated
//	optionally: u32 0xFFFFFFFF (SelfTestModuleEnd), then sections:
//	  8-byte tag, u32 little-endian length, that many payload bytes
//
// The boot-config parser self-test reads the cases and stops at the end
// marker (a length no module can hold); other self-tests find their
// section by tag (selftest_module_section). A module without sections is
// byte for byte the old case-only format. A section's payload format
// belongs to the self-test that reads it (InflateModuleTag: InflateSection).

// SelfTestModuleMagic starts the module.
const SelfTestModuleMagic = "DPXECFG1"

// SelfTestModuleEnd is the case length that ends the boot-config cases.
const SelfTestModuleEnd = 0xFFFFFFFF

// SelfTestTagLen is the length of a section tag.
const SelfTestTagLen = 8

// ErrSelfTestModule is returned by ParseSelfTestModule for bytes that are
// not a well-formed module.
var ErrSelfTestModule = errors.New("self-test module malformed")

// ModuleSection is one tagged section of the module.
type ModuleSection struct {
	Tag     string // exactly SelfTestTagLen bytes
	Payload []byte
}

// SelfTestModule is the content of a selftest=1 module.
type SelfTestModule struct {
	ConfigCases [][]byte
	Sections    []ModuleSection
}

// MarshalBinary encodes the module. Tags must be 8 bytes and distinct; a
// config case or payload must be shorter than 4 GiB - 1.
func (m SelfTestModule) MarshalBinary() ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(SelfTestModuleMagic)
	var n [4]byte
	for i, c := range m.ConfigCases {
		if uint64(len(c)) >= SelfTestModuleEnd {
			return nil, fmt.Errorf("self-test module: config case %d: %d bytes is too long", i, len(c))
		}
		binary.LittleEndian.PutUint32(n[:], uint32(len(c)))
		b.Write(n[:])
		b.Write(c)
	}
	if len(m.Sections) == 0 {
		return b.Bytes(), nil
	}
	binary.LittleEndian.PutUint32(n[:], SelfTestModuleEnd)
	b.Write(n[:])
	seen := map[string]bool{}
	for _, s := range m.Sections {
		if len(s.Tag) != SelfTestTagLen {
			return nil, fmt.Errorf("self-test module: section tag %q is not %d bytes", s.Tag, SelfTestTagLen)
		}
		if seen[s.Tag] {
			return nil, fmt.Errorf("self-test module: section %q twice", s.Tag)
		}
		seen[s.Tag] = true
		if uint64(len(s.Payload)) > 0xFFFFFFFF {
			return nil, fmt.Errorf("self-test module: section %q: %d bytes is too long", s.Tag, len(s.Payload))
		}
		b.WriteString(s.Tag)
		binary.LittleEndian.PutUint32(n[:], uint32(len(s.Payload)))
		b.Write(n[:])
		b.Write(s.Payload)
	}
	return b.Bytes(), nil
}

// ParseSelfTestModule decodes a module as the kernel reads it, but
// strictly: the kernel stops quietly at a truncated record, this returns
// an error naming the offset.
func ParseSelfTestModule(b []byte) (*SelfTestModule, error) {
	if len(b) < len(SelfTestModuleMagic) || string(b[:len(SelfTestModuleMagic)]) != SelfTestModuleMagic {
		return nil, fmt.Errorf("%w: no %q magic", ErrSelfTestModule, SelfTestModuleMagic)
	}
	m := &SelfTestModule{}
	off := len(SelfTestModuleMagic)
	for off < len(b) {
		if len(b)-off < 4 {
			return nil, fmt.Errorf("%w: offset %d: truncated case length", ErrSelfTestModule, off)
		}
		n := binary.LittleEndian.Uint32(b[off:])
		off += 4
		if n == SelfTestModuleEnd {
			return parseModuleSections(m, b, off)
		}
		if uint64(len(b)-off) < uint64(n) {
			return nil, fmt.Errorf("%w: offset %d: case of %d bytes, %d left", ErrSelfTestModule, off-4, n, len(b)-off)
		}
		m.ConfigCases = append(m.ConfigCases, b[off:off+int(n)])
		off += int(n)
	}
	return m, nil
}

func parseModuleSections(m *SelfTestModule, b []byte, off int) (*SelfTestModule, error) {
	seen := map[string]bool{}
	for off < len(b) {
		if len(b)-off < SelfTestTagLen+4 {
			return nil, fmt.Errorf("%w: offset %d: truncated section header", ErrSelfTestModule, off)
		}
		tag := string(b[off : off+SelfTestTagLen])
		n := binary.LittleEndian.Uint32(b[off+SelfTestTagLen:])
		start := off + SelfTestTagLen + 4
		if uint64(len(b)-start) < uint64(n) {
			return nil, fmt.Errorf("%w: offset %d: section %q of %d bytes, %d left", ErrSelfTestModule, off, tag, n, len(b)-start)
		}
		if seen[tag] {
			return nil, fmt.Errorf("%w: offset %d: section %q twice", ErrSelfTestModule, off, tag)
		}
		seen[tag] = true
		m.Sections = append(m.Sections, ModuleSection{Tag: tag, Payload: b[start : start+int(n)]})
		off = start + int(n)
	}
	return m, nil
}

// Section returns the payload of the section with tag, if present.
func (m *SelfTestModule) Section(tag string) ([]byte, bool) {
	for _, s := range m.Sections {
		if s.Tag == tag {
			return s.Payload, true
		}
	}
	return nil, false
}
