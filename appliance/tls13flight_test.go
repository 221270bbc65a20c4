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
			flightOpenSSL(t, leaf, inter, host, anchors, at),
			flightRecordRefused(t, flightGoServer(t, cert), "wrong.example", anchors, at, false, "name_mismatch"),
			flightRecordRefused(t, flightGoServer(t, cert), host, chainDERs([]*chainCert{other}), at, false, "unknown_ca"),
			flightRecordRefused(t, flightGoServerConfig(t, &tls.Config{Certificates: []tls.Certificate{cert}, MaxVersion: tls.VersionTLS12}),
				host, anchors, at, false, "protocol_version"),
			flightRecordRefused(t, flightGoServerConfig(t, &tls.Config{Certificates: []tls.Certificate{cert}, CurvePreferences: []tls.CurveID{tls.CurveP256}}),
				host, anchors, at, false, "hello_retry_unsupported"),
		}
		names := "crypto/tls ecdsa p256 (Discord's shape), ChaCha20 offered first\ncrypto/tls ecdsa p256, AES-128-GCM offered first\nopenssl s_server -tls1_3 -www ecdsa p256 (Discord's shape)\n" +
			"refused: crypto/tls, wrong name (name_mismatch)\nrefused: crypto/tls, unknown root (unknown_ca)\n" +
			"refused: crypto/tls capped at TLS 1.2 (protocol_version, its alert)\nrefused: crypto/tls P-256 only, a HelloRetryRequest (hello_retry_unsupported)\n"
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
		if r.Err != nil || !bytes.HasPrefix(r.Data, []byte("HTTP/1.0 200")) {
			t.Errorf("%s: %v %q", lines[i], r.Err, r.Data)
			continue
		}
		t.Logf("%s: suite %04x scheme %04x listed %d, %d bytes", lines[i], r.Conn.Suite, r.Conn.Scheme, r.Conn.Listed, len(r.Data))
	}
	all, err := tlsFlightCorpus(TLSFlightCorpusPath)
	if err != nil {
		t.Fatal(err)
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
	for _, want := range []string{"ok", "eof", "certificate_expired", "bad_record_mac", "unexpected_message", "name_mismatch", "unknown_ca", "protocol_version", "hello_retry_unsupported"} {
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

// flightOpenSSL records one exchange with openssl s_server -www.
func flightOpenSSL(t *testing.T, leaf, inter *chainCert, host string, anchors [][]byte, now int64) TLSFlightCase {
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
		"-cert_chain", write("i.pem", "CERTIFICATE", inter.der), "-key", write("k.pem", "PRIVATE KEY", kder), "-www", "-naccept", "1", "-quiet")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	return flightRecord(t, addr, host, anchors, now, false)
}
