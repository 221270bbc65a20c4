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

// setupTLS generates a throw-away CA and a server certificate signed by it for
// 127.0.0.1, ::1, localhost and the hosts of PublicHost and ResumeHost.
func (e *Emulator) setupTLS() error {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("gatewayemu: CA key: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "dpxe gateway emulator CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(certLifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("gatewayemu: CA cert: %w", err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return fmt.Errorf("gatewayemu: CA parse: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("gatewayemu: server key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "gateway emulator"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(certLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
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
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("gatewayemu: server cert: %w", err)
	}
	e.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	e.caPool = x509.NewCertPool()
	e.caPool.AddCert(caCert)
	e.tlsConf = &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der, caDER}, PrivateKey: key}},
		MinVersion:   tls.VersionTLS12,
		NextProtos:   []string{"http/1.1"},
	}
	return nil
}

// CAPEM returns the PEM of the generated CA, or nil when TLS is off.
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
