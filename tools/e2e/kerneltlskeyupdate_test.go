package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/image/qemu"
	"github.com/discord-pxe/dpxe/kernel"
	"github.com/discord-pxe/dpxe/tools/netns"
)

// openSSLSawKeyUpdate is what openssl s_server -msg prints when it reads
// a KeyUpdate (ours, answering its update_requested).
const openSSLSawKeyUpdate = "<<< TLS 1.3, Handshake [length 0005], KeyUpdate"

// TestKernelTLSGetKeyUpdate boots tlsget= against Debian's openssl
// s_server in its interactive mode with -stateless, a real peer for two
// things crypto/tls never sends: a cookie-only HelloRetryRequest (the
// kernel's second ClientHello keeps its x25519 share and echoes the
// cookie: openssl reads two ClientHellos and goes on) and a KeyUpdate.
// Once the kernel's GET has arrived the test types "K" on openssl's stdin:
// a KeyUpdate(update_requested). The kernel must answer with its own
// KeyUpdate (openssl's -msg log shows it; only then is the answer typed)
// and open the answer with the server's next traffic keys: a kernel that
// ignored the KeyUpdate fails with bad_record_mac, one that did not answer
// never gets the answer (tlsget's timeout). Then "q" closes the
// connection (a FIN) and the kernel prints the body's SHA-256 and a
// key_update line.
func TestKernelTLSGetKeyUpdate(t *testing.T) {
	if err := netns.Available(); err != nil {
		t.Skip(err)
	}
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("no openssl")
	}
	needQEMU(t, qemu.SeaBIOS)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	const name = "tls.test"
	good := newTLSGetCA(t, "tlsget test root", name)
	dir := t.TempDir()
	if _, err := image.Build(ctx, image.Options{Sources: kernel.Sources, OutDir: dir,
		Trust: []image.TrustSource{{Name: "tlsget-test-root", PEM: good.rootPEM}}}); err != nil {
		t.Fatal(err)
	}
	subnet := "10.77.94"
	ns, err := netns.New(ctx, netip.MustParsePrefix(subnet+".1/24"))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := ns.AddTap(ctx, "tap0"); err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		n string
		b []byte
	}{{"leaf.pem", good.leafPEM}, {"inter.pem", good.interPEM}, {"leaf.key", good.keyPEM}} {
		if err := os.WriteFile(filepath.Join(dir, f.n), f.b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	addr := subnet + ".1:8450"
	cmd := ns.Command(ctx, "openssl", "s_server", "-accept", addr, "-tls1_3", "-msg", "-stateless", "-naccept", "1",
		"-cert", filepath.Join(dir, "leaf.pem"), "-key", filepath.Join(dir, "leaf.key"),
		"-cert_chain", filepath.Join(dir, "inter.pem"), "-ciphersuites", "TLS_CHACHA20_POLY1305_SHA256")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Cancel(); cmd.Wait() })
	waitFor := func(s string, d time.Duration) bool { // bounded poll of openssl's log
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			if strings.Contains(out.String(), s) {
				return true
			}
		}
		return strings.Contains(out.String(), s)
	}
	if !waitFor("ACCEPT", 5*time.Second) {
		t.Fatalf("openssl s_server did not start: %s", out.String())
	}

	body := "hello from openssl after a KeyUpdate\n"
	sum := sha256.Sum256([]byte(body))
	typed := make(chan string, 1)
	go func() {
		switch {
		case !waitFor("GET /", 40*time.Second):
			typed <- "no GET"
		default:
			io.WriteString(stdin, "K\n")
			if !waitFor(openSSLSawKeyUpdate, 20*time.Second) {
				typed <- "no KeyUpdate from the kernel"
				return
			}
			sent := strings.Count(out.String(), ">>> ")
			io.WriteString(stdin, fmt.Sprintf("HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
			// "q" once the answer has gone out (a record more in -msg's
			// log), so that openssl reads it on its own
			for end := time.Now().Add(10 * time.Second); time.Now().Before(end) && strings.Count(out.String(), ">>> ") == sent; {
				time.Sleep(20 * time.Millisecond)
			}
			io.WriteString(stdin, "q\n")
			typed <- "answered"
		}
	}()

	cfg := appliance.BootConfig{NodeID: "tlsget", StaticIP: subnet + ".50/24," + subnet + ".1", TLSGet: "https://" + addr + "/," + name}
	res, err := qemu.Run(ctx, qemu.Options{
		Firmware: qemu.SeaBIOS,
		Kernel:   filepath.Join(dir, image.KernelFile),
		Append:   cfg.String(),
		Net: []string{"-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no",
			"-device", "virtio-net-pci,netdev=n0,mac=52:54:00:94:00:50"},
		Wrapper: ns.Wrapper(),
		Timeout: 60 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() { // openssl's session block (its resumption secret) left out
			log := regexp.MustCompile(`(?s)-----BEGIN SSL SESSION PARAMETERS-----.*?-----END SSL SESSION PARAMETERS-----`).ReplaceAllString(out.String(), "(session parameters)")
			t.Logf("serial console:\n%s\nopenssl:\n%s", res.Serial, log)
		}
	}()
	select {
	case s := <-typed:
		if s != "answered" {
			t.Errorf("the script: %s", s)
		}
	default:
		t.Errorf("the script had not finished when the boot ended")
	}
	all := tlsgetLine.FindAllStringSubmatch(res.Serial, -1)
	if len(all) != 1 {
		t.Fatalf("%d verdict lines, want 1", len(all))
	}
	m := all[0]
	if m[9] != "" || m[2] != "200" || !res.Passed() {
		t.Fatalf("verdict %q (exit %d), want ok status=200 and the pass exit", m[1], res.ExitCode)
	}
	if m[3] != fmt.Sprint(len(body)) || m[4] != hex.EncodeToString(sum[:]) {
		t.Errorf("body bytes=%s sha256=%s, want %d %x", m[3], m[4], len(body), sum)
	}
	if m[6] != "x25519" || m[5] != "TLS_CHACHA20_POLY1305_SHA256" {
		t.Errorf("group %s suite %s, want x25519 (the cookie-only retry keeps it) and ChaCha20", m[6], m[5])
	}
	if !regexp.MustCompile(`tlsget: key_update taken from the server count=1\r?\n`).MatchString(res.Serial) {
		t.Errorf("no key_update line with count=1")
	}
	log := out.String()
	if n := strings.Count(log, "<<< TLS 1.3, Handshake ["); n < 4 || strings.Count(log, "], ClientHello") != 2 {
		t.Errorf("openssl read %d ClientHellos, want 2 (the cookie-only HelloRetryRequest answered)", strings.Count(log, "], ClientHello"))
	}
	if strings.Count(log, openSSLSawKeyUpdate) != 1 {
		t.Errorf("openssl read %d KeyUpdates from the kernel, want 1", strings.Count(log, openSSLSawKeyUpdate))
	}
	if strings.Contains(log, "bad record mac") || strings.Contains(log, ":error:") {
		t.Errorf("openssl reported an error")
	}
}
