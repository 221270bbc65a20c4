package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
)

// TestKernelInflate boots the kernel with selftest=1 and a self-test module
// that carries both the boot-config cases and the INFLATE1 section of
// appliance.InflateCorpus (a few thousand zlib streams: compress/zlib at
// every level, Discord-style zlib-stream, streams built bit by bit, and
// corruptions of them all). The kernel inflates each in random pieces and
// prints its verdict, output length and hash; every one must agree with
// Go's compress/zlib as appliance.CheckInflateCase says, and the in-kernel
// known answers must pass. The config cases must still parse as before:
// one module, read by two self-tests.
func TestKernelInflate(t *testing.T) {
	t.Logf("self-test seed %d (set DPXE_SELFTEST_SEED to repeat)", selfTestSeed)
	start := time.Now()
	corpus := appliance.InflateCorpus(selfTestSeed)
	in := 0
	for _, c := range corpus {
		in += len(c.Stream)
	}
	cfg := configCases(selfTestSeed)
	module := writeCaseModule(t, cfg, appliance.ModuleSection{Tag: appliance.InflateModuleTag, Payload: appliance.InflateSection(corpus)})
	t.Logf("%d inflate cases, %d bytes of streams, made in %v", len(corpus), in, time.Since(start).Round(time.Millisecond))

	res := bootSelfTest(t, "inflate-selftest", module, 180*time.Second)
	t.Logf("QEMU start to exit %v", res.Elapsed.Round(time.Millisecond))
	fail := t.Errorf
	logSerialOnFailure(t, res)
	rep, err := appliance.ParseInflateReport(res.Serial)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range rep.Failures {
		fail("kernel: inflate FAIL %s", f)
	}
	if rep.Size == 0 || rep.Window != appliance.InflateWindow {
		fail("no \"inflate size N window %d\" line (size %d, window %d)", appliance.InflateWindow, rep.Size, rep.Window)
	}
	t.Logf("INFLATE is %d bytes per connection: the %d-byte window and %d bytes of tables and state", rep.Size, rep.Window, rep.Size-rep.Window)
	if rep.CaseCount != len(corpus) || len(rep.Cases) != len(corpus) {
		fail("kernel reported %d case lines and \"inflate cases %d\", sent %d", len(rep.Cases), rep.CaseCount, len(corpus))
	}
	verdicts := map[string]int{}
	mismatches := 0
	for i, k := range rep.Cases {
		if i >= len(corpus) {
			break
		}
		c := corpus[i]
		verdicts[strings.TrimSpace(k.Verdict+" "+k.Reason)]++
		err := appliance.CheckInflateCase(c.Stream, k)
		if err == nil && c.Syncs >= 0 && k.Verdict != "error" && k.Syncs != c.Syncs {
			err = fmt.Errorf("%d sync flushes counted, %d in the stream", k.Syncs, c.Syncs)
		}
		if err != nil {
			mismatches++
			if mismatches <= 10 {
				fail("inflate case %d (%s, %d bytes): %v", i, c.Kind, len(c.Stream), err)
			}
		}
	}
	t.Logf("%d cases compared with compress/zlib, %d mismatches; kernel verdicts: %v", len(rep.Cases), mismatches, verdicts)
	if rep.Throughput == "" || rep.MBps == 0 {
		fail("no inflate throughput figure")
	}
	t.Logf("inflate throughput (qemu64 under TCG): %s", rep.Throughput)

	st, err := appliance.ParseSelfTestReport(res.Serial)
	if err != nil {
		t.Fatal(err)
	}
	checkConfigCases(t, st, cfg, fail)
}
