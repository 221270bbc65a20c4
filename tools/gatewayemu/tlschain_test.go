package gatewayemu

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"
	"time"
)

// TestTLSChainIsDiscordShaped checks what a wss:// client of the emulator
// validates: TLS 1.3 by default, a chain of the leaf and one intermediate
// (no root), shaped like Discord's (research/tls-and-real-gateway.md §1.6):
// a P-256 leaf signed ECDSA-SHA256 by an intermediate with a P-256 key,
// itself signed ECDSA-SHA384 by the P-384 root that CAPEM returns, the
// leaf naming PublicHost and ResumeHost.
func TestTLSChainIsDiscordShaped(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	e, err := Start(ctx, "127.0.0.1:0", Options{TLS: true, PublicHost: "gateway.test", ResumeHost: "resume.gateway.test"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	block, _ := pem.Decode(e.CAPEM())
	if block == nil {
		t.Fatal("CAPEM is not PEM")
	}
	root, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if k, ok := root.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P384() || !root.IsCA {
		t.Fatalf("root: %T CA %v", root.PublicKey, root.IsCA)
	}
	addr := strings.TrimPrefix(e.URL(), "wss://gateway.test")
	conf := e.ClientTLSConfig()
	conf.ServerName = "gateway.test"
	c, err := tls.Dial("tcp", "127.0.0.1"+addr, conf)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st := c.ConnectionState()
	if st.Version != tls.VersionTLS13 {
		t.Errorf("version %x, want TLS 1.3", st.Version)
	}
	pc := st.PeerCertificates
	if len(pc) != 2 {
		t.Fatalf("the server sent %d certificates, want the leaf and one intermediate", len(pc))
	}
	leaf, inter := pc[0], pc[1]
	if k, ok := leaf.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() || leaf.SignatureAlgorithm != x509.ECDSAWithSHA256 {
		t.Errorf("leaf: key %T signed %v, want P-256 signed ECDSA-SHA256", leaf.PublicKey, leaf.SignatureAlgorithm)
	}
	if k, ok := inter.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() || inter.SignatureAlgorithm != x509.ECDSAWithSHA384 || !inter.IsCA {
		t.Errorf("intermediate: key %T signed %v, want a P-256 CA signed ECDSA-SHA384", inter.PublicKey, inter.SignatureAlgorithm)
	}
	if err := inter.CheckSignatureFrom(root); err != nil {
		t.Errorf("intermediate not signed by CAPEM's root: %v", err)
	}
	for _, name := range []string{"gateway.test", "resume.gateway.test"} {
		if err := leaf.VerifyHostname(name); err != nil {
			t.Errorf("leaf: %v", err)
		}
	}
}
