package appliance

import (
	"crypto"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// authGoServer records one handshake of the reference client with a
// crypto/tls server holding chain (leaf first) and key.
func authGoServer(t *testing.T, key crypto.Signer, chain []*chainCert, anchors []*chainCert, host string, now int64) TLSAuthCase {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var cert tls.Certificate
	for _, c := range chain {
		cert.Certificate = append(cert.Certificate, c.der)
	}
	cert.PrivateKey = key
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		s := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert}})
		s.Handshake()
		s.Read(make([]byte, 1))
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.SetDeadline(time.Now().Add(10 * time.Second))
	cl, err := TLSClientConnect(raw, TLSClientConfig{Host: host, Now: now, Anchors: chainDERs(anchors), Rand: rand.Reader})
	if err != nil {
		t.Fatal(err)
	}
	return TLSAuthCase{Now: now, Host: host, Anchors: chainDERs(anchors), CertBody: cl.CertBody, CVBody: cl.CVBody, CVTranscript: cl.CVTranscript}
}

// authOpenSSL records one handshake with openssl s_server.
func authOpenSSL(t *testing.T, leaf, inter *chainCert, anchors []*chainCert, host string, now int64) TLSAuthCase {
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
	cl, err := TLSClientConnect(raw, TLSClientConfig{Host: host, Now: now, Anchors: chainDERs(anchors), Rand: rand.Reader})
	if err != nil {
		t.Fatal(err)
	}
	return TLSAuthCase{Now: now, Host: host, Anchors: chainDERs(anchors), CertBody: cl.CertBody, CVBody: cl.CVBody, CVTranscript: cl.CVTranscript}
}

// TestTLSAuthCorpus re-checks the recorded flights (each accepted, named
// in cases.txt) and the digest's corpus. DPXE_WRITE_TLSAUTH=1 first
// records them: crypto/tls with Discord's chain shape, a P-384 leaf and
// an RSA-2048 leaf (rsa_pss_rsae_sha256), and openssl s_server with
// Discord's chain shape.
func TestTLSAuthCorpus(t *testing.T) {
	txt := filepath.Join(filepath.Dir(TLSAuthCorpusPath), "cases.txt")
	if os.Getenv("DPXE_WRITE_TLSAUTH") == "1" {
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
		leaf384 := chainMake(t, "discord.test", span(leafTmpl()), chainEC(t, p384), inter)
		rsaRoot := chainMake(t, "dpxe RSA root", span(caTmpl(-1)), chainRSA(t, 0), nil)
		rsaLeaf := chainMake(t, "discord.test", span(leafTmpl()), chainRSA(t, 1), rsaRoot)
		at := now.Unix()
		cases := []TLSAuthCase{
			authGoServer(t, leaf.key, []*chainCert{leaf, inter}, []*chainCert{root}, "gateway.discord.test", at),
			authGoServer(t, leaf384.key, []*chainCert{leaf384, inter}, []*chainCert{root}, "discord.test", at),
			authGoServer(t, rsaLeaf.key, []*chainCert{rsaLeaf}, []*chainCert{rsaRoot}, "10.0.0.1", at),
			authOpenSSL(t, leaf, inter, []*chainCert{root}, "gateway.discord.test", at),
		}
		names := "crypto/tls ecdsa p256 (Discord's shape)\ncrypto/tls ecdsa p384\ncrypto/tls rsa-2048 pss\nopenssl s_server ecdsa p256 (Discord's shape)\n"
		if err := os.MkdirAll(filepath.Dir(TLSAuthCorpusPath), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(TLSAuthCorpusPath, EncodeTLSAuthCases(cases), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(txt, []byte(names), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := os.ReadFile(TLSAuthCorpusPath)
	if err != nil {
		t.Fatal(err)
	}
	cases, err := DecodeTLSAuthCases(raw)
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
		if _, _, err := TLSServerAuth(c.CertBody, c.CVBody, c.CVTranscript, c.Host, c.Now, c.Anchors); err != nil {
			t.Errorf("%s: %v", lines[i], err)
		}
	}
	all, err := tlsAuthCorpus(TLSAuthCorpusPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range all {
		_, _, err := TLSServerAuth(c.CertBody, c.CVBody, c.CVTranscript, c.Host, c.Now, c.Anchors)
		if TLSAuthReasonIndex(err) < 0 {
			t.Errorf("unnumbered refusal %v", err)
		}
	}
	d, n, err := TLSAuthDigest(TLSAuthCorpusPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("tls13-auth digest %016x over %d cases", d, n)
}
