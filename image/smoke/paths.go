package smoke

import (
	"fmt"
	"strings"

	"github.com/discord-pxe/dpxe/image/qemu"
)

// Medium is what a path boots the kernel from.
type Medium string

// The media.
const (
	// MediumKernel is kernel.bin given to QEMU with -kernel.
	MediumKernel Medium = "kernel"
	// MediumDisk is usb.img attached as an IDE/SATA disk.
	MediumDisk Medium = "disk"
	// MediumUSB is usb.img attached as a USB mass-storage stick on xHCI.
	MediumUSB Medium = "usb"
	// MediumNetboot is netboot/: QEMU's user-mode network hands its iPXE
	// NIC ROM the boot script over DHCP and TFTP, iPXE boots kernel.bin.
	MediumNetboot Medium = "netboot"
)

// Path is one way of booting the artifacts. Self-test paths (every medium
// but netboot) boot with selftest=1 and end when the kernel exits QEMU;
// netboot paths check in with a dpxe serve and bring a shard to READY.
type Path struct {
	Name     string        // what --paths names, e.g. "usb-ovmf"
	Firmware qemu.Firmware // SeaBIOS or OVMF
	Medium   Medium
	// Source is how the kernel's banner line "boot: ..." must start.
	Source string
	// From is where the kernel must say its config came from
	// ("config: from=...").
	From string
}

// Paths are every path, in the order they run and are reported. The boot
// sources and config origins are the kernel's own words
// (kernel/core/kmain.inc), the same the end-to-end tests check.
var Paths = []Path{
	{"kernel-seabios", qemu.SeaBIOS, MediumKernel, "bios multiboot (QEMU -kernel)", "cmdline"},
	{"kernel-ovmf", qemu.OVMF, MediumKernel, "uefi firmware volume (QEMU -kernel)", "fw_cfg"},
	{"disk-seabios", qemu.SeaBIOS, MediumDisk, "bios disk (dpxe MBR loader)", "DPXE.CFG"},
	{"disk-ovmf", qemu.OVMF, MediumDisk, "uefi disk", "DPXE.CFG"},
	{"usb-seabios", qemu.SeaBIOS, MediumUSB, "bios disk (dpxe MBR loader)", "DPXE.CFG"},
	{"usb-ovmf", qemu.OVMF, MediumUSB, "uefi usb", "DPXE.CFG"},
	{"netboot-seabios", qemu.SeaBIOS, MediumNetboot, "bios multiboot (iPXE)", "cmdline"},
	{"netboot-ovmf", qemu.OVMF, MediumNetboot, "uefi network", "cmdline"},
}

// pathGroups are the names --paths accepts besides path names.
var pathGroups = map[string]func(Path) bool{
	"all":     func(Path) bool { return true },
	"bios":    func(p Path) bool { return p.Firmware == qemu.SeaBIOS },
	"uefi":    func(p Path) bool { return p.Firmware == qemu.OVMF },
	"kernel":  func(p Path) bool { return p.Medium == MediumKernel },
	"disk":    func(p Path) bool { return p.Medium == MediumDisk },
	"usb":     func(p Path) bool { return p.Medium == MediumUSB },
	"netboot": func(p Path) bool { return p.Medium == MediumNetboot },
}

// PathGroups names the groups ParsePaths accepts, for help texts.
const PathGroups = "all, bios, uefi, kernel, disk, usb, netboot"

// ParsePaths reads a comma-separated list of path names and groups (all,
// bios, uefi, kernel, disk, usb, netboot) and returns the paths in Paths
// order, each once. An empty list means all.
func ParsePaths(list string) ([]Path, error) {
	want := map[string]bool{}
	for _, tok := range strings.Split(list, ",") {
		tok = strings.TrimSpace(tok)
		if tok == "" {
			continue
		}
		if g, ok := pathGroups[tok]; ok {
			for _, p := range Paths {
				if g(p) {
					want[p.Name] = true
				}
			}
			continue
		}
		found := false
		for _, p := range Paths {
			if p.Name == tok {
				want[p.Name], found = true, true
			}
		}
		if !found {
			return nil, fmt.Errorf("unknown path %q (paths: %s; groups: %s)", tok, strings.Join(PathNames(), ", "), PathGroups)
		}
	}
	var out []Path
	for _, p := range Paths {
		if len(want) == 0 || want[p.Name] {
			out = append(out, p)
		}
	}
	return out, nil
}

// PathNames lists the path names in order.
func PathNames() []string {
	names := make([]string, len(Paths))
	for i, p := range Paths {
		names[i] = p.Name
	}
	return names
}
