package image

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"

	diskfs "github.com/diskfs/go-diskfs"
	"github.com/diskfs/go-diskfs/disk"
	"github.com/diskfs/go-diskfs/filesystem"
	"github.com/diskfs/go-diskfs/filesystem/fat12"
	"github.com/diskfs/go-diskfs/partition/mbr"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image/mbrloader"
)

// Layout of usb.img (docs/images.md). Sizes are in 512-byte sectors.
const (
	SectorSize = mbrloader.SectorSize
	// USBImageSize is the size of usb.img: 64 MiB. The FAT32 partition then
	// has about 127,000 clusters of 512 bytes, comfortably above the 65,525
	// below which FAT drivers (UEFI spec 13.3, Microsoft's FAT spec) decide
	// the volume is FAT16 whatever its BPB says.
	USBImageSize = 64 << 20
	// PartitionStartLBA is where the FAT32 partition starts: 1 MiB, the
	// usual alignment, leaving the "MBR gap" LBA 1..2047 to the BIOS path.
	PartitionStartLBA = 2048
	// KernelLBA is where the raw kernel.bin starts in the MBR gap.
	KernelLBA = 1
	// PartitionType is the MBR type of the EFI system partition.
	PartitionType = mbr.EFISystem // 0xEF
	// VolumeLabel is the FAT volume label.
	VolumeLabel = "DPXE"
	// EFIBootPath is the removable-media boot file for x64 (UEFI spec 3.5.1.1).
	EFIBootPath = "/EFI/BOOT/BOOTX64.EFI"
	// ConfigPath is the node config file in the FAT root.
	ConfigPath = "/DPXE.CFG"
	// ConfigSectors is DPXE.CFG's length in sectors (4096 bytes).
	ConfigSectors = appliance.MaxBootConfigLen / SectorSize

	fat32VolumeIDOffset = 0x43 // BS_VolID in the FAT32 boot sector (Microsoft FAT spec 3.3)
	fat32BackupBootLBA  = 6    // go-diskfs writes the backup boot sector here
	// fatEpoch is the default timestamp of every FAT directory entry when
	// SOURCE_DATE_EPOCH is not set: 1980-01-01T00:00:00Z, the FAT epoch.
	fatEpoch = 315532800
)

// Errors of image writing and inspection.
var (
	// ErrNotDPXEImage means the file lacks the layout of a Discord-PXE USB image.
	ErrNotDPXEImage = errors.New("not a Discord-PXE USB image")
	// ErrFragmented means DPXE.CFG is not one contiguous run of sectors, so
	// the BIOS loader could not read it by LBA.
	ErrFragmented = errors.New("DPXE.CFG is not stored in contiguous sectors")
	// ErrPatchMismatch means the MBR loader's config LBA does not point at DPXE.CFG.
	ErrPatchMismatch = errors.New("the MBR loader does not point at DPXE.CFG")
)

// USBLayout records where things are in a written usb.img.
type USBLayout struct {
	Size              int64  `json:"size"`
	DiskSignature     string `json:"disk_signature"`
	PartitionStartLBA uint32 `json:"partition_start_lba"`
	PartitionSectors  uint32 `json:"partition_sectors"`
	KernelLBA         uint32 `json:"kernel_lba"`
	KernelSectors     uint16 `json:"kernel_sectors"`
	Stage2LBA         uint32 `json:"stage2_lba"`
	Stage2Sectors     uint16 `json:"stage2_sectors"`
	ConfigLBA         uint32 `json:"config_lba"`
	ConfigSectors     uint16 `json:"config_sectors"`
	FATVolumeID       string `json:"fat_volume_id"`
}

// sourceDateMu serialises the SOURCE_DATE_EPOCH override around go-diskfs,
// which reads that variable for every directory entry it writes.
var sourceDateMu sync.Mutex

// sourceDateEpoch returns SOURCE_DATE_EPOCH (reproducible-builds.org) or the
// FAT epoch when it is unset or invalid.
func sourceDateEpoch() int64 {
	if v, err := strconv.ParseInt(os.Getenv("SOURCE_DATE_EPOCH"), 10, 64); err == nil && v >= fatEpoch {
		return v
	}
	return fatEpoch
}

// WriteUSBImage writes a hybrid BIOS/UEFI image to path (replacing it): an
// MBR with our loader and one active FAT32 partition of type 0xEF holding
// \EFI\BOOT\BOOTX64.EFI and \DPXE.CFG, plus kernel.bin and stage 2 of the
// loader in the MBR gap. config is DPXE.CFG's content: exactly 4096 bytes
// that parse as a boot config (RenderConfig or ConfigTemplate).
// Two calls with the same inputs write the same bytes.
func WriteUSBImage(path string, k *Kernel, loader *mbrloader.Loader, config []byte) (*USBLayout, error) {
	if len(config) != appliance.MaxBootConfigLen {
		return nil, fmt.Errorf("usb image: DPXE.CFG must be %d bytes, got %d", appliance.MaxBootConfigLen, len(config))
	}
	if _, err := appliance.ParseBootConfig(config); err != nil {
		return nil, fmt.Errorf("usb image: DPXE.CFG: %w", err)
	}
	lp := loader.Patch()
	patch := lp
	patch.KernelLBA = KernelLBA
	patch.KernelSectors = uint16(sectors(int64(k.Multiboot.LoadLen)))
	patch.LoadAddr = k.Multiboot.LoadAddr
	patch.EntryAddr = k.Multiboot.EntryAddr
	patch.ConfigSectors = ConfigSectors
	if end := uint64(KernelLBA) + uint64(sectors(int64(len(k.Bytes)))); end > uint64(lp.Stage2LBA) || uint64(lp.Stage2LBA)+uint64(lp.Stage2Sectors) > PartitionStartLBA {
		return nil, fmt.Errorf("usb image: kernel.bin (%d bytes) and loader stage 2 (LBA %d+%d) do not fit the MBR gap", len(k.Bytes), lp.Stage2LBA, lp.Stage2Sectors)
	}

	tmp := path + ".tmp"
	_ = os.Remove(tmp)
	defer os.Remove(tmp)
	layout, err := writeFAT(tmp, k.Bytes, config)
	if err != nil {
		return nil, fmt.Errorf("usb image: %w", err)
	}
	patch.ConfigLBA = layout.ConfigLBA
	code, err := loader.Patched(patch)
	if err != nil {
		return nil, fmt.Errorf("usb image: %w", err)
	}

	sum := sha256.Sum256(k.Bytes)
	f, err := os.OpenFile(tmp, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	volID := sum[4:8]
	for _, w := range []struct {
		b   []byte
		off int64
	}{
		{code[:], 0},
		{sum[:4], mbrloader.DiskSignatureAt}, // disk signature: from the kernel, not random
		{k.Bytes, KernelLBA * SectorSize},
		{loader.Stage2, int64(lp.Stage2LBA) * SectorSize},
		{volID, PartitionStartLBA*SectorSize + fat32VolumeIDOffset},
		{volID, (PartitionStartLBA+fat32BackupBootLBA)*SectorSize + fat32VolumeIDOffset},
	} {
		if _, err := f.WriteAt(w.b, w.off); err != nil {
			return nil, fmt.Errorf("usb image: %w", err)
		}
	}
	if err := f.Sync(); err != nil {
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, err
	}

	layout.DiskSignature = fmt.Sprintf("%08x", binary.LittleEndian.Uint32(sum[:4]))
	layout.FATVolumeID = fmt.Sprintf("%08x", binary.LittleEndian.Uint32(volID))
	layout.KernelLBA, layout.KernelSectors = KernelLBA, patch.KernelSectors
	layout.Stage2LBA, layout.Stage2Sectors = lp.Stage2LBA, lp.Stage2Sectors
	layout.ConfigSectors = ConfigSectors
	// Read back through the same path `dpxe config` uses: it checks that the
	// loader points at DPXE.CFG and that the file is contiguous.
	if _, err := ReadUSBConfig(path); err != nil {
		return nil, fmt.Errorf("usb image: written image fails its own check: %w", err)
	}
	return layout, nil
}

// writeFAT creates the disk image file with its partition table and FAT32
// file system, writes DPXE.CFG (first, so it gets the clusters after the
// root directory) and BOOTX64.EFI, and returns where DPXE.CFG landed.
func writeFAT(path string, kernel, config []byte) (*USBLayout, error) {
	sourceDateMu.Lock()
	defer sourceDateMu.Unlock()
	old, had := os.LookupEnv("SOURCE_DATE_EPOCH")
	os.Setenv("SOURCE_DATE_EPOCH", strconv.FormatInt(sourceDateEpoch(), 10))
	defer func() {
		if had {
			os.Setenv("SOURCE_DATE_EPOCH", old)
		} else {
			os.Unsetenv("SOURCE_DATE_EPOCH")
		}
	}()

	d, err := diskfs.Create(path, USBImageSize, diskfs.SectorSize512)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	total := uint32(USBImageSize / SectorSize)
	part := &mbr.Partition{
		Index: 1, Bootable: true, Type: PartitionType,
		Start: PartitionStartLBA, Size: total - PartitionStartLBA,
	}
	part.StartHead, part.StartSector, part.StartCylinder = chs(PartitionStartLBA)
	part.EndHead, part.EndSector, part.EndCylinder = chs(total - 1)
	if err := d.Partition(&mbr.Table{LogicalSectorSize: SectorSize, PhysicalSectorSize: SectorSize, Partitions: []*mbr.Partition{part}}); err != nil {
		return nil, fmt.Errorf("partition table: %w", err)
	}
	fsys, err := d.CreateFilesystem(disk.FilesystemSpec{Partition: 1, FSType: filesystem.TypeFat32, VolumeLabel: VolumeLabel, Reproducible: true})
	if err != nil {
		return nil, fmt.Errorf("FAT32: %w", err)
	}
	if err := writeFile(fsys, ConfigPath, config); err != nil {
		return nil, err
	}
	if err := fsys.Mkdir("/EFI/BOOT"); err != nil {
		return nil, fmt.Errorf("FAT32: %w", err)
	}
	if err := writeFile(fsys, EFIBootPath, kernel); err != nil {
		return nil, err
	}
	lba, err := configLBA(fsys, PartitionStartLBA)
	if err != nil {
		return nil, err
	}
	return &USBLayout{Size: USBImageSize, PartitionStartLBA: PartitionStartLBA, PartitionSectors: part.Size, ConfigLBA: lba}, nil
}

func writeFile(fsys filesystem.FileSystem, name string, data []byte) error {
	f, err := fsys.OpenFile(name, os.O_CREATE|os.O_RDWR)
	if err != nil {
		return fmt.Errorf("FAT32 %s: %w", name, err)
	}
	if n, err := f.Write(data); err != nil || n != len(data) {
		return fmt.Errorf("FAT32 %s: wrote %d of %d bytes: %v", name, n, len(data), err)
	}
	return f.Close()
}

// configLBA returns the first sector of DPXE.CFG on the disk, checking that
// the file is exactly 4096 bytes in one contiguous run.
func configLBA(fsys filesystem.FileSystem, partStart uint32) (uint32, error) {
	f, err := fsys.OpenFile(ConfigPath, os.O_RDONLY)
	if err != nil {
		return 0, fmt.Errorf("%w: no %s: %v", ErrNotDPXEImage, ConfigPath, err)
	}
	defer f.Close()
	ff, ok := f.(*fat12.File)
	if !ok {
		return 0, fmt.Errorf("%w: %s is not on a FAT file system", ErrNotDPXEImage, ConfigPath)
	}
	st, err := ff.Stat()
	if err != nil {
		return 0, err
	}
	if st.Size() != appliance.MaxBootConfigLen {
		return 0, fmt.Errorf("%w: %s is %d bytes, want %d", ErrNotDPXEImage, ConfigPath, st.Size(), appliance.MaxBootConfigLen)
	}
	ranges, err := ff.GetDiskRanges()
	if err != nil {
		return 0, err
	}
	if len(ranges) != 1 || ranges[0].Length < appliance.MaxBootConfigLen {
		return 0, fmt.Errorf("%w: %d runs %v", ErrFragmented, len(ranges), ranges)
	}
	off := uint64(partStart)*SectorSize + ranges[0].Offset
	if off%SectorSize != 0 {
		return 0, fmt.Errorf("%w: starts at byte %d, not on a sector", ErrFragmented, off)
	}
	return uint32(off / SectorSize), nil
}

// chs encodes lba as an MBR cylinder/head/sector triple for the usual
// 255-head, 63-sector geometry, or the "use LBA" maximum past cylinder 1023.
func chs(lba uint32) (head, sector, cylinder byte) {
	const heads, spt = 255, 63
	c := lba / (heads * spt)
	if c > 1023 {
		return 0xFE, 0xFF, 0xFF
	}
	h := (lba / spt) % heads
	s := lba%spt + 1
	return byte(h), byte(s) | byte(c>>8)<<6, byte(c)
}
