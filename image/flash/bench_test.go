package flash

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Benchmarks run only with DPXE_BENCH=1 (make bench). Each one runs our
// writer and `dd bs=4M conv=fsync` on the same target, alternating which
// goes first, several rounds, and reports medians and the throughput ratio
// ours/dd (≥ 1 means we are at least as fast).
func needBench(b *testing.B) {
	b.Helper()
	if os.Getenv("DPXE_BENCH") != "1" {
		b.Skip("set DPXE_BENCH=1 to run the flash benchmarks")
	}
	if _, err := exec.LookPath("dd"); err != nil {
		b.Skip("dd not installed")
	}
}

const benchRounds = 5

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// personalised returns a personalised copy of the source image.
func personalised(b *testing.B) (string, int64) {
	b.Helper()
	tmp, err := Personalize(sourceImage(b), testConfig(b, "bench-1"), b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	st, err := os.Stat(tmp)
	if err != nil {
		b.Fatal(err)
	}
	return tmp, st.Size()
}

// oursWrite times the write phase of Flash (open, write, fsync) on target.
func oursWrite(b *testing.B, img string, size int64, target string, block bool) time.Duration {
	return oursWriteProbe(b, img, size, target, block, false)
}

// oursWriteProbe is oursWrite; with probe, zero blocks the device already
// holds are skipped (Options.SkipZeroed).
func oursWriteProbe(b *testing.B, img string, size int64, target string, block, probe bool) time.Duration {
	b.Helper()
	src, err := os.Open(img)
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	t := &Target{Path: target, Block: block}
	start := time.Now()
	dst, err := openTarget(t, size)
	if err != nil {
		b.Fatal(err)
	}
	zp := zeroPolicy{Known: !block}
	if probe {
		p, err := os.OpenFile(target, os.O_RDONLY|unix.O_DIRECT, 0)
		if err != nil {
			b.Fatal(err)
		}
		defer p.Close()
		zp.Probe = p
	}
	if _, err := writeImage(context.Background(), dst, src, size, zp, nil); err != nil {
		b.Fatal(err)
	}
	if err := dst.Sync(); err != nil {
		b.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}

func ddWrite(b *testing.B, img, target string) time.Duration {
	b.Helper()
	start := time.Now()
	if out, err := exec.Command("dd", "if="+img, "of="+target, "bs=4M", "conv=fsync", "status=none").CombinedOutput(); err != nil {
		b.Fatalf("dd: %v: %s", err, out)
	}
	return time.Since(start)
}

// sideBySide runs ours and dd benchRounds times each, alternating.
func sideBySide(b *testing.B, size int64, ours, dd func() time.Duration) {
	var o, d []time.Duration
	for i := 0; i < benchRounds; i++ {
		if i%2 == 0 {
			o = append(o, ours())
			d = append(d, dd())
		} else {
			d = append(d, dd())
			o = append(o, ours())
		}
	}
	mo, md := median(o), median(d)
	b.ReportMetric(float64(size)/mo.Seconds()/1e6, "ours-MB/s")
	b.ReportMetric(float64(size)/md.Seconds()/1e6, "dd-MB/s")
	b.ReportMetric(md.Seconds()/mo.Seconds(), "ratio")
	b.Logf("median of %d: ours %v, dd bs=4M conv=fsync %v, throughput ratio ours/dd %.2f", benchRounds, mo, md, md.Seconds()/mo.Seconds())
}

// BenchmarkWriteFile: the personalised image to a regular file in a
// temporary directory (sparse: zero blocks are seeked over; dd writes them).
func BenchmarkWriteFile(b *testing.B) {
	needBench(b)
	img, size := personalised(b)
	dir := b.TempDir()
	for i := 0; i < b.N; i++ {
		target := filepath.Join(dir, "target.img")
		sideBySide(b, size,
			func() time.Duration { os.Remove(target); return oursWrite(b, img, size, target, false) },
			func() time.Duration { os.Remove(target); return ddWrite(b, img, target) })
	}
}

// BenchmarkWriteFileNoSkip: the same with zero skipping off, so both
// write every byte: the writer's raw throughput against dd's.
func BenchmarkWriteFileNoSkip(b *testing.B) {
	needBench(b)
	img, size := personalised(b)
	dir := b.TempDir()
	for i := 0; i < b.N; i++ {
		target := filepath.Join(dir, "target.img")
		sideBySide(b, size,
			func() time.Duration {
				os.Remove(target)
				// block=true: no truncation, no skipping (a plain file
				// opened like a device).
				f, err := os.Create(target)
				if err != nil {
					b.Fatal(err)
				}
				f.Close()
				return oursWrite(b, img, size, target, true)
			},
			func() time.Duration { os.Remove(target); return ddWrite(b, img, target) })
	}
}

// BenchmarkWriteLoop: the personalised image to a loop device backed by a
// file in a temporary directory; both write every byte.
func BenchmarkWriteLoop(b *testing.B) {
	needBench(b)
	img, size := personalised(b)
	dev, _ := loopDevice(b, size, false)
	for i := 0; i < b.N; i++ {
		sideBySide(b, size,
			func() time.Duration { return oursWrite(b, img, size, dev, true) },
			func() time.Duration { return ddWrite(b, img, dev) })
	}
}

// BenchmarkWriteLoopSkipZeroed: as BenchmarkWriteLoop, with SkipZeroed:
// before each of our runs the device is filled with 0xff by dd (untimed)
// for the "dirty" case, or holds the image already (after dd's run) for
// the "same image" case, so the probe finds either no zeros or all of them.
func BenchmarkWriteLoopSkipZeroed(b *testing.B) {
	needBench(b)
	img, size := personalised(b)
	ff := filepath.Join(b.TempDir(), "ff.img")
	if err := os.WriteFile(ff, bytes.Repeat([]byte{0xff}, int(size)), 0o644); err != nil {
		b.Fatal(err)
	}
	for _, tc := range []string{"dirty", "same-image"} {
		b.Run(tc, func(b *testing.B) {
			dev, _ := loopDevice(b, size, false)
			for i := 0; i < b.N; i++ {
				sideBySide(b, size,
					func() time.Duration {
						if tc == "dirty" {
							ddWrite(b, ff, dev)
						} else {
							ddWrite(b, img, dev)
						}
						return oursWriteProbe(b, img, size, dev, true, true)
					},
					func() time.Duration { return ddWrite(b, img, dev) })
			}
		})
	}
}

// BenchmarkFlashVerify: the whole of Flash (checks, personalised copy,
// write, sync, O_DIRECT read-back) for the default image, to a file and to
// a loop device (every byte written, and with SkipZeroed: from the second
// round on the device already holds the image's zeros).
func BenchmarkFlashVerify(b *testing.B) {
	needBench(b)
	src := sourceImage(b)
	cfg := testConfig(b, "bench-1")
	for _, tc := range []string{"file", "loop", "loop-skip-zeroed"} {
		b.Run(tc, func(b *testing.B) {
			target, force := filepath.Join(b.TempDir(), "t.img"), false
			if tc != "file" {
				target, _ = loopDevice(b, 64<<20, false)
				force = true
			}
			var total, write, verify []time.Duration
			for i := 0; i < b.N*benchRounds; i++ {
				start := time.Now()
				res, err := Flash(context.Background(), Options{Image: src, Config: cfg, Target: target, Force: force,
					SkipZeroed: tc == "loop-skip-zeroed", TempDir: b.TempDir()})
				if err != nil {
					b.Fatal(err)
				}
				total = append(total, time.Since(start))
				write = append(write, res.WriteTime)
				verify = append(verify, res.VerifyTime)
			}
			b.ReportMetric(median(total).Seconds()*1000, "total-ms")
			b.ReportMetric(median(write).Seconds()*1000, "write-ms")
			b.ReportMetric(median(verify).Seconds()*1000, "verify-ms")
			b.Logf("%s: median of %d flashes of the 64 MiB image: total %v (write+sync %v, verify %v)", tc, len(total), median(total), median(write), median(verify))
		})
	}
}
