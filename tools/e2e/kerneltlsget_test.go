package e2e

import (
	"bytes"
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/image/qemu"
	"github.com/discord-pxe/dpxe/kernel"
	"github.com/discord-pxe/dpxe/tools/netns"
)

// tlsgetCA is one test certificate authority: a P-384 root, an
// ECDSA-SHA384 intermediate (P-384) and a P-256 leaf for name.
type tlsgetCA struct {
	rootPEM  []byte
	chain    tls.Certificate // leaf, intermediate
	leafPEM  []byte
	interPEM []byte
	keyPEM   []byte
}

func newTLSGetCA(t testing.TB, rootName, name string) tlsgetCA {
	t.Helper()
	now := time.Now()
	mk := func(tmpl, parent *x509.Certificate, pub, priv any) (*x509.Certificate, []byte) {
		der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, priv)
		if err != nil {
			t.Fatal(err)
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		return c, der
	}
	rootKey, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	interKey, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	leafKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := func(serial int64, cn string) *x509.Certificate {
		return &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
			KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}
	}
	rootT := ca(1, rootName)
	root, rootDER := mk(rootT, rootT, &rootKey.PublicKey, rootKey)
	inter, interDER := mk(ca(2, "tlsget test intermediate"), root, &interKey.PublicKey, rootKey)
	leafT := &x509.Certificate{SerialNumber: big.NewInt(3), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	_, leafDER := mk(leafT, inter, &leafKey.PublicKey, interKey)
	if inter.SignatureAlgorithm != x509.ECDSAWithSHA384 {
		t.Fatalf("intermediate signed with %v", inter.SignatureAlgorithm)
	}
	keyDER, _ := x509.MarshalECPrivateKey(leafKey)
	p := func(typ string, b []byte) []byte { return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}) }
	return tlsgetCA{
		rootPEM:  p("CERTIFICATE", rootDER),
		chain:    tls.Certificate{Certificate: [][]byte{leafDER, interDER}, PrivateKey: leafKey},
		leafPEM:  p("CERTIFICATE", leafDER),
		interPEM: p("CERTIFICATE", interDER),
		keyPEM:   p("EC PRIVATE KEY", keyDER),
	}
}

var tlsgetLine = regexp.MustCompile(`tlsget: (ok status=(\d+) bytes=(\d+) sha256=([0-9a-f]{64}) version=TLS1\.3 suite=(\S+) group=(\S+) sig=(\S+) chain=(\d+)|refused reason=(\S+))\r?\n`)

// TestKernelTLSGet builds an image whose only trust anchor is a test
// P-384 root (dpxe build --trust, image.Build here) and boots it with
// tlsget= in a namespace, once per peer: a Go crypto/tls server (P-256
// leaf under an ECDSA-SHA384 intermediate under the root) whose body's
// SHA-256 the kernel must print (also for a 3 MiB body, beyond the
// kernel's 1 MiB response buffer), with a timing line before it; openssl s_server -tls1_3 -www with the
// same chain, once with ChaCha20-Poly1305 only and once with AES-128-GCM only,
// and with both, where the kernel's CPUID order decides (qemu64, no AES-NI:
// ChaCha20; -cpu max, AES-NI and PCLMULQDQ under TCG: AES-128-GCM); a Go
// server taking P-256 only (a HelloRetryRequest: the kernel answers with a
// P-256 share, group=secp256r1); and refusals: a name the leaf
// does not carry (name_mismatch), a chain under another root
// (unknown_ca), a TLS 1.2-only server (protocol_version). Each boot must
// print one verdict line and end QEMU through isa-debug-exit, pass or fail
// as the verdict.
func TestKernelTLSGet(t *testing.T) {
	if err := netns.Available(); err != nil {
		t.Skip(err)
	}
	needQEMU(t, qemu.SeaBIOS)
	ctx, cancel := context.WithTimeout(context.Background(), 210*time.Second)
	defer cancel()

	const name = "tls.test"
	good := newTLSGetCA(t, "tlsget test root", name)
	other := newTLSGetCA(t, "tlsget other root", name)
	dir := t.TempDir()
	start := time.Now()
	if _, err := image.Build(ctx, image.Options{Sources: kernel.Sources, OutDir: dir,
		Trust: []image.TrustSource{{Name: "tlsget-test-root", PEM: good.rootPEM}}}); err != nil {
		t.Fatal(err)
	}
	t.Logf("test image with the test root as its only anchor: %v", time.Since(start).Round(time.Millisecond))

	subnet := "10.77.93"
	ns, err := netns.New(ctx, netip.MustParsePrefix(subnet+".1/24"))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := ns.AddTap(ctx, "tap0"); err != nil {
		t.Fatal(err)
	}

	body := make([]byte, 40000) // several records
	rng := mrand.New(mrand.NewPCG(17, 4))
	for i := range body {
		body[i] = byte(rng.Uint32())
	}
	sum := sha256.Sum256(body)
	// beyond the kernel's 1 MiB response buffer: hashed as it arrives
	big := make([]byte, 3<<20+1)
	for i := range big {
		big[i] = byte(rng.Uint32())
	}
	bigSum := sha256.Sum256(big)
	var hellos helloLog // the ClientHello randoms the Go servers saw
	serve := func(addr string, cert tls.Certificate, maxVersion uint16, errs io.Writer, curves ...tls.CurveID) {
		ln, err := listenInNetns(ns.Name, addr)
		if err != nil {
			t.Fatal(err)
		}
		ln = &helloListener{Listener: ln, log: &hellos}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b := body
			if r.URL.Path == "/big" {
				b = big
			} else if r.URL.Path != "/api/v10/gateway" || r.Host != name {
				http.Error(w, "wrong path or host "+r.URL.Path+" "+r.Host, http.StatusNotFound)
				return
			}
			w.Header().Set("Content-Length", strconv.Itoa(len(b)))
			w.Write(b)
		}), TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MaxVersion: maxVersion, CurvePreferences: curves}, ErrorLog: log.New(errs, "", 0)}
		go srv.ServeTLS(ln, "", "")
		t.Cleanup(func() { srv.Close() })
	}
	serve(subnet+".1:8443", good.chain, 0, os.Stderr)
	serve(subnet+".1:8444", other.chain, 0, os.Stderr)
	serve(subnet+".1:8445", good.chain, tls.VersionTLS12, os.Stderr)
	// P-256 only: a HelloRetryRequest for the kernel's x25519 share,
	// answered with a P-256 share; no handshake error in its log
	var hrrErrs lockedBuffer
	serve(subnet+".1:8448", good.chain, 0, &hrrErrs, tls.CurveP256)
	// one GET, then what the kernel does when it ends: tlsCloseServer
	closeSeen := make(chan string, 1)
	{
		ln, err := listenInNetns(ns.Name, subnet+".1:8450")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() { closeSeen <- tlsCloseServer(&helloListener{Listener: ln, log: &hellos}, good.chain, body) }()
	}

	// openssl s_server -www with the good chain, one suite each
	haveOpenSSL := false
	openssl := func(port, suite string) {
		startOpenSSLServer(t, ctx, ns, dir, "", subnet+".1:"+port, good, "-www", "-ciphersuites", suite)
	}
	if _, err := exec.LookPath("openssl"); err == nil {
		openssl("8446", "TLS_CHACHA20_POLY1305_SHA256")
		openssl("8447", "TLS_AES_128_GCM_SHA256")
		openssl("8449", "TLS_CHACHA20_POLY1305_SHA256:TLS_AES_128_GCM_SHA256") // the client's order decides
		haveOpenSSL = true
	} else {
		t.Log("no openssl: its cases are skipped")
	}

	cases := []struct {
		label, url, reason, suite string
		checkBody                 bool
		group, cpu                string // "": x25519, qemu's default CPU (qemu64)
	}{
		{"go", "https://" + subnet + ".1:8443/api/v10/gateway," + name, "", "", true, "", ""},
		{"go-big", "https://" + subnet + ".1:8443/big," + name, "", "", true, "", ""},
		{"openssl-chacha", "https://" + subnet + ".1:8446/," + name, "", "TLS_CHACHA20_POLY1305_SHA256", false, "", ""},
		{"openssl-aes", "https://" + subnet + ".1:8447/," + name, "", "TLS_AES_128_GCM_SHA256", false, "", ""},
		{"openssl-both-qemu64", "https://" + subnet + ".1:8449/," + name, "", "TLS_CHACHA20_POLY1305_SHA256", false, "", "qemu64"},
		{"openssl-both-aesni", "https://" + subnet + ".1:8449/," + name, "", "TLS_AES_128_GCM_SHA256", false, "", "max"},
		{"wrong-name", "https://" + subnet + ".1:8443/api/v10/gateway,other.test", "name_mismatch", "", false, "", ""},
		{"unknown-root", "https://" + subnet + ".1:8444/api/v10/gateway," + name, "unknown_ca", "", false, "", ""},
		{"tls12-only", "https://" + subnet + ".1:8445/api/v10/gateway," + name, "protocol_version", "", false, "", ""},
		{"hello-retry", "https://" + subnet + ".1:8448/api/v10/gateway," + name, "", "", true, "secp256r1", ""},
		{"go-close", "https://" + subnet + ".1:8450/api/v10/gateway," + name, "", "", true, "", ""},
	}
	t.Cleanup(func() {
		// every boot drew its own random (and x25519 key) from a seeded DRBG
		seen := map[string]bool{}
		for _, r := range hellos.randoms() {
			if seen[r] {
				t.Errorf("a ClientHello random repeated across boots: %s", r)
			}
			seen[r] = true
		}
		if len(seen) < 7 {
			t.Errorf("%d ClientHello randoms recorded, want one per boot against a Go server (7)", len(seen))
		}
	})
	for i, c := range cases {
		if strings.HasPrefix(c.label, "openssl") && !haveOpenSSL {
			continue
		}
		t.Run(c.label, func(t *testing.T) {
			cfg := appliance.BootConfig{NodeID: "tlsget", StaticIP: subnet + ".50/24," + subnet + ".1", TLSGet: c.url}
			var extra []string
			if c.cpu != "" {
				extra = []string{"-cpu", c.cpu}
			}
			res, err := qemu.Run(ctx, qemu.Options{
				Extra:    extra,
				NoKVM:    c.cpu != "", // the CPU model must be the one asked for
				Firmware: qemu.SeaBIOS,
				Kernel:   filepath.Join(dir, image.KernelFile),
				Append:   cfg.String(),
				Net: []string{"-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no",
					"-device", fmt.Sprintf("virtio-net-pci,netdev=n0,mac=52:54:00:93:%02x:50", i)},
				Wrapper: ns.Wrapper(),
				Timeout: 30 * time.Second,
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %v", c.label, res.Elapsed.Round(time.Millisecond))
			if t.Failed() {
				return
			}
			defer func() {
				if t.Failed() {
					t.Logf("serial console:\n%s", res.Serial)
				}
			}()
			if !regexp.MustCompile(`tlsget: connecting to \S+ name=\S+ time=\d+ \(cmos rtc\) anchors=1 drbg=seeded`).MatchString(res.Serial) {
				t.Errorf("no connecting line naming the time source")
			}
			all := tlsgetLine.FindAllStringSubmatch(res.Serial, -1)
			if len(all) != 1 {
				t.Fatalf("%d verdict lines, want 1", len(all))
			}
			m := all[0]
			if c.reason != "" {
				if m[9] != c.reason {
					t.Errorf("verdict %q, want refused reason=%s", m[1], c.reason)
				}
				if res.ExitCode != qemu.ExitFail {
					t.Errorf("QEMU exit %d, want the fail verdict %d", res.ExitCode, qemu.ExitFail)
				}
				return
			}
			if m[9] != "" || m[2] != "200" {
				t.Fatalf("verdict %q, want ok status=200", m[1])
			}
			if !res.Passed() {
				t.Errorf("QEMU exit %d, want the pass verdict", res.ExitCode)
			}
			if want := cmp.Or(c.group, "x25519"); m[6] != want {
				t.Errorf("group %s, want %s", m[6], want)
			}
			if c.label == "hello-retry" && hrrErrs.String() != "" {
				t.Errorf("the P-256-only server's log: %s", hrrErrs.String())
			}
			if m[7] != "ecdsa_secp256r1_sha256" {
				t.Errorf("sig %s, want ecdsa_secp256r1_sha256 (the P-256 leaf)", m[7])
			}
			if m[8] != "2" {
				t.Errorf("chain=%s, want 2 (leaf and intermediate; the anchor is not counted)", m[8])
			}
			if c.label == "go-close" {
				// QEMU has exited: the server has all it will get
				select {
				case s := <-closeSeen:
					if s != "" {
						t.Errorf("the server, after the response: %s", s)
					}
				case <-time.After(30 * time.Second):
					t.Errorf("the close server did not finish in 30 s")
				}
			}
			if c.suite != "" && m[5] != c.suite {
				t.Errorf("suite %s, want %s", m[5], c.suite)
			}
			if c.checkBody {
				want, wantSum := body, sum
				if c.label == "go-big" {
					want, wantSum = big, bigSum
				}
				if m[3] != strconv.Itoa(len(want)) || m[4] != hex.EncodeToString(wantSum[:]) {
					t.Errorf("body bytes=%s sha256=%s, want %d %x", m[3], m[4], len(want), wantSum)
				}
			}
			// the timing line make bench reads, before the verdict
			tm := regexp.MustCompile(`tlsget: timing handshake_us=([1-9]\d*) body_us=([1-9]\d*) aead=(\S+)\r?\n`).FindStringSubmatchIndex(res.Serial)
			if tm == nil || tm[0] > strings.Index(res.Serial, "tlsget: ok ") {
				t.Errorf("no timing line with non-zero figures before the verdict")
			} else {
				aead := res.Serial[tm[6]:tm[7]]
				wantAEAD := map[string]bool{"chacha20poly1305-sse2": true}
				if m[5] == "TLS_AES_128_GCM_SHA256" {
					wantAEAD = map[string]bool{"aes128gcm-soft": true, "aes128gcm-aesni": true}
				}
				if !wantAEAD[aead] {
					t.Errorf("timing line's aead=%s for suite %s", aead, m[5])
				}
			}
		})
	}
}

// tlsCloseServer serves one connection from ln: it reads one request,
// answers with body and its close_notify (CloseWrite, as net/http does
// after "Connection: close"), then reads on and returns "" when the client
// ended the way tlsget= must before its VM goes: our Read returns io.EOF
// for the client's close_notify (its last record is an alert: 5 + 2 + 1 +
// 16 bytes; a bare FIN would end Go's Read with io.EOF too, which is why
// the records are counted), then the TCP stream ends with a FIN (io.EOF,
// not a reset, not silence). Anything else is described.
func tlsCloseServer(ln net.Listener, cert tls.Certificate, body []byte) string {
	c, err := ln.Accept()
	if err != nil {
		return "accept: " + err.Error()
	}
	defer c.Close()
	raw := &recordConn{Conn: c}
	tc := tls.Server(raw, &tls.Config{Certificates: []tls.Certificate{cert}})
	tc.SetDeadline(time.Now().Add(150 * time.Second))
	var req []byte
	buf := make([]byte, 4096)
	for !bytes.Contains(req, []byte("\r\n\r\n")) {
		if len(req) > 16384 {
			return "a request head over 16 KiB"
		}
		n, err := tc.Read(buf)
		req = append(req, buf[:n]...)
		if err != nil {
			return fmt.Sprintf("reading the request: %v", err)
		}
	}
	head := fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n", len(body))
	if _, err := tc.Write(append([]byte(head), body...)); err != nil {
		return fmt.Sprintf("writing the response: %v", err)
	}
	if err := tc.CloseWrite(); err != nil {
		return fmt.Sprintf("our close_notify: %v", err)
	}
	n, err := tc.Read(buf)
	if n != 0 || err != io.EOF {
		return fmt.Sprintf("after the response Read gave %d bytes, %v; want io.EOF (close_notify)", n, err)
	}
	recs := raw.records()
	if len(recs) < 3 || recs[len(recs)-1] != 5+2+1+16 {
		return fmt.Sprintf("the client's records %v: the last is not a TLS 1.3 alert (24 bytes), so no close_notify before its FIN", recs)
	}
	if !raw.eof {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err = c.Read(buf)
		if n != 0 || err != io.EOF {
			return fmt.Sprintf("after close_notify the TCP read gave %d bytes, %v; want io.EOF (the client's FIN)", n, err)
		}
	}
	return ""
}

// recordConn keeps every byte read from the connection and whether the
// stream ended (io.EOF).
type recordConn struct {
	net.Conn
	in  []byte
	eof bool
}

func (c *recordConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.in = append(c.in, p[:n]...)
	if err == io.EOF {
		c.eof = true
	}
	return n, err
}

// records is the length (header included) of each whole TLS record read.
func (c *recordConn) records() []int {
	var out []int
	for b := c.in; len(b) >= 5; {
		n := 5 + (int(b[3])<<8 | int(b[4]))
		if n > len(b) {
			break
		}
		out = append(out, n)
		b = b[n:]
	}
	return out
}

// startOpenSSLServer runs Debian's openssl s_server -tls1_3 in ns on addr
// with ca's chain (leaf.pem, inter.pem and leaf.key written to dir) and the
// extra options, from workDir when not empty, and returns once it accepts
// connections; the test's cleanup stops it.
func startOpenSSLServer(t testing.TB, ctx context.Context, ns *netns.NS, dir, workDir, addr string, ca tlsgetCA, extra ...string) {
	t.Helper()
	for _, f := range []struct {
		n string
		b []byte
	}{{"leaf.pem", ca.leafPEM}, {"inter.pem", ca.interPEM}, {"leaf.key", ca.keyPEM}} {
		if err := os.WriteFile(filepath.Join(dir, f.n), f.b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	args := append([]string{"s_server", "-quiet", "-accept", addr, "-tls1_3",
		"-cert", filepath.Join(dir, "leaf.pem"), "-key", filepath.Join(dir, "leaf.key"),
		"-cert_chain", filepath.Join(dir, "inter.pem")}, extra...)
	startInNetns(t, ctx, ns, workDir, addr, "openssl", args...)
}

// helloLog keeps the Random of each ClientHello a helloListener's
// connections began with.
type helloLog struct {
	mu   sync.Mutex
	seen []string
}

func (h *helloLog) randoms() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.seen...)
}

type helloListener struct {
	net.Listener
	log *helloLog
}

func (l *helloListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return c, err
	}
	return &helloConn{Conn: c, log: l.log}, nil
}

// helloConn records the first 43 bytes read (record header 5, handshake
// header 4, legacy_version 2, Random 32) and logs the Random.
type helloConn struct {
	net.Conn
	log  *helloLog
	head []byte
	done bool
}

func (c *helloConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if !c.done {
		c.head = append(c.head, p[:n]...)
		if len(c.head) >= 43 {
			c.done = true
			c.log.mu.Lock()
			c.log.seen = append(c.log.seen, hex.EncodeToString(c.head[11:43]))
			c.log.mu.Unlock()
		}
	}
	return n, err
}

// lockedBuffer is a bytes.Buffer a server's error log and the test share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
