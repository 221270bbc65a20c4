package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/ctlcert"
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
	bin, err := buildDpxe(dir)
	if err != nil {
		t.Fatalf("build: %v", err)
	}
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
