package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/ctlcert"
	"github.com/discord-pxe/dpxe/fleet/store"
	"github.com/discord-pxe/dpxe/fleet/store/pgtest"
	"github.com/discord-pxe/dpxe/internal/freeport"
	"github.com/discord-pxe/dpxe/tools/netns"
)

// TestReplicasNodeURLs runs two `dpxe serve` replicas on one PostgreSQL
// database in a network namespace, each with netboot on its own link to
// one boot network (--interface, no DHCP), --listen on loopback and
// --tls-listen (the same operator certificate on both, as pinned nodes
// need). A node checks in at each replica by each way a node can come:
// the boot address over http and https, and --listen and --tls-listen.
// The answer's controllers must list both replicas' URLs of that way, in
// replica order: their boot addresses (http://BOOT:LISTEN_PORT,
// https://BOOT:TLS_PORT) when the node came by a boot listener, their
// advertised URLs (and the https ones on the --tls-listen port) when it
// came by --listen or --tls-listen; never another network's or scheme's.
// Check-ins at the follower are forwarded, so the leader must take the
// way from the follower's signed statement. GET /v1/replicas shows both
// URLs of each replica. About 5 s.
//
// Mutations: with haFieldsLocked listing the http route's URLs whatever
// the route (the answers as before: the advertised URLs), the boot
// check-ins fail; with replica.forward not signing the route (the leader
// takes the connection's, the follower's --listen), the check-ins at the
// follower's boot address fail; with the boot address's HTTPS listener
// serving the boot mux itself (as before: no mark of the way, no
// forwarding), the check-ins by boot-https fail.
func TestReplicasNodeURLs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, a network namespace and two dpxe processes")
	}
	if err := netns.Available(); err != nil {
		t.Skipf("skipping: %v", err)
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

	x := (os.Getpid()+97)%200 + 20
	subnet := fmt.Sprintf("10.79.%d", x)
	ns, err := netns.New(ctx, netip.MustParsePrefix(subnet+".254/24"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	for i, name := range []string{"srva", "srvb"} {
		for _, s := range [][]string{
			{"link", "add", name, "type", "veth", "peer", "name", name + "p"},
			{"link", "set", name + "p", "master", ns.Bridge, "up"},
			{"link", "set", name, "up"},
			{"addr", "add", fmt.Sprintf("%s.%d/24", subnet, i+1), "dev", name},
		} {
			if out, err := ns.Run(ctx, "ip", s...); err != nil {
				t.Fatalf("ip %v: %v\n%s", s, err, out)
			}
		}
	}

	dir := t.TempDir()
	bin := sharedDpxe(t)
	wrapper := filepath.Join(dir, "dpxe-in-ns")
	if err := os.WriteFile(wrapper, []byte("#!/bin/sh\nexec ip netns exec "+ns.Name+" "+bin+" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	bootDir := filepath.Join(dir, "boot")
	os.Mkdir(bootDir, 0o755)
	os.WriteFile(filepath.Join(bootDir, "kernel.bin"), []byte("not a kernel"), 0o644)
	// One operator certificate for both replicas, so a node's pin holds
	// at either.
	certDir := filepath.Join(dir, "cert")
	ident, err := ctlcert.LoadOrCreate(certDir, []string{"127.0.0.1", subnet + ".1", subnet + ".2"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ports, tlsPorts := freeport.Ports(t, 2), freeport.Ports(t, 2)
	var procs []*serveProc
	for i, iface := range []string{"srva", "srvb"} {
		d := filepath.Join(dir, iface)
		procs = append(procs, startServe(t, wrapper, "--db", socketDSN, "--listen", fmt.Sprintf("127.0.0.1:%d", ports[i]),
			"--tls-listen", fmt.Sprintf("127.0.0.1:%d", tlsPorts[i]),
			"--tls-cert", filepath.Join(certDir, ctlcert.CertFile), "--tls-key", filepath.Join(certDir, ctlcert.KeyFile),
			"--admin-token-file", filepath.Join(dir, "admin.token"), "--metrics-token-file", filepath.Join(d, "metrics.token"),
			"--nats-store", filepath.Join(d, "nats"), "--replica-id", iface, "--leader-lease", "3s",
			"--interface", iface, "--dhcp", "off", "--boot-dir", bootDir, "--tftp", "off"))
	}
	for _, p := range procs {
		if !strings.Contains(p.logs(), "netboot on") {
			waitLog(t, p, "netboot on")
		}
	}
	role := func(i int) string {
		out, _ := ns.Run(ctx, "curl", "-sS", fmt.Sprintf("http://127.0.0.1:%d/healthz", ports[i]))
		var h struct{ Role string }
		json.Unmarshal([]byte(out), &h)
		return h.Role
	}
	leader := -1
	for end := time.Now().Add(e2eDeadline); ; time.Sleep(100 * time.Millisecond) {
		r0, r1 := role(0), role(1)
		if r0 == "leader" && r1 == "follower" {
			leader = 0
			break
		}
		if r1 == "leader" && r0 == "follower" {
			leader = 1
			break
		}
		if time.Now().After(end) {
			t.Fatalf("no leader and follower: %q %q", r0, r1)
		}
	}
	out, err := ns.Run(ctx, bin, "nodes", "--server", fmt.Sprintf("http://127.0.0.1:%d", ports[leader]),
		"--token-file", filepath.Join(dir, "admin.token"), "add", "url-node.1")
	if err != nil {
		t.Fatalf("dpxe nodes add: %v\n%s", err, out)
	}
	cred := strings.TrimSpace(strings.Split(out, "\n")[1])

	// The URLs each way lists: replica srva's, then srvb's.
	want := map[string][]string{}
	for i := range procs {
		boot := fmt.Sprintf("%s.%d", subnet, i+1)
		want["boot-http"] = append(want["boot-http"], fmt.Sprintf("http://%s:%d", boot, ports[i]))
		want["boot-https"] = append(want["boot-https"], fmt.Sprintf("https://%s:%d", boot, tlsPorts[i]))
		want["http"] = append(want["http"], fmt.Sprintf("http://127.0.0.1:%d", ports[i]))
		want["https"] = append(want["https"], fmt.Sprintf("https://127.0.0.1:%d", tlsPorts[i]))
	}
	checkin := func(base string) ([]string, error) {
		// -k: the node checks the pin, not the chain; curl has no pin of
		// this form, and the pin is not what this test is about.
		out, err := ns.Run(ctx, "curl", "-sSk", "--max-time", "10", "-X", "POST", "-H", "Authorization: Bearer "+cred,
			"-d", `{"node_id":"url-node.1","capacity":1,"generation":0}`, base+"/v1/checkin")
		if err != nil {
			return nil, fmt.Errorf("%v: %s", err, out)
		}
		var r struct {
			Controllers []string `json:"controllers"`
			Term        uint64   `json:"term"`
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil || r.Term == 0 {
			return nil, fmt.Errorf("answer %q: %v", out, err)
		}
		return r.Controllers, nil
	}
	names := []string{"srva", "srvb"}
	for _, way := range []string{"boot-http", "boot-https", "http", "https"} {
		for _, i := range []int{leader, 1 - leader} {
			base := want[way][i] // the replica's own URL of that way
			var got []string
			// Each replica heartbeats every second: wait until the
			// answers list both.
			for end := time.Now().Add(e2eDeadline); ; time.Sleep(200 * time.Millisecond) {
				if got, err = checkin(base); err == nil && len(got) == 2 {
					break
				}
				if time.Now().After(end) {
					t.Fatalf("check-in at %s (%s, %s): %v %v\n%s\n%s", base, names[i], way, got, err, procs[0].logs(), procs[1].logs())
				}
			}
			if !slices.Equal(got, want[way]) {
				t.Fatalf("check-in at %s (%s, the %s, by %s): controllers %q, want %q", base, names[i], role(i), way, got, want[way])
			}
			t.Logf("by %s at the %s: %q", way, role(i), got)
		}
	}

	// dpxe replicas shows the advertised and the node URLs.
	out, err = ns.Run(ctx, "curl", "-sS", "-H", "Authorization: Bearer "+readToken(t, filepath.Join(dir, "admin.token")),
		fmt.Sprintf("http://127.0.0.1:%d/v1/replicas", ports[1-leader]))
	if err != nil {
		t.Fatal(err)
	}
	var rr struct {
		Replicas []struct {
			ID       string            `json:"id"`
			URL      string            `json:"url"`
			NodeURLs map[string]string `json:"node_urls"`
			TLSPin   string            `json:"tls_pin"`
		} `json:"replicas"`
	}
	if err := json.Unmarshal([]byte(out), &rr); err != nil || len(rr.Replicas) != 2 {
		t.Fatalf("GET /v1/replicas: %q %v", out, err)
	}
	for i, r := range rr.Replicas {
		if r.ID != names[i] || r.URL != want["http"][i] || r.NodeURLs["boot-http"] != want["boot-http"][i] ||
			r.NodeURLs["boot-https"] != want["boot-https"][i] || r.NodeURLs["https"] != want["https"][i] {
			t.Fatalf("GET /v1/replicas: replica %d: %+v", i, r)
		}
		if r.TLSPin != ident.Pin {
			t.Fatalf("GET /v1/replicas: replica %d's tls_pin %q, want the certificate's %q", i, r.TLSPin, ident.Pin)
		}
	}
	for i, p := range procs {
		if strings.Contains(p.logs(), pinMismatchLog) {
			t.Fatalf("replica %d, with the same key as the other, logs a key mismatch:\n%s", i, p.logs())
		}
	}
	out, err = ns.Run(ctx, bin, "replicas", "--server", fmt.Sprintf("http://127.0.0.1:%d", ports[leader]),
		"--token-file", filepath.Join(dir, "admin.token"))
	if err != nil {
		t.Fatalf("dpxe replicas: %v\n%s", err, out)
	}
	for i := range procs {
		if !strings.Contains(out, want["http"][i]) || !strings.Contains(out, want["boot-http"][i]+" "+want["boot-https"][i]) {
			t.Fatalf("dpxe replicas does not show replica %d's advertised and boot URLs:\n%s", i, out)
		}
	}
	if strings.Contains(out, "warning") || strings.Count(out, shortPin(ident.Pin)) != 2 {
		t.Fatalf("dpxe replicas with one key: want its pin on both rows and no warning:\n%s", out)
	}
	t.Logf("dpxe replicas:\n%s", out)
}

// TestNodeURLsByRoute: a replica's node URLs by route, derived from its
// advertised URL, listeners and netboot URLs, and the lists the check-in
// answers carry per route: a replica without a URL of a route is left out
// of that route's list, and one that recorded no node URLs (a version
// before them) is listed by its advertised URL on the route of its scheme
// only.
func TestNodeURLsByRoute(t *testing.T) {
	for _, tc := range []struct {
		advertise, listenPort, tlsPort, bootHTTP, bootHTTPS string
		want                                                map[string]string
	}{
		{"http://10.0.0.2:8080", "8080", "", "", "", map[string]string{"http": "http://10.0.0.2:8080"}},
		{"http://10.0.0.2:8080", "8080", "8443", "http://192.168.7.1:8080", "https://192.168.7.1:8443",
			map[string]string{"http": "http://10.0.0.2:8080", "https": "https://10.0.0.2:8443",
				"boot-http": "http://192.168.7.1:8080", "boot-https": "https://192.168.7.1:8443"}},
		{"https://ctl-a.lan:443", "8080", "8443", "http://192.168.7.1:8080", "",
			map[string]string{"https": "https://ctl-a.lan:443", "http": "http://ctl-a.lan:8080", "boot-http": "http://192.168.7.1:8080"}},
	} {
		if got := nodeURLs(tc.advertise, tc.listenPort, tc.tlsPort, tc.bootHTTP, tc.bootHTTPS); !maps.Equal(got, tc.want) {
			t.Errorf("nodeURLs(%q, %q, %q, %q, %q) = %v, want %v", tc.advertise, tc.listenPort, tc.tlsPort, tc.bootHTTP, tc.bootHTTPS, got, tc.want)
		}
	}
	rs := []store.Replica{
		{ID: "a", URL: "http://10.0.0.2:8080", NodeURLs: map[string]string{"http": "http://10.0.0.2:8080", "boot-http": "http://192.168.7.1:8080",
			"boot-https": "https://192.168.7.1:8443"}},
		{ID: "b", URL: "http://10.0.0.3:8080"}, // before node URLs
		{ID: "c", URL: "https://10.0.0.4:8443", NodeURLs: map[string]string{"https": "https://10.0.0.4:8443", "boot-http": "http://192.168.7.3:8080"}},
	}
	got := controllersByRoute(rs)
	want := map[controller.Route][]string{
		controller.RouteHTTP:      {"http://10.0.0.2:8080", "http://10.0.0.3:8080"},
		controller.RouteHTTPS:     {"https://10.0.0.4:8443"},
		controller.RouteBootHTTP:  {"http://192.168.7.1:8080", "http://192.168.7.3:8080"},
		controller.RouteBootHTTPS: {"https://192.168.7.1:8443"},
	}
	if !maps.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("controllersByRoute = %v, want %v", got, want)
	}
}

// pinMismatchLog is how a replica's log names another replica serving
// HTTPS with another key.
const pinMismatchLog = "another replica serves HTTPS with another key"

// TestReplicasTLSKeyMismatch: two replicas on one PostgreSQL database,
// each serving HTTPS with a key of its own (a node pinned to one would
// refuse the other). Each must record its pin, log the other's different
// pin once, and `dpxe replicas` must show both pins and warn. About 5 s.
// TestReplicasNodeURLs is the contrast: one key, no warning. Mutation:
// with differentPins returning nothing, it fails.
func TestReplicasTLSKeyMismatch(t *testing.T) {
	_, dsn := haDatabase(t)
	dir := t.TempDir()
	bin, err := buildDpxe(dir)
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	tokenFile := filepath.Join(dir, "admin.token")
	var procs []*serveProc
	var pins []string
	for i, name := range []string{"ka", "kb"} {
		d := filepath.Join(dir, name)
		ident, err := ctlcert.LoadOrCreate(filepath.Join(d, "cert"), []string{"127.0.0.1"}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		pins = append(pins, ident.Pin)
		procs = append(procs, startServe(t, bin, "--db", dsn, "--tls-listen", freeport.Addr(t),
			"--tls-cert", filepath.Join(d, "cert", ctlcert.CertFile), "--tls-key", filepath.Join(d, "cert", ctlcert.KeyFile),
			"--admin-token-file", tokenFile, "--metrics-token-file", filepath.Join(d, "metrics.token"),
			"--nats-store", filepath.Join(d, "nats"), "--replica-id", name, "--leader-lease", "3s"))
		if i == 0 {
			waitLog(t, procs[0], "role changed")
		}
	}
	if pins[0] == pins[1] {
		t.Fatal("two generated keys with one pin")
	}
	// Each replica heartbeats every second; each logs the other once.
	for i, p := range procs {
		other := []string{"ka", "kb"}[1-i]
		waitLog(t, p, pinMismatchLog)
		logs := p.logs()
		var line string
		for _, l := range strings.Split(logs, "\n") {
			if strings.Contains(l, pinMismatchLog) {
				line = l
			}
		}
		if n := strings.Count(logs, pinMismatchLog); n != 1 || !strings.Contains(line, " replica="+other+" ") ||
			!strings.Contains(line, " its_pin="+pins[1-i]+" ") || !strings.HasSuffix(line, " pin="+pins[i]) {
			t.Fatalf("replica %d logs the mismatch %d times (want once, naming %s and both pins):\n%s", i, n, other, logs)
		}
	}
	cmd := exec.Command(bin, "replicas", "--server", procs[1].url, "--token-file", tokenFile)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("dpxe replicas: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	for _, p := range pins {
		if !strings.Contains(stdout.String(), shortPin(p)) || !strings.Contains(stderr.String(), shortPin(p)) {
			t.Fatalf("dpxe replicas does not show pin %s on its row and in its warning:\n%s%s", shortPin(p), stdout.String(), stderr.String())
		}
	}
	if !strings.Contains(stderr.String(), "2 different keys") {
		t.Fatalf("dpxe replicas does not warn of two keys:\n%s", stderr.String())
	}
	t.Logf("dpxe replicas:\n%s%s", stdout.String(), stderr.String())
}

// readToken reads a token file.
func readToken(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestTLSPinsWarnOnLiveReplicas: `dpxe replicas` compares the keys of
// replicas that heartbeat; a dead replica's row (a key rotated since)
// and a replica without HTTPS do not count.
func TestTLSPinsWarnOnLiveReplicas(t *testing.T) {
	a, b := strings.Repeat("a", 64), strings.Repeat("b", 64)
	rs := []store.Replica{{ID: "r1", TLSPin: a, Age: time.Second}, {ID: "r2", TLSPin: b, Age: 10 * time.Minute},
		{ID: "r3", Age: time.Second}, {ID: "r4", TLSPin: a, Age: 2 * time.Second}}
	if got := tlsPins(rs); !slices.Equal(got, []string{shortPin(a)}) {
		t.Fatalf("tlsPins = %q, want only the live key", got)
	}
	rs[1].Age = time.Second
	if got := tlsPins(rs); !slices.Equal(got, []string{shortPin(a), shortPin(b)}) {
		t.Fatalf("tlsPins = %q, want both live keys", got)
	}
}
