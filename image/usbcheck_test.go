package image

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/discord-pxe/dpxe/image/mbrloader"
)

func TestCheckUSBKernel(t *testing.T) {
	dir, _ := builtFixture(t)
	kernel, err := os.ReadFile(filepath.Join(dir, KernelFile))
	if err != nil {
		t.Fatal(err)
	}
	pristine, err := os.ReadFile(filepath.Join(dir, USBImageFile))
	if err != nil {
		t.Fatal(err)
	}
	gapAt := int(KernelLBA * SectorSize)
	efiAt := PartitionStartLBA*SectorSize + bytes.Index(pristine[PartitionStartLBA*SectorSize:], kernel)
	if efiAt < PartitionStartLBA*SectorSize {
		t.Fatal("no BOOTX64.EFI copy of kernel.bin in the FAT partition")
	}
	const at = 200 // a byte inside the kernel's headers, far from the end
	for _, tc := range []struct {
		name string
		edit func(img []byte)
		want string // "" means CheckUSBKernel passes
	}{
		{"as built", func([]byte) {}, ""},
		{"BIOS copy corrupted", func(img []byte) { img[gapAt+at] ^= 0xff },
			fmt.Sprintf("the BIOS copy in the MBR gap differs at byte %d of kernel.bin (image offset %d, LBA 1)", at, gapAt+at)},
		{"UEFI copy corrupted", func(img []byte) { img[efiAt+len(kernel)-1] ^= 1 },
			fmt.Sprintf("the UEFI copy %s differs at byte %d", EFIBootPath, len(kernel)-1)},
		{"loader loads too little", func(img []byte) {
			p, _ := mbrloader.ReadPatch(img[:SectorSize])
			binary.LittleEndian.PutUint16(img[mbrloader.PatchOffset+10:], p.KernelSectors-1)
		}, "the MBR loader loads"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img := bytes.Clone(pristine)
			tc.edit(img)
			p := filepath.Join(t.TempDir(), "usb.img")
			if err := os.WriteFile(p, img, 0o644); err != nil {
				t.Fatal(err)
			}
			err := CheckUSBKernel(p, kernel)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("CheckUSBKernel: %v", err)
			case tc.want != "" && (!errors.Is(err, ErrKernelCopy) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("CheckUSBKernel: %v, want ErrKernelCopy with %q", err, tc.want)
			}
		})
	}
	if err := CheckUSBKernel(filepath.Join(dir, USBImageFile), kernel[:100]); err == nil {
		t.Error("a truncated kernel.bin was accepted as the reference")
	}
}
