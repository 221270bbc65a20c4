package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/events"
	"github.com/discord-pxe/dpxe/fleet/events/eventstest"
	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/kernel"
	"github.com/discord-pxe/dpxe/tools/gatewayemu"
)

// checkinProxy is a reverse proxy in the namespace on addr in front of the
// lab's controller that lets edit change every check-in answer (its
// members, as JSON) before the node reads it. (kerneldns_test.go's
// startTermProxy and kerneleventsskip_test.go write their own; they could
// use this.)
func checkinProxy(t *testing.T, l *gwLab, addr string, edit func(doc map[string]json.RawMessage)) {
	t.Helper()
	target, err := url.Parse(l.server)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = &http.Transport{DisableKeepAlives: true, DialContext: func(_ context.Context, network, address string) (net.Conn, error) {
		return nsDialer{l.ns.Name}.Dial(network, address)
	}}
	rp.ModifyResponse = func(resp *http.Response) error {
		if !strings.HasSuffix(resp.Request.URL.Path, "/v1/checkin") || resp.StatusCode != http.StatusOK {
			return nil
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		var doc map[string]json.RawMessage
		if err := json.Unmarshal(body, &doc); err != nil {
			return err
		}
		edit(doc)
		body, _ = json.Marshal(doc)
		resp.Body = io.NopCloser(bytes.NewReader(body))
		resp.ContentLength = int64(len(body))
		resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
		return nil
	}
	ln, err := listenInNetns(l.ns.Name, addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: rp}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

// natsAccessProxy is a checkinProxy that puts access into every check-in
// answer's "nats" member: the answer of a controller whose nodes publish
// to a broker of their own (here Debian's nats-server), by host name.
func natsAccessProxy(t *testing.T, l *gwLab, addr string, access appliance.NATSAccess) {
	t.Helper()
	if err := access.Validate(); err != nil {
		t.Fatalf("the access the proxy adds: %v", err)
	}
	member, err := json.Marshal(access)
	if err != nil {
		t.Fatal(err)
	}
	checkinProxy(t, l, addr, func(doc map[string]json.RawMessage) { doc["nats"] = member })
}

// startNATSServer runs Debian's nats-server in the namespace with
// JetStream and the users given (name -> password), listening on url's
// host:port; extra is more of its configuration (a tls block). It returns
// a client connected to url as the first user, from the namespace, with
// the options given (nats.Secure).
func startNATSServer(t *testing.T, ctx context.Context, l *gwLab, url string, users [][2]string, extra string, o ...nats.Option) *nats.Conn {
	t.Helper()
	if _, err := os.Stat(eventstest.DebianServer); err != nil {
		t.Skipf("no nats-server: %v", err)
	}
	addr := url[strings.Index(url, "://")+3:]
	dir := t.TempDir()
	var u []string
	for _, p := range users {
		u = append(u, fmt.Sprintf("{user: %q, password: %q}", p[0], p[1]))
	}
	conf := fmt.Sprintf("listen: %q\nserver_name: %q\njetstream {store_dir: %q}\nauthorization {users: [%s]}\n%s",
		addr, "nt-"+strings.ReplaceAll(addr, ":", "-"), filepath.Join(dir, "js"), strings.Join(u, ", "), extra)
	path := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	srv := l.ns.Command(ctx, eventstest.DebianServer, "-c", path)
	srv.Stdout, srv.Stderr = &logs, &logs
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		srv.Process.Kill()
		srv.Wait()
		if t.Failed() {
			t.Logf("nats-server log:\n%s", logs.String())
		}
	})
	opts := append([]nats.Option{nats.UserInfo(users[0][0], users[0][1]), nats.SetCustomDialer(nsDialer{l.ns.Name}), nats.NoReconnect()}, o...)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		nc, err := nats.Connect(url, opts...)
		if err == nil {
			t.Cleanup(nc.Close)
			return nc
		}
		if time.Now().After(deadline) {
			t.Fatalf("nats-server did not come up: %v\n%s", err, logs.String())
		}
	}
}

// TestKernelNATSBrokerTLS: a node publishes to Debian's nats-server
// (JetStream, password users, TLS with a certificate for broker.test from
// a test CA whose root is the image's only trust anchor) that its check-in
// answer names by host name, one boot for every case. The node gets its
// address and DNS server by DHCP (dnsmasq); a DNS server in the namespace
// holds broker.test and wrong.test. The answer (dpxe serve's, with "nats"
// added by a proxy) lists, in order:
//   - nats://nowhere.test:4222: the name does not resolve (NXDOMAIN): said,
//     counted (dns_refused), the next URL;
//   - tls://wrong.test:4223: a second nats-server whose certificate, from
//     the same CA, names other.test: the handshake is refused with the
//     kernel's reason (counted, tls_refused), no CONNECT (no password)
//     reaches it, the node carries on;
//   - nats://broker.test:4222: its INFO (in clear) says tls_required, so
//     the node speaks TLS 1.3 as for a tls:// URL (as nats.go does; the
//     chain and the name checked), CONNECT and every HPUB sealed: dispatches 1..100 of
//     both sessions are in the stream once each with the emulator's bytes;
//     a worker's 12 KB commands (one record each, read in 4 KiB pieces) are
//     refused too_large and an op 2 bad_op over the same connection.
//
// Neither password is on the console.
func TestKernelNATSBrokerTLS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const (
		subnet = "10.161.0"
		app    = "bot"
		node   = "nt-node"
		want   = 100
	)
	l := newGWLab(t, ctx, subnet, gatewayemu.Options{HeartbeatInterval: 2 * time.Second, Shards: 2, MaxConcurrency: 2,
		MessagesPerSecond: 20, ReplayLimit: 100000}, "--total-shards", "2", "--lease", "30s", "--no-events")
	ca := newPeerCA(t, "dpxe nats test root", false)
	dir := t.TempDir()
	start := time.Now()
	if _, err := image.Build(ctx, image.Options{Sources: kernel.Sources, OutDir: dir,
		Trust: []image.TrustSource{{Name: "nats-test-root", PEM: ca.rootPEM}}}); err != nil {
		t.Fatal(err)
	}
	t.Logf("image with the test anchor: %v", time.Since(start).Round(time.Millisecond))
	l.kernel = filepath.Join(dir, image.KernelFile)
	certDir := t.TempDir()
	tlsConf := func(label, name string) string {
		chain, key := writePEM(t, certDir, label, ca.leaf(t, name, time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)))
		return fmt.Sprintf("tls {cert_file: %q, key_file: %q, timeout: 10}\n", chain, key)
	}
	nodePass, testPass := "np-"+strconv.FormatInt(time.Now().UnixNano(), 36), "tp-"+strconv.FormatInt(time.Now().UnixNano()+1, 36)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.rootPEM)
	secure := nats.Secure(&tls.Config{RootCAs: roots, ServerName: "broker.test", MinVersion: tls.VersionTLS13})
	nc := startNATSServer(t, ctx, l, "tls://"+subnet+".1:4222", [][2]string{{"tester", testPass}, {"node-" + node, nodePass}},
		tlsConf("broker", "broker.test"), secure)
	startNATSServer(t, ctx, l, "tls://"+subnet+".1:4223", [][2]string{{"tester", testPass}},
		tlsConf("wrong", "other.test"), nats.Secure(&tls.Config{RootCAs: roots, ServerName: "other.test"}))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := events.EnsureStream(ctx, js, app, events.DefaultStreamLimits()); err != nil {
		t.Fatal(err)
	}
	bridge := [4]byte{10, 161, 0, 1}
	dns := startLabDNS(t, l.ns.Name, subnet+".1", 30, map[string][4]byte{"broker.test": bridge, "wrong.test": bridge})
	startDHCPOnly(t, ctx, l)
	natsAccessProxy(t, l, subnet+".1:8081", appliance.NATSAccess{
		URLs: []string{"nats://nowhere.test:4222", "tls://wrong.test:4223", "nats://broker.test:4222"},
		User: "node-" + node, Password: nodePass, App: app})
	l.nodeController = "http://" + subnet + ".1:8081"
	started := time.Now()
	n := l.boot(node, "virtio-net-pci", 2)

	for _, re := range []string{
		`nats: nats://nowhere\.test:4222: DNS: no such name \(NXDOMAIN\); retrying in \d+ ms`,
		`nats: tls://wrong\.test:4223: TLS refused: name_mismatch`,
		`dns: broker\.test -> 10\.161\.0\.1 ttl 30s in \d+ ms`,
		`nats: nats://broker\.test:4222: TLS 1\.3 chain=2 name=broker\.test in \d+ ms`,
		`nats: connected to nats://broker\.test:4222 \(10\.161\.0\.1\) as node-nt-node`,
	} {
		if n.serial.waitFor(regexp.MustCompile(re), 120*time.Second) == nil {
			t.Fatalf("no console line %q", re)
		}
	}
	t.Logf("connected over TLS by name %v after the boot", time.Since(started).Round(time.Millisecond))
	t.Logf("refusal: %s", lastLine(n.serial.String(), "TLS refused"))
	if c, _ := dns.lookups("nowhere.test"); c < 1 {
		t.Error("nowhere.test was never asked for")
	}
	l.allSessionsAt(want, 90*time.Second)
	checkStreamHolds(t, ctx, l, js, app, want)
	// Records larger than one read: a worker's 12 KB command arrives in
	// one TLS record (crypto/tls has grown its records to 16 KiB by now)
	// that the node reads in pieces of at most 4 KiB; it is refused for
	// its size, and the connection goes on.
	subj, err := events.CommandSubject(app, 0)
	if err != nil {
		t.Fatal(err)
	}
	big := []byte(`{"op":3,"d":{"pad":"` + strings.Repeat("x", 12000) + `"}}`)
	ask := func(body []byte, want string) {
		t.Helper()
		m, err := nc.Request(subj, body, 10*time.Second)
		if err != nil {
			t.Fatalf("a %d-byte command: %v", len(body), err)
		}
		if !strings.Contains(string(m.Data), want) {
			t.Fatalf("a %d-byte command: reply %q, want %s", len(body), m.Data, want)
		}
	}
	for i := 0; i < 3; i++ {
		ask(big, "too_large")
	}
	ask([]byte(`{"op":2,"d":{}}`), "bad_op")
	if n.serial.waitFor(regexp.MustCompile(`nats: up .* dns_refused [1-9]\d* tls_refused [1-9]`), 15*time.Second) == nil {
		t.Error("the status line does not count the name that did not resolve and the refused certificate")
	}
	con := n.serial.String()
	if strings.Contains(con, nodePass) || strings.Contains(con, testPass) {
		t.Error("a NATS password is on the node's console")
	}
	t.Logf("nats lines:\n%s", grepLines(con, "nats: "))
}

// startDHCPOnly runs dnsmasq as the lab's DHCP server only (--port=0),
// naming the bridge's address as router and DNS server (option 6), and
// makes the lab's nodes take their address from it.
func startDHCPOnly(t *testing.T, ctx context.Context, l *gwLab) {
	t.Helper()
	s := l.subnet
	d := l.ns.Command(ctx, "dnsmasq", "--no-daemon", "--conf-file=/dev/null", "--port=0",
		"--interface=br0", "--bind-interfaces", "--no-ping", "--pid-file=",
		"--dhcp-leasefile="+filepath.Join(t.TempDir(), "leases"),
		"--dhcp-range="+s+".100,"+s+".150,255.255.255.0,2m",
		"--dhcp-option=3,"+s+".1", "--dhcp-option=6,"+s+".1")
	var out bytes.Buffer
	d.Stdout, d.Stderr = &out, &out
	if err := d.Start(); err != nil {
		t.Skipf("dnsmasq: %v", err)
	}
	t.Cleanup(func() {
		d.Cancel()
		d.Wait()
		if t.Failed() {
			t.Logf("dnsmasq:\n%s", out.String())
		}
	})
	l.dhcp = true
}

// checkStreamHolds waits until the app's stream holds dispatches 1..want
// of every emulator session, then checks each is there exactly once, on
// its subject, with its Nats-Msg-Id and the emulator's bytes.
func checkStreamHolds(t *testing.T, ctx context.Context, l *gwLab, js jetstream.JetStream, app string, want uint64) {
	t.Helper()
	sessions := l.emu.Sessions()
	if len(sessions) == 0 {
		t.Fatal("no emulator sessions")
	}
	var got []streamEvent
	var err error
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(time.Second) {
		if got, err = readEventStream(ctx, js, app); err != nil {
			t.Fatal(err)
		}
		have := map[string]int{}
		for _, ev := range got {
			if ev.meta.Seq <= want {
				have[ev.meta.Session]++
			}
		}
		complete := true
		for _, s := range sessions {
			complete = complete && uint64(have[s.ID]) >= want
		}
		if complete {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stream does not hold dispatches 1..%d of every session after 60 s (%d messages: %v)", want, len(got), have)
		}
	}
	for _, s := range sessions {
		recs, _ := l.emu.Dispatched(s.ID)
		bySeq := map[uint64][]byte{}
		for _, r := range recs {
			bySeq[uint64(r.Seq)] = r.Frame
		}
		seen := map[uint64]int{}
		for _, ev := range got {
			if ev.meta.Session != s.ID || ev.meta.Seq > want {
				continue
			}
			q := ev.meta.Seq
			seen[q]++
			var head struct {
				T string `json:"t"`
			}
			frame := bySeq[q]
			if err := json.Unmarshal(frame, &head); err != nil {
				t.Errorf("session %s seq %d: not in the emulator's record", s.ID, q)
				continue
			}
			subj, _ := events.EventSubject(app, uint32(s.Shard[0]), head.T)
			switch {
			case ev.subject != subj:
				t.Errorf("session %s seq %d: subject %q, want %q", s.ID, q, ev.subject, subj)
			case ev.msgID != s.ID+":"+strconv.FormatUint(q, 10):
				t.Errorf("session %s seq %d: Nats-Msg-Id %q", s.ID, q, ev.msgID)
			case !bytes.Equal(ev.body, frame):
				t.Errorf("session %s seq %d: body differs", s.ID, q)
			}
		}
		for q := uint64(1); q <= want; q++ {
			if seen[q] != 1 {
				t.Errorf("session %s: seq %d is in the stream %d times", s.ID, q, seen[q])
			}
		}
		t.Logf("shard %d session %s: dispatches 1..%d in the stream once each", s.Shard[0], s.ID, want)
	}
}
