package smoke

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/image/qemu"
)

const testSeed = 4242

// selfTestConsole is the console of a passing selftest=1 boot on p as the
// kernel prints it: banner, boot and config lines, the layout lines and
// every digest, computed here from the Go reference, so a check that
// misreads the kernel's format fails.
func selfTestConsole(p Path, node string, ref *reference) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\r\nDiscord-PXE shard kernel 0.1.0\r\nboot: %s loader=x\r\n", p.Source)
	fmt.Fprintf(&b, "memory: 255 MiB usable in 2 regions\r\ntsc: 2893406 cycles/ms (cpuid)\r\nconfig: from=%s node=%s controller= cred=none selftest=1\r\n", p.From, node)
	fmt.Fprintf(&b, "selftest: seed=%d\r\n", ref.seed)
	fields, size := appliance.ShardLayout()
	fmt.Fprintf(&b, "layout SHARD size %d\r\n", size)
	for _, f := range fields {
		fmt.Fprintf(&b, "layout SHARD.%s %d\r\n", f.Name, f.Offset)
	}
	fmt.Fprintf(&b, "cfgkeys %s\r\n", strings.Join(appliance.BootConfigKeys(), " "))
	for _, n := range ref.names {
		fmt.Fprintf(&b, "selftest digest %s cases=4096 value=%016x\r\n", n, ref.digests[n])
	}
	b.WriteString("selftest: pass\r\n")
	return b.String()
}

func TestReferenceNames(t *testing.T) {
	ref := newReference(testSeed)
	want := len(appliance.SelfTestFormulas) + 6 + len(appliance.LibDigestNames)
	if len(ref.names) != want || len(ref.digests) != want {
		t.Fatalf("%d names, %d digests, want %d of each", len(ref.names), len(ref.digests), want)
	}
	for _, n := range []string{"bucket", "cksum", "dhcpopt", "dns", "gwurl", "natsurl", "tcpseg", "sha1", "wsupgrade"} {
		if _, ok := ref.digests[n]; !ok {
			t.Errorf("no %s digest", n)
		}
	}
	if other := newReference(testSeed + 1); other.digests["bucket"] == ref.digests["bucket"] {
		t.Error("the bucket digest does not depend on the seed")
	}
}

func TestCheckSelfTest(t *testing.T) {
	ref := newReference(testSeed)
	p := Paths[0] // kernel-seabios
	want := expect{path: p, version: "0.1.0", node: "n1"}
	good := selfTestConsole(p, "n1", ref)
	for _, tc := range []struct {
		name   string
		end    bootEnd
		want   expect
		status Status
		reason string // substring of the verdict's reason
	}{
		{"pass", bootEnd{serial: good, exit: qemu.ExitPass}, want, Pass, ""},
		{"self-tests failed", bootEnd{serial: strings.Replace(good, "selftest: pass", "selftest lib FAIL sha1 abc\r\nselftest: FAIL failures=1", 1), exit: qemu.ExitFail}, want,
			Fail, "exit: the kernel's self-tests failed (QEMU exit 35): selftest lib FAIL sha1 abc; selftest: FAIL failures=1"},
		{"timed out", bootEnd{serial: good[:200], exit: -1, timedOut: true, timeout: 7 * time.Second, accel: "tcg"}, want,
			Fail, `exit: no "selftest: pass" within 7s (tcg)`},
		{"triple fault", bootEnd{serial: good[:200], exit: 0}, want, Fail, "QEMU exited with status 0"},
		{"halted on a config error", bootEnd{serial: "\r\nDiscord-PXE shard kernel 0.1.0\r\nboot: bios multiboot (QEMU -kernel)\r\nconfig error: byte 7 key \"bogus\": unknown key\r\nhalted: fix the node config. This machine will not reboot.\r\n", exit: -1, halted: true}, want,
			Fail, `exit: the kernel halted: config error: byte 7 key "bogus": unknown key / halted: fix the node config.`},
		{"other kernel version", bootEnd{serial: good, exit: qemu.ExitPass}, expect{path: p, version: "0.2.0", node: "n1"},
			Fail, "banner: kernel 0.1.0 on the console, manifest.json says 0.2.0"},
		{"other boot source", bootEnd{serial: good, exit: qemu.ExitPass}, expect{path: Paths[2], version: "0.1.0", node: "n1"},
			Fail, `boot source: "bios multiboot (QEMU -kernel) loader=x", want "bios disk (dpxe MBR loader)"`},
		{"other node", bootEnd{serial: good, exit: qemu.ExitPass}, expect{path: p, version: "0.1.0", node: "n2"},
			Fail, `config: "config: from=cmdline node=n1 controller= cred=none selftest=1", want "config: from=cmdline node=n2 ..."`},
		{"node prefix is not the node", bootEnd{serial: good, exit: qemu.ExitPass}, expect{path: p, version: "0.1.0", node: "n"},
			Fail, "config: "},
		{"digest differs", bootEnd{serial: strings.Replace(good, fmt.Sprintf("ack cases=4096 value=%016x", ref.digests["ack"]), "ack cases=4096 value=0000000000000001", 1), exit: qemu.ExitPass}, want,
			Fail, fmt.Sprintf("digests: 1 of %d differ from the Go reference in this dpxe (seed %d): ack kernel 0000000000000001 Go %016x", len(ref.names), testSeed, ref.digests["ack"])},
		{"digest missing", bootEnd{serial: strings.Replace(good, "selftest digest tcpseg", "selftest digest tcpsegX", 1), exit: qemu.ExitPass}, want,
			Fail, "tcpseg missing"},
		{"other seed", bootEnd{serial: strings.Replace(good, fmt.Sprintf("seed=%d", testSeed), "seed=1", 1), exit: qemu.ExitPass}, want,
			Fail, fmt.Sprintf("digests: the kernel ran seed 1, the Go reference seed %d", testSeed)},
		{"layout differs", bootEnd{serial: strings.Replace(good, "layout SHARD.state 8", "layout SHARD.state 9", 1), exit: qemu.ExitPass}, want,
			Fail, "layout: SHARD.state kernel 9 (printed true) Go 8"},
		{"malformed digest line", bootEnd{serial: strings.Replace(good, "selftest digest ack cases=4096 value=", "selftest digest ack cases=4096 value=zz", 1), exit: qemu.ExitPass}, want,
			Fail, "digests: digest line"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := checkSelfTest(tc.end, tc.want, ref)
			st, reason := verdict(cs)
			if st != tc.status || !strings.Contains(reason, tc.reason) {
				t.Fatalf("verdict %s %q, want %s with %q\nchecks: %+v", st, reason, tc.status, tc.reason, cs)
			}
		})
	}
}

// TestCheckBootAnchors compares the kernel's anchors line with the
// manifest's trust set: equal passes, any difference or no line fails
// naming both, and a manifest without a trust set is n/a, never a pass.
func TestCheckBootAnchors(t *testing.T) {
	trust := &image.TrustInfo{SHA256: strings.Repeat("ab", 32), Anchors: make([]image.AnchorInfo, 3)}
	line := "tls: anchors=3 sha256=" + trust.SHA256 + "\r\n"
	plain := selfTestConsole(Paths[0], "n", newReference(1))
	with := strings.Replace(plain, "memory: ", line+"memory: ", 1)
	for _, tc := range []struct {
		name   string
		serial string
		trust  *image.TrustInfo
		status Status
		detail string
	}{
		{"equal", with, trust, Pass, "3 anchors, sha256 " + trust.SHA256},
		{"no manifest trust set", with, nil, NotApplicable, "records no trust anchors"},
		{"no console line", plain, trust, Fail, `no "tls: anchors=N sha256=..." line`},
		{"other hash", strings.Replace(with, "sha256=abab", "sha256=cdab", 1), trust, Fail, `manifest.json says "tls: anchors=3 sha256=abab`},
		{"other count", strings.Replace(with, "anchors=3", "anchors=4", 1), trust, Fail, `"tls: anchors=4 sha256=`},
		{"hash prefix only", strings.Replace(with, trust.SHA256, trust.SHA256[:62], 1), trust, Fail, "manifest.json says"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got *Check
			for _, c := range checkBoot(tc.serial, expect{path: Paths[0], node: "n", trust: tc.trust}) {
				if c.Name == "anchors" {
					got = &c
				}
			}
			if got == nil {
				t.Fatal("no anchors check")
			}
			if got.Status != tc.status || !strings.Contains(got.Detail, tc.detail) {
				t.Errorf("anchors check %s %q, want %s with %q", got.Status, got.Detail, tc.status, tc.detail)
			}
		})
	}
}

func TestVerdictPrefersErrors(t *testing.T) {
	st, reason := verdict([]Check{{"a", Pass, ""}, {"b", Fail, "bad"}, {"c", Error, "missing"}})
	if st != Error || reason != "c: missing" {
		t.Errorf("verdict %s %q", st, reason)
	}
	if st, _ := verdict([]Check{{"a", Pass, ""}, {"anchors", NotApplicable, "later"}}); st != Pass {
		t.Errorf("n/a must not fail a path: %s", st)
	}
}

func TestHaltReason(t *testing.T) {
	for _, tc := range []struct{ serial, want string }{
		{"a\r\nEXCEPTION vector=13\r\n\r\nhalted: kernel fault\r\n", "EXCEPTION vector=13 / halted: kernel fault"},
		{"halted: kernel fault\n", "halted: kernel fault"},
		{"no halt here\n", ""},
		{"\x1b[2Jconfig error: x\nhalted: y\n", "config error: x / halted: y"},
	} {
		if got := haltReason(tc.serial); got != tc.want {
			t.Errorf("haltReason(%q) = %q, want %q", tc.serial, got, tc.want)
		}
	}
}
