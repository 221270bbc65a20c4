package flash

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// Refusals. Every error Check returns wraps exactly one of these.
var (
	// ErrNotTarget means the path is neither a regular file nor a block device.
	ErrNotTarget = errors.New("not a regular file or block device")
	// ErrPartition means the path names a partition; flash writes whole devices.
	ErrPartition = errors.New("is a partition, not a whole device")
	// ErrMounted means the device or one of its partitions is mounted
	// somewhere (bind mounts included).
	ErrMounted = errors.New("is mounted")
	// ErrSystemDevice means the device holds the running system (/, /boot, ...).
	ErrSystemDevice = errors.New("holds the running system")
	// ErrNotRemovable means sysfs does not report the device as removable;
	// --force overrides this check and no other.
	ErrNotRemovable = errors.New("is not a removable device")
	// ErrTooSmall means the device is smaller than the image.
	ErrTooSmall = errors.New("is smaller than the image")
	// ErrInUse means something else holds the device or file: a device-mapper
	// or md holder, active swap, an attached loop device, or the kernel
	// refusing an exclusive open.
	ErrInUse = errors.New("is in use")
	// ErrSameFile means the target is the source image itself.
	ErrSameFile = errors.New("is the source image")
)

// Preflight runs every check Flash makes before it writes, for a target
// already inspected and the source image at img: the target is not the
// image itself nor a loop device backed by it, then Check, then (block
// devices) an exclusive open for writing, closed at once. Callers that
// change something elsewhere before flashing (`dpxe flash` creating the
// node at the controller) call it first, so a refusal changes nothing.
func (e *Env) Preflight(t *Target, img string, force bool) error {
	srcInfo, err := os.Stat(img)
	if err != nil {
		return err
	}
	if t.Exist {
		if st, err := os.Stat(t.Path); err == nil && os.SameFile(st, srcInfo) {
			return fmt.Errorf("%s %w (%s): flash writes a copy", t.Path, ErrSameFile, img)
		}
	}
	if t.Backing != "" {
		// Writing a loop device writes its backing file.
		if st, err := os.Stat(strings.TrimSuffix(t.Backing, " (deleted)")); err == nil && os.SameFile(st, srcInfo) {
			return fmt.Errorf("%s %w: its backing file is %s", t.Path, ErrSameFile, img)
		}
	}
	if err := e.Check(t, srcInfo.Size(), force); err != nil {
		return err
	}
	if t.Block {
		// What the write's exclusive open will meet: a mount in another
		// namespace or a program holding the device refuses it now, and
		// so does a device this user may not write.
		f, err := os.OpenFile(t.Path, os.O_WRONLY|unix.O_EXCL, 0)
		if errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("%s %w: the kernel refuses exclusive access (mounted or claimed by something else)", t.Path, ErrInUse)
		}
		if err != nil {
			return err
		}
		f.Close()
	}
	return nil
}

// Check refuses targets flash must not write. For a block device, in this
// order: a partition instead of a whole device; a device holding the running
// system (even with force); a device or partition that is mounted, in
// active swap or held by another block device; a device sysfs does not call
// removable (unless force); a device smaller than imageSize. For a regular
// file: a file that backs a loop device. A regular file is truncated to the
// image size when written, so its size does not matter.
func (e *Env) Check(t *Target, imageSize int64, force bool) error {
	if !t.Block {
		if !t.Exist {
			return nil
		}
		if loops := e.loopsBackedBy(t.Path); len(loops) > 0 {
			return fmt.Errorf("%s %w: it backs loop device %s (losetup -d it first)", t.Path, ErrInUse, strings.Join(loops, ", "))
		}
		return nil
	}
	if t.IsPart {
		return fmt.Errorf("%s %w (%s is on /dev/%s: give the whole device)", t.Path, ErrPartition, t.Name, t.Parent)
	}
	mounts, err := e.mounts()
	if err != nil {
		return err
	}
	if sys := e.systemUse(t, mounts); sys != "" {
		return fmt.Errorf("%s %w: %s", t.Path, ErrSystemDevice, sys)
	}
	devs := t.devs()
	var where []string
	for _, m := range mounts {
		if name, ok := devs[m.Dev]; ok {
			s := fmt.Sprintf("%s on %s", name, m.MountPoint)
			if m.Root != "/" {
				s += fmt.Sprintf(" (bind mount of %s)", m.Root)
			}
			where = append(where, s)
		}
	}
	if len(where) > 0 {
		return fmt.Errorf("%s %w: %s (unmount first)", t.Path, ErrMounted, strings.Join(where, ", "))
	}
	if sw := e.swapsOn(devs); len(sw) > 0 {
		return fmt.Errorf("%s %w: active swap on %s (swapoff first)", t.Path, ErrInUse, strings.Join(sw, ", "))
	}
	if h := e.holders(t); len(h) > 0 {
		return fmt.Errorf("%s %w: held by %s (device mapper, RAID or similar)", t.Path, ErrInUse, strings.Join(h, ", "))
	}
	if !t.Removable && !force {
		return fmt.Errorf("%s %w (sysfs %s/removable is 0); if you are sure, use --force", t.Path, ErrNotRemovable, t.Name)
	}
	if t.Size < imageSize {
		return fmt.Errorf("%s %w: %s (%d bytes) < %s (%d bytes)", t.Path, ErrTooSmall, humanBytes(t.Size), t.Size, humanBytes(imageSize), imageSize)
	}
	return nil
}

func (e *Env) mounts() ([]Mount, error) {
	f, err := os.Open(e.MountInfo)
	if err != nil {
		return nil, fmt.Errorf("cannot tell what is mounted: %w", err)
	}
	defer f.Close()
	ms, err := ParseMountInfo(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", e.MountInfo, err)
	}
	return ms, nil
}

// systemUse names the system mount points whose file systems live on t
// (through partitions, device mapper or md), or returns "".
func (e *Env) systemUse(t *Target, mounts []Mount) string {
	var hits []string
	for _, m := range mounts {
		if !contains(e.SystemMounts, m.MountPoint) {
			continue
		}
		for _, disk := range e.wholeDisks(m.Dev, 0) {
			if disk == t.Name {
				hits = append(hits, fmt.Sprintf("%s is on it (%s %s)", m.MountPoint, m.Source, m.Dev))
			}
		}
	}
	sort.Strings(hits)
	return strings.Join(hits, ", ")
}

// swapsOn lists active swap areas (from /proc/swaps) on the given devices.
func (e *Env) swapsOn(devs map[DevNum]string) []string {
	f, err := os.Open(e.Swaps)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || fields[1] != "partition" {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(unescapeMount(fields[0]), &st) != nil {
			continue
		}
		d := DevNum{unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev))}
		if _, ok := devs[d]; ok {
			out = append(out, fields[0])
		}
	}
	return out
}

// holders lists the block devices stacked on t or its partitions.
func (e *Env) holders(t *Target) []string {
	dirs := []string{t.sysDir}
	for _, p := range t.Partitions {
		dirs = append(dirs, filepath.Join(t.sysDir, p.Name))
	}
	var out []string
	for _, d := range dirs {
		ents, _ := os.ReadDir(filepath.Join(d, "holders"))
		for _, ent := range ents {
			out = append(out, filepath.Base(d)+"→"+ent.Name())
		}
	}
	return out
}

// loopsBackedBy names the loop devices whose backing file is path.
func (e *Env) loopsBackedBy(path string) []string {
	want, err := os.Stat(path)
	if err != nil {
		return nil
	}
	ents, _ := os.ReadDir(filepath.Join(e.SysRoot, "block"))
	var out []string
	for _, ent := range ents {
		b := readTrim(filepath.Join(e.SysRoot, "block", ent.Name(), "loop", "backing_file"))
		if b == "" {
			continue
		}
		if st, err := os.Stat(strings.TrimSuffix(b, " (deleted)")); err == nil && os.SameFile(st, want) {
			out = append(out, "/dev/"+ent.Name())
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
