package appliance

import (
	"bytes"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// recConn keeps every byte read from the server.
type recConn struct {
	net.Conn
	got []byte
}

func (r *recConn) Read(b []byte) (int, error) {
	n, err := r.Conn.Read(b)
	r.got = append(r.got, b[:n]...)
	return n, err
}

// flightRecord runs the reference client against addr (a GET, then
// records to close_notify) and keeps its inputs and the server's bytes.
func flightRecord(t *testing.T, addr, host string, anchors [][]byte, now int64, preferAES bool) TLSFlightCase {
	return flightRecordRefused(t, addr, host, anchors, now, preferAES, "")
}

// flightRecordRefused is flightRecord for a handshake the reference
// client refuses with want (a reason or the server's alert): what the
// server sent up to then.
func flightRecordRefused(t *testing.T, addr, host string, anchors [][]byte, now int64, preferAES bool, want string) TLSFlightCase {
	var raw net.Conn
	var err error
	for i := 0; i < 100; i++ {
		if raw, err = net.Dial("tcp", addr); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.SetDeadline(time.Now().Add(10 * time.Second))
	c := TLSFlightCase{Now: now, Host: host, Anchors: anchors, PreferAES: preferAES}
	if _, err := rand.Read(c.Rand[:]); err != nil {
		t.Fatal(err)
	}
	rc := &recConn{Conn: raw}
	cl, err := TLSClientConnect(rc, TLSClientConfig{Host: host, Now: now, Anchors: anchors, Rand: bytes.NewReader(c.Rand[:]), PreferAES: preferAES})
	if want != "" {
		if err == nil || !strings.HasSuffix(err.Error(), want) {
			t.Fatalf("%s: %v, want %s", addr, err, want)
		}
		c.Server = rc.got
		return c
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Write([]byte("GET / HTTP/1.0\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := cl.ReadRecord(); err != nil {
			if err != io.EOF {
				t.Fatalf("%s: %v", addr, err)
			}
			break
		}
	}
	c.Server = rc.got
	return c
}

// flightGoServer serves one connection: the request, a response, close.
func flightGoServer(t *testing.T, cert tls.Certificate) string {
	return flightGoServerConfig(t, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13})
}

func flightGoServerConfig(t *testing.T, cfg *tls.Config) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer ln.Close()
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		s := tls.Server(c, cfg)
		b := make([]byte, 512)
		if n, err := s.Read(b); err != nil || !bytes.HasPrefix(b[:n], []byte("GET ")) {
			return
		}
		body := "hello from crypto/tls\n"
		s.Write([]byte("HTTP/1.0 200 OK\r\nContent-Length: 22\r\n\r\n" + body))
		s.Close()
	}()
	return ln.Addr().String()
}

// TestTLSFlightCorpus re-checks the recorded exchanges (each ends with
// the server's close_notify after a 200 response, named in cases.txt) and
// that every replay of the corpus ends in a named verdict.
// DPXE_WRITE_TLSFLIGHT=1 first records them: crypto/tls with Discord's
// chain shape offering ChaCha20 first and AES first, and openssl
// s_server -tls1_3 -www with the same chain.
func TestTLSFlightCorpus(t *testing.T) {
	txt := filepath.Join(filepath.Dir(TLSFlightCorpusPath), "cases.txt")
	if os.Getenv("DPXE_WRITE_TLSFLIGHT") == "1" {
		p256, p384 := elliptic.P256(), elliptic.P384()
		now := time.Now()
		span := func(tm *x509.Certificate) *x509.Certificate {
			tm.NotBefore, tm.NotAfter = now.Add(-time.Hour), now.Add(90*24*time.Hour)
			return tm
		}
		root := chainMake(t, "dpxe test root P-384", span(caTmpl(-1)), chainEC(t, p384), nil)
		it := span(caTmpl(0))
		it.SignatureAlgorithm = x509.ECDSAWithSHA384
		inter := chainMake(t, "dpxe test WE1", it, chainEC(t, p256), root)
		leaf := chainMake(t, "discord.test", span(leafTmpl()), chainEC(t, p256), inter)
		other := chainMake(t, "dpxe other root P-384", span(caTmpl(-1)), chainEC(t, p384), nil)
		cert := tls.Certificate{Certificate: [][]byte{leaf.der, inter.der}, PrivateKey: leaf.key}
		at := now.Unix()
		anchors := chainDERs([]*chainCert{root})
		host := "gateway.discord.test"
		cases := []TLSFlightCase{
			flightRecord(t, flightGoServer(t, cert), host, anchors, at, false),
			flightRecord(t, flightGoServer(t, cert), host, anchors, at, true),
			flightOpenSSL(t, leaf, inter, host, anchors, at, "-groups", "X25519"),
			// HelloRetryRequests: selecting secp256r1 (crypto/tls and
			// openssl taking P-256 only), and a cookie only (openssl
			// -stateless: the x25519 share stays)
			flightRecord(t, flightGoServerConfig(t, &tls.Config{Certificates: []tls.Certificate{cert}, CurvePreferences: []tls.CurveID{tls.CurveP256}}),
				host, anchors, at, false),
			flightOpenSSL(t, leaf, inter, host, anchors, at, "-groups", "P-256"),
			flightKeyUpdate(t, leaf, inter, host, anchors, at),
			flightRecordRefused(t, flightGoServer(t, cert), "wrong.example", anchors, at, false, "name_mismatch"),
			flightRecordRefused(t, flightGoServer(t, cert), host, chainDERs([]*chainCert{other}), at, false, "unknown_ca"),
			flightRecordRefused(t, flightGoServerConfig(t, &tls.Config{Certificates: []tls.Certificate{cert}, MaxVersion: tls.VersionTLS12}),
				host, anchors, at, false, "protocol_version"),
		}
		names := "crypto/tls ecdsa p256 (Discord's shape), ChaCha20 offered first\ncrypto/tls ecdsa p256, AES-128-GCM offered first\nopenssl s_server -tls1_3 -www ecdsa p256 (Discord's shape)\n" +
			"hrr: crypto/tls P-256 only, a HelloRetryRequest answered with a P-256 share\n" +
			"hrr: openssl s_server -groups P-256, a HelloRetryRequest answered with a P-256 share\n" +
			"keyupdate: openssl s_server -stateless (interactive): a cookie-only HelloRetryRequest answered with the same x25519 share, KeyUpdate(update_requested) answered, then the 200 answer (eof)\n" +
			"refused: crypto/tls, wrong name (name_mismatch)\nrefused: crypto/tls, unknown root (unknown_ca)\n" +
			"refused: crypto/tls capped at TLS 1.2 (protocol_version, its alert)\n"
		if err := os.MkdirAll(filepath.Dir(TLSFlightCorpusPath), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(TLSFlightCorpusPath, EncodeTLSFlightCases(cases), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(txt, []byte(names), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := os.ReadFile(TLSFlightCorpusPath)
	if err != nil {
		t.Fatal(err)
	}
	cases, err := DecodeTLSFlightCases(raw)
	if err != nil {
		t.Fatal(err)
	}
	names, err := os.ReadFile(txt)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(names)), "\n")
	if len(lines) != len(cases) {
		t.Fatalf("%d cases, %d names", len(cases), len(lines))
	}
	for i, c := range cases {
		r := ReplayTLSFlight(c)
		if want, refused := strings.CutPrefix(lines[i], "refused: "); refused {
			if r.Err == nil || !strings.Contains(want, "("+r.Err.Error()) {
				t.Errorf("%s: %v", lines[i], r.Err)
			}
			continue
		}
		if strings.HasPrefix(lines[i], "keyupdate: ") {
			if r.Err == nil || r.Err.Error() != "eof" || !bytes.HasPrefix(r.Data, []byte("HTTP/1.0 200")) || r.Conn.KeyUpdates() != 1 ||
				!r.Conn.Retry || r.Conn.Group != TLSGroupX25519 {
				t.Errorf("%s: %v %q", lines[i], r.Err, r.Data)
			} else if !bytes.Contains(r.Out, []byte{TLSContentApplicationData, 3, 3, 0, 5 + 1 + 16}) {
				t.Errorf("%s: no sealed KeyUpdate answer among what the client sent", lines[i])
			}
			continue
		}
		if r.Err != nil || !bytes.HasPrefix(r.Data, []byte("HTTP/1.0 200")) {
			t.Errorf("%s: %v %q", lines[i], r.Err, r.Data)
			continue
		}
		if strings.HasPrefix(lines[i], "hrr: ") != r.Conn.Retry {
			t.Errorf("%s: HelloRetryRequest answered %v", lines[i], r.Conn.Retry)
		}
		t.Logf("%s: suite %04x scheme %04x listed %d, %d bytes", lines[i], r.Conn.Suite, r.Conn.Scheme, r.Conn.Listed, len(r.Data))
	}
	all, err := tlsFlightCorpus(TLSFlightCorpusPath)
	if err != nil {
		t.Fatal(err)
	}
	// the made-up HelloRetryRequests (tlsSynthRetries), each refused as
	// named or answered before the flight ends
	synth := []string{"unexpected_message", "illegal_parameter", "illegal_parameter", "illegal_parameter", "cookie_too_large", "eof",
		"unexpected_message", "illegal_parameter", "illegal_parameter", "illegal_parameter", "illegal_parameter", "eof", "eof"}
	for i, want := range synth {
		r := ReplayTLSFlight(all[len(all)-len(synth)+i])
		if r.Err == nil || r.Err.Error() != want {
			t.Errorf("made-up HelloRetryRequest %d: %v, want %s", i, r.Err, want)
		}
		if sent := bytes.Count(r.Out, []byte{TLSContentHandshake, 3, 3}); sent != []int{1, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1}[i] {
			t.Errorf("made-up HelloRetryRequest %d: %d second ClientHellos sent", i, sent)
		}
	}
	verdicts := map[string]int{}
	for _, c := range all {
		r := ReplayTLSFlight(c)
		name := "ok"
		if r.Err != nil {
			name = r.Err.Error()
		}
		if strings.ContainsAny(name, " :") {
			t.Errorf("unnamed refusal %q", name)
		}
		verdicts[name]++
	}
	t.Logf("verdicts %v", verdicts)
	for _, want := range []string{"ok", "eof", "certificate_expired", "bad_record_mac", "unexpected_message", "name_mismatch", "unknown_ca", "protocol_version"} {
		if verdicts[want] == 0 {
			t.Errorf("no case ends %s", want)
		}
	}
	d, n, err := TLSFlightDigest(TLSFlightCorpusPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("tls13-client digest %016x over %d cases", d, n)
}

// flightOpenSSL records one exchange with openssl s_server -www and the
// extra options.
func flightOpenSSL(t *testing.T, leaf, inter *chainCert, host string, anchors [][]byte, now int64, extra ...string) TLSFlightCase {
	bin, err := exec.LookPath("openssl")
	if err != nil {
		t.Fatal("the corpus wants openssl")
	}
	dir := t.TempDir()
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	kder, err := x509.MarshalPKCS8PrivateKey(leaf.key)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	args := append([]string{"s_server", "-accept", addr, "-tls1_3", "-cert", write("l.pem", "CERTIFICATE", leaf.der),
		"-cert_chain", write("i.pem", "CERTIFICATE", inter.der), "-key", write("k.pem", "PRIVATE KEY", kder), "-www", "-naccept", "1", "-quiet"}, extra...)
	cmd := exec.Command(bin, args...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	return flightRecord(t, addr, host, anchors, now, false)
}

// flightKeyUpdate records an exchange with openssl s_server -stateless in
// its interactive mode: a cookie-only HelloRetryRequest, then, once our GET has arrived, "K" on its stdin sends a
// KeyUpdate(update_requested); once our answering KeyUpdate has arrived
// (-msg shows it), a 200 answer typed on its stdin. The recording stops
// when the whole answer is in (the flight then ends: "eof" on replay).
func flightKeyUpdate(t *testing.T, leaf, inter *chainCert, host string, anchors [][]byte, now int64) TLSFlightCase {
	const answer = "HTTP/1.0 200 OK\r\nContent-Length: 24\r\n\r\nhello after a KeyUpdate\n"
	addr, out := openSSLInteractive(t, leaf, inter, answer)
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.SetDeadline(time.Now().Add(20 * time.Second))
	c := TLSFlightCase{Now: now, Host: host, Anchors: anchors}
	if _, err := rand.Read(c.Rand[:]); err != nil {
		t.Fatal(err)
	}
	rc := &recConn{Conn: raw}
	cl, err := TLSClientConnect(rc, TLSClientConfig{Host: host, Now: now, Anchors: anchors, Rand: bytes.NewReader(c.Rand[:])})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Write([]byte("GET / HTTP/1.0\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	var got []byte
	for len(got) < len(answer) { // bounded by the deadline above
		d, err := cl.ReadRecord()
		if err != nil {
			t.Fatalf("%v after %q; openssl: %s", err, got, out.String())
		}
		got = append(got, d...)
	}
	if cl.KeyUpdates() != 1 || !strings.Contains(out.String(), openSSLSawKeyUpdate) {
		t.Fatalf("key updates %d; openssl: %s", cl.KeyUpdates(), out.String())
	}
	c.Server = rc.got
	return c
}

// openSSLSawKeyUpdate is what openssl -msg prints for a KeyUpdate it read.
const openSSLSawKeyUpdate = "<<< TLS 1.3, Handshake [length 0005], KeyUpdate"

// openSSLInteractive starts openssl s_server -msg -stateless
// (interactive, X25519; a cookie-only HelloRetryRequest first) for one
// connection: once a GET has arrived it types "K" (a
// KeyUpdate(update_requested)), once the client's KeyUpdate has arrived
// it types answer. It returns the address and the server's output.
func openSSLInteractive(t *testing.T, leaf, inter *chainCert, answer string) (string, *syncLog) {
	bin, err := exec.LookPath("openssl")
	if err != nil {
		t.Fatal("the corpus wants openssl")
	}
	dir := t.TempDir()
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	kder, err := x509.MarshalPKCS8PrivateKey(leaf.key)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(bin, "s_server", "-accept", addr, "-tls1_3", "-groups", "X25519", "-cert", write("l.pem", "CERTIFICATE", leaf.der),
		"-cert_chain", write("i.pem", "CERTIFICATE", inter.der), "-key", write("k.pem", "PRIVATE KEY", kder), "-naccept", "1", "-msg", "-stateless")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out := &syncLog{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	go func() {
		if out.waitFor("GET /", 15*time.Second) {
			io.WriteString(stdin, "K\n")
			if out.waitFor(openSSLSawKeyUpdate, 15*time.Second) {
				io.WriteString(stdin, answer)
			}
		}
	}()
	for i := 0; i < 100 && !out.contains("ACCEPT"); i++ { // bounded: until it listens
		time.Sleep(50 * time.Millisecond)
	}
	return addr, out
}

// syncLog is a process's output, shared with the test.
type syncLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *syncLog) contains(s string) bool { return strings.Contains(l.String(), s) }

// waitFor polls for s in the output until d has passed.
func (l *syncLog) waitFor(s string, d time.Duration) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if l.contains(s) {
			return true
		}
	}
	return l.contains(s)
}
