package appliance

import (
	"crypto"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// flipConn changes one byte of what the server sends, at offset at.
type flipConn struct {
	net.Conn
	at, seen int
}

func (f *flipConn) Read(b []byte) (int, error) {
	n, err := f.Conn.Read(b)
	if f.at >= f.seen && f.at < f.seen+n {
		b[f.at-f.seen] ^= 0x40
	}
	f.seen += n
	return n, err
}

// TestTLSClientAgainstCryptoTLS runs the reference client (this package's
// ClientHello, ServerHello, key schedule, records, Certificate,
// X509VerifyChain, CertificateVerify and Finished) against Go's crypto/tls
// server on loopback TCP: Discord's chain shape, a P-384 leaf, RSA-2048,
// both suites, application data both ways with NewSessionTicket skipped;
// and each refusal named.
func TestTLSClientAgainstCryptoTLS(t *testing.T) {
	p256, p384 := elliptic.P256(), elliptic.P384()
	root := chainMake(t, "dpxe test root P-384", caTmpl(-1), chainEC(t, p384), nil)
	it := caTmpl(0)
	it.SignatureAlgorithm = x509.ECDSAWithSHA384
	inter := chainMake(t, "dpxe test WE1", it, chainEC(t, p256), root)
	leaf := chainMake(t, "discord.test", leafTmpl(), chainEC(t, p256), inter)
	leaf384 := chainMake(t, "discord.test", leafTmpl(), chainEC(t, p384), inter)
	rsaRoot := chainMake(t, "dpxe RSA root", caTmpl(-1), chainRSA(t, 0), nil)
	rsaLeaf := chainMake(t, "discord.test", leafTmpl(), chainRSA(t, 1), rsaRoot)
	other := chainMake(t, "other root", caTmpl(-1), chainEC(t, p384), nil)
	now := chainNow.Unix()

	tlsCert := func(key crypto.Signer, chain ...*chainCert) tls.Certificate {
		var c tls.Certificate
		for _, x := range chain {
			c.Certificate = append(c.Certificate, x.der)
		}
		c.PrivateKey = key
		return c
	}
	for _, tc := range []struct {
		name      string
		cert      tls.Certificate
		anchors   []*chainCert
		host      string
		preferAES bool
		maxVer    uint16
		flip      int
		want      string // "" accepted
		scheme    int
		suite     uint16
	}{
		{"ecdsa p256 chacha", tlsCert(leaf.key, leaf, inter), []*chainCert{root}, "gateway.discord.test", false, 0, 0, "", TLSSigECDSAP256SHA256, TLSSuiteChaCha20Poly1305SHA256},
		{"ecdsa p256 aes", tlsCert(leaf.key, leaf, inter), []*chainCert{root}, "10.0.0.1", true, 0, 0, "", TLSSigECDSAP256SHA256, 0},
		{"ecdsa p384", tlsCert(leaf384.key, leaf384, inter), []*chainCert{root}, "discord.test", false, 0, 0, "", TLSSigECDSAP384SHA384, 0},
		{"rsa-2048", tlsCert(rsaLeaf.key, rsaLeaf), []*chainCert{rsaRoot}, "discord.test", false, 0, 0, "", TLSSigRSAPSSSHA256, 0},
		{"wrong name", tlsCert(leaf.key, leaf, inter), []*chainCert{root}, "discord.example", false, 0, 0, "name_mismatch", 0, 0},
		{"unknown root", tlsCert(leaf.key, leaf, inter), []*chainCert{other}, "discord.test", false, 0, 0, "unknown_ca", 0, 0},
		{"missing intermediate", tlsCert(leaf.key, leaf), []*chainCert{root}, "discord.test", false, 0, 0, "unknown_ca", 0, 0},
		{"TLS 1.2 only", tlsCert(leaf.key, leaf, inter), []*chainCert{root}, "discord.test", false, tls.VersionTLS12, 0, "alert protocol_version", 0, 0},
		{"corrupted record", tlsCert(leaf.key, leaf, inter), []*chainCert{root}, "discord.test", false, 0, 400, "bad_record_mac", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			cfg := &tls.Config{Certificates: []tls.Certificate{tc.cert}, MinVersion: tls.VersionTLS12, MaxVersion: tc.maxVer}
			done := make(chan error, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					done <- err
					return
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				s := tls.Server(c, cfg)
				if err := s.Handshake(); err != nil {
					done <- err
					return
				}
				b := make([]byte, 64)
				n, err := s.Read(b)
				if err != nil {
					done <- err
					return
				}
				_, err = s.Write(append([]byte("pong:"), b[:n]...))
				s.Close() // close_notify
				done <- err
			}()
			raw, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			raw.SetDeadline(time.Now().Add(10 * time.Second))
			var conn net.Conn = raw
			if tc.flip > 0 {
				conn = &flipConn{Conn: raw, at: tc.flip}
			}
			c, err := TLSClientConnect(conn, TLSClientConfig{Host: tc.host, Now: now, Anchors: chainDERs(tc.anchors), Rand: rand.Reader, PreferAES: tc.preferAES})
			if tc.want != "" {
				if err == nil || err.Error() != tc.want {
					t.Fatalf("%v, want %s", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Scheme != tc.scheme || tc.suite != 0 && c.Suite != tc.suite {
				t.Errorf("scheme %04x suite %04x, want %04x %04x", c.Scheme, c.Suite, tc.scheme, tc.suite)
			}
			t.Logf("suite %04x scheme %04x path %v listed %d", c.Suite, c.Scheme, c.Path.Listed, c.Listed)
			if _, err := c.Write([]byte("ping")); err != nil {
				t.Fatal(err)
			}
			got, err := c.ReadRecord()
			if err != nil || string(got) != "pong:ping" {
				t.Fatalf("%q, %v", got, err)
			}
			if _, err := c.ReadRecord(); !errors.Is(err, io.EOF) {
				t.Errorf("after the answer: %v, want close_notify", err)
			}
			if err := <-done; err != nil {
				t.Errorf("server: %v", err)
			}
		})
	}
}

// TestTLSClientAgainstOpenSSL runs the reference client against Debian's
// `openssl s_server -tls1_3 -www` with Discord's chain shape, once per
// suite: the handshake, a GET and the status page it answers.
func TestTLSClientAgainstOpenSSL(t *testing.T) {
	bin, err := exec.LookPath("openssl")
	if err != nil {
		t.Skip("no openssl (tools/scripts/deps.sh test installs it)")
	}
	p256, p384 := elliptic.P256(), elliptic.P384()
	// checked at the real clock here: certificates valid now
	nb, na := time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	rt := caTmpl(-1)
	rt.NotBefore, rt.NotAfter = nb, na
	root := chainMake(t, "dpxe test root P-384", rt, chainEC(t, p384), nil)
	it := caTmpl(0)
	it.SignatureAlgorithm = x509.ECDSAWithSHA384
	it.NotBefore, it.NotAfter = nb, na
	inter := chainMake(t, "dpxe test WE1", it, chainEC(t, p256), root)
	lt := leafTmpl()
	lt.NotBefore, lt.NotAfter = nb, na
	leaf := chainMake(t, "discord.test", lt, chainEC(t, p256), inter)
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
	certPath, chainPath, keyPath := write("leaf.pem", "CERTIFICATE", leaf.der), write("inter.pem", "CERTIFICATE", inter.der), write("key.pem", "PRIVATE KEY", kder)
	for _, suite := range []struct {
		name string
		id   uint16
		aes  bool
	}{{"TLS_CHACHA20_POLY1305_SHA256", TLSSuiteChaCha20Poly1305SHA256, false}, {"TLS_AES_128_GCM_SHA256", TLSSuiteAES128GCMSHA256, true}} {
		t.Run(suite.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := ln.Addr().String()
			ln.Close()
			cmd := exec.Command(bin, "s_server", "-accept", addr, "-tls1_3", "-ciphersuites", suite.name, "-groups", "X25519",
				"-cert", certPath, "-cert_chain", chainPath, "-key", keyPath, "-www", "-naccept", "1", "-quiet")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { cmd.Process.Kill(); cmd.Wait() }()
			var raw net.Conn
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
			c, err := TLSClientConnect(raw, TLSClientConfig{Host: "gateway.discord.test", Now: time.Now().Unix(),
				Anchors: [][]byte{root.der}, Rand: rand.Reader, PreferAES: suite.aes})
			if err != nil {
				t.Fatal(err)
			}
			if c.Suite != suite.id || c.Scheme != TLSSigECDSAP256SHA256 {
				t.Errorf("suite %04x scheme %04x", c.Suite, c.Scheme)
			}
			if _, err := c.Write([]byte("GET / HTTP/1.0\r\n\r\n")); err != nil {
				t.Fatal(err)
			}
			var page []byte
			for {
				b, err := c.ReadRecord()
				if err != nil {
					break // close_notify or the server closing
				}
				page = append(page, b...)
			}
			if !strings.Contains(string(page), "HTTP/1.0 200") || !strings.Contains(string(page), suite.name) {
				t.Errorf("page %q", page)
			}
		})
	}
}
