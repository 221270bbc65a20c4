package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/image/qemu"
	"github.com/discord-pxe/dpxe/kernel"
)

// BenchmarkBootToSelfTestPass measures, per boot path, the time from QEMU's
// start to its exit with the self-test verdict (the kernel writes the
// isa-debug-exit port right after "selftest: pass").
func BenchmarkBootToSelfTestPass(b *testing.B) {
	if os.Getenv("DPXE_BENCH") != "1" {
		b.Skip("set DPXE_BENCH=1 (make bench)")
	}
	for _, p := range bootPaths {
		b.Run(p.name, func(b *testing.B) {
			needQEMU(b, p.fw)
			cfg := appliance.BootConfig{NodeID: "bench", SelfTest: true, Seed: 1, HasSeed: true}
			var total time.Duration
			for i := 0; i < b.N; i++ {
				o := bootOptions(b, p, cfg, "")
				res, err := qemu.Run(context.Background(), o)
				if err != nil {
					b.Fatal(err)
				}
				if !res.Passed() {
					b.Fatalf("self-test did not pass:\n%s", res.Serial)
				}
				total += res.Elapsed
			}
			b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/boot")
		})
	}
}

// BenchmarkBuildImages measures a build from clean: nasm for the kernel and
// the MBR loader, header validation, the netboot tree, usb.img and the
// manifest. It also reports the kernel's size.
func BenchmarkBuildImages(b *testing.B) {
	if os.Getenv("DPXE_BENCH") != "1" {
		b.Skip("set DPXE_BENCH=1 (make bench)")
	}
	var size int64
	for i := 0; i < b.N; i++ {
		dir := b.TempDir()
		if _, err := image.Build(context.Background(), image.Options{Sources: kernel.Sources, OutDir: dir}); err != nil {
			b.Fatal(err)
		}
		st, err := os.Stat(filepath.Join(dir, image.KernelFile))
		if err != nil {
			b.Fatal(err)
		}
		size = st.Size()
	}
	b.ReportMetric(float64(size), "kernel-bytes")
	_, ctx := appliance.ShardLayout()
	b.ReportMetric(float64(128*ctx), "bytes/128-shard-contexts")
}
