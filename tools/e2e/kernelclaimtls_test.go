package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/tools/gatewayemu"
)

// TestKernelGatewayWSSClaimsOverTLS runs a node whose controller is
// https:// with controller_pin= (dpxe serve's own identity on
// --tls-listen) and whose shards dial wss://: the check-ins and the
// Identify claims go to the controller over the kernel's pinned TLS 1.3
// client only. The controller's plain HTTP API listens on the namespace's
// loopback, which a node cannot reach, so a claim sent in clear (or not at
// all) gets no grant and no shard Identifies. Both shards must Identify
// once through granted claims, reach READY with ACKed heartbeats, and the
// emulator must record no violation. The claims share one kept-alive
// connection (node/ctltls.inc claim_ch): the console names each pinned
// claim connection it opens.
func TestKernelGatewayWSSClaimsOverTLS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	const subnet = "10.132.0"
	l := newGWLabNoServe(t, ctx, subnet, gatewayemu.Options{HeartbeatInterval: time.Second, Shards: 2, MaxConcurrency: 2,
		TLS: true, PublicHost: wssHost, ResumeHost: wssResumeHost, ResumeTimeout: 2 * time.Minute})
	// The admin API in clear on the namespace's loopback only (the test
	// drives it from inside the namespace); the node API for the node on
	// HTTPS only.
	l.server = "http://127.0.0.1:8080"
	secure := "https://" + subnet + ".1:8443"
	wssPrepare(t, l, [4]byte{10, 132, 0, 1}, l.emu.CAPEM(), wssHost, "--listen", "127.0.0.1:8080", "--tls-listen", subnet+".1:8443",
		"--total-shards", "2", "--max-concurrency", "2", "--lease", "15s")
	pinLabController(t, l)

	n := l.boot("gw-claimtls", "e1000", 2)
	started := time.Now()
	l.awaitEmu(90*time.Second, "two sessions over wss:// with 3 heartbeats each, Identified through claims over TLS", func(s gatewayemu.State) bool {
		m := readySessions(s, 3)
		return m[0] == 1 && m[1] == 1
	})
	t.Logf("both shards READY with 3 ACKed heartbeats %v after the boot", time.Since(started).Round(time.Millisecond))
	q := regexp.QuoteMeta
	for _, re := range []string{
		`checkin: controller reachable`,
		`claim: pinned TLS 1\.3 connection 1 to ` + q(secure) + `\r?\n`,
		`shard 0: READY session `, `shard 1: READY session `,
	} {
		if n.serial.waitFor(regexp.MustCompile(re), 20*time.Second) == nil {
			t.Fatalf("no console line %q", re)
		}
	}
	con := n.serial.String()
	if strings.Contains(con, "claim: refused") {
		t.Error("a claim connection was refused")
	}
	if ids := l.emu.Identifies(); len(ids) != 2 {
		t.Errorf("%d Identifies, want 2", len(ids))
	}
	// Each Identify was granted by the controller: a claim it answered.
	grants, err := l.grants()
	if err != nil {
		t.Fatal(err)
	}
	if len(grants) < 2 {
		t.Errorf("%d identify grants at the controller, want at least 2", len(grants))
	}
	conns := len(regexp.MustCompile(`claim: pinned TLS 1\.3 connection \d+ `).FindAllString(con, -1))
	t.Logf("%d grants over %d pinned claim connection(s)", len(grants), conns)
	if v := l.emu.Violations(); len(v) != 0 {
		t.Errorf("emulator violations: %s", violationReport(v))
	}
	if strings.Contains(l.logs.String(), "kernel-lab-token") {
		t.Error("the serve log shows the bot token")
	}
}

// pinLabController points the lab's nodes at its dpxe serve's HTTPS
// listener, started with --tls-listen SUBNET.1:8443, with the pin that
// serve prints: their check-ins and Identify claims go over pinned TLS.
func pinLabController(t testing.TB, l *gwLab) {
	t.Helper()
	out, err := exec.CommandContext(l.ctx, l.bin, "serve", "--db", filepath.Join(l.dir, "dpxe.db"), "--print-pin").Output()
	if err != nil {
		t.Fatalf("--print-pin: %v", err)
	}
	pin := strings.TrimSpace(string(out))
	l.nodeController = "https://" + l.subnet + ".1:8443"
	l.nodeConfig = func(_ int, c *appliance.BootConfig) { c.ControllerPin = pin }
}
