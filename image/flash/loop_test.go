package flash

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// needLoop skips unless the test runs as root with losetup.
func needLoop(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("loop devices need root")
	}
	if _, err := exec.LookPath("losetup"); err != nil {
		t.Skip("losetup not installed (util-linux)")
	}
}

// loopDevice attaches a new loop device backed by a file of size bytes in
// t.TempDir() and detaches it when the test ends. These are the only block
// devices the tests write to.
func loopDevice(t testing.TB, size int64, partscan bool) (dev, backing string) {
	t.Helper()
	needLoop(t)
	backing = filepath.Join(t.TempDir(), "loop-backing.img")
	f, err := os.Create(backing)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	args := []string{"--find", "--show"}
	if partscan {
		args = append(args, "--partscan")
	}
	out, err := exec.Command("losetup", append(args, backing)...).CombinedOutput()
	if err != nil {
		t.Skipf("losetup cannot attach a loop device here: %v: %s", err, out)
	}
	dev = strings.TrimSpace(string(out))
	if !strings.HasPrefix(dev, "/dev/loop") {
		t.Fatalf("losetup printed %q", dev)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "--detach", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup --detach %s: %v: %s", dev, err, out)
		}
	})
	return dev, backing
}

// mountAt mounts src on a new directory (extra mount(8) arguments first)
// and unmounts it when the test ends, before the loop device is detached.
func mountAt(t *testing.T, args ...string) (string, error) {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", append(args, dir)...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("%v: %s", err, out)
	}
	t.Cleanup(func() { unmount(t, dir) })
	return dir, nil
}

func unmount(t *testing.T, dir string) {
	if err := unix.Unmount(dir, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		t.Logf("umount %s: %v; detaching lazily", dir, err)
		unix.Unmount(dir, unix.MNT_DETACH)
	}
}

func TestFlashLoopDevice(t *testing.T) {
	src := sourceImage(t)
	dev, backing := loopDevice(t, 64<<20, false)
	before := fileSum(t, src)
	res, err := Flash(context.Background(), Options{Image: src, Config: testConfig(t, "loop-node-1"), Target: dev, Force: true, TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	checkFlashed(t, src, dev, "loop-node-1")
	checkFlashed(t, src, backing, "loop-node-1")
	if fileSum(t, src) != before {
		t.Fatal("the source image changed")
	}
	if !res.Target.Block || res.Target.Backing != backing || res.Written != res.Size || res.Skipped != 0 {
		t.Errorf("target %+v, written %d, skipped %d: a device is written in full", res.Target, res.Written, res.Skipped)
	}
	if !res.VerifyDirect {
		t.Error("a loop device must be verified with O_DIRECT")
	}
	t.Logf("write %v, verify %v, re-read partitions: %v", res.WriteTime, res.VerifyTime, res.RereadErr)

	// --list --all shows it as Discord-PXE media of loop-node-1. The list
	// probes every device it sees, so it sees only this one: a sysfs of
	// links to the loop device's real entries.
	env := onlyDevice(t, res.Target)
	ms, err := env.List(true)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, m := range ms {
		if m.Path == dev {
			found = true
			if !m.Loader || !m.DPXE || m.Node != "loop-node-1" || m.Ctrl != "http://10.9.8.7:8080" {
				t.Errorf("listed as %+v", m)
			}
		}
	}
	if !found {
		t.Errorf("%s not in the device list", dev)
	}
	// Not removable: left out without --all.
	ms, _ = env.List(false)
	for _, m := range ms {
		if m.Path == dev {
			t.Errorf("loop device listed as removable")
		}
	}
}

func TestFlashLoopVerifyCatchesFlip(t *testing.T) {
	src := sourceImage(t)
	dev, _ := loopDevice(t, 64<<20, false)
	const off = 2048*512 + 777 // inside the FAT partition
	_, err := Flash(context.Background(), Options{Image: src, Config: testConfig(t, "n"), Target: dev, Force: true, TempDir: t.TempDir(), BeforeVerify: flipByte(off)})
	if !errors.Is(err, ErrVerify) || !strings.Contains(err.Error(), fmt.Sprintf("offset %d ", off/512*512)) {
		t.Fatalf("err %v, want ErrVerify at block %d", err, off/512*512)
	}
}

func TestFlashLoopRefusals(t *testing.T) {
	src := sourceImage(t)
	cfg := testConfig(t, "n")
	flash := func(dev string, force bool, env *Env) error {
		_, err := Flash(context.Background(), Options{Image: src, Config: cfg, Target: dev, Force: force, Env: env, TempDir: t.TempDir()})
		return err
	}
	t.Run("not removable", func(t *testing.T) {
		dev, _ := loopDevice(t, 64<<20, false)
		if err := flash(dev, false, nil); !errors.Is(err, ErrNotRemovable) || !strings.Contains(err.Error(), "--force") {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("too small", func(t *testing.T) {
		dev, _ := loopDevice(t, 32<<20, false)
		if err := flash(dev, true, nil); !errors.Is(err, ErrTooSmall) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("system device", func(t *testing.T) {
		dev, _ := loopDevice(t, 64<<20, false)
		tg, err := System().Inspect(dev)
		if err != nil {
			t.Fatal(err)
		}
		env := System()
		env.MountInfo = filepath.Join(t.TempDir(), "mountinfo")
		os.WriteFile(env.MountInfo, []byte(fmt.Sprintf("1 0 %s / / rw - ext4 %s rw\n", tg.Dev, dev)), 0o644)
		if err := flash(dev, true, env); !errors.Is(err, ErrSystemDevice) || !strings.Contains(err.Error(), "/ is on it") {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("loop device over the source image", func(t *testing.T) {
		// Attach a loop device to a copy that plays the source, read-only
		// so that even a bug could not change it.
		img, err := Personalize(src, cfg, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("losetup", "--find", "--show", "--read-only", img).CombinedOutput()
		if err != nil {
			t.Skipf("losetup: %v: %s", err, out)
		}
		dev := strings.TrimSpace(string(out))
		t.Cleanup(func() { exec.Command("losetup", "--detach", dev).Run() })
		before := fileSum(t, img)
		_, err = Flash(context.Background(), Options{Image: img, Config: cfg, Target: dev, Force: true, TempDir: t.TempDir()})
		if !errors.Is(err, ErrSameFile) || !strings.Contains(err.Error(), "backing file") {
			t.Fatalf("err %v, want ErrSameFile", err)
		}
		if fileSum(t, img) != before {
			t.Fatal("the source changed")
		}
	})
	t.Run("backing file of a loop device", func(t *testing.T) {
		_, backing := loopDevice(t, 64<<20, false)
		if err := flash(backing, false, nil); !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "backs loop device") {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("mounted", func(t *testing.T) {
		dev, mnt, what := mountedLoop(t, src)
		err := flash(dev, true, nil)
		if !errors.Is(err, ErrMounted) || !strings.Contains(err.Error(), "on "+mnt) {
			t.Fatalf("%s: err %v", what, err)
		}
		t.Logf("%s: %v", what, err)
		// The kernel agrees: an exclusive open fails while mounted.
		tg, _ := System().Inspect(dev)
		if f, err := openTarget(tg, 64<<20); !errors.Is(err, ErrInUse) {
			if f != nil {
				f.Close()
			}
			t.Errorf("exclusive open of a mounted device: %v, want ErrInUse", err)
		}

		// A bind mount of a subdirectory keeps the device busy after the
		// original mount is gone.
		sub := filepath.Join(mnt, "sub")
		if err := os.MkdirAll(sub, 0o755); err != nil {
			t.Skipf("cannot make a directory on the mounted file system: %v", err)
		}
		bind, err := mountAt(t, "--bind", sub)
		if err != nil {
			t.Fatalf("bind mount: %v", err)
		}
		unmount(t, mnt)
		err = flash(dev, true, nil)
		if !errors.Is(err, ErrMounted) || !strings.Contains(err.Error(), "on "+bind+" (bind mount of /sub)") {
			t.Fatalf("bind mount: err %v", err)
		}
		unmount(t, bind)
		// Unmounted, it flashes.
		if err := flash(dev, true, nil); err != nil {
			t.Fatalf("after unmounting: %v", err)
		}
	})
}

// mountedLoop returns a loop device with a mounted file system: the FAT
// partition of a flashed image when the kernel scans loop partitions and
// has vfat (Debian's does), else an ext4 file system on the whole device.
func mountedLoop(t *testing.T, src string) (dev, mnt, what string) {
	t.Helper()
	dev, _ = loopDevice(t, 64<<20, true)
	if _, err := Flash(context.Background(), Options{Image: src, Config: testConfig(t, "m"), Target: dev, Force: true, TempDir: t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	part := dev + "p1"
	for i := 0; i < 20 && !exists(part); i++ {
		time.Sleep(50 * time.Millisecond) // the partition node appears after BLKRRPART
	}
	if exists(part) {
		if m, err := mountAt(t, "-t", "vfat", part); err == nil {
			return dev, m, "FAT partition " + part
		} else {
			t.Logf("mounting %s: %v; using ext4 on the whole device", part, err)
		}
	} else {
		t.Logf("no %s (kernel without loop partition scanning); using ext4 on the whole device", part)
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("neither vfat partitions nor mkfs.ext4 available to make a mounted loop device")
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", dev).CombinedOutput(); err != nil {
		t.Skipf("mkfs.ext4 %s: %v: %s", dev, err, out)
	}
	m, err := mountAt(t, "-t", "ext4", dev)
	if err != nil {
		t.Skipf("mount ext4: %v", err)
	}
	return dev, m, "ext4 on " + dev
}

// TestFlashLoopSkipZeroed: with SkipZeroed, zero blocks the device already
// holds as zeros are left out, and only those.
func TestFlashLoopSkipZeroed(t *testing.T) {
	src := sourceImage(t)
	for _, tc := range []struct {
		name string
		fill byte // the backing file's bytes before the flash (0: a sparse file)
		skip bool // some bytes must be skipped
	}{
		{"zeroed device", 0, true},
		{"device full of 0xff", 0xff, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev, backing := loopDevice(t, 64<<20, false)
			if tc.fill != 0 {
				f, err := os.OpenFile(backing, os.O_WRONLY, 0)
				if err != nil {
					t.Fatal(err)
				}
				buf := bytes.Repeat([]byte{tc.fill}, 1<<20)
				for off := int64(0); off < 64<<20; off += 1 << 20 {
					f.WriteAt(buf, off)
				}
				f.Close()
			}
			opts := Options{Image: src, Config: testConfig(t, "z"), Target: dev, Force: true, SkipZeroed: true, TempDir: t.TempDir()}
			res, err := Flash(context.Background(), opts)
			if err != nil {
				t.Fatal(err)
			}
			checkFlashed(t, src, dev, "z")
			if !res.Probed || res.Written+res.Skipped != res.Size {
				t.Fatalf("probed %v, written %d + skipped %d != %d", res.Probed, res.Written, res.Skipped, res.Size)
			}
			if tc.skip != (res.Skipped > res.Size/2) || (!tc.skip && res.Skipped != 0) {
				t.Errorf("skipped %d of %d bytes", res.Skipped, res.Size)
			}
			// Flashing again over itself skips every zero block.
			res2, err := Flash(context.Background(), opts)
			if err != nil {
				t.Fatal(err)
			}
			if res2.Skipped < res.Size/2 {
				t.Errorf("second flash skipped only %d bytes", res2.Skipped)
			}
			t.Logf("written %d, skipped %d; again: written %d, skipped %d", res.Written, res.Skipped, res2.Written, res2.Skipped)
		})
	}
}

// onlyDevice returns the system Env with a sysfs that holds only tg: links
// to its real /sys/block and /sys/dev/block entries.
func onlyDevice(t *testing.T, tg *Target) *Env {
	t.Helper()
	root := t.TempDir()
	for _, l := range [][2]string{
		{"/sys/block/" + tg.Name, filepath.Join(root, "block", tg.Name)},
		{"/sys/dev/block/" + tg.Dev.String(), filepath.Join(root, "dev", "block", tg.Dev.String())},
	} {
		os.MkdirAll(filepath.Dir(l[1]), 0o755)
		real, err := filepath.EvalSymlinks(l[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(real, l[1]); err != nil {
			t.Fatal(err)
		}
	}
	env := System()
	env.SysRoot = root
	return env
}
