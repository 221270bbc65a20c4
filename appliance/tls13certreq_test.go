package appliance

import (
	"bytes"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"testing"
	"time"
)

// TestTLSCertificateRequestParse: the CertificateRequest bodies taken and
// refused (§4.3.2), and the empty Certificate that answers one (§4.4.2).
func TestTLSCertificateRequestParse(t *testing.T) {
	sigalgs := []byte{0, 13, 0, 4, 0, 2, 4, 3} // signature_algorithms: ecdsa_secp256r1_sha256
	for _, tc := range []struct {
		name string
		body []byte
		ctx  []byte
		err  error
	}{
		{"crypto/tls shape", append([]byte{0, 0, 8}, sigalgs...), []byte{}, nil},
		{"context echoed", append([]byte{3, 'a', 'b', 'c', 0, 8}, sigalgs...), []byte("abc"), nil},
		{"no extensions", []byte{0, 0, 0}, []byte{}, nil},
		{"empty body", nil, nil, ErrTLSDecodeError},
		{"context past the end", []byte{5, 1, 2}, nil, ErrTLSDecodeError},
		{"no extensions length", []byte{0, 0}, nil, ErrTLSDecodeError},
		{"extensions shorter than said", append([]byte{0, 0, 9}, sigalgs...), nil, ErrTLSDecodeError},
		{"extensions longer than said", append([]byte{0, 0, 7}, sigalgs...), nil, ErrTLSDecodeError},
		{"extension header cut", []byte{0, 0, 3, 0, 13, 0}, nil, ErrTLSDecodeError},
		{"extension data past the block", []byte{0, 0, 4, 0, 13, 0, 1}, nil, ErrTLSDecodeError},
	} {
		ctx, err := ParseTLSCertificateRequest(tc.body)
		if err != tc.err || tc.err == nil && !bytes.Equal(ctx, tc.ctx) {
			t.Errorf("%s: %q %v, want %q %v", tc.name, ctx, err, tc.ctx, tc.err)
		}
	}
	if got, want := TLSEmptyCertificate(nil), []byte{11, 0, 0, 4, 0, 0, 0, 0}; !bytes.Equal(got, want) {
		t.Errorf("empty context: % x, want % x", got, want)
	}
	ctx := bytes.Repeat([]byte{7}, 255)
	got := TLSEmptyCertificate(ctx)
	if want := append(append([]byte{11, 0, 1, 3, 255}, ctx...), 0, 0, 0); !bytes.Equal(got, want) {
		t.Errorf("255-byte context: % x", got)
	}
}

// TestTLSClientCertificateRequest runs the reference client against
// crypto/tls servers that ask for a client certificate: RequestClientCert
// (the server sees an empty certificate list, then our GET) and
// RequireAnyClientCert (refused by the server with certificate_required).
func TestTLSClientCertificateRequest(t *testing.T) {
	p256, p384 := elliptic.P256(), elliptic.P384()
	root := chainMake(t, "dpxe test root P-384", caTmpl(-1), chainEC(t, p384), nil)
	it := caTmpl(0)
	it.SignatureAlgorithm = x509.ECDSAWithSHA384
	inter := chainMake(t, "dpxe test WE1", it, chainEC(t, p256), root)
	leaf := chainMake(t, "discord.test", leafTmpl(), chainEC(t, p256), inter)
	cert := tls.Certificate{Certificate: [][]byte{leaf.der, inter.der}, PrivateKey: leaf.key}
	for _, auth := range []tls.ClientAuthType{tls.RequestClientCert, tls.RequireAnyClientCert} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		type seen struct {
			peers int
			req   string
			err   error
		}
		done := make(chan seen, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				done <- seen{err: err}
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			s := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13, ClientAuth: auth})
			if err := s.Handshake(); err != nil {
				done <- seen{err: err}
				return
			}
			b := make([]byte, 64)
			n, err := s.Read(b)
			peers := len(s.ConnectionState().PeerCertificates)
			if err == nil {
				_, err = s.Write([]byte("HTTP/1.0 200 OK\r\n\r\n"))
			}
			s.Close()
			done <- seen{peers, string(b[:n]), err}
		}()
		raw, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		raw.SetDeadline(time.Now().Add(10 * time.Second))
		c, err := TLSClientConnect(raw, TLSClientConfig{Host: "discord.test", Now: chainNow.Unix(), Anchors: chainDERs([]*chainCert{root}), Rand: rand.Reader})
		if err != nil {
			t.Fatalf("%v: %v", auth, err)
		}
		if !c.CertRequested || len(c.CertContext) != 0 {
			t.Errorf("%v: requested %v context %q", auth, c.CertRequested, c.CertContext)
		}
		if _, err := c.Write([]byte("GET / HTTP/1.0\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		got, rerr := c.ReadRecord()
		s := <-done
		if auth == tls.RequestClientCert {
			if rerr != nil || !bytes.HasPrefix(got, []byte("HTTP/1.0 200")) || s.err != nil || s.peers != 0 || s.req != "GET / HTTP/1.0\r\n\r\n" {
				t.Errorf("RequestClientCert: client %q %v; server saw %d certificates, %q, %v", got, rerr, s.peers, s.req, s.err)
			}
			continue
		}
		// the server refuses the empty Certificate with certificate_required
		// (after our Finished: we learn it on our first read)
		var ae *TLSAlertError
		if !errors.As(rerr, &ae) || ae.Name != "certificate_required" || s.err == nil {
			t.Errorf("RequireAnyClientCert: client %v, server %v", rerr, s.err)
		}
	}
}
