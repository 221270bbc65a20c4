package e2e

import (
	"fmt"
	"strings"
	"testing"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image"
)

// The TLS 1.3 self-test (kernel/selftest/tls_selftest.inc) runs in the
// crypto boot (cryptotest=1). It replays RFC 8448 §3 from the 'TLS8448 '
// section and runs pseudo-random handshakes and records; both print
// digests that appliance's Go reference (tls13.go) must reproduce.

// rfc8448Path is the RFC 8448 data file, from this package's directory.
const rfc8448Path = "../../appliance/testdata/rfc8448-simple-1rtt.txt"

// x509Dir is the X.509 corpus's certificates, from this package's directory.
const x509Dir = "../../appliance/testdata/x509"

// x509ChainPath is the chain-check cases, from this package's directory.
const x509ChainPath = "../../appliance/" + appliance.X509ChainCorpusPath

// tlsCertPath is the Certificate / CertificateVerify cases.
const tlsCertPath = "../../appliance/" + appliance.TLSCertCorpusPath

// tlsAuthPath is the server flights recorded from crypto/tls and openssl.
const tlsAuthPath = "../../appliance/" + appliance.TLSAuthCorpusPath

// tlsFlightPath is whole exchanges recorded from crypto/tls and openssl,
// replayed through the client state machine.
const tlsFlightPath = "../../appliance/" + appliance.TLSFlightCorpusPath

func init() {
	cryptoSections["TLS8448 "] = func() ([]byte, error) {
		v, err := appliance.LoadRFC8448(rfc8448Path)
		if err != nil {
			return nil, err
		}
		return appliance.TLSRFC8448Section(v)
	}
	cryptoSections["TLSHS   "] = func() ([]byte, error) { return appliance.TLSHSSection(), nil }
	cryptoSections["X509DER "] = func() ([]byte, error) { return appliance.X509Section(x509Dir) }
	cryptoSections["X509CHN "] = func() ([]byte, error) { return appliance.X509ChainSection(x509ChainPath) }
	cryptoSections["TLSCERT "] = func() ([]byte, error) { return appliance.TLSCertSection(tlsCertPath) }
	cryptoSections["TLSAUTH "] = func() ([]byte, error) { return appliance.TLSAuthSection(tlsAuthPath) }
	cryptoSections["TLSFLT  "] = func() ([]byte, error) { return appliance.TLSFlightSection(tlsFlightPath) }
	cryptoSections["TLSPOST "] = func() ([]byte, error) { return appliance.TLSPostSection(), nil }
}

// TestKernelTLS boots the crypto self-test on every CPU model and wants the
// kernel's TLS digests to equal Go's: the RFC 8448 replay, the
// pseudo-random handshakes (both suites, records both ways, every refusal),
// the ClientHellos and alert names, the handshake-message corpus and the
// X.509 corpus and the chain checks.
func TestKernelTLS(t *testing.T) {
	v, err := appliance.LoadRFC8448(rfc8448Path)
	if err != nil {
		t.Fatal(err)
	}
	rfc, err := appliance.TLSRFC8448Digest(v)
	if err != nil {
		t.Fatal(err)
	}
	want := appliance.TLSDigests(selfTestSeed)
	want["tls13-rfc8448"] = rfc
	if want["x509"], _, err = appliance.X509Digest(x509Dir); err != nil {
		t.Fatal(err)
	}
	if want["x509chain"], _, err = appliance.X509ChainDigest(x509ChainPath); err != nil {
		t.Fatal(err)
	}
	if want["tls13-cert"], _, err = appliance.TLSCertDigest(tlsCertPath); err != nil {
		t.Fatal(err)
	}
	if want["tls13-auth"], _, err = appliance.TLSAuthDigest(tlsAuthPath); err != nil {
		t.Fatal(err)
	}
	if want["tls13-client"], _, err = appliance.TLSFlightDigest(tlsFlightPath); err != nil {
		t.Fatal(err)
	}
	want["tls13-post"] = appliance.TLSPostDigest()
	_, trust, err := image.TrustAnchors([]image.TrustSource{{Name: image.DefaultTrustName, PEM: image.DefaultTrustPEM}})
	if err != nil {
		t.Fatal(err)
	}
	anchorsLine := fmt.Sprintf("tls: anchors=%d sha256=%s", len(trust.Anchors), trust.SHA256)
	checkedLine := fmt.Sprintf("tlstest: anchors checked=%d", len(trust.Anchors))
	for _, cpu := range cryptoCPUs {
		t.Run(cpu, func(t *testing.T) {
			res := cryptoSelfTest(t, cpu)
			// the default trust anchors are in the image, hashed as the
			// manifest says, and each one passes the kernel's reader
			for _, want := range []string{anchorsLine, checkedLine} {
				if !strings.Contains(res.Serial, want) {
					t.Errorf("no %q line on the console", want)
				}
			}
			for _, line := range strings.Split(res.Serial, "\n") {
				if strings.HasPrefix(line, "tlstest") {
					t.Logf("%s", strings.TrimSpace(line)) // figures for notes, never asserted
				}
				if strings.HasPrefix(line, "cryptotest FAIL tls") {
					t.Errorf("%s", strings.TrimSpace(line))
				}
			}
			wantSize := fmt.Sprintf("tlstest: TLS_CONN=%d bytes per connection", appliance.TLSKernelConnBytes)
			if !strings.Contains(res.Serial, wantSize) {
				t.Errorf("no %q line: the TLS_CONN layout changed (update appliance.TLSKernelConnBytes and docs/kernel.md) or the TLS self-test did not run", wantSize)
			}
			rep, err := appliance.ParseSelfTestReport(res.Serial)
			if err != nil {
				t.Fatal(err)
			}
			for _, name := range appliance.TLSDigestNames {
				got, ok := rep.Digests[name]
				if !ok {
					t.Errorf("no \"selftest digest %s\" line", name)
					continue
				}
				if got != want[name] {
					t.Errorf("digest %s (seed %d): kernel %016x, Go %016x", name, selfTestSeed, got, want[name])
					continue
				}
				t.Logf("digest %s: %016x, as Go", name, got)
			}
		})
	}
}
