package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/store"
	"github.com/discord-pxe/dpxe/fleet/store/pgtest"
	"github.com/discord-pxe/dpxe/internal/freeport"
	"github.com/discord-pxe/dpxe/tools/netns"
)

// TestReplicasShareDHCPPool runs two `dpxe serve` replicas on one
// PostgreSQL database in one network namespace, each serving
// authoritative DHCP with the same pool on its own link to one boot
// network, and eight busybox udhcpc clients that broadcast to both at
// once. It asserts that every client gets an address of the pool and no
// two clients get the same one, and that the database holds exactly these
// bindings. A node's check-in sent to the follower's boot address must be
// answered (forwarded to the leader), not refused. Then it SIGKILLs one
// replica and runs each client again asking for its address (udhcpc -r):
// the other replica must give every client its own address back. About
// 5 s.
//
// Mutations: with SharedLeases off in serve_netboot.go (each replica's
// table in its own memory, as on SQLite) the two replicas hand out
// addresses independently and the test fails; with bootRoute.ServeHTTP
// serving the boot mux without forwarding, the follower answers the
// check-in 503 and the test fails.
func TestReplicasShareDHCPPool(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, a network namespace and two dpxe processes")
	}
	if err := netns.Available(); err != nil {
		t.Skipf("skipping: %v", err)
	}
	if _, err := exec.LookPath("busybox"); err != nil {
		t.Skip("skipping: no busybox (udhcpc)")
	}
	ctx := context.Background()
	srv, err := pgtest.Start(ctx)
	if err != nil {
		if errors.Is(err, pgtest.ErrNotInstalled) {
			t.Skipf("skipping: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	dsn, err := srv.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	socketDSN := srv.SocketURL(strings.TrimPrefix(u.Path, "/")) // the namespace shares files, not loopback

	x := os.Getpid()%200 + 20
	subnet := fmt.Sprintf("10.78.%d", x)
	ns, err := netns.New(ctx, netip.MustParsePrefix(subnet+".254/24"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	link := func(name, mac, addr string) {
		t.Helper()
		steps := [][]string{
			{"link", "add", name, "type", "veth", "peer", "name", name + "p"},
			{"link", "set", name + "p", "master", ns.Bridge, "up"},
			{"link", "set", name, "up"},
		}
		if mac != "" {
			steps = append(steps, []string{"link", "set", name, "address", mac})
		}
		if addr != "" {
			steps = append(steps, []string{"addr", "add", addr, "dev", name})
		}
		for _, s := range steps {
			if out, err := ns.Run(ctx, "ip", s...); err != nil {
				t.Fatalf("ip %v: %v\n%s", s, err, out)
			}
		}
	}
	link("srva", "", subnet+".1/24")
	link("srvb", "", subnet+".2/24")

	dir := t.TempDir()
	bin := sharedDpxe(t)
	wrapper := filepath.Join(dir, "dpxe-in-ns")
	if err := os.WriteFile(wrapper, []byte("#!/bin/sh\nexec ip netns exec "+ns.Name+" "+bin+" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	bootDir := filepath.Join(dir, "boot")
	os.Mkdir(bootDir, 0o755)
	os.WriteFile(filepath.Join(bootDir, "kernel.bin"), []byte("not a kernel"), 0o644)
	pool := subnet + ".10-" + subnet + ".60/24"
	var procs []*serveProc
	ports := freeport.Ports(t, 2)
	for i, iface := range []string{"srva", "srvb"} {
		d := filepath.Join(dir, iface)
		procs = append(procs, startServe(t, wrapper, "--db", socketDSN, "--listen", fmt.Sprintf("127.0.0.1:%d", ports[i]),
			"--admin-token-file", filepath.Join(dir, "admin.token"), "--metrics-token-file", filepath.Join(d, "metrics.token"),
			"--nats-store", filepath.Join(d, "nats"), "--replica-id", iface, "--leader-lease", "3s",
			"--interface", iface, "--dhcp", "authoritative", "--pool", pool, "--boot-dir", bootDir, "--tftp", "off"))
	}
	for _, p := range procs {
		if !strings.Contains(p.logs(), "netboot on") {
			waitLog(t, p, "netboot on")
		}
	}

	const clients = 8
	script := filepath.Join(dir, "udhcpc.sh")
	os.WriteFile(script, []byte("#!/bin/sh\n[ \"$1\" = bound ] && echo \"BOUND ip=$ip serverid=$serverid\"\nexit 0\n"), 0o755)
	for i := range clients {
		link(fmt.Sprintf("cl%d", i), fmt.Sprintf("02:00:00:00:%02x:%02x", x, i), "")
	}
	// udhcpc runs each client through DISCOVER, OFFER, REQUEST, ACK; extra
	// arguments ask for an address (-r).
	lease := func(i int, extra ...string) (ip, server string, err error) {
		args := append([]string{"udhcpc", "-f", "-q", "-n", "-t", "8", "-T", "1", "-i", fmt.Sprintf("cl%d", i), "-s", script}, extra...)
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		out, err := ns.Run(cctx, "busybox", args...)
		if err != nil {
			return "", "", fmt.Errorf("udhcpc: %v\n%s", err, out)
		}
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, "BOUND ") {
				fmt.Sscanf(strings.TrimPrefix(line, "BOUND "), "ip=%s serverid=%s", &ip, &server)
			}
		}
		if ip == "" {
			return "", "", fmt.Errorf("udhcpc bound nothing:\n%s", out)
		}
		return ip, server, nil
	}
	ips, servers := make([]string, clients), make([]string, clients)
	errs := make([]error, clients)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() { defer wg.Done(); ips[i], servers[i], errs[i] = lease(i) }()
	}
	wg.Wait()
	owner := map[string]int{}
	p := netip.MustParsePrefix(subnet + ".0/24")
	for i := range clients {
		if errs[i] != nil {
			t.Fatalf("client %d: %v\n%s\n%s", i, errs[i], procs[0].logs(), procs[1].logs())
		}
		a, err := netip.ParseAddr(ips[i])
		if err != nil || !p.Contains(a) || a.As4()[3] < 10 || a.As4()[3] > 60 {
			t.Fatalf("client %d bound %q, outside the pool %s", i, ips[i], pool)
		}
		if j, dup := owner[ips[i]]; dup {
			t.Fatalf("%s went to client %d and client %d (servers %s, %s)", ips[i], j, i, servers[j], servers[i])
		}
		owner[ips[i]] = i
	}
	t.Logf("first leases: %v from servers %v", ips, servers)
	st, err := store.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ls, err := st.Netboot().Leases(ctx)
	if err != nil || len(ls) != clients {
		t.Fatalf("stored leases %d (%v), want %d: %+v", len(ls), err, clients, ls)
	}
	for _, l := range ls {
		i, ok := owner[l.IP.String()]
		if !ok || l.MAC.String() != fmt.Sprintf("02:00:00:00:%02x:%02x", x, i) {
			t.Fatalf("stored lease %s → %s; clients hold %v", l.IP, l.MAC, owner)
		}
	}

	// A node's check-in at the follower's boot address reaches the leader.
	role := func(i int) string {
		out, _ := ns.Run(ctx, "curl", "-sS", fmt.Sprintf("http://127.0.0.1:%d/healthz", ports[i]))
		var h struct{ Role string }
		json.Unmarshal([]byte(out), &h)
		return h.Role
	}
	leader, follower := -1, -1
	for end := time.Now().Add(e2eDeadline); leader < 0 || follower < 0; {
		leader, follower = -1, -1
		for i := range procs {
			switch role(i) {
			case "leader":
				leader = i
			case "follower":
				follower = i
			}
		}
		if time.Now().After(end) {
			t.Fatalf("no leader and follower: %q %q", role(0), role(1))
		}
		time.Sleep(100 * time.Millisecond)
	}
	out, err := ns.Run(ctx, bin, "nodes", "--server", fmt.Sprintf("http://127.0.0.1:%d", ports[leader]),
		"--token-file", filepath.Join(dir, "admin.token"), "add", "dhcp-node.1")
	if err != nil {
		t.Fatalf("dpxe nodes add: %v\n%s", err, out)
	}
	cred := strings.TrimSpace(strings.Split(out, "\n")[1])
	code, err := ns.Run(ctx, "curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST",
		"-H", "Authorization: Bearer "+cred, "-d", `{"node_id":"dhcp-node.1","capacity":1,"generation":0}`,
		fmt.Sprintf("http://%s.%d:%d/v1/checkin", subnet, follower+1, ports[follower]))
	if err != nil || code != "200" {
		t.Fatalf("check-in at the follower's boot address: %q %v\n%s", code, err, procs[follower].logs())
	}

	// Replica a dies; every client asks b for its address.
	procs[0].cmd.Process.Kill()
	<-procs[0].done
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var ip, server string
			ip, server, errs[i] = lease(i, "-r", ips[i])
			if errs[i] == nil && (ip != ips[i] || server != subnet+".2") {
				errs[i] = fmt.Errorf("got %s from %s, held %s", ip, server, ips[i])
			}
		}()
	}
	wg.Wait()
	for i := range clients {
		if errs[i] != nil {
			t.Fatalf("client %d at the other replica: %v\n%s", i, errs[i], procs[1].logs())
		}
	}
}

// waitLog waits until p's log contains s.
func waitLog(t *testing.T, p *serveProc, s string) {
	t.Helper()
	end := time.Now().Add(e2eDeadline)
	for !strings.Contains(p.logs(), s) {
		if time.Now().After(end) {
			t.Fatalf("no %q in the log:\n%s", s, p.logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
