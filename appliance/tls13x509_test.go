package appliance

import (
	"bytes"
	"crypto/x509"
	"encoding/asn1"
	"os"
	"path/filepath"
	"testing"
)

// TestX509CryptoX509 parses every certificate of testdata/x509 (real roots
// from Debian's ca-certificates and generated chains) with the reference
// and with crypto/x509 and wants the same fields: TBS, serial, issuer,
// subject, validity, SPKI, signature, extensions with criticality and
// values, dNSNames.
func TestX509CryptoX509(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(X509TestdataDir, "*.der"))
	if len(files) < 9 {
		t.Fatalf("%d certificates in %s", len(files), X509TestdataDir)
	}
	for _, f := range files {
		der, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		c, err := ParseX509(der)
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		g, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		eq := func(what string, a, b []byte) {
			if !bytes.Equal(a, b) {
				t.Errorf("%s: %s %x, crypto/x509 %x", f, what, a, b)
			}
		}
		eq("TBS", c.TBS, g.RawTBSCertificate)
		if got := c.Serial; !bytes.Equal(bytes.TrimLeft(got, "\x00"), g.SerialNumber.Bytes()) {
			t.Errorf("%s: serial %x, crypto/x509 %x", f, got, g.SerialNumber.Bytes())
		}
		eq("issuer", c.Issuer, g.RawIssuer)
		eq("subject", c.Subject, g.RawSubject)
		eq("SPKI", c.SPKI, g.RawSubjectPublicKeyInfo)
		eq("signature", c.Signature, g.Signature)
		if c.NotBefore != g.NotBefore.Unix() || c.NotAfter != g.NotAfter.Unix() {
			t.Errorf("%s: validity %d..%d, crypto/x509 %d..%d", f, c.NotBefore, c.NotAfter, g.NotBefore.Unix(), g.NotAfter.Unix())
		}
		if len(c.Extensions) != len(g.Extensions) {
			t.Fatalf("%s: %d extensions, crypto/x509 %d", f, len(c.Extensions), len(g.Extensions))
		}
		for i, x := range g.Extensions {
			oid, err := asn1.Marshal(x.Id)
			if err != nil {
				t.Fatal(err)
			}
			oid = oid[2:] // tag, short length
			eq("extension OID", c.Extensions[i].OID, oid)
			eq("extension value", c.Extensions[i].Value, x.Value)
			if c.Extensions[i].Critical != x.Critical {
				t.Errorf("%s: extension %v critical %v", f, x.Id, c.Extensions[i].Critical)
			}
		}
		if c.DNSCount != len(g.DNSNames) {
			t.Errorf("%s: %d dNSNames, crypto/x509 %d", f, c.DNSCount, len(g.DNSNames))
		}
		for i, n := range c.DNSNames {
			if string(n) != g.DNSNames[i] {
				t.Errorf("%s: dNSName %q, crypto/x509 %q", f, n, g.DNSNames[i])
			}
		}
	}
}

// TestX509Refusals: the hand-made cases' verdicts, each named.
func TestX509Refusals(t *testing.T) {
	want := []error{nil, nil, nil, nil, ErrX509Malformed, nil, ErrX509Version, ErrX509Version,
		ErrX509Malformed, ErrX509Malformed, ErrX509Version, ErrX509Malformed, ErrX509Malformed, ErrX509Malformed,
		nil, nil, ErrX509Malformed,
		ErrX509Malformed, nil, ErrX509Malformed, ErrX509Malformed, ErrX509Malformed, ErrX509Malformed,
		ErrX509Malformed, nil, nil, ErrX509Malformed, ErrX509Malformed, ErrX509Malformed,
		ErrX509Malformed, ErrX509Malformed, ErrX509Malformed, ErrX509Malformed, ErrX509Malformed,
		ErrX509Malformed, ErrX509DuplicateExtension, nil, ErrX509TooManyExtensions, ErrX509Malformed,
		ErrX509Malformed,
		nil, nil, nil, nil, ErrX509Time, ErrX509Time, ErrX509Time, ErrX509Time, ErrX509Time,
		ErrX509Time, ErrX509Time, ErrX509Time, ErrX509Time, ErrX509Time, ErrX509Time, ErrX509Time,
		ErrX509Time, ErrX509Time, ErrX509Time, ErrX509Malformed, ErrX509Malformed,
		ErrDERMalformed, ErrX509Malformed,
		ErrDERMalformed, ErrDERMalformed, ErrDERMalformed, ErrDERMalformed, ErrDERMalformed,
		ErrDERMalformed, ErrDERMalformed, ErrDERMalformed}
	cases := x509SynthCases()
	if len(cases) != len(want) {
		t.Fatalf("%d cases, %d verdicts", len(cases), len(want))
	}
	for i, b := range cases {
		c, err := ParseX509(b)
		if err != want[i] {
			t.Errorf("case %d: %v, want %v (%x)", i, err, want[i], b)
		}
		_, gerr := x509.ParseCertificate(b)
		if err == nil && gerr != nil {
			t.Logf("case %d: we accept, crypto/x509 says %v", i, gerr)
		}
		if i == 24 && (c.DNSCount != 20 || len(c.DNSNames) != X509MaxDNSNames) {
			t.Errorf("20 dNSNames: count %d, kept %d", c.DNSCount, len(c.DNSNames))
		}
	}
}

// TestX509Times: conversions at the edges.
func TestX509Times(t *testing.T) {
	for _, c := range []struct {
		s   string
		tag byte
		v   int64
	}{
		{"700101000000Z", tagUTCTime, 0},
		{"500101000000Z", tagUTCTime, -631152000},
		{"491231235959Z", tagUTCTime, 2524607999},
		{"20000229000000Z", tagGenTime, 951782400},
		{"99991231235959Z", tagGenTime, 253402300799},
	} {
		v, err := x509Time(derTLV{tag: c.tag, content: []byte(c.s)})
		if err != nil || v != c.v {
			t.Errorf("%s: %d %v, want %d", c.s, v, err, c.v)
		}
	}
}

// FuzzParseX509: no panic, every refusal named, the limits kept, and
// where crypto/x509 also accepts the input, the same fields.
func FuzzParseX509(f *testing.F) {
	entries, err := x509CorpusEntries(X509TestdataDir)
	if err != nil {
		f.Fatal(err)
	}
	for i, e := range entries {
		if i%7 == 0 {
			f.Add(e)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseX509(b)
		if X509ReasonIndex(err) < 0 {
			t.Fatalf("unnamed refusal %v", err)
		}
		if err != nil {
			return
		}
		if len(c.Extensions) > X509MaxExtensions || len(c.DNSNames) > X509MaxDNSNames {
			t.Fatalf("over the limits: %d, %d", len(c.Extensions), len(c.DNSNames))
		}
		g, gerr := x509.ParseCertificate(b)
		if gerr != nil {
			return // crypto/x509 checks more (keys, names, extension contents)
		}
		if !bytes.Equal(c.TBS, g.RawTBSCertificate) || !bytes.Equal(c.Issuer, g.RawIssuer) ||
			!bytes.Equal(c.Subject, g.RawSubject) || !bytes.Equal(c.SPKI, g.RawSubjectPublicKeyInfo) ||
			!bytes.Equal(c.Signature, g.Signature) || c.NotBefore != g.NotBefore.Unix() ||
			c.NotAfter != g.NotAfter.Unix() || len(c.Extensions) != len(g.Extensions) ||
			c.DNSCount != len(g.DNSNames) {
			t.Fatalf("both accept, fields differ from crypto/x509")
		}
		for i, x := range g.Extensions {
			if c.Extensions[i].Critical != x.Critical || !bytes.Equal(c.Extensions[i].Value, x.Value) {
				t.Fatalf("extension %v differs from crypto/x509", x.Id)
			}
		}
	})
}
