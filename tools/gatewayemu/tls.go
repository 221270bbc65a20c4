package gatewayemu

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"time"
)

// certLifetime is how long the generated certificates are valid.
const certLifetime = 7 * 24 * time.Hour

// setupTLS generates a throw-away certificate authority shaped like the
// chain Discord's Cloudflare front end serves (research/tls-and-real-
// gateway.md §1.6: a P-256 leaf under Google Trust Services' WE1, a P-256
// key signed ecdsa-with-SHA384 by GTS Root R4, a P-384 root): a P-384
// root, an intermediate with a P-256 key signed by it with ECDSA-SHA384,
// and a P-256 leaf signed by the intermediate with ECDSA-SHA256 for
// 127.0.0.1, ::1, localhost and the hosts of PublicHost and ResumeHost.
// The server sends the leaf and the intermediate, not the root: a client
// must hold the root (CAPEM) as its trust anchor, as a node's image does.
func (e *Emulator) setupTLS() error {
	now := time.Now()
	rootKey, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		return fmt.Errorf("gatewayemu: root key: %w", err)
	}
	interKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("gatewayemu: intermediate key: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("gatewayemu: server key: %w", err)
	}
	ca := func(serial int64, cn string, pathLen int) *x509.Certificate {
		return &x509.Certificate{
			SerialNumber:          big.NewInt(serial),
			Subject:               pkix.Name{CommonName: cn, Organization: []string{"dpxe test"}},
			NotBefore:             now.Add(-time.Hour),
			NotAfter:              now.Add(certLifetime),
			KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
			BasicConstraintsValid: true,
			IsCA:                  true,
			MaxPathLen:            pathLen,
			MaxPathLenZero:        pathLen == 0,
		}
	}
	rootTmpl := ca(1, "dpxe gateway emulator root R4", -1)
	rootDER, err := x509.CreateCertificate(rand.Reader, rootTmpl, rootTmpl, &rootKey.PublicKey, rootKey)
	if err != nil {
		return fmt.Errorf("gatewayemu: root cert: %w", err)
	}
	root, err := x509.ParseCertificate(rootDER)
	if err != nil {
		return fmt.Errorf("gatewayemu: root parse: %w", err)
	}
	interTmpl := ca(2, "dpxe gateway emulator WE1", 0)
	interTmpl.SignatureAlgorithm = x509.ECDSAWithSHA384
	interDER, err := x509.CreateCertificate(rand.Reader, interTmpl, root, &interKey.PublicKey, rootKey)
	if err != nil {
		return fmt.Errorf("gatewayemu: intermediate cert: %w", err)
	}
	inter, err := x509.ParseCertificate(interDER)
	if err != nil {
		return fmt.Errorf("gatewayemu: intermediate parse: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:       big.NewInt(3),
		Subject:            pkix.Name{CommonName: "gateway emulator"},
		NotBefore:          now.Add(-time.Hour),
		NotAfter:           now.Add(certLifetime),
		KeyUsage:           x509.KeyUsageDigitalSignature,
		ExtKeyUsage:        []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:           []string{"localhost"},
		IPAddresses:        []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		SignatureAlgorithm: x509.ECDSAWithSHA256,
	}
	for _, hp := range []string{e.opts.PublicHost, e.opts.ResumeHost} {
		if hp == "" {
			continue
		}
		h := hostName(hp)
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, inter, &key.PublicKey, interKey)
	if err != nil {
		return fmt.Errorf("gatewayemu: server cert: %w", err)
	}
	e.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: rootDER})
	e.caPool = x509.NewCertPool()
	e.caPool.AddCert(root)
	e.tlsConf = &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der, interDER}, PrivateKey: key}},
		MinVersion:   tls.VersionTLS12,
		NextProtos:   []string{"http/1.1"},
	}
	return nil
}

// CAPEM returns the PEM of the generated root (the trust anchor), or nil
// when TLS is off.
func (e *Emulator) CAPEM() []byte { return append([]byte(nil), e.caPEM...) }

// ClientTLSConfig returns a client TLS config that trusts the generated CA,
// or nil when TLS is off.
func (e *Emulator) ClientTLSConfig() *tls.Config {
	if e.caPool == nil {
		return nil
	}
	return &tls.Config{RootCAs: e.caPool, MinVersion: tls.VersionTLS12}
}

// HTTPClient returns an HTTP client for the REST routes (trusting the CA when
// TLS is on).
func (e *Emulator) HTTPClient() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = e.ClientTLSConfig()
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}
