// Package flash writes a personalised Discord-PXE USB image to a block
// device or a regular file, safely: it refuses devices that are mounted,
// hold the running system, are not removable or are too small; it writes
// with progress, skips zero blocks where the target is known to read as
// zeros, syncs, and reads everything back to verify it against the image's
// SHA-256. See docs/flashing.md.
//
// The source image is never opened for writing: the node config goes into a
// temporary sparse copy (image.WriteUSBConfig, the same code `dpxe config
// set` uses), and that copy is what is written and verified.
package flash

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/discord-pxe/dpxe/image"
)

// ErrAborted means the operator did not confirm the write.
var ErrAborted = errors.New("aborted: nothing was written")

// ErrChanged means the target is not the device or file that was checked
// and confirmed.
var ErrChanged = errors.New("changed")

// sameTarget reports whether two inspections describe the same device or
// file: same kind, device number, size, vendor, model and loop backing file.
func sameTarget(a, b *Target) bool {
	return a.Block == b.Block && a.Exist == b.Exist && a.Dev == b.Dev && a.Size == b.Size &&
		a.Vendor == b.Vendor && a.Model == b.Model && a.Backing == b.Backing
}

// Options describe one flash.
type Options struct {
	Image  string // source usb.img; opened read-only
	Config []byte // the personalised DPXE.CFG, 4096 bytes (image.RenderConfig)
	Target string // block device or regular file
	// Force writes to a device sysfs does not report as removable. It
	// overrides no other check.
	Force bool
	// SkipZeroed, for block devices: read each range of the device (with
	// O_DIRECT) just before writing it, and leave out the image's zero
	// blocks the device already holds as zeros. Off, every byte is
	// written. Regular files are always written sparsely.
	SkipZeroed bool
	// Env is the system the checks look at; nil means System().
	Env *Env
	// Progress receives the progress lines (usually os.Stderr); nil: quiet.
	Progress io.Writer
	// Confirm is called with the target after every check passed and
	// before anything is written; a non-nil error aborts. nil: no prompt.
	Confirm func(*Target) error
	// Expect, when set, is the target as the operator confirmed it (from
	// Env.Inspect): Flash refuses a target that is no longer the same
	// device (another stick under the same name, a resized file).
	Expect *Target
	// TempDir holds the personalised copy; "" means os.TempDir().
	TempDir string
	// BeforeVerify, when set, runs between the write (synced) and the
	// read-back. It exists for fault-injection tests.
	BeforeVerify func(target string) error
}

// Result is what a successful flash did.
type Result struct {
	Target       *Target
	Size         int64         // image bytes
	Written      int64         // bytes written
	Skipped      int64         // zero bytes not written: holes of a regular file, or zeros the device already held
	Probed       bool          // the device was read before writing to find zeros it already holds (SkipZeroed)
	SHA256       [32]byte      // of the personalised image, read back from the target
	WriteTime    time.Duration // write and sync
	VerifyTime   time.Duration
	VerifyDirect bool  // the read-back bypassed the page cache (O_DIRECT)
	RereadErr    error // block devices: asking the kernel to re-read the partition table failed (harmless)
}

// Flash personalises opts.Image with opts.Config and writes it to
// opts.Target, then verifies it. Nothing is written to the target before
// every check passed and Confirm agreed.
func Flash(ctx context.Context, opts Options) (*Result, error) {
	env := opts.Env
	if env == nil {
		env = System()
	}
	srcInfo, err := os.Stat(opts.Image)
	if err != nil {
		return nil, err
	}
	size := srcInfo.Size()
	t, err := env.Inspect(opts.Target)
	if err != nil {
		return nil, err
	}
	if err := env.Preflight(t, opts.Image, opts.Force); err != nil {
		return nil, err
	}

	tmp, err := Personalize(opts.Image, opts.Config, opts.TempDir)
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp)

	if opts.Expect != nil && !sameTarget(opts.Expect, t) {
		return nil, fmt.Errorf("%s %w: was %s, is now %s", opts.Target, ErrChanged, opts.Expect.Describe(), t.Describe())
	}
	if opts.Confirm != nil {
		if err := opts.Confirm(t); err != nil {
			return nil, err
		}
		// The answer may take minutes: look again.
		now, err := env.Inspect(opts.Target)
		if err != nil {
			return nil, err
		}
		if !sameTarget(t, now) {
			return nil, fmt.Errorf("%s %w while waiting for the answer: was %s, is now %s", opts.Target, ErrChanged, t.Describe(), now.Describe())
		}
		if err := env.Check(now, size, opts.Force); err != nil {
			return nil, err
		}
	}

	src, err := os.Open(tmp)
	if err != nil {
		return nil, err
	}
	defer src.Close()

	res := &Result{Target: t, Size: size}
	dst, err := openTarget(t, size)
	if err != nil {
		return nil, err
	}
	zp := zeroPolicy{Known: !t.Block}
	if t.Block && opts.SkipZeroed {
		// The device is open O_EXCL for writing, so what this reads
		// stays true until the write; the read-back checks it anyway.
		if probe, err := os.OpenFile(t.Path, os.O_RDONLY|unix.O_DIRECT, 0); err == nil {
			defer probe.Close()
			zp.Probe = probe
			res.Probed = true
		}
	}
	start := time.Now()
	prog := NewProgress(opts.Progress, "write", size)
	st, err := writeImage(ctx, dst, src, size, zp, prog)
	if err == nil {
		err = dst.Sync()
	}
	prog.Finish()
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	res.WriteTime, res.Written, res.Skipped = time.Since(start), st.Written, st.Skipped
	if err != nil {
		return res, fmt.Errorf("%s: %w", t.Path, err)
	}

	if opts.BeforeVerify != nil {
		if err := opts.BeforeVerify(t.Path); err != nil {
			return res, err
		}
	}
	start = time.Now()
	prog = NewProgress(opts.Progress, "verify", size)
	vr, err := verify(ctx, t.Path, src, size, prog)
	prog.Finish()
	res.VerifyTime, res.VerifyDirect, res.SHA256 = time.Since(start), vr.Direct, vr.Sum
	if err != nil {
		return res, err
	}
	if t.Block {
		// Let the kernel see the new partition table now rather than at
		// the next plug-in. Loop devices without partition scanning
		// refuse this; it changes nothing on the medium either way.
		res.RereadErr = rereadPartitions(t.Path)
	}
	return res, nil
}

// openTarget opens the target for writing. A regular file is created or
// truncated and extended to read as zeros (so zero blocks may be skipped).
// A block device is opened O_EXCL: Linux then refuses (EBUSY) while any of
// its partitions is mounted or claimed, and nobody can mount it while the
// write runs, which closes the gap between Check and the write.
func openTarget(t *Target, size int64) (*os.File, error) {
	if !t.Block {
		f, err := os.OpenFile(t.Path, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return nil, err
		}
		if err := prepareFile(f, size); err != nil {
			f.Close()
			return nil, err
		}
		return f, nil
	}
	f, err := os.OpenFile(t.Path, os.O_WRONLY|unix.O_EXCL, 0)
	if errors.Is(err, unix.EBUSY) {
		return nil, fmt.Errorf("%s %w: the kernel refuses exclusive access (mounted or claimed by something else)", t.Path, ErrInUse)
	}
	return f, err
}

// Personalize writes a sparse copy of the image at src into dir (""
// means os.TempDir()) with DPXE.CFG replaced by cfg, and returns its path;
// the caller removes it. src is only read.
func Personalize(src string, cfg []byte, dir string) (string, error) {
	in, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return "", err
	}
	out, err := os.CreateTemp(dir, "dpxe-flash-*.img")
	if err != nil {
		return "", err
	}
	name := out.Name()
	fail := func(err error) (string, error) {
		out.Close()
		os.Remove(name)
		return "", err
	}
	if err := prepareFile(out, st.Size()); err != nil {
		return fail(err)
	}
	if _, err := writeImage(context.Background(), out, in, st.Size(), zeroPolicy{Known: true}, nil); err != nil {
		return fail(fmt.Errorf("copying %s: %w", src, err))
	}
	if err := out.Close(); err != nil {
		return fail(err)
	}
	if err := image.WriteUSBConfig(name, cfg); err != nil {
		os.Remove(name)
		return "", fmt.Errorf("personalising a copy of %s: %w", filepath.Base(src), err)
	}
	return name, nil
}

// rereadPartitions asks the kernel to re-read the partition table of the
// device at path (BLKRRPART). u-root's block.BlockDev.ReadPartitionTable
// does the same, but importing pkg/mount/block pulls two modules (a GPT and
// a PCI library) into the build for this one ioctl.
func rereadPartitions(path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.IoctlSetInt(int(f.Fd()), unix.BLKRRPART, 0)
}
