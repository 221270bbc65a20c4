// Package qemu runs the shard kernel and boot images in QEMU: it finds the
// firmware, builds the command line for each boot path, captures the serial
// console, and maps the isa-debug-exit status. `dpxe smoke` (image/smoke)
// boots operators' images with it; the end-to-end tests and the lab boot
// theirs.
//
// Everything it needs comes from Debian's qemu-system-x86 and ovmf
// packages; it never needs root, /dev/net/tun or /dev/kvm.
package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Firmware selects the machine's firmware.
type Firmware int

const (
	// SeaBIOS is QEMU's default legacy BIOS.
	SeaBIOS Firmware = iota
	// OVMF is UEFI (EDK2) from Debian's ovmf package.
	OVMF
)

func (f Firmware) String() string {
	if f == OVMF {
		return "ovmf"
	}
	return "seabios"
}

// Debian's OVMF build (package ovmf). The code image is read-only; each run
// gets a private copy of the variable store.
const (
	ovmfCode = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	ovmfVars = "/usr/share/OVMF/OVMF_VARS_4M.fd"
)

// isa-debug-exit: the kernel writes a byte v to this port and QEMU exits
// with status (v << 1) | 1. The kernel writes 0x10 for pass, 0x11 for fail.
const (
	DebugExitPort = 0xf4
	ExitPass      = 0x10<<1 | 1 // 33
	ExitFail      = 0x11<<1 | 1 // 35
)

// Drive is a disk attached to the machine.
type Drive struct {
	Path string
	// USB attaches the disk as a USB mass-storage device on an xHCI
	// controller instead of an IDE/SATA disk.
	USB bool
	// Snapshot keeps the image unmodified (writes go to a temporary overlay).
	Snapshot bool
}

// Options describe one QEMU run.
type Options struct {
	Firmware Firmware
	Kernel   string // -kernel file (QEMU's multiboot loader on SeaBIOS, OVMF's loader on UEFI)
	Append   string // -append command line for Kernel
	Drives   []Drive
	// Net is passed through as extra -netdev/-device arguments.
	Net []string
	// Memory in MiB; 0 means 256.
	Memory int
	// Timeout bounds the whole run; 0 means 60 s.
	Timeout time.Duration
	// Serial, when set, also receives the serial console as it arrives.
	Serial io.Writer
	// Extra arguments appended last.
	Extra []string
	// Initrd is passed as -initrd: a Multiboot module on SeaBIOS.
	Initrd string
	// Config is handed to the kernel as the fw_cfg file
	// opt/org.discord-pxe/config: the only way to give a config to
	// `-kernel kernel.bin` under OVMF, since QEMU keeps a Multiboot
	// kernel's -append text inside its Multiboot info blob.
	Config string
	// Until, when set, is called with the serial output so far whenever
	// more arrives and every 100 ms; returning true stops QEMU (the run is
	// then not a timeout). Tests use it to end runs that halt on purpose.
	Until func(serial string) bool
	// NoKVM forces TCG even when /dev/kvm works.
	NoKVM bool
	// Accel chooses the accelerator: "" is the default policy (see
	// Accelerator), "tcg" forces TCG and "kvm" forces KVM (Run fails with
	// ErrNoKVM when /dev/kvm is unusable).
	Accel string
	// Wrapper runs QEMU through another command, e.g. ["ip","netns","exec","ns"].
	Wrapper []string
}

// Result is what a run produced.
type Result struct {
	Serial   string        // everything the guest wrote to COM1
	ExitCode int           // QEMU's exit status (-1 when killed on timeout)
	TimedOut bool          // the run hit Options.Timeout or the context ended
	Stopped  bool          // Options.Until ended the run
	Elapsed  time.Duration // from start to exit
	Args     []string      // the command line used
	Stderr   string        // QEMU's own messages
}

// Passed reports whether the guest signalled success through isa-debug-exit.
func (r *Result) Passed() bool { return r.ExitCode == ExitPass }

// ErrNoQEMU means qemu-system-x86_64 is not installed.
var ErrNoQEMU = errors.New("qemu-system-x86_64 not found (apt-get install qemu-system-x86)")

// ErrNoOVMF means the OVMF firmware files are missing.
var ErrNoOVMF = errors.New("OVMF firmware not found in /usr/share/OVMF (apt-get install ovmf)")

// ErrNoKVM means Options.Accel asks for KVM and /dev/kvm cannot be opened.
var ErrNoKVM = errors.New("KVM asked for but /dev/kvm cannot be opened for reading and writing")

var (
	kvmOnce sync.Once
	kvmOK   bool
)

// KVMUsable reports whether /dev/kvm can be opened for reading and writing.
func KVMUsable() bool {
	kvmOnce.Do(func() {
		f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
		if err == nil {
			f.Close()
			kvmOK = true
		}
	})
	return kvmOK
}

// useKVM decides the accelerator: TCG unless DPXE_KVM=1 and /dev/kvm
// works. Measured on this project's machines, which run KVM nested: OVMF
// stops early with "KVM internal error ... emulation failure", and every
// port I/O the kernel does (the serial console) is a slow nested exit, so
// the SeaBIOS self-test run takes 25 s under KVM against 0.3 s under TCG.
func useKVM(o Options) bool {
	switch o.Accel {
	case "kvm":
		return true
	case "tcg":
		return false
	}
	return !o.NoKVM && os.Getenv("DPXE_KVM") == "1" && KVMUsable()
}

// Accelerator names the accelerator a run with o would use: Options.Accel
// when set, else TCG unless DPXE_KVM=1 and /dev/kvm works.
func Accelerator(o Options) string {
	if useKVM(o) {
		return "kvm"
	}
	return "tcg"
}

// Available returns nil when QEMU (and, for OVMF, the firmware) can run.
func Available(fw Firmware) error {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		return ErrNoQEMU
	}
	if fw == OVMF {
		if _, err := os.Stat(ovmfCode); err != nil {
			return ErrNoOVMF
		}
	}
	return nil
}

// Args builds the QEMU command line for o. workDir holds per-run files
// (the OVMF variable store copy).
func Args(o Options, workDir string) ([]string, error) {
	mem := o.Memory
	if mem == 0 {
		mem = 256
	}
	args := []string{
		"-machine", "q35",
		"-m", fmt.Sprint(mem),
		"-display", "none",
		"-vga", "none",
		"-no-reboot", // a triple fault ends the run instead of looping
		"-serial", "stdio",
		"-monitor", "none",
		"-device", fmt.Sprintf("isa-debug-exit,iobase=0x%x,iosize=0x04", DebugExitPort),
	}
	if useKVM(o) {
		args = append(args, "-accel", "kvm", "-cpu", "host")
	} else {
		// The baseline x86-64 model (SSE2, no SSE4.2/POPCNT/AVX): the
		// kernel must run on the old PCs it is made for, and an
		// instruction they lack must fail here, not in a rack.
		args = append(args, "-accel", "tcg", "-cpu", "qemu64")
	}
	if o.Firmware == OVMF {
		vars := filepath.Join(workDir, "OVMF_VARS.fd")
		b, err := os.ReadFile(ovmfVars)
		if err != nil {
			return nil, ErrNoOVMF
		}
		if err := os.WriteFile(vars, b, 0o644); err != nil {
			return nil, err
		}
		args = append(args,
			"-drive", "if=pflash,format=raw,unit=0,readonly=on,file="+optValue(ovmfCode),
			"-drive", "if=pflash,format=raw,unit=1,file="+optValue(vars))
	}
	if o.Kernel != "" {
		args = append(args, "-kernel", o.Kernel)
		if o.Append != "" {
			args = append(args, "-append", o.Append)
		}
		if o.Initrd != "" {
			args = append(args, "-initrd", o.Initrd)
		}
	}
	if o.Config != "" {
		if strings.Contains(o.Config, ",") {
			return nil, fmt.Errorf("qemu: fw_cfg config must not contain a comma")
		}
		args = append(args, "-fw_cfg", "name=opt/org.discord-pxe/config,string="+o.Config)
	}
	usb := false
	for i, d := range o.Drives {
		id := fmt.Sprintf("d%d", i)
		snap := ""
		if d.Snapshot {
			snap = ",snapshot=on"
		}
		if d.USB {
			if !usb {
				args = append(args, "-device", "qemu-xhci,id=xhci")
				usb = true
			}
			args = append(args,
				"-drive", fmt.Sprintf("if=none,id=%s,format=raw,file=%s%s", id, optValue(d.Path), snap),
				"-device", fmt.Sprintf("usb-storage,bus=xhci.0,drive=%s,bootindex=%d", id, i))
		} else {
			args = append(args,
				"-drive", fmt.Sprintf("if=none,id=%s,format=raw,file=%s%s", id, optValue(d.Path), snap),
				"-device", fmt.Sprintf("ide-hd,drive=%s,bootindex=%d", id, i))
		}
	}
	if len(o.Net) == 0 {
		args = append(args, "-nic", "none")
	}
	args = append(args, o.Net...)
	args = append(args, o.Extra...)
	return args, nil
}

// optValue escapes a value inside a QEMU option list, where ',' separates
// options and ",," stands for a comma.
func optValue(v string) string { return strings.ReplaceAll(v, ",", ",,") }

// Run boots the machine described by o and waits until QEMU exits, the
// timeout passes, or ctx ends. The serial console is returned in full.
func Run(ctx context.Context, o Options) (*Result, error) {
	if err := Available(o.Firmware); err != nil {
		return nil, err
	}
	switch o.Accel {
	case "", "tcg":
	case "kvm":
		if !KVMUsable() {
			return nil, ErrNoKVM
		}
	default:
		return nil, fmt.Errorf("qemu: accelerator %q: want tcg or kvm", o.Accel)
	}
	work, err := os.MkdirTemp("", "dpxe-qemu-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	args, err := Args(o, work)
	if err != nil {
		return nil, err
	}
	timeout := o.Timeout
	if timeout == 0 {
		timeout = 60 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	argv := append(append([]string{}, o.Wrapper...), "qemu-system-x86_64")
	argv = append(argv, args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.WaitDelay = 2 * time.Second
	var serial bytes.Buffer
	var mu sync.Mutex
	stopped := false
	w := io.Writer(&lockedWriter{mu: &mu, w: &serial, after: func(b *bytes.Buffer) {
		if o.Until != nil && !stopped && o.Until(b.String()) {
			stopped = true
			cancel()
		}
	}})
	if o.Serial != nil {
		w = io.MultiWriter(w, o.Serial)
	}
	cmd.Stdout = w
	if o.Until != nil { // also ask Until while the guest is silent
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
					mu.Lock()
					if !stopped && o.Until(serial.String()) {
						stopped = true
						cancel()
					}
					mu.Unlock()
				}
			}
		}()
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	err = cmd.Run()
	res := &Result{Elapsed: time.Since(start), Args: argv, Stderr: stderr.String()}
	mu.Lock()
	res.Serial = serial.String()
	wasStopped := stopped
	mu.Unlock()
	if wasStopped {
		res.Stopped = true
		res.ExitCode = -1
		return res, nil
	}
	if ctx.Err() != nil {
		res.TimedOut = true
		res.ExitCode = -1
		return res, nil
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
		res.ExitCode = 0
	case errors.As(err, &ee):
		res.ExitCode = ee.ExitCode()
	default:
		return res, fmt.Errorf("qemu: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	if res.ExitCode != ExitPass && res.ExitCode != ExitFail && stderr.Len() > 0 {
		res.Serial += "\n[qemu stderr] " + stderr.String()
	}
	return res, nil
}

// lockedWriter collects the serial console and runs after (under the lock)
// once each chunk is stored.
type lockedWriter struct {
	mu    *sync.Mutex
	w     *bytes.Buffer
	after func(*bytes.Buffer)
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, err := l.w.Write(p)
	if l.after != nil {
		l.after(l.w)
	}
	return n, err
}
