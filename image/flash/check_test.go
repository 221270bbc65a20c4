package flash

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseMountInfo(t *testing.T) {
	const text = `27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
28 27 8:17 / /media/stick rw,nosuid shared:5 - vfat /dev/sdb1 rw
29 27 8:17 /photos /srv/my\040photos rw master:1 - vfat /dev/sdb1 rw
30 27 0:25 / /run rw - tmpfs tmpfs rw

`
	ms, err := ParseMountInfo(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	want := []Mount{
		{27, DevNum{254, 0}, "/", "/", "ext4", "/dev/vda"},
		{28, DevNum{8, 17}, "/", "/media/stick", "vfat", "/dev/sdb1"},
		{29, DevNum{8, 17}, "/photos", "/srv/my photos", "vfat", "/dev/sdb1"},
		{30, DevNum{0, 25}, "/", "/run", "tmpfs", "tmpfs"},
	}
	if len(ms) != len(want) {
		t.Fatalf("%d mounts, want %d: %+v", len(ms), len(want), ms)
	}
	for i := range want {
		if ms[i] != want[i] {
			t.Errorf("mount %d: %+v, want %+v", i, ms[i], want[i])
		}
	}
	for _, bad := range []string{
		"27 1 254:0 / / rw",                  // no separator
		"x 1 254:0 / / rw - ext4 /dev/vda",   // mount ID
		"27 1 254 / / rw - ext4 /dev/vda",    // device number
		"27 1 254:0 / / rw -",                // nothing after the separator
		"27 1 a:b / / rw - ext4 /dev/vda rw", // device number
	} {
		if _, err := ParseMountInfo(strings.NewReader(bad)); !errors.Is(err, ErrMountInfo) {
			t.Errorf("%q: err %v, want ErrMountInfo", bad, err)
		}
	}
}

func FuzzParseMountInfo(f *testing.F) {
	f.Add("27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n")
	f.Add("29 27 8:17 /a\\040b /srv rw master:1 - vfat /dev/sdb1 rw\n")
	f.Add("1 2 3:4 \\ \\1 \\12 - x")
	f.Fuzz(func(t *testing.T, s string) {
		ms, err := ParseMountInfo(strings.NewReader(s))
		if err != nil {
			return
		}
		for _, m := range ms {
			if m.FSType == "" {
				t.Fatalf("parsed a mount without a file-system type from %q", s)
			}
		}
	})
}

// fakeSys is a sysfs tree with the block devices the checks read.
type fakeSys struct {
	root string
	env  *Env
}

// newFakeSys makes a fake /sys with:
//   - sda (8:0, 64 GiB, not removable) with sda1 (8:1) and sda2 (8:2);
//   - sdb (8:16, 8 GiB, removable "SanDisk Cruzer") with sdb1 (8:17);
//   - sdc (8:32, 32 MiB, removable);
//   - dm-0 (253:0) on sda2.
//
// mountinfo starts with / on dm-0 and /boot on sda1.
func newFakeSys(t *testing.T) *fakeSys {
	t.Helper()
	root := t.TempDir()
	fs := &fakeSys{root: root}
	w := func(p, s string) {
		p = filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := func(dev, dir string) {
		p := filepath.Join(root, "sys/dev/block", dev)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.Symlink(filepath.Join(root, dir), p); err != nil {
			t.Fatal(err)
		}
	}
	disk := func(dir, dev, sectors, removable, model string, parts map[string]string) {
		w(dir+"/dev", dev)
		w(dir+"/size", sectors)
		w(dir+"/removable", removable)
		if model != "" {
			w(dir+"/device/model", model)
			w(dir+"/device/vendor", "SanDisk ")
		}
		os.MkdirAll(filepath.Join(root, dir, "holders"), 0o755)
		link(dev, dir)
		for name, pdev := range parts {
			w(dir+"/"+name+"/dev", pdev)
			w(dir+"/"+name+"/size", "1000")
			w(dir+"/"+name+"/partition", "1")
			os.MkdirAll(filepath.Join(root, dir, name, "holders"), 0o755)
			link(pdev, dir+"/"+name)
		}
		os.MkdirAll(filepath.Join(root, "sys/block"), 0o755)
		os.Symlink(filepath.Join(root, dir), filepath.Join(root, "sys/block", filepath.Base(dir)))
	}
	disk("sys/devices/pci0/ata1/block/sda", "8:0", "134217728", "0", "", map[string]string{"sda1": "8:1", "sda2": "8:2"})
	disk("sys/devices/pci0/usb1/block/sdb", "8:16", "16777216", "1", "Cruzer Blade    ", map[string]string{"sdb1": "8:17"})
	disk("sys/devices/pci0/usb2/block/sdc", "8:32", "65536", "1", "", nil)
	disk("sys/devices/virtual/block/dm-0", "253:0", "100000", "0", "", nil)
	os.MkdirAll(filepath.Join(root, "sys/devices/virtual/block/dm-0/slaves"), 0o755)
	os.Symlink(filepath.Join(root, "sys/devices/pci0/ata1/block/sda/sda2"), filepath.Join(root, "sys/devices/virtual/block/dm-0/slaves/sda2"))
	os.Symlink(filepath.Join(root, "sys/devices/virtual/block/dm-0"), filepath.Join(root, "sys/devices/pci0/ata1/block/sda/sda2/holders/dm-0"))
	fs.env = &Env{
		SysRoot:      filepath.Join(root, "sys"),
		DevRoot:      filepath.Join(root, "dev"),
		MountInfo:    filepath.Join(root, "mountinfo"),
		Swaps:        filepath.Join(root, "swaps"),
		SystemMounts: System().SystemMounts,
	}
	fs.mountinfo(t, "")
	w("swaps", "Filename Type Size Used Priority")
	return fs
}

// mountinfo sets the fake mountinfo: the system mounts plus extra lines.
func (fs *fakeSys) mountinfo(t *testing.T, extra string) {
	t.Helper()
	text := "1 0 253:0 / / rw - ext4 /dev/mapper/vg-root rw\n2 1 8:1 / /boot rw - ext4 /dev/sda1 rw\n3 1 0:5 / /proc rw - proc proc rw\n" + extra
	if err := os.WriteFile(fs.env.MountInfo, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (fs *fakeSys) target(t *testing.T, dev string) *Target {
	t.Helper()
	d, err := ParseDevNum(dev)
	if err != nil {
		t.Fatal(err)
	}
	tg := &Target{Path: "/dev/x"}
	if err := fs.env.inspectDev(tg, d); err != nil {
		t.Fatal(err)
	}
	tg.Path = "/dev/" + tg.Name
	return tg
}

func TestInspectFakeSysfs(t *testing.T) {
	fs := newFakeSys(t)
	tg := fs.target(t, "8:16")
	if tg.Name != "sdb" || tg.Size != 8<<30 || !tg.Removable || tg.Model != "Cruzer Blade" || tg.Vendor != "SanDisk" || tg.IsPart {
		t.Errorf("sdb: %+v", tg)
	}
	if len(tg.Partitions) != 1 || tg.Partitions[0].Name != "sdb1" || tg.Partitions[0].Dev != (DevNum{8, 17}) {
		t.Errorf("sdb partitions: %+v", tg.Partitions)
	}
	if d := tg.Describe(); !strings.Contains(d, "8.0 GiB") || !strings.Contains(d, "SanDisk Cruzer Blade") || !strings.Contains(d, "removable") {
		t.Errorf("Describe: %s", d)
	}
	p := fs.target(t, "8:17")
	if !p.IsPart || p.Parent != "sdb" {
		t.Errorf("sdb1: %+v", p)
	}
}

func TestCheckFakeSysfs(t *testing.T) {
	const image = 64 << 20
	for _, tc := range []struct {
		name   string
		dev    string
		mounts string // extra mountinfo lines
		swaps  string
		force  bool
		want   error
		msg    string
	}{
		{name: "removable stick", dev: "8:16"},
		{name: "partition", dev: "8:17", want: ErrPartition, msg: "sdb1 is on /dev/sdb: give the whole device"},
		{name: "partition mounted", dev: "8:16", mounts: "9 1 8:17 / /media/u/STICK rw - vfat /dev/sdb1 rw\n", want: ErrMounted, msg: "sdb1 on /media/u/STICK (unmount first)"},
		{name: "whole device mounted", dev: "8:16", mounts: "9 1 8:16 / /mnt rw - iso9660 /dev/sdb ro\n", want: ErrMounted, msg: "sdb on /mnt"},
		{name: "bind mount only", dev: "8:16", mounts: "9 1 8:17 /photos /srv/photos rw - vfat /dev/sdb1 rw\n", want: ErrMounted, msg: "sdb1 on /srv/photos (bind mount of /photos)"},
		{name: "system disk via LVM", dev: "8:0", force: true, want: ErrSystemDevice, msg: "/ is on it (/dev/mapper/vg-root 253:0), /boot is on it (/dev/sda1 8:1)"},
		{name: "system disk even with force", dev: "8:0", force: true, want: ErrSystemDevice},
		{name: "stick holding root", dev: "8:16", mounts: "", want: ErrSystemDevice, msg: "/ is on it"},
		{name: "the root device-mapper device itself", dev: "253:0", force: true, want: ErrSystemDevice, msg: "/ is on it"},
		{name: "too small", dev: "8:32", want: ErrTooSmall, msg: "32.0 MiB (33554432 bytes) < 64.0 MiB (67108864 bytes)"},
		{name: "swap", dev: "8:16", swaps: "/dev/sdb1 partition 1000 0 -2\n", want: ErrInUse, msg: "active swap"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := newFakeSys(t)
			fs.mountinfo(t, tc.mounts)
			if tc.name == "stick holding root" {
				os.WriteFile(fs.env.MountInfo, []byte("1 0 8:17 / / rw - ext4 /dev/sdb1 rw\n"), 0o644)
			}
			if tc.swaps != "" {
				// /proc/swaps names device nodes and the check stats them:
				// make a node with the partition's number (never opened).
				if os.Geteuid() != 0 {
					t.Skip("making a device node to stand for the swap partition needs root")
				}
				node := filepath.Join(t.TempDir(), "swapdev")
				if err := unix.Mknod(node, unix.S_IFBLK|0o600, int(unix.Mkdev(8, 17))); err != nil {
					t.Skipf("mknod: %v", err)
				}
				os.WriteFile(fs.env.Swaps, []byte("Filename Type Size Used Priority\n"+strings.Replace(tc.swaps, "/dev/sdb1", node, 1)), 0o644)
			}
			err := fs.env.Check(fs.target(t, tc.dev), image, tc.force)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("message %q lacks %q", err, tc.msg)
			}
		})
	}
}

func TestCheckNotRemovable(t *testing.T) {
	fs := newFakeSys(t)
	// sda without the system mounts: only the removable rule stands.
	os.WriteFile(fs.env.MountInfo, []byte("1 0 0:20 / / rw - overlay overlay rw\n"), 0o644)
	// dm-0 holds sda2, so take the holder away for this case.
	os.Remove(filepath.Join(fs.root, "sys/devices/pci0/ata1/block/sda/sda2/holders/dm-0"))
	err := fs.env.Check(fs.target(t, "8:0"), 64<<20, false)
	if !errors.Is(err, ErrNotRemovable) || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("err %v, want ErrNotRemovable naming --force", err)
	}
	if err := fs.env.Check(fs.target(t, "8:0"), 64<<20, true); err != nil {
		t.Fatalf("with force: %v", err)
	}
	// A holder refuses even with force.
	os.Symlink("x", filepath.Join(fs.root, "sys/devices/pci0/ata1/block/sda/sda1/holders/md0"))
	if err := fs.env.Check(fs.target(t, "8:0"), 64<<20, true); !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "sda1→md0") {
		t.Fatalf("holder: %v", err)
	}
}
