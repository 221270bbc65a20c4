// Package smoke proves that the artifacts of `make image` boot: it boots
// kernel.bin and usb.img in QEMU on every firmware path with the kernel's
// self-tests and compares the kernel's differential digests with the Go
// reference in appliance, and it network-boots the kernel through QEMU's
// user-mode network (its DHCP and TFTP) into a `dpxe serve` and a Gateway
// emulator on loopback until a shard is READY. It needs no root, no
// /dev/net/tun, no namespaces and no /dev/kvm: only what Debian's
// qemu-system-x86 and ovmf packages install. `dpxe smoke` is its command
// line; docs/ci.md shows it in CI.
package smoke

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/image/qemu"
)

// Defaults of Options.
const (
	DefaultTimeout = 2 * time.Minute
	DefaultMemory  = 256 // MiB per guest
)

// Accelerator choices of Options.Accel.
const (
	// AccelAuto uses KVM when /dev/kvm works and this machine is not
	// itself a virtual machine, else TCG; a KVM boot that QEMU ends with
	// "KVM internal error" is repeated under TCG. Nested KVM, what CI
	// runners offer, is where this project measured OVMF stopping with
	// emulation failures and the serial console running 80 times slower
	// than under TCG (image/qemu).
	AccelAuto = "auto"
	AccelTCG  = "tcg"
	AccelKVM  = "kvm"
)

// Options configure Run. Out and Paths are required.
type Options struct {
	// Out is the output directory of `make image` (dpxe build).
	Out string
	// Paths are the paths to boot, normally from ParsePaths.
	Paths []Path
	// Timeout bounds each path, from its start to its verdict; 0 means
	// DefaultTimeout.
	Timeout time.Duration
	// Jobs is how many paths boot at once; 0 means one per CPU.
	Jobs int
	// Seed is the seed of the differential self-tests.
	Seed uint32
	// Accel is AccelAuto (the default when empty), AccelTCG or AccelKVM.
	Accel string
	// KernelVersion, when set, is the kernel version the manifest and
	// every banner must show (a pinned version, docs/ci.md).
	KernelVersion string
	// DPXE is the dpxe binary the netboot paths run `dpxe serve` from.
	DPXE string
	// GatewayEmulator is the gateway-emulator binary the netboot paths
	// run (tools/cmd/gateway-emulator).
	GatewayEmulator string
	// WorkDir holds each run's files (a usb.img copy, the fleets' files,
	// TFTP roots); default os.TempDir(). Run removes what it made.
	WorkDir string
	// OnResult, when set, receives each path's result as it ends. Calls
	// do not overlap.
	OnResult func(Result)
}

// Result is one path's verdict.
type Result struct {
	Path     string
	Firmware string
	Medium   Medium
	Status   Status
	// Reason says why the path did not pass, in one line.
	Reason string
	// Awaited is the console line the path waited for, and ToLine the time
	// from QEMU's start until it arrived (0 when it did not).
	Awaited string
	ToLine  time.Duration
	// Elapsed is the path's whole wall time, set-up included.
	Elapsed time.Duration
	Accel   string
	Checks  []Check
	// Serial is the whole serial console.
	Serial string
	// Tail is the console's last lines when the path did not pass, and
	// Log the netboot peers' last log lines.
	Tail []string
	Log  []string
}

// TailLines is how many console lines a failed path reports.
const TailLines = 20

// Report is what Run found.
type Report struct {
	Out           string
	KernelVersion string
	Seed          uint32
	Started       time.Time
	Elapsed       time.Duration
	Jobs          int
	Results       []Result
}

// Passed reports whether every path passed.
func (r *Report) Passed() bool {
	for _, res := range r.Results {
		if res.Status != Pass {
			return false
		}
	}
	return len(r.Results) > 0
}

// Counts returns how many paths passed, failed and could not run.
func (r *Report) Counts() (pass, fail, errs int) {
	for _, res := range r.Results {
		switch res.Status {
		case Pass:
			pass++
		case Fail:
			fail++
		default:
			errs++
		}
	}
	return
}

// Run boots every path of o and returns the report. It returns an error
// only for unusable options; everything a path meets is in its Result.
func Run(ctx context.Context, o Options) (*Report, error) {
	if o.Out == "" || len(o.Paths) == 0 {
		return nil, errors.New("smoke: Out and Paths are required")
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Jobs <= 0 {
		o.Jobs = runtime.NumCPU()
	}
	o.Jobs = min(o.Jobs, len(o.Paths))
	switch o.Accel {
	case "":
		o.Accel = AccelAuto
	case AccelAuto, AccelTCG, AccelKVM:
	default:
		return nil, fmt.Errorf("smoke: accelerator %q: want auto, tcg or kvm", o.Accel)
	}
	work, err := os.MkdirTemp(o.WorkDir, "dpxe-smoke-")
	if err != nil {
		return nil, fmt.Errorf("smoke: work directory: %w", err)
	}
	defer os.RemoveAll(work)

	r := &Report{Out: o.Out, Seed: o.Seed, Started: time.Now(), Jobs: o.Jobs, Results: make([]Result, len(o.Paths))}
	s := &run{o: &o, work: work, art: loadArtifacts(o.Out, o.KernelVersion)}
	r.KernelVersion = s.art.version
	if needsSelfTest(o.Paths) {
		s.ref = newReference(o.Seed)
	}
	sem := make(chan struct{}, o.Jobs)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i, p := range o.Paths {
		sem <- struct{}{} // paths start in order, Jobs at a time
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			res := s.path(ctx, p)
			mu.Lock()
			defer mu.Unlock()
			r.Results[i] = res
			if o.OnResult != nil {
				o.OnResult(res)
			}
		}()
	}
	wg.Wait()
	r.Elapsed = time.Since(r.Started)
	return r, nil
}

func needsSelfTest(ps []Path) bool {
	for _, p := range ps {
		if p.Medium != MediumNetboot {
			return true
		}
	}
	return false
}

// run is one Run's shared state.
type run struct {
	o    *Options
	work string
	art  *artifacts
	ref  *reference
}

// path runs one path and fills in its result.
func (s *run) path(ctx context.Context, p Path) Result {
	start := time.Now()
	res := Result{Path: p.Name, Firmware: p.Firmware.String(), Medium: p.Medium}
	if p.Medium == MediumNetboot {
		res.Awaited = lineReady
		s.netboot(ctx, p, &res)
	} else {
		res.Awaited = lineSelfTestPass
		s.selfTest(ctx, p, &res)
	}
	res.Elapsed = time.Since(start)
	res.Status, res.Reason = verdict(res.Checks)
	res.Reason = strings.ReplaceAll(res.Reason, "\n", "; ")
	if res.Status == Pass {
		res.Log = nil
	} else {
		res.Tail = Tail(res.Serial, TailLines)
	}
	return res
}

// fail records a check that ends the path before or without a verdict of
// the boot itself.
func (res *Result) fail(name string, st Status, err error) {
	res.Checks = append(res.Checks, Check{name, st, err.Error()})
}

// need checks that QEMU and the path's firmware are installed.
func need(p Path, res *Result) bool {
	if err := qemu.Available(p.Firmware); err != nil {
		res.fail("packages", Error, err)
		return false
	}
	return true
}

// accel is the accelerator a path boots with first.
func (s *run) accel() string {
	switch s.o.Accel {
	case AccelKVM:
		return AccelKVM
	case AccelAuto:
		if qemu.KVMUsable() && !nestedVM() {
			return AccelKVM
		}
	}
	return AccelTCG
}

// nestedVM reports whether this machine is itself a guest (the CPU's
// hypervisor flag), where KVM is nested.
func nestedVM() bool {
	b, err := os.ReadFile("/proc/cpuinfo")
	return err != nil || strings.Contains(string(b), " hypervisor")
}

// boot runs QEMU for a path with o (Accel set by boot), falling back from
// KVM to TCG once under AccelAuto when QEMU reports a KVM internal error.
// halted reports whether the kernel stopped for good.
func (s *run) boot(ctx context.Context, o qemu.Options, con func() *console, res *Result) (*qemu.Result, *console, bool, error) {
	o.Accel = s.accel()
	until := o.Until
	for {
		c := con()
		o.Serial = c
		var halted atomic.Bool
		o.Until = func(serial string) bool {
			if strings.Contains(serial, "\n"+lineHalted) {
				halted.Store(true)
				return true
			}
			return until != nil && until(serial)
		}
		qr, err := qemu.Run(ctx, o)
		res.Accel = o.Accel
		if err == nil && o.Accel == AccelKVM && s.o.Accel == AccelAuto && strings.Contains(qr.Stderr, "KVM internal error") {
			res.Checks = append(res.Checks, Check{"accel", NotApplicable, "KVM failed (KVM internal error); booted again under TCG"})
			o.Accel = AccelTCG
			continue
		}
		return qr, c, halted.Load(), err
	}
}

// selfTest boots a kernel, disk or USB path with selftest=1.
func (s *run) selfTest(ctx context.Context, p Path, res *Result) {
	if !need(p, res) {
		return
	}
	art := s.art
	o := qemu.Options{Firmware: p.Firmware, Timeout: s.o.Timeout, Memory: DefaultMemory}
	var node string
	switch p.Medium {
	case MediumKernel:
		if art.kernelErr != nil {
			res.fail("artifacts", Fail, art.kernelErr)
			return
		}
		node = "smoke-" + p.Name
		cfg := appliance.BootConfig{NodeID: node, SelfTest: true, Seed: s.o.Seed, HasSeed: true}
		o.Kernel = art.file(image.KernelFile)
		if p.Firmware == qemu.OVMF {
			o.Config = cfg.String() // QEMU gives OVMF no -append for a Multiboot kernel
		} else {
			o.Append = cfg.String()
		}
	default:
		if art.usbErr != nil {
			res.fail("artifacts", Fail, art.usbErr)
			return
		}
		img, err := art.usbCopy(s.work, s.o.Seed)
		if err != nil {
			res.fail("artifacts", Error, err)
			return
		}
		node = art.smokeConfig(s.o.Seed).NodeID
		o.Drives = []qemu.Drive{{Path: img, USB: p.Medium == MediumUSB, Snapshot: true}}
	}
	start := time.Now()
	qr, con, halted, err := s.boot(ctx, o, func() *console { start = time.Now(); return newConsole(start) }, res)
	if err != nil {
		res.fail("qemu", Error, err)
		return
	}
	res.Serial = qr.Serial
	if at, ok := con.At(lineSelfTestPass); ok {
		res.ToLine = at
	}
	res.Checks = append(res.Checks, checkSelfTest(endOf(qr, halted, s.o.Timeout, res.Accel), expect{path: p, version: art.version, node: node, trust: art.manifest.Trust}, s.ref)...)
	if qr.Stderr != "" && !qr.Passed() {
		res.Log = Tail(qr.Stderr, 5)
	}
}

// workDir makes a directory for one path inside the run's work directory.
func (s *run) workDir(p Path) (string, error) {
	d := filepath.Join(s.work, p.Name)
	return d, os.MkdirAll(d, 0o700)
}
