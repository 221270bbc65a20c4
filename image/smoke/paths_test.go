package smoke

import (
	"strings"
	"testing"
)

func names(ps []Path) string {
	var n []string
	for _, p := range ps {
		n = append(n, p.Name)
	}
	return strings.Join(n, ",")
}

func TestParsePaths(t *testing.T) {
	for _, tc := range []struct{ list, want string }{
		{"", strings.Join(PathNames(), ",")},
		{"all", strings.Join(PathNames(), ",")},
		{"bios", "kernel-seabios,disk-seabios,usb-seabios,netboot-seabios"},
		{"uefi", "kernel-ovmf,disk-ovmf,usb-ovmf,netboot-ovmf"},
		{"netboot", "netboot-seabios,netboot-ovmf"},
		{"usb-ovmf, kernel-seabios", "kernel-seabios,usb-ovmf"},         // Paths order, spaces allowed
		{"kernel,kernel-seabios,,kernel", "kernel-seabios,kernel-ovmf"}, // each once
		{"disk,usb", "disk-seabios,disk-ovmf,usb-seabios,usb-ovmf"},
	} {
		ps, err := ParsePaths(tc.list)
		if err != nil {
			t.Errorf("ParsePaths(%q): %v", tc.list, err)
			continue
		}
		if got := names(ps); got != tc.want {
			t.Errorf("ParsePaths(%q) = %s, want %s", tc.list, got, tc.want)
		}
	}
	_, err := ParsePaths("kernel-seabios,pxe")
	if err == nil || !strings.Contains(err.Error(), `unknown path "pxe"`) || !strings.Contains(err.Error(), "netboot-ovmf") {
		t.Errorf("unknown path: %v", err)
	}
}

func TestPathsAreDistinct(t *testing.T) {
	seen := map[string]bool{}
	for _, p := range Paths {
		if seen[p.Name] || p.Source == "" || p.From == "" {
			t.Errorf("path %+v", p)
		}
		seen[p.Name] = true
		if _, ok := pathGroups[p.Name]; ok {
			t.Errorf("path %s shadows a group", p.Name)
		}
	}
}
