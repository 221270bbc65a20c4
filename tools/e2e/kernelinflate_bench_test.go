package e2e

// Issue #18's inflate benchmark, run only with DPXE_BENCH=1 (make bench):
// the kernel's inflate against Go's compress/zlib (and compress/flate) in
// a Linux guest, on the same stream (appliance.InflateCorpus's large case:
// 4 MiB of Discord-like JSON at zlib level 6) and the same QEMU CPU model
// (qemu64 under TCG). Both sides inflate the whole stream five times from
// memory into 32 KiB output rooms and time each pass with their own clock
// (the kernel its calibrated TSC, Go time.Now), leaving out setting the
// decoder up; each reports its median pass. The Linux guest is Debian's
// kernel with a u-root initramfs this file builds, holding a static Go
// program and the stream; no network is involved.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/image/qemu"
)

const (
	inflateBenchSeed    = 1   // the corpus seed of the stream (fixed: the initramfs is cached)
	inflateBenchMemory  = 512 // MiB for both guests
	inflateBenchTimeout = 6 * time.Minute
)

// inflateBenchProgram is the Go side, built static for the Linux guest:
// five timed passes each of compress/zlib over the stream and of
// compress/flate over its DEFLATE part, 32 KiB reads.
const inflateBenchProgram = `package main

import (
	"bytes"
	"compress/flate"
	"compress/zlib"
	"fmt"
	"io"
	"os"
	"sort"
	"time"
)

func main() {
	stream, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Println("dpxe-inflate: error", err)
		return
	}
	buf := make([]byte, 32768)
	for _, kind := range []string{"zlib", "flate"} {
		var ns []int64
		var out int64
		for pass := 0; pass < 5; pass++ {
			var r io.Reader
			if kind == "zlib" {
				zr, err := zlib.NewReader(bytes.NewReader(stream))
				if err != nil {
					fmt.Println("dpxe-inflate: error", err)
					return
				}
				r = zr
			} else {
				r = flate.NewReader(bytes.NewReader(stream[2 : len(stream)-4]))
			}
			out = 0
			start := time.Now()
			for {
				n, err := r.Read(buf)
				out += int64(n)
				if err == io.EOF {
					break
				}
				if err != nil {
					fmt.Println("dpxe-inflate: error", err)
					return
				}
			}
			ns = append(ns, time.Since(start).Nanoseconds())
		}
		sort.Slice(ns, func(i, j int) bool { return ns[i] < ns[j] })
		rate := func(t int64) float64 { return float64(out) * 1e3 / float64(t) }
		fmt.Printf("dpxe-inflate: %s out=%d passes=%d ns=%d MBps=%.2f best=%.2f\n", kind, out, len(ns), ns[len(ns)/2], rate(ns[len(ns)/2]), rate(ns[0]))
	}
	fmt.Println("dpxe-inflate: done")
}
`

// inflateBenchLinux builds, or reuses from $DPXE_OUT/bench/linux-inflate,
// the initramfs: u-root (init, gosh, poweroff) with the program and the
// stream. It returns Debian's vmlinuz and the cpio.
func inflateBenchLinux(b *testing.B, stream []byte) (string, string) {
	kernels, _ := filepath.Glob("/boot/vmlinuz-*-amd64")
	if len(kernels) == 0 {
		b.Skip("no Debian kernel in /boot (tools/scripts/deps.sh bench installs linux-image-amd64)")
	}
	sort.Strings(kernels)
	vmlinuz := kernels[len(kernels)-1]
	release := strings.TrimPrefix(filepath.Base(vmlinuz), "vmlinuz-")
	script := "echo dpxe-inflate: start\n/inflatebench /stream.z\npoweroff\n"
	h := sha256.New()
	for _, part := range []string{tcpBenchURoot, release, script, inflateBenchProgram, string(stream)} {
		fmt.Fprintf(h, "%d:%s", len(part), part)
	}
	cache := filepath.Join(outDir(b), "bench", "linux-inflate")
	cpio := filepath.Join(cache, "uroot-"+hex.EncodeToString(h.Sum(nil)[:6])+".cpio")
	if _, err := os.Stat(cpio); err == nil {
		return vmlinuz, cpio
	}
	work := filepath.Join(cache, "build")
	os.RemoveAll(work)
	if err := os.MkdirAll(filepath.Join(work, "prog"), 0o755); err != nil {
		b.Fatal(err)
	}
	write := func(name string, data []byte) {
		if err := os.WriteFile(filepath.Join(work, name), data, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	write("go.mod", []byte("module dpxe.invalid/inflatebench\n\ngo 1.26\n"))
	write("prog/main.go", []byte(inflateBenchProgram))
	write("bench.sh", []byte(script))
	write("stream.z", stream)
	run := func(args ...string) {
		cmd := exec.Command("go", args...)
		cmd.Dir = work
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("go %s: %v\n%s", strings.Join(args[:2], " "), err, out)
		}
	}
	start := time.Now()
	run("build", "-o", "inflatebench", "./prog")
	run("get", "github.com/u-root/u-root@"+tcpBenchURoot)
	args := []string{"run", "github.com/u-root/u-root", "-o", cpio + ".tmp",
		"-defaultsh", "gosh", "-uinitcmd", "gosh /bench.sh",
		"-files", filepath.Join(work, "bench.sh") + ":bench.sh",
		"-files", filepath.Join(work, "inflatebench") + ":inflatebench",
		"-files", filepath.Join(work, "stream.z") + ":stream.z"}
	for _, c := range []string{"init", "gosh", "poweroff", "echo"} {
		args = append(args, "github.com/u-root/u-root/cmds/core/"+c)
	}
	run(args...)
	if err := os.Rename(cpio+".tmp", cpio); err != nil {
		b.Fatal(err)
	}
	os.RemoveAll(work)
	b.Logf("built the inflate initramfs (u-root %s, %s) in %s: %s", tcpBenchURoot, release, time.Since(start).Round(time.Second), cpio)
	return vmlinuz, cpio
}

var (
	inflateBenchKernelLine = regexp.MustCompile(`inflate throughput case=\d+ out=(\d+) .* MBps=([0-9.]+) best=([0-9.]+)`)
	inflateBenchGoLine     = regexp.MustCompile(`dpxe-inflate: (zlib|flate) out=(\d+) .* MBps=([0-9.]+) best=([0-9.]+)`)
)

// inflateBenchKernel boots selftest=1 with a module holding only the
// stream and returns the kernel's median MB/s.
func inflateBenchKernel(b *testing.B, module string, want int) float64 {
	cfg := appliance.BootConfig{NodeID: "inflate-bench", SelfTest: true, Seed: inflateBenchSeed, HasSeed: true}
	res, err := qemu.Run(context.Background(), qemu.Options{
		Firmware: qemu.SeaBIOS, Memory: inflateBenchMemory, Timeout: inflateBenchTimeout,
		Kernel: filepath.Join(outDir(b), image.KernelFile), Append: cfg.String(), Initrd: module,
	})
	if err != nil {
		b.Fatal(err)
	}
	m := inflateBenchKernelLine.FindStringSubmatch(res.Serial)
	if !res.Passed() || m == nil || m[1] != strconv.Itoa(want) {
		b.Fatalf("kernel: exit %d, no throughput line for %d bytes\nserial console:\n%s", res.ExitCode, want, res.Serial)
	}
	mbs, _ := strconv.ParseFloat(m[2], 64)
	b.Logf("kernel: %s", strings.TrimSpace(m[0]))
	return mbs
}

// inflateBenchGo boots the Linux guest and returns Go's median MB/s for
// compress/zlib and compress/flate.
func inflateBenchGo(b *testing.B, vmlinuz, initrd string, want int) (float64, float64) {
	res, err := qemu.Run(context.Background(), qemu.Options{
		Firmware: qemu.SeaBIOS, Memory: inflateBenchMemory, Timeout: inflateBenchTimeout,
		Kernel: vmlinuz, Initrd: initrd, Append: "console=ttyS0 quiet",
		Until: func(s string) bool {
			i := strings.Index(s, "dpxe-inflate: done")
			return i >= 0 && strings.Contains(s[i:], "\n")
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	got := map[string]float64{}
	for _, m := range inflateBenchGoLine.FindAllStringSubmatch(res.Serial, -1) {
		if m[2] != strconv.Itoa(want) {
			b.Fatalf("linux: %s inflated %s bytes, want %d", m[1], m[2], want)
		}
		got[m[1]], _ = strconv.ParseFloat(m[3], 64)
		b.Logf("linux: %s", strings.TrimSpace(m[0]))
	}
	if len(got) != 2 {
		b.Fatalf("linux: no Go figures\nserial console:\n%s", res.Serial)
	}
	return got["zlib"], got["flate"]
}

// BenchmarkKernelInflate reports the kernel's and Go's MB/s of output
// (medians over DPXE_INFLATEBENCH_ROUNDS boots each, 2 by default,
// alternating) and the ratios kernel/zlib (the same work: DEFLATE and
// Adler-32) and kernel/flate.
func BenchmarkKernelInflate(b *testing.B) {
	nbSkipUnlessBench(b)
	needQEMU(b, qemu.SeaBIOS)
	rounds := 2
	if v, err := strconv.Atoi(os.Getenv("DPXE_INFLATEBENCH_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	large := appliance.InflateCorpus(inflateBenchSeed)[0]
	want := len(appliance.GoInflate(large.Stream).Out)
	mod, err := appliance.SelfTestModule{Sections: []appliance.ModuleSection{
		{Tag: appliance.InflateModuleTag, Payload: appliance.InflateSection([]appliance.InflateCase{large})}}}.MarshalBinary()
	if err != nil {
		b.Fatal(err)
	}
	module := filepath.Join(b.TempDir(), "inflate.bin")
	if err := os.WriteFile(module, mod, 0o644); err != nil {
		b.Fatal(err)
	}
	vmlinuz, initrd := inflateBenchLinux(b, large.Stream)
	var kernel, gz, gf []float64
	for range b.N {
		for r := 0; r < rounds; r++ {
			kernel = append(kernel, inflateBenchKernel(b, module, want))
			z, f := inflateBenchGo(b, vmlinuz, initrd, want)
			gz, gf = append(gz, z), append(gf, f)
		}
	}
	k, ks := tcpBenchStats(kernel)
	z, zs := tcpBenchStats(gz)
	f, fs := tcpBenchStats(gf)
	b.Logf("%s (%d bytes in, %d out): kernel %.2f MB/s (runs %.2f, spread %.0f%%), Go zlib %.2f MB/s (runs %.2f, spread %.0f%%), Go flate %.2f MB/s (runs %.2f, spread %.0f%%); kernel/zlib %.2f, kernel/flate %.2f",
		large.Kind, len(large.Stream), want, k, kernel, 100*ks, z, gz, 100*zs, f, gf, 100*fs, k/z, k/f)
	b.ReportMetric(k, "kernel-MB/s")
	b.ReportMetric(z, "go-zlib-MB/s")
	b.ReportMetric(f, "go-flate-MB/s")
	b.ReportMetric(k/z, "kernel/zlib")
	b.ReportMetric(k/f, "kernel/flate")
}
