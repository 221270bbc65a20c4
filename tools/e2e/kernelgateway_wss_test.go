package e2e

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/kernel"
	"github.com/discord-pxe/dpxe/tools/gatewayemu"
)

// wssHost is the Gateway host name the namespace's DNS resolves to the
// emulator (the leaf names it; the kernel sends it as SNI), and
// wssResumeHost the host of READY's resume_gateway_url (named by the leaf
// too, resolved to the same address).
const (
	wssHost       = "gateway.test"
	wssResumeHost = "resume.gateway.test"
)

// newWSSLab is a gwLab whose emulator serves wss:// (TLS 1.3, the
// Discord-shaped chain of gatewayemu's setupTLS) under the name wssHost,
// with its controller started by wssPrepare.
func newWSSLab(t *testing.T, ctx context.Context, subnet string, bridge [4]byte, shards int, anchor func(*gatewayemu.Emulator) []byte) *gwLab {
	return newWSSLabDial(t, ctx, subnet, bridge, shards, anchor, wssHost)
}

// newWSSLabDial is newWSSLab with the controller handing out
// wss://dialHost:7878 (dialHost resolves to the emulator too).
func newWSSLabDial(t *testing.T, ctx context.Context, subnet string, bridge [4]byte, shards int, anchor func(*gatewayemu.Emulator) []byte, dialHost string) *gwLab {
	t.Helper()
	l := newGWLabNoServe(t, ctx, subnet, gatewayemu.Options{HeartbeatInterval: time.Second, Shards: shards, MaxConcurrency: shards,
		TLS: true, PublicHost: wssHost, ResumeHost: wssResumeHost, ResumeTimeout: 2 * time.Minute})
	total := fmt.Sprint(shards)
	wssPrepare(t, l, bridge, anchor(l.emu), dialHost, "--total-shards", total, "--max-concurrency", total, "--lease", "15s")
	return l
}

// wssPrepare readies a gwLab whose emulator serves wss:// under wssHost
// (Options.TLS and PublicHost wssHost), dialled as dialHost (wssHost, or
// another name for the same address): it builds an image whose only
// trust anchor is anchorPEM (the emulator's root, or another), which the
// lab's nodes boot; starts a DNS server on the bridge that resolves
// wssHost to bridge, and dnsmasq for DHCP naming it, so nodes boot
// without ip=; and starts `dpxe serve` handing out wss://dialHost:7878
// (--gateway-url: the emulator's REST routes are https with a root the
// controller does not hold) with the extra flags.
func wssPrepare(t testing.TB, l *gwLab, bridge [4]byte, anchorPEM []byte, dialHost string, serveArgs ...string) {
	t.Helper()
	subnet := l.subnet
	dir := t.TempDir()
	start := time.Now()
	if _, err := image.Build(l.ctx, image.Options{Sources: kernel.Sources, OutDir: dir,
		Trust: []image.TrustSource{{Name: "wss-test-root", PEM: anchorPEM}}}); err != nil {
		t.Fatal(err)
	}
	t.Logf("image with the test anchor: %v", time.Since(start).Round(time.Millisecond))
	l.kernel = filepath.Join(dir, image.KernelFile)
	startLabDNS(t, l.ns.Name, subnet+".1", 60, map[string][4]byte{wssHost: bridge, wssResumeHost: bridge, dialHost: bridge})
	dnsmasq := l.ns.Command(l.ctx, "dnsmasq", "--no-daemon", "--conf-file=/dev/null", "--port=0",
		"--interface=br0", "--bind-interfaces", "--no-ping", "--pid-file=",
		"--dhcp-leasefile="+filepath.Join(t.TempDir(), "leases"),
		"--dhcp-range="+subnet+".100,"+subnet+".150,255.255.255.0,2m",
		"--dhcp-option=3,"+subnet+".1", "--dhcp-option=6,"+subnet+".1")
	var dlog bytes.Buffer
	dnsmasq.Stdout, dnsmasq.Stderr = &dlog, &dlog
	if err := dnsmasq.Start(); err != nil {
		t.Skipf("dnsmasq: %v", err)
	}
	t.Cleanup(func() {
		dnsmasq.Cancel()
		dnsmasq.Wait()
	})
	l.dhcp = true
	l.srvArgs = append([]string{"serve", "--db", filepath.Join(l.dir, "dpxe.db"), "--listen", subnet + ".1:8080", "--no-dashboard",
		"--gateway-url", "wss://" + dialHost + ":7878", "--bot-token-file", l.botToken}, serveArgs...)
	l.startServe()
}

// TestKernelGatewayWSS runs two shards of one node over wss:// against the
// emulator's crypto/tls server: each shard resolves the Gateway's name,
// takes a shared handshake slot, validates the chain (P-256 leaf, P-256
// intermediate signed ECDSA-SHA384, the P-384 test root as the image's
// only anchor) with the name as SNI, and then speaks WebSocket through
// its own record state: both READY, heartbeats ACKed, one Identify each.
// A dropped connection is Resumed over a fresh TLS connection to the
// session's wss:// resume URL, whose own host name is the SNI; so is a
// close with code 4000, whose Close frame the shard reads before the
// close_notify behind it (the reset line carries the code). The emulator
// records no violation, and no ClientHello Random repeats.
func TestKernelGatewayWSS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	l := newWSSLab(t, ctx, "10.97.0", [4]byte{10, 97, 0, 1}, 2, (*gatewayemu.Emulator).CAPEM)
	n := l.boot("gw-wss", "e1000", 2)
	started := time.Now()
	l.awaitEmu(60*time.Second, "two sessions over wss:// with 3 heartbeats each", func(s gatewayemu.State) bool {
		m := readySessions(s, 3)
		return m[0] == 1 && m[1] == 1
	})
	t.Logf("both shards READY with 3 ACKed heartbeats %v after the boot", time.Since(started).Round(time.Millisecond))
	// The emulator counts a session from its accepted Identify; the node
	// holds it once it has read READY. A fault before that would find no
	// session to Resume (seen once: the drop came between the two).
	for _, re := range []string{`shard 0: READY session `, `shard 1: READY session `} {
		if n.serial.waitFor(regexp.MustCompile(re), 20*time.Second) == nil {
			t.Fatalf("no console line %q", re)
		}
	}
	hs := regexp.MustCompile(`shard (\d): TLS 1\.3 (TLS_\S+) x25519 sig=0x0403 chain=2 name=` + regexp.QuoteMeta(wssHost) + ` in (\d+) ms \(handshake slot (\d) wiped and freed\)`)
	if m := hs.FindAllStringSubmatch(n.serial.String(), -1); len(m) < 2 {
		t.Errorf("want a TLS line per shard, got %q", m)
	} else {
		t.Logf("handshakes: %q", m)
	}
	for _, re := range []string{
		`memory per shard with TLS \(wss://\): the workspace holds the record state \d+ and the record buffer \d+; handshake slots shared by all shards: 4 x \d+ bytes`,
		`shard 0: STARTING: connecting to wss://` + regexp.QuoteMeta(wssHost) + `:7878/\?v=10&encoding=json`,
	} {
		if n.serial.waitFor(regexp.MustCompile(re), 5*time.Second) == nil {
			t.Errorf("no console line %q", re)
		}
	}
	// The target: at most 96 KiB a shard with TLS (the shared
	// handshake slots are not a shard's).
	if per, _ := shardMemory(t, n.serial.String(), 2); per > 96<<10 {
		t.Errorf("memory per shard with TLS: %.0f bytes, over the 96 KiB (98304) target by %.0f", per, per-96<<10)
	}
	if ids := l.emu.Identifies(); len(ids) != 2 {
		t.Errorf("%d Identifies, want 2", len(ids))
	}

	// A forced close: the shard Resumes the same session over a new TLS
	// connection to the resume URL.
	ses0, ok := l.shardSession(0)
	if !ok {
		t.Fatal("no live session of shard 0")
	}
	zero := 0
	if _, err := l.emu.Inject(gatewayemu.Fault{Kind: gatewayemu.FaultDrop, Shard: &zero}); err != nil {
		t.Fatal(err)
	}
	l.awaitEmu(40*time.Second, "shard 0 resumed over wss://", func(gatewayemu.State) bool {
		ses, ok := l.shardSession(0)
		return ok && ses.ID == ses0.ID && ses.Resumes > ses0.Resumes
	})
	if c := strings.Count(n.serial.String(), "shard 0: TLS 1.3 "); c < 2 {
		t.Errorf("shard 0 made %d TLS handshakes, want a second one for the Resume", c)
	}
	// The Resume went to READY's resume URL, by its own name: its SNI and
	// the name the leaf was checked against.
	for _, re := range []string{
		`shard 0: STARTING: connecting to wss://` + regexp.QuoteMeta(wssResumeHost) + `:7878/\?v=10&encoding=json \(10\.97\.0\.1\) to Resume`,
		`shard 0: TLS 1\.3 \S+ x25519 sig=0x0403 chain=2 name=` + regexp.QuoteMeta(wssResumeHost) + ` in `,
	} {
		if n.serial.waitFor(regexp.MustCompile(re), 5*time.Second) == nil {
			t.Errorf("no console line %q", re)
		}
	}
	// A Close frame with a resumable code, then close_notify and FIN: the
	// shard reads the frame before the end of the TLS stream, so its reset
	// carries the code, and it Resumes.
	ses1, ok := l.shardSession(1)
	if !ok {
		t.Fatal("no live session of shard 1")
	}
	one := 1
	if _, err := l.emu.Inject(gatewayemu.Fault{Kind: gatewayemu.FaultClose, Shard: &one, Code: 4000}); err != nil {
		t.Fatal(err)
	}
	if n.serial.waitFor(regexp.MustCompile(`shard 1: closed by the Gateway: phase 7 tcp \d+ close 4000 `), 20*time.Second) == nil {
		t.Error("no reset line with close 4000 for shard 1 (the Close frame before close_notify was lost?)")
	}
	l.awaitEmu(40*time.Second, "shard 1 resumed over wss://", func(gatewayemu.State) bool {
		ses, ok := l.shardSession(1)
		return ok && ses.ID == ses1.ID && ses.Resumes > ses1.Resumes
	})
	if ids := l.emu.Identifies(); len(ids) != 2 {
		t.Errorf("%d Identifies after the Resumes, want still 2", len(ids))
	}
	if v := l.emu.Violations(); len(v) != 0 {
		t.Errorf("emulator violations: %s", violationReport(v))
	}
	// Every handshake drew its own Random (and key share) from the DRBG:
	// none repeats across the shards and their reconnects.
	rs := l.hellos.randoms()
	seen := map[string]bool{}
	for _, r := range rs {
		if seen[r] {
			t.Errorf("ClientHello Random %s seen twice in %d handshakes", r, len(rs))
		}
		seen[r] = true
	}
	if len(rs) < 4 {
		t.Errorf("%d ClientHellos, want at least 4 (two shards, two Resumes)", len(rs))
	}
	for _, m := range regexp.MustCompile(`shard \d: [^\n]*: phase \d+ tcp [^\n]*`).FindAllString(n.serial.String(), -1) {
		t.Logf("reset: %s", m)
	}
}

// TestKernelGatewayWSSUnknownRoot boots a node whose image trusts another
// P-384 root than the one the emulator's chain ends in: every shard
// refuses the chain with unknown_ca (console, reset line and the
// controller's last_error), retries after its backoff and refuses again,
// and the emulator never sees an Identify (the token is never sent on a
// refused connection).
func TestKernelGatewayWSSUnknownRoot(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	other := newTLSGetCA(t, "wss other root", wssHost)
	l := newWSSLab(t, ctx, "10.98.0", [4]byte{10, 98, 0, 1}, 2, func(*gatewayemu.Emulator) []byte { return other.rootPEM })
	n := l.boot("gw-wss-bad", "e1000", 2)
	for _, re := range []string{
		`shard 0: TLS refused: unknown_ca\r?\n`,
		`shard 1: TLS refused: unknown_ca\r?\n`,
		`shard 0: unknown_ca: phase 10 tcp \d+ close 0 seq \d+ acks 0 reconnects 0 tls 1\r?\n`,
	} {
		if n.serial.waitFor(regexp.MustCompile(re), 60*time.Second) == nil {
			t.Fatalf("no console line %q", re)
		}
	}
	// The retry after the 5 s backoff refuses again.
	if n.serial.waitFor(regexp.MustCompile(`shard 0: unknown_ca: phase 10 tcp \d+ close 0 seq \d+ acks 0 reconnects 1 tls 1`), 20*time.Second) == nil {
		t.Error("no second refusal after the backoff")
	}
	// The reason reached the controller as each shard's last_error.
	deadline := time.Now().Add(20 * time.Second)
	for {
		d, err := l.nodeDetail("gw-wss-bad")
		ok := err == nil && len(d.Shards) == 2
		for _, s := range d.Shards {
			ok = ok && s.LastError == "unknown_ca"
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("last_error at the controller: %+v (%v), want unknown_ca for both shards", d.Shards, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
	if ids := l.emu.Identifies(); len(ids) != 0 {
		t.Errorf("%d Identifies on refused connections, want 0", len(ids))
	}
	if c := len(l.emu.Sessions()); c != 0 {
		t.Errorf("%d emulator sessions, want none", c)
	}
	if strings.Contains(n.serial.String(), "upgrade") {
		t.Error("a WebSocket upgrade was sent on a refused connection")
	}
}

// TestKernelGatewayWSSLadder is a ladder step over wss:// (the harness
// of TestKernelGatewayScale's wss:// steps in make test-scale): 6 shards with
// max_concurrency 3 start at once, more than the kernel's 4 TLS handshake
// slots, so some wait for a slot (a console line says so) and all reach
// READY within the Identify floor's bound, one Identify each, with no
// violation (ladderRunShape's checks). The node checks in and claims over
// pinned https:// (three claims at once share claim_ch).
func TestKernelGatewayWSSLadder(t *testing.T) {
	f := ladderRunShape(t, "10.99.0", 6, 3, true, ladderShape{wss: true})
	hs := regexp.MustCompile(`shard \d+: TLS 1\.3 \S+ x25519 sig=0x[0-9a-f]+ chain=\d+ name=\S+ in (\d+) ms`).FindAllStringSubmatch(f.console, -1)
	if len(hs) < 6 {
		t.Errorf("%d TLS handshakes on the console, want 6", len(hs))
	}
	var ms []int
	for _, m := range hs {
		ms = append(ms, int(mustU(m[1])))
	}
	slices.Sort(ms)
	if len(ms) > 0 {
		t.Logf("handshake ClientHello to Finished (wall, TCG, shared machine): min %d ms, median %d ms, max %d ms over %d (4 slots)", ms[0], ms[len(ms)/2], ms[len(ms)-1], len(ms))
	}
	if !strings.Contains(f.console, "waiting for a TLS handshake slot") {
		t.Error("no shard waited for a handshake slot: 6 shards, 4 slots")
	}
}

// TestKernelGatewayWSSNameMismatch dials the emulator under a name its
// leaf does not carry (the chain is trusted): the shard sends that name as
// SNI, refuses with name_mismatch, and nothing reaches the WebSocket.
func TestKernelGatewayWSSNameMismatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	l := newWSSLabDial(t, ctx, "10.95.0", [4]byte{10, 95, 0, 1}, 1, (*gatewayemu.Emulator).CAPEM, "elsewhere.test")
	n := l.boot("gw-wss-name", "e1000", 1)
	if n.serial.waitFor(regexp.MustCompile(`shard 0: TLS refused: name_mismatch\r?\n`), 60*time.Second) == nil {
		t.Fatal("no name_mismatch refusal on the console")
	}
	if c := len(l.emu.Sessions()); c != 0 || len(l.emu.Identifies()) != 0 {
		t.Errorf("%d emulator sessions, %d Identifies, want none", c, len(l.emu.Identifies()))
	}
}
