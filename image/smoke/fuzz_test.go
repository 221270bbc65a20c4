package smoke

import (
	"strings"
	"testing"

	"github.com/discord-pxe/dpxe/image/qemu"
)

// FuzzParsePaths: any list either parses to paths in Paths order, each
// once, or fails naming the token.
func FuzzParsePaths(f *testing.F) {
	for _, s := range []string{"", "all", "bios,uefi", "usb-ovmf, kernel", "x", ",,", "netboot,netboot-ovmf"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, list string) {
		ps, err := ParsePaths(list)
		if err != nil {
			if !strings.Contains(err.Error(), "unknown path") {
				t.Fatalf("error %v", err)
			}
			return
		}
		last := -1
		for _, p := range ps {
			i := indexOf(p.Name)
			if i <= last {
				t.Fatalf("%q: %s out of order or twice", list, p.Name)
			}
			last = i
		}
	})
}

func indexOf(name string) int {
	for i, p := range Paths {
		if p.Name == name {
			return i
		}
	}
	return -1
}

// FuzzCheckSelfTest feeds arbitrary consoles to the self-test checks: they
// never panic, and a console without "selftest: pass" never passes.
func FuzzCheckSelfTest(f *testing.F) {
	ref := newReference(testSeed)
	good := selfTestConsole(Paths[0], "n1", ref)
	f.Add(good, qemu.ExitPass, false)
	f.Add(good[:len(good)/2], qemu.ExitFail, false)
	f.Add("config error: byte 1 key \"x\": bad\nhalted: y\n", -1, true)
	f.Add("selftest digest a b c value=zz\nlayout SHARD size x\ncfgcase 3 ok\n", 0, false)
	f.Fuzz(func(t *testing.T, serial string, exit int, halted bool) {
		cs := checkSelfTest(bootEnd{serial: serial, exit: exit, halted: halted}, expect{path: Paths[0], version: "0.1.0", node: "n1"}, ref)
		st, reason := verdict(cs)
		if st == Pass && (!strings.Contains(serial, lineSelfTestPass) || exit != qemu.ExitPass) {
			t.Fatalf("passed without %q and exit 33", lineSelfTestPass)
		}
		if st != Pass && reason == "" {
			t.Fatal("a failure without a reason")
		}
		haltReason(serial)
		Tail(serial, TailLines)
	})
}
