package e2e

// `dpxe serve --interface` end to end, and the netboot attacks of issue
// 24 against it, in network namespaces: the server's namespace holds the
// bridge, and a victim and an attacker are hosts of their own on it
// (netns.AddHost), so their traffic crosses the bridge as a real LAN's
// would. Each attack must be refused; at the end a QEMU machine with the
// victim's MAC PXE-boots while the victim node is still live, waits for
// its lease to lapse, enrolls and checks in (the one QEMU boot of this
// path).

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3"

	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/store"
	"github.com/discord-pxe/dpxe/image/qemu"
	"github.com/discord-pxe/dpxe/tools/netns"
)

// firstCheckin is the kernel's line for its first answered check-in.
var firstCheckin = regexp.MustCompile(`checkin: controller reachable.*\(network up (\d+) ms ago\)`)

// secServer is one `dpxe serve` inside a namespace.
type secServer struct {
	t     *testing.T
	ns    *netns.NS
	bin   string
	dir   string // holds dpxe.db and admin.token
	logs  *nbBuffer
	token string
	cmd   *exec.Cmd
	done  chan error
}

// buildDPXE is the dpxe command (dpxeBinary).
func buildDPXE(t *testing.T) string {
	t.Helper()
	return dpxeBinary(t)
}

// startSecServer starts `dpxe serve` in ns with the operator API on
// 127.0.0.1:8080 of the namespace (and args) and waits for it.
func startSecServer(t *testing.T, ns *netns.NS, bin string, args ...string) *secServer {
	t.Helper()
	dir := t.TempDir()
	s := &secServer{t: t, ns: ns, bin: bin, dir: dir, logs: &nbBuffer{}, done: make(chan error, 1)}
	all := append([]string{"serve", "--db", filepath.Join(dir, "dpxe.db")}, args...)
	s.cmd = ns.Command(t.Context(), bin, all...)
	s.cmd.Stdout, s.cmd.Stderr = s.logs, s.logs
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.done <- s.cmd.Wait() }()
	t.Cleanup(func() {
		s.stop()
		if t.Failed() {
			t.Logf("dpxe serve log:\n%s", s.logs.String())
		}
	})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if tok, err := os.ReadFile(filepath.Join(dir, "admin.token")); err == nil {
			s.token = strings.TrimSpace(string(tok))
			if _, code := s.admin("GET", "/v1/netboot/machines", ""); code == 200 {
				return s
			}
		}
		select {
		case err := <-s.done:
			t.Fatalf("dpxe serve exited: %v\n%s", err, s.logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("dpxe serve did not come up:\n%s", s.logs.String())
		}
	}
}

func (s *secServer) stop() {
	if s.cmd.Process != nil {
		s.cmd.Process.Kill()
	}
}

// curlIn runs curl in a namespace or host (run) and returns the body and
// the status (0 when curl failed).
func curlIn(run func(ctx context.Context, name string, args ...string) (string, error), args ...string) (string, int) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	out, _ := run(ctx, "curl", append([]string{"-s", "-m", "10", "-w", "\n%{http_code}"}, args...)...)
	i := strings.LastIndexByte(out, '\n')
	if i < 0 {
		return out, 0
	}
	code, _ := strconv.Atoi(strings.TrimSpace(out[i+1:]))
	return out[:i], code
}

// admin calls the operator API on the namespace's loopback.
func (s *secServer) admin(method, path, body string) (string, int) {
	args := []string{"-X", method, "-H", "Authorization: Bearer " + s.token}
	if body != "" {
		args = append(args, "-d", body)
	}
	return curlIn(s.ns.Run, append(args, "http://127.0.0.1:8080"+path)...)
}

// events returns the audit log entries of one kind.
func (s *secServer) events(kind string) []store.Event {
	s.t.Helper()
	var out struct{ Events []store.Event }
	// Events are written in batches (one second in dpxe serve).
	body, code := s.admin("GET", "/v1/events?kind="+kind+"&limit=1000", "")
	if code != 200 || json.Unmarshal([]byte(body), &out) != nil {
		s.t.Fatalf("GET /v1/events: %d %s", code, body)
	}
	return out.Events
}

// timeline returns a machine's boot timeline as "stage detail" lines.
func (s *secServer) timeline(mac string) []string {
	s.t.Helper()
	var out struct {
		Timeline []struct{ Stage, Detail string }
	}
	body, code := s.admin("GET", "/v1/netboot/machines/"+mac+"/timeline", "")
	if code != 200 || json.Unmarshal([]byte(body), &out) != nil {
		s.t.Fatalf("timeline of %s: %d %s", mac, code, body)
	}
	var lines []string
	for _, e := range out.Timeline {
		lines = append(lines, e.Stage+" "+e.Detail)
	}
	return lines
}

// udhcpcScript configures the address udhcpc gets.
const udhcpcScript = `#!/bin/sh
case "$1" in
bound|renew)
	ip addr flush dev "$interface"
	ip addr add "$ip/${mask:-24}" dev "$interface"
	echo "BOUND $ip"
	;;
esac
exit 0
`

// dhcpLease runs busybox udhcpc once in h and returns the address it
// bound: a real DHCP exchange, after which an approved MAC may fetch its
// script once.
func dhcpLease(t *testing.T, h *netns.Host, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := h.Run(ctx, "busybox", "udhcpc", "-f", "-q", "-n", "-t", "5", "-T", "1", "-i", netns.HostIface, "-s", script)
	if err != nil {
		t.Fatalf("udhcpc: %v\n%s", err, out)
	}
	for _, line := range strings.Split(out, "\n") {
		if ip, ok := strings.CutPrefix(line, "BOUND "); ok {
			return strings.TrimSpace(ip)
		}
	}
	t.Fatalf("udhcpc bound nothing:\n%s", out)
	return ""
}

var credRE = regexp.MustCompile(`cred=([A-Za-z0-9_-]+)`)

// checkin checks node id in with cred from h (curl, as the kernel would).
func checkin(h *netns.Host, base, id, cred string) (string, int) {
	return curlIn(h.Run, "-H", "Authorization: Bearer "+cred, "-d", `{"node_id":"`+id+`","capacity":4}`, base+"/v1/checkin")
}

// TestServeNetbootPXE runs the real `dpxe serve --interface` inside a
// namespace (authoritative DHCP, TFTP, HTTP boot, API and dashboard in one
// process, --listen 0.0.0.0:8080, so the boot address and loopback share
// one listener and are told apart by local address), performs the
// attacks of issue 24 against it, then PXE-boots a SeaBIOS + e1000 QEMU
// machine with QEMU's iPXE ROM that takes over from the live node it
// replaces: the kernel's banner must show the node ID, the controller URL
// and a credential, the node must be live at the address DHCP leased, the
// inventory must hold no credential in clear, `dpxe nodes show` must list
// the boot timeline, and SIGTERM must stop the server cleanly.
func TestServeNetbootPXE(t *testing.T) {
	if err := netns.Available(); err != nil {
		t.Skipf("skipping: %v", err)
	}
	out := outDir(t)
	bin := buildDPXE(t)
	ctx := context.Background()
	ns, err := netns.New(ctx, netip.MustParsePrefix("10.92.0.1/24"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	const (
		boot     = "http://10.92.0.1:8080"
		victimID = "victim-01"
		vmac     = "52:54:00:92:00:01"
		vkey     = "52-54-00-92-00-01"
		amac     = "52:54:00:92:00:66"
	)
	srv := startSecServer(t, ns, bin, "--listen", "0.0.0.0:8080", "--total-shards", "4", "--lease", "12s",
		"--interface", ns.Bridge, "--dhcp", "authoritative", "--pool", "10.92.0.100-10.92.0.149/24",
		"--router", "10.92.0.1", "--boot-dir", out, "--ipv6-no-router")
	if body, code := srv.admin("POST", "/v1/netboot/machines/"+vmac+"/approve", `{"node_id":"`+victimID+`"}`); code != 200 {
		t.Fatalf("approve: %d %s", code, body)
	}
	script := filepath.Join(t.TempDir(), "udhcpc.sh")
	if err := os.WriteFile(script, []byte(udhcpcScript), 0o755); err != nil {
		t.Fatal(err)
	}
	victim, err := ns.AddHost(ctx, vmac, netip.Prefix{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { victim.Close() })
	// The attacker is a static host on the LAN, as in the probe.
	attacker, err := ns.AddHost(ctx, amac, netip.MustParsePrefix("10.92.0.66/24"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { attacker.Close() })
	scriptPath := "/boot/" + vkey + ".ipxe"
	noCred := func(what, body string) {
		t.Helper()
		if credRE.MatchString(body) {
			t.Fatalf("%s: the answer carries a credential:\n%s", what, body)
		}
	}

	// The operator listener serves no /boot/, and the boot address none
	// of the operator's routes.
	t.Run("loopback", func(t *testing.T) {
		if body, code := curlIn(ns.Run, "http://127.0.0.1:8080"+scriptPath); code != 404 {
			t.Fatalf("script from loopback: %d %s", code, body)
		}
		// The server's own address on the boot LAN holds no lease.
		if body, code := curlIn(ns.Run, boot+scriptPath); code != 403 {
			t.Fatalf("script from the server's own boot address: %d %s", code, body)
		}
	})
	t.Run("admin surface on the boot LAN", func(t *testing.T) {
		for _, p := range []string{"/", "/login", "/nodes", "/v1/nodes", "/v1/netboot/machines", "/v1/events", "/static/app.js"} {
			if body, code := curlIn(attacker.Run, "-H", "Authorization: Bearer "+srv.token, boot+p); code != 404 {
				t.Errorf("GET %s on the boot address: %d %.200s", p, code, body)
			}
		}
		if _, code := curlIn(attacker.Run, boot+"/healthz"); code != 200 {
			t.Errorf("GET /healthz on the boot address: %d", code)
		}
	})

	// The victim's machine boots: a DHCP exchange, then its script.
	vip := dhcpLease(t, victim, script)
	t.Run("foreign Host header", func(t *testing.T) {
		// Even from the victim's own address right after its DHCP
		// exchange: a DNS-rebinding page in a browser there.
		body, code := curlIn(victim.Run, "-H", "Host: rebind.attacker.example:8080", boot+scriptPath)
		if code != 421 {
			t.Fatalf("script with a foreign Host: %d %s", code, body)
		}
		noCred("foreign Host", body)
	})
	t.Run("script from another host", func(t *testing.T) {
		// The attacker learns the URL from the broadcast OFFER and asks
		// while the victim's DHCP exchange is fresh.
		body, code := curlIn(attacker.Run, boot+scriptPath)
		if code != 403 {
			t.Fatalf("the attacker's script fetch: %d %s", code, body)
		}
		noCred("attacker's fetch", body)
	})
	body, code := curlIn(victim.Run, boot+scriptPath)
	m := credRE.FindStringSubmatch(body)
	if code != 200 || m == nil {
		t.Fatalf("the victim's own script: %d\n%s", code, body)
	}
	cred := m[1]
	if body, code := checkin(victim, boot, victimID, cred); code != 200 || !strings.Contains(body, `"generation"`) {
		t.Fatalf("the victim's first check-in: %d %s", code, body)
	}
	// The victim stays live: it checks in every 2 s (lease 12 s).
	var stopKeep = make(chan struct{})
	var keepMu sync.Mutex
	var keepFails []string
	keepDone := make(chan struct{})
	go func() {
		defer close(keepDone)
		for {
			select {
			case <-stopKeep:
				return
			case <-time.After(2 * time.Second):
			}
			if body, code := checkin(victim, boot, victimID, cred); code != 200 {
				keepMu.Lock()
				keepFails = append(keepFails, fmt.Sprintf("%d %s", code, body))
				keepMu.Unlock()
			}
		}
	}()
	keepStopped := false
	stopKeeping := func() {
		if !keepStopped {
			keepStopped = true
			close(stopKeep)
			<-keepDone
		}
	}
	t.Cleanup(stopKeeping)
	liveFails := func(when string) {
		t.Helper()
		keepMu.Lock()
		defer keepMu.Unlock()
		if len(keepFails) > 0 {
			t.Fatalf("%s: the live victim's check-ins were refused: %v", when, keepFails)
		}
	}

	t.Run("second fetch while the node is live", func(t *testing.T) {
		dhcpLease(t, victim, script) // a fresh exchange: the fetch is allowed
		body, code := curlIn(victim.Run, boot+scriptPath)
		if code != 200 || !strings.Contains(body, "is still checking in") {
			t.Fatalf("script of a live node: %d\n%s", code, body)
		}
		noCred("live node's script", body)
		if _, code := checkin(victim, boot, victimID, cred); code != 200 {
			t.Fatalf("the live node's credential stopped working: %d", code)
		}
		var ev []store.Event
		for deadline := time.Now().Add(5 * time.Second); len(ev) == 0 && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			ev = srv.events(controller.EventEnrollmentRefused)
		}
		if len(ev) == 0 || ev[0].NodeID != victimID || !strings.Contains(ev[0].Detail, vip) {
			t.Fatalf("no security event for the refused re-enrollment: %+v", ev)
		}
		t.Logf("security event: %s", ev[0].Detail)
	})

	t.Run("forged 4011 REQUEST", func(t *testing.T) {
		r := runAttackHelper(t, attacker, attackJob{Op: "pxe4011", Server: "10.92.0.1", MAC: amac, CIAddr: vip})
		t.Logf("4011 answer to the attacker: %v %q", r.Replied, r.File)
		// The victim's address is still its own: after its next DHCP
		// exchange its script fetch is answered (the live script), not
		// refused as another MAC's address.
		dhcpLease(t, victim, script)
		if body, code := curlIn(victim.Run, boot+scriptPath); code != 200 || !strings.Contains(body, "is still checking in") {
			t.Fatalf("the victim's fetch after the forged 4011 request: %d\n%s", code, body)
		}
	})

	t.Run("fake timeline steps", func(t *testing.T) {
		count := func() int {
			n := 0
			for _, l := range srv.timeline(vkey) {
				if strings.HasPrefix(l, "kernel_fetched") || strings.HasPrefix(l, "tftp_file") {
					n++
				}
			}
			return n
		}
		before := count()
		if _, code := curlIn(attacker.Run, "-o", "/dev/null", boot+"/boot/node/"+vkey+"/kernel.bin"); code != 200 {
			t.Fatalf("kernel download: %d", code)
		}
		dst := filepath.Join(t.TempDir(), "k")
		if out, err := attacker.Run(context.Background(), "tftp", "-m", "binary", "10.92.0.1", "-c", "get", "kernel.bin", dst); err != nil {
			t.Fatalf("tftp: %v %s", err, out)
		}
		time.Sleep(1500 * time.Millisecond) // timeline writes are asynchronous
		if after := count(); after != before {
			t.Fatalf("the attacker wrote %d steps onto the victim's timeline:\n%s", after-before, strings.Join(srv.timeline(vkey), "\n"))
		}
	})

	t.Run("DHCP pool starvation", func(t *testing.T) {
		r := runAttackHelper(t, attacker, attackJob{Op: "flood", Server: "10.92.0.1", Count: 60})
		// 50 addresses, unapproved MACs hold at most half (the victim's
		// is approved; the attacker's own address is static).
		if r.Acks > 25 || r.Offers > 25 {
			t.Fatalf("60 made-up MACs got %d offers and %d leases of a 50-address pool, cap 25", r.Offers, r.Acks)
		}
		t.Logf("flood of 60 made-up MACs: %d offers, %d leases", r.Offers, r.Acks)
		// An approved machine still gets an address.
		const lmac = "52:54:00:92:00:02"
		if body, code := srv.admin("POST", "/v1/netboot/machines/"+lmac+"/approve", `{"node_id":"late-02"}`); code != 200 {
			t.Fatalf("approve: %d %s", code, body)
		}
		late, err := ns.AddHost(ctx, lmac, netip.Prefix{})
		if err != nil {
			t.Fatal(err)
		}
		defer late.Close()
		if ip := dhcpLease(t, late, script); ip == "" {
			t.Fatal("no lease for an approved machine after the flood")
		}
		if n := strings.Count(srv.logs.String(), "dhcp: no address"); n > 2 {
			t.Fatalf("%d log lines for refused DHCP clients, want them rate-limited", n)
		}
	})
	liveFails("after the attacks")

	// A genuine reboot: the node keeps checking in with its session
	// credential (from another address: its old incarnation) while a
	// QEMU machine with its MAC PXE-boots. Its script fetch is refused
	// while the node is live; once the old incarnation stops and the
	// lease lapses, the machine re-runs DHCP, enrolls, and its kernel
	// checks in.
	t.Run("genuine reboot enrolls", func(t *testing.T) {
		needQEMU(t, qemu.SeaBIOS)
		for _, args := range [][]string{
			{"link", "set", netns.HostIface, "down"},
			{"link", "set", netns.HostIface, "address", "02:00:00:92:00:99"},
			{"addr", "flush", "dev", netns.HostIface},
			{"addr", "add", "10.92.0.61/24", "dev", netns.HostIface},
			{"link", "set", netns.HostIface, "up"},
		} {
			if out, err := victim.Run(ctx, "ip", args...); err != nil {
				t.Fatalf("moving the old incarnation: %v %s", err, out)
			}
		}
		if err := ns.AddTap(ctx, "tap92"); err != nil {
			t.Fatal(err)
		}
		var serial nbBuffer
		qctx, qcancel := context.WithCancel(ctx)
		defer qcancel()
		qdone := make(chan *qemu.Result, 1)
		go func() {
			res, err := qemu.Run(qctx, qemu.Options{
				Firmware: qemu.SeaBIOS,
				Net: []string{"-netdev", "tap,id=n0,ifname=tap92,script=no,downscript=no",
					"-device", "e1000,netdev=n0,mac=" + vmac + ",romfile=/usr/lib/ipxe/qemu/pxe-e1000.rom,bootindex=1"},
				Wrapper: ns.Wrapper(), NoKVM: os.Getenv("DPXE_NETBOOT_KVM") != "1",
				Timeout: 200 * time.Second, Serial: &serial,
				Until: func(s string) bool {
					return firstCheckin.MatchString(s) || strings.Contains(s, "config error") || strings.Contains(s, "halted:")
				},
			})
			if err != nil {
				serial.Write([]byte("\n[qemu error] " + err.Error()))
			}
			qdone <- res
		}()
		defer func() {
			if t.Failed() {
				t.Logf("serial console:\n%s", serial.String())
				t.Logf("timeline:\n%s", strings.Join(srv.timeline(vkey), "\n"))
			}
		}()
		liveRefusals := func() int {
			n := 0
			for _, l := range srv.timeline(vkey) {
				if strings.Contains(l, "refused (node is live)") {
					n++
				}
			}
			return n
		}
		before := liveRefusals() // the curl victim's, above
		start := time.Now()
		for deadline := time.Now().Add(150 * time.Second); liveRefusals() == before; time.Sleep(500 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the rebooting machine's script fetch was never refused as live")
			}
			liveFails("while the machine boots")
		}
		refusedAt := time.Since(start)
		stopKeeping() // the old incarnation is gone
		var res *qemu.Result
		select {
		case res = <-qdone:
		case <-time.After(200 * time.Second):
			t.Fatal("QEMU did not finish")
		}
		if res == nil || !firstCheckin.MatchString(res.Serial) || !strings.Contains(res.Serial, "node="+victimID) {
			t.Fatalf("the rebooted machine did not enroll and check in (stopped %v)", res != nil && res.Stopped)
		}
		var enrolled []store.Event
		for deadline := time.Now().Add(5 * time.Second); len(enrolled) == 0 && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			enrolled = srv.events(controller.EventNodeEnrolled)
		}
		if len(enrolled) < 2 { // the curl victim's, then the machine's
			t.Fatalf("node_enrolled events: %+v", enrolled)
		}
		// The old incarnation's credential is void now.
		if _, code := checkin(victim, boot, victimID, cred); code != 401 {
			t.Fatalf("the replaced credential: %d, want 401", code)
		}
		want := "node=" + victimID + " controller=" + boot + " cred=set"
		if !strings.Contains(res.Serial, want) {
			t.Fatalf("no %q on the node's console", want)
		}
		bound := regexp.MustCompile(`dhcp: bound (\S+)/24 gw \S+ server 10\.92\.0\.1 .* in (\d+) ms`).FindStringSubmatch(res.Serial)
		if bound == nil || bound[1] != vip {
			t.Fatalf("the kernel did not get its lease %s from dpxe serve: %v", vip, bound)
		}
		up := firstCheckin.FindStringSubmatch(res.Serial)
		t.Logf("reboot: script refused as live %s after QEMU start; kernel DHCP lease %s in %s ms, first check-in %s ms after the network came up, %s after QEMU start; %s",
			refusedAt.Round(time.Millisecond), bound[1], bound[2], up[1], res.Elapsed.Round(time.Millisecond), enrolled[len(enrolled)-1].Detail)
		var list struct{ Nodes []controller.NodeView }
		body, _ := srv.admin("GET", "/v1/nodes", "")
		json.Unmarshal([]byte(body), &list)
		live := false
		for _, n := range list.Nodes {
			live = live || n.ID == victimID && n.Live && n.Address == vip && n.Capacity == 128
		}
		if !live {
			t.Fatalf("the machine is not the live %s at %s with capacity 128: %s", victimID, vip, body)
		}
		// No secret in clear: the inventory holds no credential.
		sdb, err := sql.Open("sqlite3", "file:"+filepath.Join(srv.dir, "dpxe.db")+"?mode=ro")
		if err != nil {
			t.Fatal(err)
		}
		defer sdb.Close()
		var stored sql.NullString
		if err := sdb.QueryRow(`SELECT credential FROM netboot_nodes WHERE mac = ?`, vkey).Scan(&stored); err != nil {
			t.Fatalf("reading the inventory: %v", err)
		}
		if stored.Valid && stored.String != "" {
			t.Error("the netboot inventory holds a credential in clear")
		}
		tok := filepath.Join(srv.dir, "admin.token")
		show, err := ns.Run(ctx, bin, "nodes", "show", victimID, "--server", "http://127.0.0.1:8080", "--token-file", tok)
		if err != nil {
			t.Fatalf("dpxe nodes show: %v\n%s", err, show)
		}
		for _, stage := range []string{"dhcp_ack", "script_fetched", "kernel_fetched", "checkin"} {
			if !strings.Contains(show, stage) {
				t.Errorf("dpxe nodes show lacks the %s step:\n%s", stage, show)
			}
		}
		machines, err := ns.Run(ctx, bin, "nodes", "machines", "--server", "http://127.0.0.1:8080", "--token-file", tok)
		if err != nil || !strings.Contains(machines, victimID) || !strings.Contains(machines, "approved") {
			t.Errorf("dpxe nodes machines: %v\n%s", err, machines)
		}
	})
	if n := strings.Count(srv.logs.String(), "\n"); n > 400 {
		t.Errorf("dpxe serve wrote %d log lines; refusals should be rate-limited", n)
	}
	// SIGTERM: a clean, prompt shutdown.
	srv.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-srv.done:
		if err != nil {
			t.Errorf("dpxe serve exited with %v after SIGTERM", err)
		}
	case <-time.After(20 * time.Second):
		t.Error("dpxe serve did not stop within 20 s of SIGTERM")
	}
	if !strings.Contains(srv.logs.String(), "stopped") {
		t.Errorf("no clean stop in the log:\n%s", srv.logs.String())
	}
}

// TestServeNetbootProxyEnroll: in proxy DHCP mode an approved machine is
// not enrolled over the network unless the operator opts in with
// --proxy-enroll; then the first script fetch after a proxy answer gets
// the credential, and a second one without a new answer does not.
func TestServeNetbootProxyEnroll(t *testing.T) {
	if err := netns.Available(); err != nil {
		t.Skipf("skipping: %v", err)
	}
	out := outDir(t)
	bin := buildDPXE(t)
	ctx := context.Background()
	const (
		boot = "http://10.93.0.1:8080"
		vmac = "52:54:00:93:00:01"
		vkey = "52-54-00-93-00-01"
	)
	for _, optIn := range []bool{false, true} {
		t.Run(fmt.Sprintf("proxy-enroll=%v", optIn), func(t *testing.T) {
			ns, err := netns.New(ctx, netip.MustParsePrefix("10.93.0.1/24"))
			if err != nil {
				t.Fatal(err)
			}
			defer ns.Close()
			args := []string{"--total-shards", "4", "--interface", ns.Bridge, "--dhcp", "proxy", "--boot-dir", out}
			if optIn {
				args = append(args, "--proxy-enroll")
			}
			srv := startSecServer(t, ns, bin, args...)
			defer srv.stop()
			if body, code := srv.admin("POST", "/v1/netboot/machines/"+vmac+"/approve", `{"node_id":"proxied-01"}`); code != 200 {
				t.Fatalf("approve: %d %s", code, body)
			}
			// The site's DHCP gave the machine 10.93.0.50 (static here).
			h, err := ns.AddHost(ctx, vmac, netip.MustParsePrefix("10.93.0.50/24"))
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			r := runAttackHelper(t, h, attackJob{Op: "discover", MAC: vmac})
			if !r.Replied || r.File != boot+"/boot/"+vkey+".ipxe" {
				t.Fatalf("proxy offer: %+v", r)
			}
			body, code := curlIn(h.Run, boot+"/boot/"+vkey+".ipxe")
			if !optIn {
				if code != 200 || !strings.Contains(body, "network enrollment is off") || credRE.MatchString(body) {
					t.Fatalf("proxy mode without --proxy-enroll: %d\n%s", code, body)
				}
				if !strings.Contains(srv.logs.String(), "proxy DHCP without --proxy-enroll") {
					t.Fatal("no warning about enrollment being off in the log")
				}
				return
			}
			m := credRE.FindStringSubmatch(body)
			if code != 200 || m == nil {
				t.Fatalf("proxy mode with --proxy-enroll: %d\n%s", code, body)
			}
			if body, code := curlIn(h.Run, boot+"/boot/"+vkey+".ipxe"); code != 200 || credRE.MatchString(body) {
				t.Fatalf("second fetch without a new proxy answer: %d\n%s", code, body)
			}
			if body, code := checkin(h, boot, "proxied-01", m[1]); code != 200 {
				t.Fatalf("first check-in: %d %s", code, body)
			}
		})
	}
}
