package image

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	diskfs "github.com/diskfs/go-diskfs"

	"github.com/discord-pxe/dpxe/image/mbrloader"
)

// ErrKernelCopy means a kernel copy inside a USB image differs from the
// kernel.bin it should equal.
var ErrKernelCopy = errors.New("kernel copy in the USB image differs from kernel.bin")

// CheckUSBKernel compares the kernel copies inside the USB image at path
// with kernel (a kernel.bin that passes ValidateKernel): the raw copy in
// the MBR gap that the BIOS loader reads, with the loader's patch block
// (load sectors, load and entry address) matching kernel's Multiboot
// header, and \EFI\BOOT\BOOTX64.EFI that UEFI firmware starts. It returns
// nil when both equal kernel byte for byte, else an ErrKernelCopy naming
// the copy and the first byte at fault.
func CheckUSBKernel(path string, kernel []byte) error {
	k, err := ValidateKernel(kernel)
	if err != nil {
		return err
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sector0 := make([]byte, SectorSize)
	if _, err := io.ReadFull(f, sector0); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrNotDPXEImage, path, err)
	}
	patch, err := mbrloader.ReadPatch(sector0)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrNotDPXEImage, path, err)
	}
	wantSectors := uint16(sectors(int64(k.Multiboot.LoadLen)))
	switch {
	case patch.KernelLBA != KernelLBA:
		return fmt.Errorf("%w: %s: the MBR loader reads the kernel from LBA %d, the image keeps it at LBA %d", ErrKernelCopy, path, patch.KernelLBA, KernelLBA)
	case patch.KernelSectors != wantSectors:
		return fmt.Errorf("%w: %s: the MBR loader loads %d sectors, kernel.bin needs %d", ErrKernelCopy, path, patch.KernelSectors, wantSectors)
	case patch.LoadAddr != k.Multiboot.LoadAddr || patch.EntryAddr != k.Multiboot.EntryAddr:
		return fmt.Errorf("%w: %s: the MBR loader loads at %#x and enters at %#x, kernel.bin's Multiboot header says %#x and %#x",
			ErrKernelCopy, path, patch.LoadAddr, patch.EntryAddr, k.Multiboot.LoadAddr, k.Multiboot.EntryAddr)
	}
	gap := make([]byte, len(kernel))
	if _, err := f.ReadAt(gap, int64(KernelLBA)*SectorSize); err != nil {
		return fmt.Errorf("%w: %s: reading the MBR gap copy: %v", ErrKernelCopy, path, err)
	}
	if i := firstDiff(gap, kernel); i >= 0 {
		return fmt.Errorf("%w: %s: the BIOS copy in the MBR gap differs at byte %d of kernel.bin (image offset %d, LBA %d)",
			ErrKernelCopy, path, i, int64(KernelLBA)*SectorSize+int64(i), int64(KernelLBA)+int64(i)/SectorSize)
	}

	d, err := diskfs.Open(path, diskfs.WithOpenMode(diskfs.ReadOnly), diskfs.WithSectorSize(diskfs.SectorSize512))
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrNotDPXEImage, path, err)
	}
	defer d.Close()
	fsys, err := d.GetFilesystem(1)
	if err != nil {
		return fmt.Errorf("%w: %s: partition 1: %v", ErrNotDPXEImage, path, err)
	}
	ef, err := fsys.OpenFile(EFIBootPath, os.O_RDONLY)
	if err != nil {
		return fmt.Errorf("%w: %s: %s: %v", ErrKernelCopy, path, EFIBootPath, err)
	}
	defer ef.Close()
	efi, err := io.ReadAll(io.LimitReader(ef, int64(len(kernel))+1))
	if err != nil {
		return fmt.Errorf("%w: %s: reading %s: %v", ErrKernelCopy, path, EFIBootPath, err)
	}
	if len(efi) != len(kernel) {
		return fmt.Errorf("%w: %s: %s is %s, kernel.bin is %d bytes", ErrKernelCopy, path, EFIBootPath, sizeText(len(efi), len(kernel)), len(kernel))
	}
	if i := firstDiff(efi, kernel); i >= 0 {
		return fmt.Errorf("%w: %s: the UEFI copy %s differs at byte %d", ErrKernelCopy, path, EFIBootPath, i)
	}
	return nil
}

// firstDiff returns the index of the first byte where a and b (of equal
// length) differ, or -1.
func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

func sizeText(n, limit int) string {
	if n > limit {
		return "longer"
	}
	return fmt.Sprintf("%d bytes", n)
}
