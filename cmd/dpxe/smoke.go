package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/discord-pxe/dpxe/image/smoke"
)

func init() {
	register(&command{
		name:    "smoke",
		summary: "boot the built images in QEMU on every path, no root needed (CI: docs/ci.md)",
		run:     runSmoke,
	})
}

// gatewayEmulatorName is the binary tools/cmd/gateway-emulator builds to
// (make build puts it in bin/ beside dpxe).
const gatewayEmulatorName = "gateway-emulator"

// smokeFlags are the parsed flags of `dpxe smoke`.
type smokeFlags struct {
	out, paths, junit     string
	json                  bool
	timeout               time.Duration
	jobs                  int
	seed                  uint32
	accel, kernelVersion  string
	gatewayEmulator, work string
}

func parseSmokeFlags(args []string) (smokeFlags, []smoke.Path, error) {
	var f smokeFlags
	fs := newFlagSet("smoke", "[--out DIR] [--paths LIST] [--junit FILE] [--json] [--timeout D]")
	fs.StringVar(&f.out, "out", "out", "`directory` with the artifacts of make image (dpxe build)")
	fs.StringVar(&f.paths, "paths", "all", "comma-separated `list` of paths ("+strings.Join(smoke.PathNames(), ", ")+") and groups ("+smoke.PathGroups+")")
	fs.StringVar(&f.junit, "junit", "", "also write a JUnit XML report to `file`")
	fs.BoolVar(&f.json, "json", false, "print the report as JSON on stdout (progress goes to stderr)")
	fs.DurationVar(&f.timeout, "timeout", smoke.DefaultTimeout, "time limit of each path")
	fs.IntVar(&f.jobs, "jobs", 0, "paths booted at once (default one per CPU)")
	seed := fs.String("seed", "", "seed of the differential self-tests (default: a new one each run, printed)")
	fs.StringVar(&f.accel, "accel", smoke.AccelAuto, "accelerator: auto (KVM on bare metal when /dev/kvm works, else TCG), tcg or kvm")
	fs.StringVar(&f.kernelVersion, "kernel-version", "", "fail unless the manifest and every banner show this kernel `version`")
	fs.StringVar(&f.gatewayEmulator, "gateway-emulator", "", "gateway-emulator `binary` for the netboot paths (default: beside dpxe, bin/, then $PATH)")
	fs.StringVar(&f.work, "work-dir", "", "`directory` for the run's temporary files (default $TMPDIR)")
	if err := parseFlags(fs, args); err != nil {
		return f, nil, err
	}
	if fs.NArg() != 0 {
		return f, nil, fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	paths, err := smoke.ParsePaths(f.paths)
	if err != nil {
		return f, nil, fmt.Errorf("%w: --paths: %v", errUsage, err)
	}
	switch {
	case f.timeout <= 0:
		return f, nil, fmt.Errorf("%w: --timeout must be positive", errUsage)
	case f.jobs < 0:
		return f, nil, fmt.Errorf("%w: --jobs must not be negative", errUsage)
	}
	switch f.accel {
	case smoke.AccelAuto, smoke.AccelTCG, smoke.AccelKVM:
	default:
		return f, nil, fmt.Errorf("%w: --accel %q: want auto, tcg or kvm", errUsage, f.accel)
	}
	if *seed == "" {
		f.seed = rand.Uint32()
	} else {
		n, err := strconv.ParseUint(*seed, 10, 32)
		if err != nil {
			return f, nil, fmt.Errorf("%w: --seed %q: want 0..4294967295", errUsage, *seed)
		}
		f.seed = uint32(n)
	}
	return f, paths, nil
}

// findGatewayEmulator returns the gateway-emulator binary to run: the
// flag's, else the first of: beside the dpxe executable, bin/ in the
// working directory (make build), $PATH. It returns "" when there is none.
func findGatewayEmulator(flagValue, self string) string {
	if flagValue != "" {
		return flagValue
	}
	cands := []string{filepath.Join("bin", gatewayEmulatorName)}
	if self != "" {
		cands = append([]string{filepath.Join(filepath.Dir(self), gatewayEmulatorName)}, cands...)
	}
	for _, c := range cands {
		if st, err := os.Stat(c); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			if abs, err := filepath.Abs(c); err == nil {
				return abs
			}
			return c
		}
	}
	if p, err := exec.LookPath(gatewayEmulatorName); err == nil {
		return p
	}
	return ""
}

// runSmoke implements `dpxe smoke`: it boots the artifacts on the chosen
// paths and prints one line per path as each ends, then a summary; the
// exit status is 0 only when every path passed.
func runSmoke(ctx context.Context, args []string) error {
	f, paths, err := parseSmokeFlags(args)
	if err != nil {
		return err
	}
	return smokeMain(ctx, f, paths, os.Stdout, os.Stderr)
}

func smokeMain(ctx context.Context, f smokeFlags, paths []smoke.Path, stdout, stderr io.Writer) error {
	self, _ := os.Executable()
	progress := stdout
	if f.json {
		progress = stderr
	}
	fmt.Fprintf(progress, "dpxe smoke: %d paths from %s, %s per path, seed %d\n", len(paths), f.out, f.timeout, f.seed)
	var mu sync.Mutex
	rep, err := smoke.Run(ctx, smoke.Options{
		Out: f.out, Paths: paths, Timeout: f.timeout, Jobs: f.jobs, Seed: f.seed, Accel: f.accel,
		KernelVersion: f.kernelVersion, DPXE: self, GatewayEmulator: findGatewayEmulator(f.gatewayEmulator, self),
		WorkDir: f.work,
		OnResult: func(res smoke.Result) {
			mu.Lock()
			defer mu.Unlock()
			res.WriteText(progress)
		},
	})
	if err != nil {
		return err
	}
	fmt.Fprintln(progress, rep.Summary())
	if f.junit != "" {
		if err := writeFileWith(f.junit, rep.WriteJUnit); err != nil {
			return fmt.Errorf("--junit: %w", err)
		}
	}
	if f.json {
		if err := rep.WriteJSON(stdout); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if !rep.Passed() {
		_, failed, errs := rep.Counts()
		return fmt.Errorf("%d of %d paths failed, %d could not run", failed, len(rep.Results), errs)
	}
	return nil
}

// writeFileWith writes a file through write, replacing it only when write
// succeeded.
func writeFileWith(name string, write func(io.Writer) error) error {
	tmp := name + ".tmp"
	fh, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if err := write(fh); err != nil {
		fh.Close()
		os.Remove(tmp)
		return err
	}
	if err := fh.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, name)
}
