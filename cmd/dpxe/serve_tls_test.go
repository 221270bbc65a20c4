package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/ctlcert"
	"github.com/discord-pxe/dpxe/internal/freeport"
)

var httpsRE = regexp.MustCompile(`msg="https listening" part=tls addr=(127\.0\.0\.\d+:\d+) pin=([0-9a-f]{64})`)

// pinnedClient is an HTTPS client that, like a node, checks only that the
// server's key has the pin (no chain, no name).
func pinnedClient(pin string) *http.Client {
	return &http.Client{Timeout: e2eDeadline, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		InsecureSkipVerify: true, MinVersion: tls.VersionTLS13,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			leaf, err := x509.ParseCertificate(raw[0])
			if err != nil {
				return err
			}
			if ctlcert.Pin(leaf) != pin {
				return errors.New("pin_mismatch")
			}
			return nil
		}}}}
}

// TestServeHTTPSPinned: `dpxe serve --print-pin` makes the controller's
// key and prints its pin; serve with --tls-listen logs the same pin and
// answers a node's check-in over HTTPS to a client pinning it; a client
// pinning another key refuses the handshake and sends nothing; a restart
// keeps the key (same pin).
func TestServeHTTPSPinned(t *testing.T) {
	dir := t.TempDir()
	bin := sharedDpxe(t)
	db := filepath.Join(dir, "var", "dpxe.db")
	out, err := exec.Command(bin, "serve", "--db", db, "--print-pin").Output()
	if err != nil {
		t.Fatalf("--print-pin: %v", err)
	}
	pin := strings.TrimSpace(string(out))
	if err := appliance.ValidatePin(pin); err != nil {
		t.Fatalf("--print-pin printed %q: %v", out, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "var", ctlcert.KeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi, err)
	}

	start := func() (*serveProc, string) {
		p := startServe(t, bin, "--db", db, "--tls-listen", "127.0.0.1:0")
		m := httpsRE.FindStringSubmatch(p.logs())
		if m == nil {
			t.Fatalf("no https listening line:\n%s", p.logs())
		}
		if m[2] != pin {
			t.Fatalf("serve logs pin %s, --print-pin said %s", m[2], pin)
		}
		return p, "https://" + m[1]
	}
	p, base := start()
	tokenFile := filepath.Join(dir, "var", "admin.token")
	out, err = exec.Command(bin, "nodes", "--server", p.url, "--token-file", tokenFile, "add", "tls-node").CombinedOutput()
	if err != nil {
		t.Fatalf("dpxe nodes add: %v\n%s", err, out)
	}
	cred := strings.TrimSpace(strings.Split(string(out), "\n")[1])
	checkin := func(c *http.Client) (int, error) {
		req, _ := http.NewRequest("POST", base+"/v1/checkin", strings.NewReader(`{"node_id":"tls-node","capacity":1}`))
		req.Header.Set("Authorization", "Bearer "+cred)
		resp, err := c.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	if code, err := checkin(pinnedClient(pin)); err != nil || code != 200 {
		t.Fatalf("pinned check-in over HTTPS: %d %v\n%s", code, err, p.logs())
	}
	if _, err := checkin(pinnedClient(strings.Repeat("0", 64))); err == nil || !strings.Contains(err.Error(), "pin_mismatch") {
		t.Fatalf("a client pinning another key: %v", err)
	}
	if strings.Contains(p.logs(), cred) {
		t.Fatal("the node credential appeared in the server log")
	}
	p.stop(t)
	p, _ = start() // the same pin again: the key was reused
	p.stop(t)
}

// TestTLSBootListener: with netboot on, --tls-listen on a management
// address also opens an HTTPS listener on the boot address, same port,
// that serves the boot mux only (node routes, never an operator route);
// --tls-listen on the boot address itself is refused.
func TestTLSBootListener(t *testing.T) {
	id, err := ctlcert.LoadOrCreate(t.TempDir(), []string{"127.0.0.1", "127.0.0.2"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	op := http.NewServeMux()
	op.HandleFunc("GET /v1/nodes", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "operator") })
	boot := &bootRoute{ip: netip.MustParseAddr("127.0.0.2"), mux: http.NewServeMux()}
	boot.mux.HandleFunc("POST /v1/checkin", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "node") })
	port := strconv.Itoa(freeport.Port(t))
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	refused := &fleetApp{mux: op, boot: boot, tls: id}
	refused.cfg.TLSListen = net.JoinHostPort("127.0.0.2", port)
	if _, err := attachTLS(ctx, refused, log); err == nil || !strings.Contains(err.Error(), "boot network's address") {
		t.Fatalf("--tls-listen on the boot address: %v", err)
	}

	app := &fleetApp{mux: op, boot: boot, tls: id}
	app.cfg.TLSListen = net.JoinHostPort("127.0.0.1", port)
	run, err := attachTLS(ctx, app, log)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	c := pinnedClient(id.Pin)
	for _, tc := range []struct {
		host, method, path string
		want               int
	}{
		{"127.0.0.1", "GET", "/v1/nodes", 200},
		{"127.0.0.1", "POST", "/v1/checkin", 404}, // the operator side has no node route here
		{"127.0.0.2", "POST", "/v1/checkin", 200},
		{"127.0.0.2", "GET", "/v1/nodes", 404}, // the boot address: no operator route
	} {
		req, _ := http.NewRequest(tc.method, "https://"+net.JoinHostPort(tc.host, port)+tc.path, nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s https://%s%s: %v", tc.method, tc.host, tc.path, err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s https://%s%s: %d, want %d", tc.method, tc.host, tc.path, resp.StatusCode, tc.want)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}

// TestDefaultControllerURL: boot scripts default to https:// on the boot
// address and --tls-listen's port when the controller has a TLS identity,
// and to the plain base URL otherwise (no --tls-listen, or no identity).
func TestDefaultControllerURL(t *testing.T) {
	ip := netip.MustParseAddr("10.0.0.1")
	base := "http://10.0.0.1:8080"
	for _, tc := range []struct {
		tlsListen string
		identity  bool
		want      string
	}{
		{"0.0.0.0:8443", true, "https://10.0.0.1:8443"},
		{"127.0.0.1:9443", true, "https://10.0.0.1:9443"},
		{"", true, base},
		{"0.0.0.0:8443", false, base},
	} {
		if got := defaultControllerURL(base, ip, tc.tlsListen, tc.identity); got != tc.want {
			t.Errorf("defaultControllerURL(%q, %v) = %q, want %q", tc.tlsListen, tc.identity, got, tc.want)
		}
	}
}
