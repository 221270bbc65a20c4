package smoke

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/image/qemu"
)

// Status is the verdict of a check or a path.
type Status string

// The verdicts. A failure is the artifacts' fault (they do not boot, or
// boot and disagree with the Go reference); an error means the smoke test
// could not run the path (a package or binary missing, a peer that did not
// start) and says nothing about the artifacts.
const (
	Pass          Status = "pass"
	Fail          Status = "fail"
	Error         Status = "error"
	NotApplicable Status = "n/a"
)

// Check is one thing a path verified.
type Check struct {
	Name   string `json:"name"`
	Status Status `json:"status"`
	Detail string `json:"detail"`
}

// The lines smoke waits for or reacts to, in the kernel's words.
const (
	lineSelfTestPass = "selftest: pass"
	lineBanner       = "Discord-PXE shard kernel "
	lineHalted       = "halted: " // kernel/core/kmain.inc and idt.inc: the kernel stops for good
	lineReady        = "shard 0: READY session"
)

// reference is the Go side of the differential self-tests: every digest
// the kernel prints with selftest=1 for a seed, computed by the functions
// the end-to-end tests compare with (appliance.SelfTestDigests and the
// checksum, DHCP option, DNS, dial URL, broker URL, TCP segment and lib
// digests).
type reference struct {
	seed    uint32
	names   []string // in the order they are reported
	digests map[string]uint64
}

func newReference(seed uint32) *reference {
	r := &reference{seed: seed, digests: map[string]uint64{}}
	add := func(name string, v uint64) {
		r.names = append(r.names, name)
		r.digests[name] = v
	}
	formulas := appliance.SelfTestDigests(seed)
	for _, f := range appliance.SelfTestFormulas {
		add(f, formulas[f])
	}
	add("cksum", appliance.ChecksumDigest(seed))
	add("dhcpopt", appliance.DHCPOptionsDigest(seed))
	add("dns", appliance.DNSDigest(seed))
	add("gwurl", appliance.DialURLDigest(seed))
	add("natsurl", appliance.NATSURLDigest(seed))
	add("tcpseg", appliance.TCPSegmentDigest(seed))
	lib := appliance.LibDigests(seed)
	for _, n := range appliance.LibDigestNames {
		add(n, lib[n])
	}
	return r
}

// bootEnd is how a QEMU run ended, as the checks see it.
type bootEnd struct {
	serial   string
	exit     int  // QEMU's exit status (-1 when smoke stopped it)
	timedOut bool // the path's timeout passed
	halted   bool // the kernel printed "halted: ..." and smoke stopped QEMU
	timeout  time.Duration
	accel    string
}

func endOf(res *qemu.Result, halted bool, timeout time.Duration, accel string) bootEnd {
	return bootEnd{serial: res.Serial, exit: res.ExitCode, timedOut: res.TimedOut, halted: halted, timeout: timeout, accel: accel}
}

// expect is what a path's console must show.
type expect struct {
	path    Path
	version string           // kernel version from manifest.json
	node    string           // node ID in the boot config
	trust   *image.TrustInfo // manifest.json's trust anchors; nil: none recorded
}

var bannerRE = regexp.MustCompile(`Discord-PXE shard kernel (\S+)`)

// consoleLine returns the first console line starting with prefix.
func consoleLine(serial, prefix string) (string, bool) {
	for _, l := range strings.Split(serial, "\n") {
		l = strings.TrimRight(l, "\r")
		if strings.HasPrefix(l, prefix) {
			return l, true
		}
	}
	return "", false
}

// haltReason is what the kernel printed before it halted: the line before
// "halted: ..." (a config error or an exception dump) and the halt line.
func haltReason(serial string) string {
	lines := strings.Split(serial, "\n")
	for i, l := range lines {
		if strings.HasPrefix(cleanLine(l), lineHalted) {
			for j := i - 1; j >= 0; j-- {
				if prev := cleanLine(lines[j]); prev != "" {
					return prev + " / " + cleanLine(l)
				}
			}
			return cleanLine(l)
		}
	}
	return ""
}

// checkBoot checks what every path's console shows: the banner with the
// kernel version, the boot source, the config line, and the trust-anchor
// set.
func checkBoot(serial string, want expect) []Check {
	var cs []Check
	if m := bannerRE.FindStringSubmatch(serial); m == nil {
		cs = append(cs, Check{"banner", Fail, "no \"Discord-PXE shard kernel\" banner on the serial console"})
	} else if want.version != "" && m[1] != want.version {
		cs = append(cs, Check{"banner", Fail, fmt.Sprintf("kernel %s on the console, manifest.json says %s", m[1], want.version)})
	} else {
		cs = append(cs, Check{"banner", Pass, "kernel " + m[1]})
	}
	if l, ok := consoleLine(serial, "boot: "); !ok {
		cs = append(cs, Check{"boot source", Fail, "no \"boot: ...\" line"})
	} else if src := strings.TrimPrefix(l, "boot: "); !strings.HasPrefix(src, want.path.Source) {
		cs = append(cs, Check{"boot source", Fail, fmt.Sprintf("%q, want %q", src, want.path.Source)})
	} else {
		cs = append(cs, Check{"boot source", Pass, src})
	}
	wantCfg := "config: from=" + want.path.From + " node=" + want.node
	if l, ok := consoleLine(serial, "config: "); !ok {
		d := "no \"config: ...\" line"
		if h := haltReason(serial); h != "" {
			d += "; the kernel halted: " + h
		}
		cs = append(cs, Check{"config", Fail, d})
	} else if l != wantCfg && !strings.HasPrefix(l, wantCfg+" ") {
		cs = append(cs, Check{"config", Fail, fmt.Sprintf("%q, want %q", l, wantCfg+" ...")})
	} else {
		cs = append(cs, Check{"config", Pass, "from " + want.path.From + ", node " + want.node})
	}
	cs = append(cs, checkTSC(serial), checkAnchors(serial, want.trust))
	return cs
}

// tscRE is the kernel's calibration line (core/kmain.inc).
var tscRE = regexp.MustCompile(`^tsc: (\d+) cycles/ms \(([a-z]+)\)$`)

// checkTSC wants the TSC calibrated: every timer the kernel keeps
// (heartbeats, leases, TCP) counts TSC cycles, so 0 cycles/ms would stop
// them all.
func checkTSC(serial string) Check {
	l, ok := consoleLine(serial, "tsc: ")
	if !ok {
		return Check{"tsc", Fail, "no \"tsc: N cycles/ms (SOURCE)\" line on the serial console"}
	}
	m := tscRE.FindStringSubmatch(l)
	if m == nil || m[1] == "0" || strings.TrimLeft(m[1], "0") != m[1] {
		return Check{"tsc", Fail, fmt.Sprintf("%q: the TSC is not calibrated", l)}
	}
	return Check{"tsc", Pass, m[1] + " cycles/ms from " + m[2]}
}

// checkAnchors compares the kernel's "tls: anchors=N sha256=HEX" line
// (tls/anchors.inc: the SHA-256 of the anchor blob compiled in) with the
// trust set manifest.json records for the build. A manifest without one
// (an image built before the kernel had anchors) has nothing to compare,
// and the check says so instead of passing.
func checkAnchors(serial string, trust *image.TrustInfo) Check {
	if trust == nil {
		return Check{"anchors", NotApplicable, "manifest.json records no trust anchors (built by a dpxe without them): nothing to compare"}
	}
	l, ok := consoleLine(serial, "tls: anchors=")
	if !ok {
		d := "no \"tls: anchors=N sha256=...\" line on the serial console"
		if h := haltReason(serial); h != "" {
			d += "; the kernel halted: " + h
		}
		return Check{"anchors", Fail, d}
	}
	want := fmt.Sprintf("tls: anchors=%d sha256=%s", len(trust.Anchors), trust.SHA256)
	if l != want {
		return Check{"anchors", Fail, fmt.Sprintf("%q on the console, manifest.json says %q", l, want)}
	}
	return Check{"anchors", Pass, fmt.Sprintf("%d anchors, sha256 %s as in manifest.json", len(trust.Anchors), trust.SHA256)}
}

// checkSelfTest checks a selftest=1 boot: QEMU's exit status, the boot
// lines, and every differential digest and layout line against ref.
func checkSelfTest(end bootEnd, want expect, ref *reference) []Check {
	var cs []Check
	switch {
	case end.exit == qemu.ExitPass && strings.Contains(end.serial, lineSelfTestPass):
		cs = append(cs, Check{"exit", Pass, fmt.Sprintf("%q, QEMU exit %d", lineSelfTestPass, end.exit)})
	case end.exit == qemu.ExitFail:
		cs = append(cs, Check{"exit", Fail, "the kernel's self-tests failed (QEMU exit 35): " + failLines(end.serial)})
	case end.halted:
		cs = append(cs, Check{"exit", Fail, "the kernel halted: " + haltReason(end.serial)})
	case end.timedOut:
		cs = append(cs, Check{"exit", Fail, fmt.Sprintf("no %q within %v (%s)", lineSelfTestPass, end.timeout, end.accel)})
	default:
		cs = append(cs, Check{"exit", Fail, fmt.Sprintf("QEMU exited with status %d before %q (with -no-reboot a reset or triple fault ends QEMU)", end.exit, lineSelfTestPass)})
	}
	cs = append(cs, checkBoot(end.serial, want)...)
	rep, err := appliance.ParseSelfTestReport(end.serial)
	if err != nil {
		return append(cs, Check{"digests", Fail, err.Error()})
	}
	cs = append(cs, checkDigests(rep, ref), checkLayout(rep))
	return cs
}

// failLines joins the kernel's "... FAIL ..." lines (at most three).
func failLines(serial string) string {
	var fails []string
	n := 0
	for _, l := range strings.Split(serial, "\n") {
		if l = cleanLine(l); strings.Contains(l, " FAIL") || strings.HasPrefix(l, "selftest: FAIL") {
			n++
			if len(fails) < 3 {
				fails = append(fails, l)
			}
		}
	}
	if n == 0 {
		return "no FAIL line on the console"
	}
	if n > len(fails) {
		fails = append(fails, fmt.Sprintf("and %d more", n-len(fails)))
	}
	return strings.Join(fails, "; ")
}

// checkDigests compares every digest the kernel printed with the Go
// reference for the same seed.
func checkDigests(rep *appliance.SelfTestReport, ref *reference) Check {
	if rep.Seed != ref.seed {
		return Check{"digests", Fail, fmt.Sprintf("the kernel ran seed %d, the Go reference seed %d", rep.Seed, ref.seed)}
	}
	var bad []string
	for _, name := range ref.names {
		got, ok := rep.Digests[name]
		switch {
		case !ok:
			bad = append(bad, fmt.Sprintf("%s missing", name))
		case got != ref.digests[name]:
			bad = append(bad, fmt.Sprintf("%s kernel %016x Go %016x", name, got, ref.digests[name]))
		}
	}
	if len(bad) > 0 {
		return Check{"digests", Fail, fmt.Sprintf("%d of %d differ from the Go reference in this dpxe (seed %d): %s",
			len(bad), len(ref.names), ref.seed, strings.Join(bad, ", "))}
	}
	return Check{"digests", Pass, fmt.Sprintf("%d equal the Go reference (seed %d)", len(ref.names), ref.seed)}
}

// checkLayout compares the kernel's struc SHARD and config keys with the
// Go mirrors in appliance.
func checkLayout(rep *appliance.SelfTestReport) Check {
	fields, size := appliance.ShardLayout()
	var bad []string
	if rep.Size != size {
		bad = append(bad, fmt.Sprintf("SHARD size kernel %d Go %d", rep.Size, size))
	}
	for _, f := range fields {
		if off, ok := rep.Layout[f.Name]; !ok || off != f.Offset {
			bad = append(bad, fmt.Sprintf("SHARD.%s kernel %d (printed %v) Go %d", f.Name, off, ok, f.Offset))
		}
	}
	if len(rep.Layout) != len(fields) {
		bad = append(bad, fmt.Sprintf("SHARD has %d fields in the kernel, %d in Go", len(rep.Layout), len(fields)))
	}
	if got, want := strings.Join(rep.CfgKeys, " "), strings.Join(appliance.BootConfigKeys(), " "); got != want {
		bad = append(bad, fmt.Sprintf("config keys kernel %q Go %q", got, want))
	}
	if len(bad) > 0 {
		return Check{"layout", Fail, strings.Join(bad, ", ")}
	}
	return Check{"layout", Pass, fmt.Sprintf("SHARD (%d fields, %d bytes) and %d config keys as in Go", len(fields), size, len(rep.CfgKeys))}
}

// verdict folds checks into a path status and the reason of the first
// check that did not pass.
func verdict(cs []Check) (Status, string) {
	for _, c := range cs {
		if c.Status == Error {
			return Error, c.Name + ": " + c.Detail
		}
	}
	for _, c := range cs {
		if c.Status == Fail {
			return Fail, c.Name + ": " + c.Detail
		}
	}
	return Pass, ""
}
