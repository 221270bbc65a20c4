package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/image/qemu"
)

// bootPath is one way the shard kernel reaches kmain.
type bootPath struct {
	name       string
	fw         qemu.Firmware
	medium     string // "kernel" (QEMU -kernel), "disk" (IDE/SATA) or "usb" (xHCI mass storage)
	wantSource string // the kernel's "boot: ..." banner
	wantFrom   string // where the config came from: "cmdline" or "DPXE.CFG"
}

var bootPaths = []bootPath{
	{"kernel-seabios", qemu.SeaBIOS, "kernel", "bios multiboot (QEMU -kernel)", "cmdline"},
	{"kernel-ovmf", qemu.OVMF, "kernel", "uefi firmware volume (QEMU -kernel)", "fw_cfg"},
	{"disk-seabios", qemu.SeaBIOS, "disk", "bios disk (dpxe MBR loader)", "DPXE.CFG"},
	{"disk-ovmf", qemu.OVMF, "disk", "uefi disk", "DPXE.CFG"},
	{"usb-seabios", qemu.SeaBIOS, "usb", "bios disk (dpxe MBR loader)", "DPXE.CFG"},
	{"usb-ovmf", qemu.OVMF, "usb", "uefi usb", "DPXE.CFG"},
}

// needQEMU skips when QEMU or the firmware is missing (make test installs them).
func needQEMU(t testing.TB, fw qemu.Firmware) {
	t.Helper()
	if err := qemu.Available(fw); err != nil {
		t.Skipf("skipping: %v", err)
	}
}

// selfTestSeed is fixed per test process but differs between runs, so CI
// keeps exploring new cases; the seed is logged for reproduction.
var selfTestSeed = func() uint32 {
	if s := os.Getenv("DPXE_SELFTEST_SEED"); s != "" {
		var n uint32
		fmt.Sscan(s, &n)
		return n
	}
	return uint32(time.Now().UnixNano())
}()

// bootOptions prepares one run of path with a self-test config.
func bootOptions(t testing.TB, p bootPath, cfg appliance.BootConfig, module string) qemu.Options {
	t.Helper()
	out := outDir(t)
	o := qemu.Options{Firmware: p.fw, Timeout: 180 * time.Second}
	switch p.medium {
	case "kernel":
		o.Kernel = filepath.Join(out, image.KernelFile)
		o.Initrd = module
		if p.fw == qemu.OVMF {
			o.Config = cfg.String() // QEMU gives OVMF no -append for a Multiboot kernel
		} else {
			o.Append = cfg.String() // QEMU puts the kernel path first itself
		}
	default:
		img := filepath.Join(t.TempDir(), "usb.img")
		copyImage(t, filepath.Join(out, image.USBImageFile), img)
		raw, err := image.RenderConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := image.WriteUSBConfig(img, raw); err != nil {
			t.Fatalf("writing DPXE.CFG: %v", err)
		}
		o.Drives = []qemu.Drive{{Path: img, USB: p.medium == "usb"}}
	}
	return o
}

func copyImage(t testing.TB, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestBootPaths boots the kernel with selftest=1 on the SeaBIOS -kernel
// path, the one that carries the boot-config cases as a Multiboot module:
// the run must print the banner naming its boot source and where its
// config came from, pass the in-kernel tests (QEMU exit 33), print formula
// digests equal to the Go reference, compare every config case with Go's
// parser and the SHARD layout with its mirror. The other five paths are
// booted once per `make test` by TestSmokeUnprivileged, whose `dpxe smoke`
// checks the same banner, config line, TSC, digests and layout on each
// (and the anchor set); DPXE_BOOT_PATHS=all boots them here as well, for
// a kernel change checked without the smoke test.
func TestBootPaths(t *testing.T) {
	t.Logf("self-test seed %d (set DPXE_SELFTEST_SEED to repeat)", selfTestSeed)
	want := appliance.SelfTestDigests(selfTestSeed)
	paths := bootPaths[:1]
	if os.Getenv("DPXE_BOOT_PATHS") == "all" {
		paths = bootPaths
	}
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			needQEMU(t, p.fw)
			node := "boot-" + p.name
			cfg := appliance.BootConfig{NodeID: node, Controller: "http://10.250.0.1:8080",
				SelfTest: true, Seed: selfTestSeed, HasSeed: true}
			module, cases := "", [][]byte(nil)
			if p.name == "kernel-seabios" {
				cases = configCases(selfTestSeed)
				module = writeCaseModule(t, cases)
			}
			o := bootOptions(t, p, cfg, module)
			res, err := qemu.Run(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %s, accel %s, QEMU start to exit %v", p.name, p.medium, qemu.Accelerator(o), res.Elapsed.Round(time.Millisecond))
			fail := t.Errorf
			logSerialOnFailure(t, res)
			if !res.Passed() {
				fail("QEMU exit status %d (timed out: %v), want %d (self-test pass)", res.ExitCode, res.TimedOut, qemu.ExitPass)
			}
			if !strings.Contains(res.Serial, "boot: "+p.wantSource) {
				fail("banner does not name the boot source %q", p.wantSource)
			}
			if !strings.Contains(res.Serial, "config: from="+p.wantFrom+" node="+node+" controller=http://10.250.0.1:8080") {
				fail("config line does not show from=%s node=%s and the controller URL", p.wantFrom, node)
			}
			if !strings.Contains(res.Serial, "tsc: ") || strings.Contains(res.Serial, "tsc: 0 cycles/ms") {
				fail("TSC not calibrated")
			}
			rep, err := appliance.ParseSelfTestReport(res.Serial)
			if err != nil {
				fail("%v", err)
				return
			}
			if rep.Seed != selfTestSeed {
				fail("kernel ran seed %d, want %d", rep.Seed, selfTestSeed)
			}
			for _, f := range appliance.SelfTestFormulas {
				if got, ok := rep.Digests[f]; !ok || got != want[f] {
					fail("digest %s: kernel %016x, Go reference %016x (present: %v)", f, got, want[f], ok)
				}
			}
			if cases != nil {
				checkConfigCases(t, rep, cases, fail)
			}
			if p.name == "kernel-seabios" {
				checkLayout(t, rep, fail)
			}
		})
	}
}

// checkLayout compares the kernel's struc SHARD with appliance.ShardContext
// and the kernel's config keys with appliance.BootConfigKeys.
func checkLayout(t *testing.T, rep *appliance.SelfTestReport, fail func(string, ...any)) {
	fields, size := appliance.ShardLayout()
	if rep.Size != size {
		fail("SHARD size: kernel %d bytes, Go mirror %d", rep.Size, size)
	}
	if len(rep.Layout) != len(fields) {
		fail("SHARD has %d fields in the kernel, %d in the Go mirror", len(rep.Layout), len(fields))
	}
	for _, f := range fields {
		if off, ok := rep.Layout[f.Name]; !ok || off != f.Offset {
			fail("SHARD.%s: kernel offset %d (present %v), Go offset %d", f.Name, off, ok, f.Offset)
		}
	}
	if got, want := strings.Join(rep.CfgKeys, " "), strings.Join(appliance.BootConfigKeys(), " "); got != want {
		fail("config keys: kernel %q, Go %q", got, want)
	}
	t.Logf("128 shard contexts use %d bytes (%d each)", 128*size, size)
}

func checkConfigCases(t *testing.T, rep *appliance.SelfTestReport, cases [][]byte, fail func(string, ...any)) {
	if len(rep.CfgCases) != len(cases) {
		fail("kernel reported %d config cases, sent %d", len(rep.CfgCases), len(cases))
	}
	mismatches := 0
	for i, c := range cases {
		if i >= len(rep.CfgCases) {
			break
		}
		if want := appliance.KernelConfigVerdict(c); rep.CfgCases[i] != want {
			mismatches++
			if mismatches <= 10 {
				fail("config case %d %q: kernel %q, Go %q", i, clipCase(c), rep.CfgCases[i], want)
			}
		}
	}
	t.Logf("%d boot-config cases compared with appliance.ParseBootConfig, %d mismatches", len(cases), mismatches)
}

func clipCase(b []byte) string {
	if len(b) > 120 {
		return string(b[:120]) + "..."
	}
	return string(b)
}

// writeCaseModule frames cases for the kernel (appliance.SelfTestModule:
// "DPXECFG1", then for each case a little-endian uint32 length and the
// bytes, then the sections, if any).
func writeCaseModule(t testing.TB, cases [][]byte, sections ...appliance.ModuleSection) string {
	t.Helper()
	b, err := appliance.SelfTestModule{ConfigCases: cases, Sections: sections}.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "cfgcases.bin")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// configCases returns hand-picked boot configs around every rule of the
// parser, plus seeded mutations of a valid one.
func configCases(seed uint32) [][]byte {
	a := func(n int) string { return strings.Repeat("a", n) }
	pin := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	hand := []string{
		"", "   \t\r\n", "# only a comment\n", "kernel.bin", "kernel.bin node=a", "node=a", "node=", "=x", "=",
		"node=a node=b", "nodes=1", "NODE=a", "node=" + a(64), "node=" + a(65), "node=a.b-c_D9", "node=a/b", "node=a=b",
		"controller=http://x", "controller=http://", "controller=https://x", "controller=http:/x", "controller=http://h:0",
		"controller=http://h:1", "controller=http://h:65535", "controller=http://h:65536", "controller=http://h:",
		"controller=http://:80", "controller=http:///x", "controller=http://h:8080/api/v1", "controller=http://h:80a",
		"controller=http://h/p:x", "controller=http://[::1]:80", "controller=http://h%20~", "controller=http://h:0000000080",
		"controller=http://h:00000000080", "controller=http://h:1:2", "controller=http://" + a(193), "controller=http://" + a(194),
		"controller=http://a,http://b:8080/x", "controller=http://a,", "controller=,http://a", "controller=http://a,,http://b",
		"controller=http://a,http://b,http://c,http://d", "controller=http://a,http://b,http://c,http://d,http://e",
		"controller=http://a,https://b", "controller=http://a,http://b:0", "controller=http://a:1,http://" + a(182), "controller=http://a:1,http://" + a(183),
		"cred=" + a(15), "cred=" + a(16), "cred=" + a(128), "cred=" + a(129), "cred=abcdefgh+ijklmnop", "cred=ABCDEFGH-ijklmn_9",
		"shards=0", "shards=1", "shards=128", "shards=129", "shards=01", "shards=+1", "shards=-1", "shards=1x", "shards=99999999999",
		"total_shards=131072", "total_shards=131073", "capacity=7", "capacity=0", "selftest=0", "selftest=1", "selftest=2",
		"seed=4294967295", "seed=4294967296", "seed=0000000001", "seed=00000000001",
		"node=a\tcontroller=http://h\r\nshards=3", "node=a #comment\nshards=2", "#c\nkernel node=a", "a b", "a b=c",
		"node=a\x01", "\x7fnode=a", "node=a\x00garbage=1", "initrd=initrd node=a", "node=\xc3\xa9", "node=a \x0b",
		"node=a#b", "#x node=a\nnode=b", "node=a\n#\n#\nseed=5 seed=6", "initrd=a initrd=b",
		"node=a " + strings.Repeat(" ", 4100), "node=a #" + strings.Repeat("x", 4096-8),
		"tlsget=https://1.2.3.4/", "tlsget=https://1.2.3.4:443/api/v10/gateway,discord.com", "tlsget=https://1.2.3.4:65535/x",
		"tlsget=https://1.2.3.4:65536/x", "tlsget=https://1.2.3.4:0/", "tlsget=https://1.2.3.4:0443/", "tlsget=https://1.2.3.4:/",
		"tlsget=https://1.2.3.4:123456/", "tlsget=https://1.2.3.4", "tlsget=https://1.2.3.4:80", "tlsget=http://1.2.3.4/",
		"tlsget=https://discord.com/", "tlsget=https://01.2.3.4/", "tlsget=https://1.2.3.4/,", "tlsget=https://1.2.3.4/,a,b",
		"tlsget=https://1.2.3.4x/", "tlsget=https://1.2.3.4/" + a(1023), "tlsget=https://1.2.3.4/" + a(1024),
		"tlsget=https://1.2.3.4/," + a(253), "tlsget=https://1.2.3.4/," + a(254), "tlsget=https://1.2.3.4/a=b?c,n.test",
		"tlsget=https://discord.com/api/v10/gateway", "tlsget=https://Tls-1.test:8443/x,o.test", "tlsget=https://a..b/",
		"tlsget=https://a./", "tlsget=https://.a/", "tlsget=https://a_b/", "tlsget=https://1.2.3.4.5/", "tlsget=https://1.2.3/",
		"tlsget=https://" + a(63) + ".t/", "tlsget=https://" + a(64) + ".t/", "tlsget=https://" + strings.Repeat("a.", 125) + "abc/",
		"tlsget=https://" + strings.Repeat("a.", 126) + "ab/", "tlsget=https://:443/",
		"controller=https://x:8443/p", "controller=https://", "controller=https:/x", "controller=httpsx://a", "controller=https://h:0",
		"controller=https://h:443,http://a", "controller=https://:1", "controller=HTTPS://h", "controller=https://" + a(192), "controller=https://" + a(193),
		"controller_pin=" + pin, "controller_pin=" + pin[:63], "controller_pin=" + pin + "0", "controller_pin=" + pin[:63] + "F",
		"controller_pin=" + pin[:63] + "g", "controller_pin=" + pin[:63] + "/", "controller_pin=" + pin + " controller_pin=" + pin,
		"controller=https://10.0.0.1:8443 controller_pin=" + strings.Repeat("f", 64), "controller_pin=" + strings.Repeat("0", 64),
	}
	cases := make([][]byte, 0, 400)
	for _, h := range hand {
		cases = append(cases, []byte(h))
	}
	base := []byte("kernel.bin node=rack-7 controller=http://10.1.2.3:8080/x cred=ABCDEFGHIJKLMNOPqrstuvwx shards=16 total_shards=64 capacity=32 seed=99")
	interesting := []byte(" \t\r\n#=:/0123456789aZ._-%~\x00\x01\x7f\xff+")
	rng := rand.New(rand.NewPCG(uint64(seed), 0x5eed))
	for i := 0; i < 300; i++ {
		c := append([]byte(nil), base...)
		for m := rng.IntN(3) + 1; m > 0; m-- {
			if len(c) == 0 {
				break
			}
			pos := rng.IntN(len(c))
			switch rng.IntN(4) {
			case 0: // replace a byte
				c[pos] = interesting[rng.IntN(len(interesting))]
			case 1: // delete a byte
				c = append(c[:pos], c[pos+1:]...)
			case 2: // insert a byte
				c = append(c[:pos], append([]byte{interesting[rng.IntN(len(interesting))]}, c[pos:]...)...)
			case 3: // repeat a token
				toks := bytes.Fields(c)
				if len(toks) > 0 {
					c = append(append(c, ' '), toks[rng.IntN(len(toks))]...)
				}
			}
		}
		cases = append(cases, c)
	}
	return cases
}

// TestBadConfigHalts boots a kernel with an unknown key: it must name the
// key and byte, then halt for good instead of rebooting.
func TestBadConfigHalts(t *testing.T) {
	needQEMU(t, qemu.SeaBIOS)
	kernelPath := filepath.Join(outDir(t), image.KernelFile)
	o := qemu.Options{
		Firmware: qemu.SeaBIOS,
		Kernel:   kernelPath,
		Append:   "node=ok-1 bogus=1",
		Timeout:  60 * time.Second,
	}
	// QEMU's Multiboot command line is "<kernel path> <append>".
	wantErr := fmt.Sprintf(`config error: byte %d key "bogus": unknown key`, len(kernelPath)+1+len("node=ok-1 "))
	const halted = "This machine will not reboot."
	var sawHalt time.Time
	o.Until = func(serial string) bool {
		if sawHalt.IsZero() && strings.Contains(serial, halted) {
			sawHalt = time.Now()
		}
		// Keep watching one more second: a reboot would print a second banner.
		return !sawHalt.IsZero() && time.Since(sawHalt) > time.Second
	}
	res, err := qemu.Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(res.Serial, wantErr) {
		t.Errorf("no %q in the console:\n%s", wantErr, res.Serial)
	}
	if !strings.Contains(res.Serial, halted) {
		t.Errorf("kernel did not halt with the no-reboot message:\n%s", res.Serial)
	}
	if n := strings.Count(res.Serial, "Discord-PXE shard kernel"); n != 1 {
		t.Errorf("banner printed %d times: the machine rebooted", n)
	}
	if !res.Stopped {
		t.Errorf("QEMU ended by itself (exit %d, timed out %v): the kernel must halt and stay halted", res.ExitCode, res.TimedOut)
	}
}
