package appliance

import (
	"crypto"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
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
