package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/image/qemu"
	"github.com/discord-pxe/dpxe/tools/gatewayemu"
	"github.com/discord-pxe/dpxe/tools/netns"
)

// rtcBase is the wrong date the guests' CMOS clocks start at: any time the
// kernel reports near today came from the controller, not the RTC.
const rtcBase = "2001-01-01"

// TestKernelTrustedTime boots nodes whose CMOS clock says 2001 against a
// real `dpxe serve` (issue 17, node/ttime.inc). Over pinned https:// the
// kernel takes the controller's time_ms as its trusted time: it says so
// ("time: controller (pinned https)") and prints trusted_now, which must
// match the controller's clock (this host's) within a bound that covers
// the answer's travel, the boot's console and TSC calibration error, not
// a speed. Over plain http:// the answer's time_ms is ignored, with a
// console line, and the kernel never claims the controller's time.
func TestKernelTrustedTime(t *testing.T) {
	if err := netns.Available(); err != nil {
		t.Skip(err)
	}
	needQEMU(t, qemu.SeaBIOS)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	const subnet = "10.87.0"
	ps := startPinnedServe(t, ctx, subnet, 4, "tt-pinned", "tt-plain")
	ns, pin, server, secure, creds := ps.ns, ps.pin, ps.server, ps.secure, ps.creds
	if err := ns.AddTap(ctx, "taptt0"); err != nil {
		t.Fatal(err)
	}

	// boot runs one node with cfg and its RTC at rtcBase until every line
	// in want has appeared on its console, then returns the console.
	boot := func(name, id string, cfg appliance.BootConfig, want ...string) string {
		t.Helper()
		cfg.NodeID, cfg.Credential = id, creds[id]
		cfg.StaticIP = subnet + ".31/24," + subnet + ".1"
		n := startNode(ctx, qemu.Options{
			Firmware: qemu.SeaBIOS,
			Kernel:   filepath.Join(outDir(t), image.KernelFile),
			Append:   cfg.String(),
			Net: []string{"-netdev", "tap,id=n0,ifname=taptt0,script=no,downscript=no",
				"-device", "e1000,netdev=n0,mac=52:54:00:87:00:31"},
			Extra:   []string{"-rtc", "base=" + rtcBase},
			Wrapper: ns.Wrapper(),
			Timeout: 100 * time.Second,
		})
		defer func() {
			if err := n.stop(); err != nil {
				t.Errorf("%s: qemu: %v", name, err)
			}
			if t.Failed() {
				t.Logf("%s console:\n%s", name, n.serial.String())
			}
		}()
		for _, w := range want {
			if n.serial.waitFor(regexp.MustCompile(w), 60*time.Second) == nil {
				t.Fatalf("%s: no console line %q", name, w)
			}
		}
		return n.serial.String()
	}
	q := regexp.QuoteMeta
	rtcUnix, _ := time.Parse(time.DateOnly, rtcBase)

	// Plain http: checks in, ignores time_ms. Two check-ins, so a later
	// answer did not change that either.
	plain := boot("plain http", "tt-plain", appliance.BootConfig{Controller: server},
		q("checkin: controller reachable"), q("time: controller time ignored (plain http)"),
		`node: controller=ok checkins=([2-9]|\d\d+) `)
	for _, bad := range []string{"time: controller (pinned https)", "time: unix="} {
		if strings.Contains(plain, bad) {
			t.Errorf("plain http: the kernel took the controller's time: %q", bad)
		}
	}

	// Pinned https: the controller's time, with the TSC since receipt.
	before := time.Now()
	pinned := boot("pinned https", "tt-pinned", appliance.BootConfig{Controller: secure, ControllerPin: pin},
		q("checkin: controller reachable"), q("time: controller (pinned https)"), `time: unix=\d+ rtc=\d+\r?\n`)
	after := time.Now()
	m := regexp.MustCompile(`time: unix=(\d+) rtc=(\d+)`).FindStringSubmatch(pinned)
	unix, _ := strconv.ParseInt(m[1], 10, 64)
	rtc, _ := strconv.ParseInt(m[2], 10, 64)
	if rtc < rtcUnix.Unix() || rtc > rtcUnix.Unix()+3600 {
		t.Fatalf("rtc=%d: the guest's CMOS clock is not at %s (%d): the test shows nothing", rtc, rtcBase, rtcUnix.Unix())
	}
	// Correctness bound: the kernel's trusted time lies between the
	// controller's clock before the boot and after the line, give or take
	// 2 s of rounding (seconds, truncated) and TSC calibration error.
	const slack = 2
	if unix < before.Unix()-slack || unix > after.Unix()+slack {
		t.Fatalf("trusted time unix=%d, want the controller's clock in [%d, %d] ± %d s (rtc=%d)", unix, before.Unix(), after.Unix(), slack, rtc)
	}
	if strings.Contains(pinned, "time: controller time ignored") {
		t.Error("pinned https: the kernel said it ignored the controller's time")
	}
	t.Logf("RTC at %s (rtc=%d); pinned https: trusted time unix=%d, controller clock %d..%d; plain http: time_ms ignored",
		rtcBase, rtc, unix, before.Unix(), after.Unix())
}

// TestKernelGatewayWSSTrustedTime: two nodes whose CMOS clocks say 2001
// (before the emulator's certificates, made valid from an hour ago) run
// one wss:// shard each. The node that checks in over pinned https://
// validates the chain against the controller's time and completes the
// handshake; the node that checks in over plain http:// must not take the
// controller's time and refuses the chain with certificate_not_yet_valid
// on its RTC.
func TestKernelGatewayWSSTrustedTime(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	const subnet = "10.88.0"
	l := newGWLabNoServe(t, ctx, subnet, gatewayemu.Options{HeartbeatInterval: time.Second, Shards: 2, MaxConcurrency: 2,
		TLS: true, PublicHost: wssHost, ResumeHost: wssResumeHost, ResumeTimeout: 2 * time.Minute})
	pinOut, err := exec.CommandContext(ctx, l.bin, "serve", "--db", filepath.Join(l.dir, "dpxe.db"), "--print-pin").Output()
	if err != nil {
		t.Fatalf("--print-pin: %v", err)
	}
	pin := strings.TrimSpace(string(pinOut))
	secure := "https://" + subnet + ".1:8443"
	l.qemuExtra = []string{"-rtc", "base=" + rtcBase}
	l.nodeConfig = func(i int, c *appliance.BootConfig) {
		if i == 0 {
			c.Controller, c.ControllerPin = secure, pin
		}
	}
	wssPrepare(t, l, [4]byte{10, 88, 0, 1}, l.emu.CAPEM(), wssHost,
		"--total-shards", "2", "--max-concurrency", "2", "--lease", "15s", "--tls-listen", subnet+".1:8443")
	q := regexp.QuoteMeta
	pinned := l.boot("tt-wss-pinned", "e1000", 1)
	for _, re := range []string{q("time: controller (pinned https)"), `shard \d: TLS 1\.3 \S+ x25519 sig=0x0403 chain=2 name=` + q(wssHost) + ` in `} {
		if pinned.serial.waitFor(regexp.MustCompile(re), 60*time.Second) == nil {
			t.Fatalf("pinned https node: no console line %q", re)
		}
	}
	plain := l.boot("tt-wss-plain", "e1000", 1)
	for _, re := range []string{q("time: controller time ignored (plain http)"), q("time: cmos rtc (no pinned check-in yet)"),
		`shard \d: TLS refused: certificate_not_yet_valid\r?\n`} {
		if plain.serial.waitFor(regexp.MustCompile(re), 60*time.Second) == nil {
			t.Fatalf("plain http node: no console line %q", re)
		}
	}
	if strings.Contains(plain.serial.String(), "TLS 1.3 ") {
		t.Error("plain http node: a handshake completed on the 2001 RTC")
	}
	if strings.Contains(pinned.serial.String(), "certificate_not_yet_valid") {
		t.Error("pinned https node: refused the chain as not yet valid")
	}
	t.Log("RTC at " + rtcBase + ": pinned https node validated the wss:// chain on the controller's time; plain http node refused it (certificate_not_yet_valid)")
}
