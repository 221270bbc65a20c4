package image

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	diskfs "github.com/diskfs/go-diskfs"
	"github.com/diskfs/go-diskfs/partition/mbr"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image/mbrloader"
)

// ErrConfigTooLong means a rendered config does not fit DPXE.CFG.
var ErrConfigTooLong = errors.New("config does not fit the 4096 bytes of DPXE.CFG")

// configHeader opens every DPXE.CFG the tools write.
const configHeader = `# Discord-PXE node boot config (DPXE.CFG, docs/boot-config.md).
# Edit with: dpxe config set IMAGE key=value ...   Show: dpxe config show IMAGE
# Syntax: key=value tokens separated by spaces or line breaks; '#' starts a
# comment. A non-empty kernel command line takes precedence over this file.
`

// ConfigTemplate returns the DPXE.CFG of a fresh image: the header, every key
// with its description as a comment, no key set, NUL-padded to 4096 bytes.
func ConfigTemplate() []byte {
	b, err := RenderConfig(appliance.BootConfig{})
	if err != nil {
		panic(err) // the empty config always fits
	}
	return b
}

// RenderConfig renders c as DPXE.CFG content: the commented header and key
// list, then one key=value per line, NUL-padded to exactly 4096 bytes. It
// checks that the text parses back to c.
func RenderConfig(c appliance.BootConfig) ([]byte, error) {
	var b strings.Builder
	b.WriteString(configHeader)
	b.WriteString("# Keys:\n")
	for _, k := range appliance.BootConfigKeys() {
		fmt.Fprintf(&b, "#   %-13s %s\n", k, appliance.BootConfigKeyDoc(k))
	}
	if s := c.String(); s != "" {
		b.WriteString(strings.ReplaceAll(s, " ", "\n"))
		b.WriteString("\n")
	}
	if b.Len() > appliance.MaxBootConfigLen {
		return nil, fmt.Errorf("%w: %d bytes", ErrConfigTooLong, b.Len())
	}
	out := make([]byte, appliance.MaxBootConfigLen)
	copy(out, b.String())
	back, err := appliance.ParseBootConfig(out)
	if err != nil {
		return nil, fmt.Errorf("rendered config does not parse: %w", err)
	}
	if back != c {
		return nil, fmt.Errorf("rendered config parses to %q, want %q", back.String(), c.String())
	}
	return out, nil
}

// ConfigText returns the text of DPXE.CFG content: up to the first NUL.
func ConfigText(raw []byte) []byte {
	if i := bytes.IndexByte(raw, 0); i >= 0 {
		return raw[:i]
	}
	return raw
}

// USBConfig is the node config found in a USB image or device.
type USBConfig struct {
	Raw    []byte // the 4096 bytes of DPXE.CFG
	LBA    uint32 // its first sector, as the MBR loader reads it
	Offset int64  // its byte offset in the image
}

// ReadUSBConfig locates \DPXE.CFG in the image or device at path and returns
// it. It checks the layout both firmware paths rely on: an MBR with our
// loader, partition 1 active, type 0xEF, FAT32 holding DPXE.CFG as 4096
// contiguous bytes, and the loader's config LBA and length pointing at them.
func ReadUSBConfig(path string) (*USBConfig, error) {
	loc, err := locateConfig(path)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	raw := make([]byte, appliance.MaxBootConfigLen)
	if _, err := f.ReadAt(raw, loc.Offset); err != nil {
		return nil, fmt.Errorf("%s: reading DPXE.CFG: %w", path, err)
	}
	if !bytes.Equal(raw, loc.Raw) {
		return nil, fmt.Errorf("%s: DPXE.CFG read by sector differs from the file read through FAT", path)
	}
	return loc, nil
}

// WriteUSBConfig replaces the content of \DPXE.CFG in the image or device at
// path, in place: same clusters, so the MBR loader's patch stays right. raw
// must be exactly 4096 bytes and parse as a boot config. The write is synced
// and read back.
func WriteUSBConfig(path string, raw []byte) error {
	if len(raw) != appliance.MaxBootConfigLen {
		return fmt.Errorf("DPXE.CFG must be %d bytes, got %d", appliance.MaxBootConfigLen, len(raw))
	}
	if _, err := appliance.ParseBootConfig(raw); err != nil {
		return err
	}
	loc, err := ReadUSBConfig(path)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.WriteAt(raw, loc.Offset); err != nil {
		return fmt.Errorf("%s: writing DPXE.CFG: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	back, err := ReadUSBConfig(path)
	if err != nil {
		return fmt.Errorf("%s: after writing DPXE.CFG: %w", path, err)
	}
	if !bytes.Equal(back.Raw, raw) {
		return fmt.Errorf("%s: DPXE.CFG reads back different from what was written", path)
	}
	return nil
}

// locateConfig opens path with go-diskfs, checks the partition and loader,
// and reads DPXE.CFG through the file system.
func locateConfig(path string) (*USBConfig, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	sector0 := make([]byte, SectorSize)
	_, err = io.ReadFull(f, sector0)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrNotDPXEImage, path, err)
	}
	patch, err := mbrloader.ReadPatch(sector0)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrNotDPXEImage, path, err)
	}

	d, err := diskfs.Open(path, diskfs.WithOpenMode(diskfs.ReadOnly), diskfs.WithSectorSize(diskfs.SectorSize512))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrNotDPXEImage, path, err)
	}
	defer d.Close()
	pt, err := d.GetPartitionTable()
	if err != nil {
		return nil, fmt.Errorf("%w: %s: no partition table: %v", ErrNotDPXEImage, path, err)
	}
	table, ok := pt.(*mbr.Table)
	if !ok || len(table.Partitions) == 0 {
		return nil, fmt.Errorf("%w: %s: no MBR partition table", ErrNotDPXEImage, path)
	}
	p := table.Partitions[0]
	if !p.Bootable || p.Type != PartitionType || p.Start != PartitionStartLBA {
		return nil, fmt.Errorf("%w: %s: partition 1 is type %#02x at LBA %d, active=%v; want 0xef at %d, active",
			ErrNotDPXEImage, path, byte(p.Type), p.Start, p.Bootable, PartitionStartLBA)
	}
	fsys, err := d.GetFilesystem(1)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: partition 1: %v", ErrNotDPXEImage, path, err)
	}
	lba, err := configLBA(fsys, p.Start)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if patch.ConfigLBA != lba || patch.ConfigSectors != ConfigSectors {
		return nil, fmt.Errorf("%w: %s: loader reads %d sectors at LBA %d, DPXE.CFG is %d sectors at LBA %d",
			ErrPatchMismatch, path, patch.ConfigSectors, patch.ConfigLBA, ConfigSectors, lba)
	}
	cf, err := fsys.OpenFile(ConfigPath, os.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer cf.Close()
	raw := make([]byte, appliance.MaxBootConfigLen)
	if _, err := io.ReadFull(cf, raw); err != nil {
		return nil, fmt.Errorf("%s: reading DPXE.CFG: %w", path, err)
	}
	return &USBConfig{Raw: raw, LBA: lba, Offset: int64(lba) * SectorSize}, nil
}
