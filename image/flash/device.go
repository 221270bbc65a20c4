package flash

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Env is the view of the running system the safety checks and the device
// list read. The zero value is not useful; use System(). Tests point it at a
// fake sysfs tree and a fake mountinfo to simulate devices and mounts that
// cannot be made for real (a system disk, a removable stick).
type Env struct {
	SysRoot   string // sysfs, "/sys"
	DevRoot   string // device nodes, "/dev"
	MountInfo string // "/proc/self/mountinfo"
	Swaps     string // "/proc/swaps"
	// SystemMounts are the mount points whose devices hold the running
	// system: a target backing any of them is refused even with --force.
	SystemMounts []string
}

// System returns the Env of the running machine.
func System() *Env {
	return &Env{
		SysRoot:      "/sys",
		DevRoot:      "/dev",
		MountInfo:    "/proc/self/mountinfo",
		Swaps:        "/proc/swaps",
		SystemMounts: []string{"/", "/boot", "/boot/efi", "/efi", "/usr"},
	}
}

// Partition is one partition of a block device, from sysfs.
type Partition struct {
	Name string // e.g. sdb1
	Dev  DevNum
	Size int64 // bytes
}

// Target is what flash would write: a regular file or a whole block device.
type Target struct {
	Path  string // as given
	Block bool   // a block device (else a regular file, possibly not yet existing)
	Exist bool   // the file exists (always true for a block device)
	Size  int64  // bytes: the device's capacity, or the file's current size

	// Block devices only.
	Name       string // kernel name, e.g. sdb, loop3
	Dev        DevNum
	Removable  bool   // sysfs "removable"
	Vendor     string // sysfs device/vendor, trimmed
	Model      string // sysfs device/model, trimmed
	Backing    string // loop devices: the backing file
	Partitions []Partition
	IsPart     bool   // the path names a partition, not a whole device
	Parent     string // for a partition: the whole device's name
	sysDir     string // resolved /sys/devices/... directory
}

// Describe is a one-line summary for listings and the confirmation prompt.
func (t *Target) Describe() string {
	if !t.Block {
		if !t.Exist {
			return fmt.Sprintf("%s: new regular file", t.Path)
		}
		return fmt.Sprintf("%s: regular file, %s", t.Path, humanBytes(t.Size))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s (%s %s): %s", t.Path, t.Name, t.Dev, humanBytes(t.Size))
	if m := strings.TrimSpace(t.Vendor + " " + t.Model); m != "" {
		fmt.Fprintf(&b, ", %s", m)
	}
	if t.Backing != "" {
		fmt.Fprintf(&b, ", loop device backed by %s", t.Backing)
	}
	if t.Removable {
		b.WriteString(", removable")
	} else {
		b.WriteString(", not removable")
	}
	return b.String()
}

// Inspect describes the file or block device at path without opening it
// for writing. Character devices, directories and other file types are
// refused.
func (e *Env) Inspect(path string) (*Target, error) {
	t := &Target{Path: path}
	st, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return t, nil
	}
	if err != nil {
		return nil, err
	}
	switch {
	case st.Mode().IsRegular():
		t.Exist, t.Size = true, st.Size()
		return t, nil
	case st.Mode()&fs.ModeDevice != 0 && st.Mode()&fs.ModeCharDevice == 0:
	default:
		return nil, fmt.Errorf("%w: %s is a %s", ErrNotTarget, path, st.Mode().Type())
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return nil, fmt.Errorf("%s: no device number", path)
	}
	dev := DevNum{unix.Major(uint64(sys.Rdev)), unix.Minor(uint64(sys.Rdev))}
	if err := e.inspectDev(t, dev); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// inspectDev fills t from sysfs for the block device dev.
func (e *Env) inspectDev(t *Target, dev DevNum) error {
	dir, err := filepath.EvalSymlinks(filepath.Join(e.SysRoot, "dev", "block", dev.String()))
	if err != nil {
		return fmt.Errorf("block device %s not in sysfs: %w", dev, err)
	}
	t.Block, t.Exist, t.Dev, t.sysDir, t.Name = true, true, dev, dir, filepath.Base(dir)
	if exists(filepath.Join(dir, "partition")) {
		t.IsPart, t.Parent = true, filepath.Base(filepath.Dir(dir))
	}
	sectors, err := readInt(filepath.Join(dir, "size"))
	if err != nil {
		return err
	}
	t.Size = sectors * 512 // sysfs size is always in 512-byte units
	if !t.IsPart {
		r, _ := readInt(filepath.Join(dir, "removable"))
		t.Removable = r == 1
		t.Vendor = readTrim(filepath.Join(dir, "device", "vendor"))
		t.Model = readTrim(filepath.Join(dir, "device", "model"))
		t.Backing = readTrim(filepath.Join(dir, "loop", "backing_file"))
		t.Partitions, err = partitions(dir)
		if err != nil {
			return err
		}
	}
	return nil
}

// partitions lists the partitions under a whole device's sysfs directory.
func partitions(dir string) ([]Partition, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []Partition
	for _, ent := range ents {
		p := filepath.Join(dir, ent.Name())
		if !exists(filepath.Join(p, "partition")) {
			continue
		}
		d, err := ParseDevNum(readTrim(filepath.Join(p, "dev")))
		if err != nil {
			return nil, fmt.Errorf("partition %s: %w", ent.Name(), err)
		}
		n, _ := readInt(filepath.Join(p, "size"))
		out = append(out, Partition{Name: ent.Name(), Dev: d, Size: n * 512})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// devs returns the device numbers of t and its partitions.
func (t *Target) devs() map[DevNum]string {
	m := map[DevNum]string{t.Dev: t.Name}
	for _, p := range t.Partitions {
		m[p.Dev] = p.Name
	}
	return m
}

// wholeDisks resolves a device number to the whole devices it lives on: a
// partition gives its disk, a device-mapper or md device gives itself and
// the disks of its slaves, recursively (root on LVM or RAID is still the system
// disk). depth stops loops in a broken tree.
func (e *Env) wholeDisks(dev DevNum, depth int) []string {
	dir, err := filepath.EvalSymlinks(filepath.Join(e.SysRoot, "dev", "block", dev.String()))
	if err != nil || depth > 8 {
		return nil
	}
	if exists(filepath.Join(dir, "partition")) {
		dir = filepath.Dir(dir)
	}
	out := []string{filepath.Base(dir)}
	slaves, _ := os.ReadDir(filepath.Join(dir, "slaves"))
	for _, s := range slaves {
		d, err := ParseDevNum(readTrim(filepath.Join(dir, "slaves", s.Name(), "dev")))
		if err != nil {
			continue
		}
		out = append(out, e.wholeDisks(d, depth+1)...)
	}
	return out
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func readTrim(p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func readInt(p string) (int64, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %v", p, err)
	}
	return n, nil
}

// humanBytes prints a size in binary units with one decimal.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}
