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
		if g.BasicConstraintsValid != (c.Flags&X509BasicConstraints != 0) || g.IsCA != (c.Flags&X509CA != 0) {
			t.Errorf("%s: basicConstraints flags %x, crypto/x509 valid %v CA %v", f, c.Flags, g.BasicConstraintsValid, g.IsCA)
		}
		if gl := g.MaxPathLen; (g.MaxPathLenZero || gl > 0) != (c.PathLen >= 0) || (c.PathLen >= 0 && gl != c.PathLen) {
			t.Errorf("%s: pathLen %d, crypto/x509 %d", f, c.PathLen, gl)
		}
		var ku x509.KeyUsage // crypto/x509 numbers the bits from the first
		for i := 0; i < 9; i++ {
			if c.KeyUsage&(0x8000>>i) != 0 {
				ku |= 1 << i
			}
		}
		if ku != g.KeyUsage {
			t.Errorf("%s: keyUsage %04x, crypto/x509 %b", f, c.KeyUsage, g.KeyUsage)
		}
		serverAuth := false
		for _, u := range g.ExtKeyUsage {
			serverAuth = serverAuth || u == x509.ExtKeyUsageServerAuth
		}
		if serverAuth != (c.Flags&X509EKUServerAuth != 0) || (len(g.ExtKeyUsage)+len(g.UnknownExtKeyUsage) > 0) != (c.Flags&X509ExtKeyUsage != 0) {
			t.Errorf("%s: EKU flags %x, crypto/x509 %v", f, c.Flags, g.ExtKeyUsage)
		}
		if c.UnknownCritical != len(g.UnhandledCriticalExtensions) {
			t.Errorf("%s: %d unknown critical, crypto/x509 %d", f, c.UnknownCritical, len(g.UnhandledCriticalExtensions))
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

// TestX509ExtensionContents: basicConstraints, keyUsage, extendedKeyUsage
// and unknown critical extensions, verdicts and what they say.
func TestX509ExtensionContents(t *testing.T) {
	M := ErrX509Malformed
	D := ErrDERMalformed
	want := []struct {
		err                         error
		flags, path, ku, unknownCrt int
	}{
		{nil, X509BasicConstraints, -1, 0, 0}, {nil, X509BasicConstraints | X509CA, -1, 0, 0},
		{nil, X509BasicConstraints | X509CA, 0, 0, 0}, {nil, X509BasicConstraints, 127, 0, 0},
		{nil, X509BasicConstraints | X509CA, 255, 0, 0}, {M, 0, 0, 0, 0},
		{M, 0, 0, 0, 0}, {M, 0, 0, 0, 0},
		{M, 0, 0, 0, 0}, {M, 0, 0, 0, 0},
		{M, 0, 0, 0, 0}, {M, 0, 0, 0, 0},
		{M, 0, 0, 0, 0}, {M, 0, 0, 0, 0}, {D, 0, 0, 0, 0},
		{nil, X509KeyUsage, -1, 0x8000, 0}, {nil, X509KeyUsage, -1, 0x8680, 0}, {nil, X509KeyUsage, -1, 0x0600, 0},
		{M, 0, 0, 0, 0}, {M, 0, 0, 0, 0}, {M, 0, 0, 0, 0}, {M, 0, 0, 0, 0},
		{M, 0, 0, 0, 0},
		{nil, X509ExtKeyUsage | X509EKUServerAuth, -1, 0, 0},
		{nil, X509ExtKeyUsage | X509EKUAny, -1, 0, 0},
		{M, 0, 0, 0, 0}, {M, 0, 0, 0, 0}, {M, 0, 0, 0, 0},
		{M, 0, 0, 0, 0},
		{nil, 0, -1, 0, 2},
		{nil, 0, -1, 0, 2},
	}
	cases := x509SynthExtCases()
	if len(cases) != len(want) {
		t.Fatalf("%d cases, %d verdicts", len(cases), len(want))
	}
	for i, b := range cases {
		c, err := ParseX509(b)
		w := want[i]
		if err != w.err {
			t.Errorf("case %d: %v, want %v", i, err, w.err)
			continue
		}
		if err == nil && (c.Flags != w.flags || c.PathLen != w.path || c.KeyUsage != w.ku || c.UnknownCritical != w.unknownCrt) {
			t.Errorf("case %d: flags %x path %d ku %04x unknown %d", i, c.Flags, c.PathLen, c.KeyUsage, c.UnknownCritical)
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
