package smoke

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/image/qemu"
)

// fakeQEMU puts a qemu-system-x86_64 first in PATH that records its
// arguments in dir/args-N, prints console (a file) on its serial port
// (stdout) and exits with status exit.
func fakeQEMU(t *testing.T, console string, exit int) string {
	t.Helper()
	dir := t.TempDir()
	script := fmt.Sprintf("#!/bin/sh\nprintf '%%s\\n' \"$@\" > %s/args-$$\ncat %s\nexit %d\n", dir, console, exit)
	if err := os.WriteFile(filepath.Join(dir, "qemu-system-x86_64"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	return dir
}

// recordedArgs returns the argument lists the fake QEMU was called with.
func recordedArgs(t *testing.T, dir string) [][]string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "args-*"))
	var out [][]string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, strings.Split(strings.TrimSpace(string(b)), "\n"))
	}
	return out
}

func TestRunSelfTestPaths(t *testing.T) {
	out := builtFixture(t)
	ref := newReference(testSeed)
	// Both SeaBIOS paths print the same console here; the fake cannot
	// tell them apart, so the disk path is expected to fail its boot
	// source and config checks, which shows they are read per path.
	p := Paths[0]
	console := filepath.Join(t.TempDir(), "console")
	m, err := readManifest(out)
	if err != nil {
		t.Fatal(err)
	}
	serial := strings.Replace(selfTestConsole(p, "smoke-kernel-seabios", ref), "0.1.0", "0.0.1-fixture", 1)
	serial = strings.Replace(serial, "config: ", fmt.Sprintf("tls: anchors=%d sha256=%s\r\nconfig: ", len(m.Trust.Anchors), m.Trust.SHA256), 1)
	os.WriteFile(console, []byte(serial), 0o644)
	dir := fakeQEMU(t, console, qemu.ExitPass)
	paths, _ := ParsePaths("kernel-seabios,disk-seabios")
	var mu sync.Mutex
	var seen []string
	r, err := Run(context.Background(), Options{Out: out, Paths: paths, Seed: testSeed, Accel: AccelTCG, Jobs: 2, WorkDir: t.TempDir(),
		OnResult: func(res Result) { mu.Lock(); seen = append(seen, res.Path); mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Results) != 2 || len(seen) != 2 || r.KernelVersion != "0.0.1-fixture" || r.Jobs != 2 {
		t.Fatalf("report %+v, OnResult saw %v", r, seen)
	}
	k, d := r.Results[0], r.Results[1]
	if k.Path != "kernel-seabios" || k.Status != Pass || k.Accel != "tcg" || k.Awaited != lineSelfTestPass || k.Tail != nil {
		t.Errorf("kernel-seabios: %+v", k)
	}
	if d.Path != "disk-seabios" || d.Status != Fail || !strings.Contains(d.Reason, `boot source: "bios multiboot (QEMU -kernel) loader=x", want "bios disk (dpxe MBR loader)"`) || len(d.Tail) == 0 {
		t.Errorf("disk-seabios: %+v", d)
	}
	args := recordedArgs(t, dir)
	if len(args) != 2 {
		t.Fatalf("QEMU ran %d times", len(args))
	}
	var sawKernel, sawDisk bool
	for _, a := range args {
		joined := strings.Join(a, " ")
		if strings.Contains(joined, "-kernel "+filepath.Join(out, "kernel.bin")) {
			sawKernel = strings.Contains(joined, fmt.Sprintf("-append node=smoke-kernel-seabios selftest=1 seed=%d", testSeed))
		}
		if strings.Contains(joined, "ide-hd,drive=d0") {
			sawDisk = strings.Contains(joined, "usb.img,snapshot=on") && !strings.Contains(joined, out)
		}
	}
	if !sawKernel || !sawDisk {
		t.Errorf("QEMU arguments (kernel with the smoke config %v, disk from a private snapshot copy %v):\n%q", sawKernel, sawDisk, args)
	}
	if r.Passed() {
		t.Error("report passed with a failed path")
	}
}

func TestRunHaltedKernel(t *testing.T) {
	out := builtFixture(t)
	console := filepath.Join(t.TempDir(), "console")
	// A kernel that halts prints and then never exits: the fake sleeps.
	os.WriteFile(console, []byte("\r\nDiscord-PXE shard kernel 0.0.1-fixture\r\nboot: bios multiboot (QEMU -kernel)\r\nconfig error: byte 3 key \"x\": unknown key\r\nhalted: fix the node config. This machine will not reboot.\r\n"), 0o644)
	dir := t.TempDir()
	script := fmt.Sprintf("#!/bin/sh\ncat %s\nexec sleep 30\n", console)
	os.WriteFile(filepath.Join(dir, "qemu-system-x86_64"), []byte(script), 0o755)
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	paths, _ := ParsePaths("kernel-seabios")
	start := time.Now()
	r, err := Run(context.Background(), Options{Out: out, Paths: paths, Seed: 1, Accel: AccelTCG, Timeout: 20 * time.Second, WorkDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	res := r.Results[0]
	if res.Status != Fail || !strings.Contains(res.Reason, `the kernel halted: config error: byte 3 key "x": unknown key`) {
		t.Errorf("halted kernel: %s %q", res.Status, res.Reason)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("a halted kernel took %v to fail: smoke must stop at the halt line, not wait for the timeout", d)
	}
}

func TestRunWithoutPeersOrPackages(t *testing.T) {
	out := builtFixture(t)
	// No QEMU at all: every path says which package to install.
	t.Setenv("PATH", t.TempDir())
	r, err := Run(context.Background(), Options{Out: out, Paths: Paths, Seed: 1, WorkDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	for _, res := range r.Results {
		if res.Status != Error || !strings.Contains(res.Reason, "apt-get install qemu-system-x86") {
			t.Errorf("%s without QEMU: %s %q", res.Path, res.Status, res.Reason)
		}
	}
	if _, err := Run(context.Background(), Options{Out: out}); err == nil {
		t.Error("Run without paths")
	}
	if _, err := Run(context.Background(), Options{Out: out, Paths: Paths, Accel: "hvf"}); err == nil {
		t.Error("Run with accelerator hvf")
	}
}

func TestRunNetbootNeedsEmulator(t *testing.T) {
	if qemu.Available(qemu.SeaBIOS) != nil {
		t.Skip("no QEMU")
	}
	if _, err := os.Stat(ROMBIOS); err != nil {
		t.Skip("no iPXE ROM")
	}
	paths, _ := ParsePaths("netboot-seabios")
	r, err := Run(context.Background(), Options{Out: builtFixture(t), Paths: paths, DPXE: "/bin/true", WorkDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if res := r.Results[0]; res.Status != Error || !strings.Contains(res.Reason, "no gateway-emulator binary (build it with `make build`") {
		t.Errorf("netboot without the emulator: %s %q", res.Status, res.Reason)
	}
}
