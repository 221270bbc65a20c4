package appliance

import (
	"bytes"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// TestTLSClientHelloRetry runs the reference client against Go's
// crypto/tls server configured with P-256 only: it answers the x25519
// share with a HelloRetryRequest selecting secp256r1. The client sends a
// second ClientHello with a P-256 share and completes (application data
// both ways), with either suite first.
func TestTLSClientHelloRetry(t *testing.T) {
	p256, p384 := elliptic.P256(), elliptic.P384()
	root := chainMake(t, "dpxe test root P-384", caTmpl(-1), chainEC(t, p384), nil)
	it := caTmpl(0)
	it.SignatureAlgorithm = x509.ECDSAWithSHA384
	inter := chainMake(t, "dpxe test WE1", it, chainEC(t, p256), root)
	leaf := chainMake(t, "discord.test", leafTmpl(), chainEC(t, p256), inter)
	cert := tls.Certificate{Certificate: [][]byte{leaf.der, inter.der}, PrivateKey: leaf.key}
	for _, tc := range []struct {
		name string
		aes  bool
		want string
	}{
		{"chacha", false, ""},
		{"aes", true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13,
				CurvePreferences: []tls.CurveID{tls.CurveP256}}
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
				if s.ConnectionState().DidResume || !s.ConnectionState().HandshakeComplete {
					done <- errors.New("state")
					return
				}
				b := make([]byte, 64)
				n, err := s.Read(b)
				if err != nil {
					done <- err
					return
				}
				_, err = s.Write(append([]byte("pong:"), b[:n]...))
				s.Close()
				done <- err
			}()
			raw, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			raw.SetDeadline(time.Now().Add(10 * time.Second))
			c, err := TLSClientConnect(raw, TLSClientConfig{Host: "gateway.discord.test", Now: chainNow.Unix(),
				Anchors: chainDERs([]*chainCert{root}), Rand: rand.Reader, PreferAES: tc.aes})
			if tc.want != "" {
				if err == nil || err.Error() != tc.want {
					t.Fatalf("%v, want %s", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !c.Retry || c.Group != TLSGroupSecp256r1 {
				t.Errorf("retry %v group %04x, want an HRR and secp256r1", c.Retry, c.Group)
			}
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
			t.Logf("suite %04x group %04x scheme %04x", c.Suite, c.Group, c.Scheme)
		})
	}
}

// hrrMessage builds a HelloRetryRequest: suite, selected_group (0: no
// key_share) and cookie (nil: none).
func hrrMessage(sid []byte, suite, group uint16, cookie []byte) []byte {
	var ext []byte
	ext = append(ext, 0, tlsExtSupportedVersions, 0, 2, 3, 4)
	if group != 0 {
		ext = append(ext, 0, tlsExtKeyShare, 0, 2, byte(group>>8), byte(group))
	}
	if cookie != nil {
		ext = appendU16(append(ext, 0, tlsExtCookie), len(cookie)+2)
		ext = append(appendU16(ext, len(cookie)), cookie...)
	}
	b := append([]byte{3, 3}, tlsHRRRandom...)
	b = append(append(b, byte(len(sid))), sid...)
	b = append(appendU16(b, int(suite)), 0)
	b = append(appendU16(b, len(ext)), ext...)
	return append([]byte{TLSHSServerHello, 0, byte(len(b) >> 8), byte(len(b))}, b...)
}

// scriptConn plays a server that answers each ClientHello with the next
// of its messages, in one handshake record, and keeps the ClientHellos.
type scriptConn struct {
	answers [][]byte
	hellos  [][]byte
	in      bytes.Buffer
}

func (s *scriptConn) Write(b []byte) (int, error) {
	if len(b) > TLSRecordHeaderLen && b[0] == TLSContentHandshake && b[TLSRecordHeaderLen] == TLSHSClientHello {
		ch := b[TLSRecordHeaderLen:]
		s.hellos = append(s.hellos, append([]byte(nil), ch...))
		if len(s.answers) > 0 {
			a := s.answers[0]
			s.answers = s.answers[1:]
			s.in.Write([]byte{TLSContentHandshake, 3, 3, byte(len(a) >> 8), byte(len(a))})
			s.in.Write(a)
			s.in.Write([]byte{tlsContentCCS, 3, 3, 0, 1, 1}) // as crypto/tls does after an HRR
		}
	}
	return len(b), nil
}

func (s *scriptConn) Read(b []byte) (int, error) {
	if s.in.Len() == 0 {
		return 0, io.EOF
	}
	return s.in.Read(b)
}

// chExtension maps a ClientHello message's extension types to their data.
func chExtension(t *testing.T, ch []byte) map[int][]byte {
	r := tlsReader{b: ch[tlsHSHeaderLen:]}
	r.bytes(2 + TLSRandomLen)
	r.bytes(r.u8())
	r.bytes(r.u16())
	r.bytes(r.u8())
	m := map[int][]byte{}
	if err := tlsExtensions(r.b, func(typ int, data []byte) error { m[typ] = data; return nil }); err != nil || r.bad {
		t.Fatalf("ClientHello: %v", err)
	}
	return m
}

// TestTLSClientHelloRetryScripted checks the second ClientHello (same
// random and session id, a 65-byte secp256r1 share, the cookie echoed)
// and the refusals after an HRR: a second HRR (unexpected_message), a
// ServerHello with another suite or group than the HRR's, an HRR
// selecting x25519 (offered already) or a group never offered
// (illegal_parameter), a cookie over TLSCookieMax (cookie_too_large); and
// after a cookie-only HRR, the same x25519 share with the cookie, and a
// P-256 share in the answer refused (illegal_parameter).
func TestTLSClientHelloRetryScripted(t *testing.T) {
	cookie := []byte("dpxe-cookie-0123456789")
	rnd := bytes.Repeat([]byte{7}, 200)
	sid := rnd[TLSRandomLen : TLSRandomLen+TLSSessionIDLen] // the client reads random, then session id
	chacha := TLSSuiteChaCha20Poly1305SHA256
	hrr := hrrMessage(sid, chacha, TLSGroupSecp256r1, cookie)
	// a ServerHello answering with an x25519 share after the HRR
	shX := func(suite uint16, group uint16, keyLen int) []byte {
		ext := []byte{0, tlsExtSupportedVersions, 0, 2, 3, 4, 0, tlsExtKeyShare}
		ext = appendU16(ext, keyLen+4)
		ext = appendU16(appendU16(ext, int(group)), keyLen)
		key := make([]byte, keyLen)
		if keyLen == TLSP256ShareLen {
			copy(key, elliptic.Marshal(elliptic.P256(), elliptic.P256().Params().Gx, elliptic.P256().Params().Gy))
		}
		ext = append(ext, key...)
		b := append([]byte{3, 3}, bytes.Repeat([]byte{1}, TLSRandomLen)...)
		b = append(append(b, byte(len(sid))), sid...)
		b = append(appendU16(b, int(suite)), 0)
		b = append(appendU16(b, len(ext)), ext...)
		return append([]byte{TLSHSServerHello, 0, byte(len(b) >> 8), byte(len(b))}, b...)
	}
	same := hrrMessage(sid, chacha, 0, cookie) // a cookie only: the x25519 share stays
	for _, tc := range []struct {
		name    string
		answers [][]byte
		want    string
		x25519  bool // the second ClientHello keeps the first's share
	}{
		{"second HRR", [][]byte{hrr, hrr}, "unexpected_message", false},
		{"HRR selecting x25519", [][]byte{hrrMessage(sid, chacha, TLSGroupX25519, nil)}, "illegal_parameter", false},
		{"HRR selecting secp384r1", [][]byte{hrrMessage(sid, chacha, 0x0018, nil)}, "illegal_parameter", false},
		{"suite changed", [][]byte{hrr, shX(TLSSuiteAES128GCMSHA256, TLSGroupSecp256r1, TLSP256ShareLen)}, "illegal_parameter", false},
		{"x25519 share after the HRR", [][]byte{hrr, shX(chacha, TLSGroupX25519, TLSX25519Len)}, "illegal_parameter", false},
		{"no answer", [][]byte{hrr}, "EOF", false},
		{"cookie too large", [][]byte{hrrMessage(sid, chacha, TLSGroupSecp256r1, bytes.Repeat([]byte{1}, TLSCookieMax+1))}, "cookie_too_large", false},
		{"cookie only, then P-256", [][]byte{same, shX(chacha, TLSGroupSecp256r1, TLSP256ShareLen)}, "illegal_parameter", true},
		{"cookie only, no answer", [][]byte{same}, "EOF", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &scriptConn{answers: tc.answers}
			_, err := TLSClientConnect(s, TLSClientConfig{Host: "discord.test", Rand: bytes.NewReader(rnd)})
			if err == nil || err.Error() != tc.want {
				t.Fatalf("%v, want %s", err, tc.want)
			}
			if len(s.hellos) < 2 {
				return
			}
			ch1, ch2 := s.hellos[0], s.hellos[1]
			if !bytes.Equal(ch1[6:6+TLSRandomLen+1+TLSSessionIDLen], ch2[6:6+TLSRandomLen+1+TLSSessionIDLen]) {
				t.Error("the second ClientHello's random or session id differ")
			}
			e1, e2 := chExtension(t, ch1), chExtension(t, ch2)
			ks := e2[tlsExtKeyShare]
			if tc.x25519 {
				if !bytes.Equal(ks, e1[tlsExtKeyShare]) {
					t.Errorf("second key_share %x, want the first's %x", ks, e1[tlsExtKeyShare])
				}
			} else if len(ks) != 2+4+TLSP256ShareLen || binary.BigEndian.Uint16(ks[2:]) != TLSGroupSecp256r1 || ks[6] != 4 {
				t.Errorf("second key_share %x", ks)
			}
			if c := e2[tlsExtCookie]; len(c) < 2 || !bytes.Equal(c[2:], cookie) {
				t.Errorf("cookie %x", c)
			}
			delete(e1, tlsExtKeyShare)
			delete(e2, tlsExtKeyShare)
			delete(e2, tlsExtCookie)
			for typ, d := range e1 {
				if !bytes.Equal(d, e2[typ]) || len(e1) != len(e2) {
					t.Errorf("extension %d changed", typ)
				}
			}
		})
	}
}
