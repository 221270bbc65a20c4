package image

import (
	"errors"
	"fmt"
	"regexp"

	"github.com/discord-pxe/dpxe/image/mbrloader"
	"github.com/discord-pxe/dpxe/image/multiboot"
	"github.com/discord-pxe/dpxe/image/pe"
)

// Errors of kernel validation beyond those of the pe and multiboot packages.
var (
	// ErrBaseMismatch means the PE ImageBase and the Multiboot load_addr
	// differ, so the two loaders would not map the file the same way.
	ErrBaseMismatch = errors.New("kernel: PE ImageBase differs from Multiboot load_addr")
	// ErrMultibootEntry means the Multiboot entry is not in PE code.
	ErrMultibootEntry = errors.New("kernel: Multiboot entry_addr is not inside an executable PE section")
	// ErrKernelTooBig means the BIOS MBR loader cannot stage the kernel.
	ErrKernelTooBig = errors.New("kernel: too big for the BIOS MBR loader (at most 512 KiB loaded)")
	// ErrNoVersion means version.inc has no KERNEL_VERSION definition.
	ErrNoVersion = errors.New(`kernel: no %define KERNEL_VERSION "x.y.z" in version.inc`)
)

// Kernel is a validated kernel.bin.
type Kernel struct {
	Bytes     []byte
	PE        *pe.Image
	Multiboot *multiboot.Image
}

// ValidateKernel checks that b is both a PE32+ EFI application and a
// Multiboot v1 a.out-kludge kernel that map the file identically (ImageBase
// == load_addr, file offset == RVA), with the Multiboot entry in PE code, and
// small enough for the BIOS MBR loader.
func ValidateKernel(b []byte) (*Kernel, error) {
	p, err := pe.Parse(b)
	if err != nil {
		return nil, fmt.Errorf("kernel.bin is not a valid EFI application: %w", err)
	}
	mb, err := multiboot.Find(b)
	if err != nil {
		return nil, fmt.Errorf("kernel.bin is not a valid Multiboot kernel: %w", err)
	}
	if p.ImageBase != uint64(mb.LoadAddr) {
		return nil, fmt.Errorf("%w: ImageBase %#x, load_addr %#x", ErrBaseMismatch, p.ImageBase, mb.LoadAddr)
	}
	entry := mb.EntryOffset()
	inCode := false
	for _, s := range p.Sections {
		if s.Executable() && entry >= s.RVA && uint64(entry) < uint64(s.RVA)+uint64(max(s.VirtualSize, s.RawSize)) {
			inCode = true
		}
	}
	if !inCode {
		return nil, fmt.Errorf("%w: entry_addr %#x (RVA %#x)", ErrMultibootEntry, mb.EntryAddr, entry)
	}
	if sectors(int64(mb.LoadLen)) > mbrloader.MaxKernelSectors {
		return nil, fmt.Errorf("%w: loads %d bytes", ErrKernelTooBig, mb.LoadLen)
	}
	return &Kernel{Bytes: b, PE: p, Multiboot: mb}, nil
}

// versionRE matches the version line of kernel/version.inc.
var versionRE = regexp.MustCompile(`(?m)^\s*%define\s+KERNEL_VERSION\s+"([^"\r\n]+)"`)

// KernelVersion extracts KERNEL_VERSION from the text of version.inc.
func KernelVersion(versionInc []byte) (string, error) {
	m := versionRE.FindSubmatch(versionInc)
	if m == nil {
		return "", ErrNoVersion
	}
	return string(m[1]), nil
}

// sectors returns n bytes rounded up to whole sectors.
func sectors(n int64) int64 { return (n + SectorSize - 1) / SectorSize }
