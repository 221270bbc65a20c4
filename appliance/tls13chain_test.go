package appliance

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// chainNow is the time every generated chain is checked at.
var chainNow = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)

var (
	chainRSAOnce sync.Once
	chainRSAKeys [2]*rsa.PrivateKey
)

func chainRSA(t *testing.T, i int) *rsa.PrivateKey {
	chainRSAOnce.Do(func() {
		for j := range chainRSAKeys {
			k, err := rsa.GenerateKey(rand.Reader, 2048)
			if err != nil {
				t.Fatal(err)
			}
			chainRSAKeys[j] = k
		}
	})
	return chainRSAKeys[i]
}

// chainCert is a generated certificate: its DER and private key.
type chainCert struct {
	der  []byte
	key  crypto.Signer
	cert *x509.Certificate
}

var chainSerial int64 = 1

// chainMake signs tmpl's certificate for key with parent (nil:
// self-signed); tmpl gets a fresh serial, a subject from name and, unless
// set, a validity around chainNow.
func chainMake(t *testing.T, name string, tmpl *x509.Certificate, key crypto.Signer, parent *chainCert) *chainCert {
	t.Helper()
	chainSerial++
	tmpl.SerialNumber = big.NewInt(chainSerial)
	tmpl.Subject = pkix.Name{CommonName: name}
	if tmpl.NotBefore.IsZero() {
		tmpl.NotBefore = chainNow.Add(-24 * time.Hour)
	}
	if tmpl.NotAfter.IsZero() {
		tmpl.NotAfter = chainNow.Add(90 * 24 * time.Hour)
	}
	signer, ptmpl := key, tmpl
	if parent != nil {
		signer, ptmpl = parent.key, parent.cert
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ptmpl, key.Public(), signer)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &chainCert{der: der, key: key, cert: c}
}

func chainEC(t *testing.T, curve elliptic.Curve) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(curve, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func caTmpl(pathLen int) *x509.Certificate {
	t := &x509.Certificate{BasicConstraintsValid: true, IsCA: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign, MaxPathLen: pathLen}
	if pathLen == 0 {
		t.MaxPathLenZero = true
	}
	return t
}

func leafTmpl() *x509.Certificate {
	return &x509.Certificate{
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"discord.test", "*.discord.test"},
		IPAddresses: []net.IP{net.ParseIP("10.0.0.1"), net.ParseIP("fd00::1")},
	}
}

// chainCase is one chain check: the list (leaf first), anchors, host, the
// reference's expected reason, and whether crypto/x509 differs on purpose.
type chainCase struct {
	name    string
	list    []*chainCert
	anchors []*chainCert
	host    string
	want    error
	differs string // why crypto/x509 decides otherwise, "" when it agrees
}

func chainCases(t *testing.T) []chainCase {
	p256, p384 := elliptic.P256(), elliptic.P384()
	// Discord's shape: P-256 leaf <- P-256 intermediate (ecdsa-with-SHA384) <- P-384 root
	root := chainMake(t, "dpxe test root P-384", caTmpl(-1), chainEC(t, p384), nil)
	intT := caTmpl(0)
	intT.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	intT.SignatureAlgorithm = x509.ECDSAWithSHA384
	inter := chainMake(t, "dpxe test WE1", intT, chainEC(t, p256), root)
	leaf := chainMake(t, "discord.test", leafTmpl(), chainEC(t, p256), inter)
	other := chainMake(t, "dpxe other root", caTmpl(-1), chainEC(t, p384), nil)

	withLeaf := func(name string, edit func(*x509.Certificate), key crypto.Signer) *chainCert {
		tm := leafTmpl()
		edit(tm)
		if key == nil {
			key = chainEC(t, p256)
		}
		return chainMake(t, name, tm, key, inter)
	}
	withInter := func(name string, tm *x509.Certificate) *chainCert {
		return chainMake(t, name, tm, chainEC(t, p256), root)
	}
	badSig := *leaf
	badSig.der = append([]byte(nil), leaf.der...)
	badSig.der[len(badSig.der)-3] ^= 1

	expiredInt := caTmpl(0)
	expiredInt.NotBefore, expiredInt.NotAfter = chainNow.Add(-48*time.Hour), chainNow.Add(-time.Hour)
	ie := withInter("expired intermediate", expiredInt)
	notCA := &x509.Certificate{BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	inc := withInter("not a CA", notCA)
	clientOnly := caTmpl(-1)
	clientOnly.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	ico := withInter("client-only intermediate", clientOnly)
	noCertSign := caTmpl(-1)
	noCertSign.KeyUsage = x509.KeyUsageDigitalSignature
	incs := withInter("no keyCertSign", noCertSign)
	nc := caTmpl(-1)
	nc.PermittedDNSDomains = []string{"discord.test"}
	inc2 := withInter("name-constrained", nc)
	rootPL0 := chainMake(t, "root pathLen 0", caTmpl(0), chainEC(t, p384), nil)
	interPL0 := chainMake(t, "int under pathLen 0", caTmpl(-1), chainEC(t, p256), rootPL0)
	expiredRoot := caTmpl(-1)
	expiredRoot.NotBefore, expiredRoot.NotAfter = chainNow.Add(-48*time.Hour), chainNow.Add(-time.Hour)
	rootExp := chainMake(t, "expired root", expiredRoot, chainEC(t, p384), nil)
	intUnderExp := chainMake(t, "int under expired root", caTmpl(-1), chainEC(t, p256), rootExp)

	// a ladder of intermediates: root <- i1 <- ... <- i5
	ladder := []*chainCert{root}
	for i := 0; i < 5; i++ {
		ladder = append(ladder, chainMake(t, "ladder "+string(rune('1'+i)), caTmpl(-1), chainEC(t, p256), ladder[len(ladder)-1]))
	}
	ladderList := func(n int) []*chainCert {
		l := []*chainCert{chainMake(t, "discord.test", leafTmpl(), chainEC(t, p256), ladder[n])}
		for i := n; i >= 1; i-- {
			l = append(l, ladder[i])
		}
		return l
	}

	// RSA-2048: root signs PKCS#1 v1.5 and PSS
	rsaRoot := chainMake(t, "dpxe RSA root", caTmpl(-1), chainRSA(t, 0), nil)
	rsaLeaf := func(alg x509.SignatureAlgorithm) *chainCert {
		tm := leafTmpl()
		tm.SignatureAlgorithm = alg
		return chainMake(t, "discord.test", tm, chainRSA(t, 1), rsaRoot)
	}
	// ECDSA leaf under an RSA intermediate under the P-384 root
	rsaInter := chainMake(t, "RSA intermediate", caTmpl(-1), chainRSA(t, 1), root)
	ecUnderRSA := chainMake(t, "discord.test", leafTmpl(), chainEC(t, p256), rsaInter)
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)

	unknownCrit := withLeaf("unknown critical", func(tm *x509.Certificate) {
		tm.ExtraExtensions = []pkix.Extension{{Id: asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 99999, 1}, Critical: true, Value: []byte{5, 0}}}
	}, nil)
	sub := chainMake(t, "sub", caTmpl(-1), chainEC(t, p256), inter)
	a := []*chainCert{root}
	return []chainCase{
		{"good", []*chainCert{leaf, inter}, a, "gateway.discord.test", nil, ""},
		{"good apex", []*chainCert{leaf, inter}, a, "discord.test", nil, ""},
		{"good upper case", []*chainCert{leaf, inter}, a, "GATEWAY.Discord.TEST", nil, ""},
		{"good trailing dot", []*chainCert{leaf, inter}, a, "gateway.discord.test.", nil, ""},
		{"good IPv4", []*chainCert{leaf, inter}, a, "10.0.0.1", nil, ""},
		{"IPv6", []*chainCert{leaf, inter}, a, "fd00::1", ErrNameMismatch, "the kernel has no IPv6"},
		{"good with root and stranger listed", []*chainCert{leaf, other, root, inter}, a, "discord.test", nil, ""},
		{"good among anchors", []*chainCert{leaf, inter}, []*chainCert{other, root}, "discord.test", nil, ""},
		{"wildcard one label only", []*chainCert{leaf, inter}, a, "a.b.discord.test", ErrNameMismatch, ""},
		{"wrong name", []*chainCert{leaf, inter}, a, "discord.example", ErrNameMismatch, ""},
		{"suffix is not a match", []*chainCert{leaf, inter}, a, "xdiscord.test", ErrNameMismatch, ""},
		{"wrong IP", []*chainCert{leaf, inter}, a, "10.0.0.2", ErrNameMismatch, ""},
		{"IP is not a DNS name", []*chainCert{withLeaf("dns only", func(tm *x509.Certificate) { tm.DNSNames = []string{"10.0.0.1"}; tm.IPAddresses = nil }, nil), inter}, a, "10.0.0.1", ErrNameMismatch, ""},
		{"no CN fallback", []*chainCert{withLeaf("discord.test", func(tm *x509.Certificate) { tm.DNSNames, tm.IPAddresses = nil, nil }, nil), inter}, a, "discord.test", ErrNameMismatch, ""},
		{"expired leaf", []*chainCert{withLeaf("old", func(tm *x509.Certificate) { tm.NotAfter = chainNow.Add(-time.Second) }, nil), inter}, a, "discord.test", ErrCertificateExpired, ""},
		{"leaf not yet valid", []*chainCert{withLeaf("early", func(tm *x509.Certificate) { tm.NotBefore = chainNow.Add(time.Hour) }, nil), inter}, a, "discord.test", ErrCertificateNotYetValid, ""},
		{"expired intermediate", []*chainCert{chainMake(t, "discord.test", leafTmpl(), chainEC(t, p256), ie), ie}, a, "discord.test", ErrCertificateExpired, ""},
		{"expired root", []*chainCert{chainMake(t, "discord.test", leafTmpl(), chainEC(t, p256), intUnderExp), intUnderExp}, []*chainCert{rootExp}, "discord.test", ErrCertificateExpired, ""},
		{"unknown root", []*chainCert{leaf, inter}, []*chainCert{other}, "discord.test", ErrUnknownCA, ""},
		{"missing intermediate", []*chainCert{leaf}, a, "discord.test", ErrUnknownCA, ""},
		{"bad signature", []*chainCert{&badSig, inter}, a, "discord.test", ErrBadSignature, ""},
		{"empty list", nil, a, "discord.test", ErrCertificateRequired, ""},
		{"intermediate not a CA", []*chainCert{chainMake(t, "discord.test", leafTmpl(), chainEC(t, p256), inc), inc}, a, "discord.test", ErrNotCA, ""},
		{"root pathLen 0 over one intermediate", []*chainCert{chainMake(t, "discord.test", leafTmpl(), chainEC(t, p256), interPL0), interPL0}, []*chainCert{rootPL0}, "discord.test", ErrPathLen, ""},
		{"intermediate pathLen 0 over another", []*chainCert{chainMake(t, "discord.test", leafTmpl(), chainEC(t, p256), sub), sub, inter}, a, "discord.test", ErrPathLen, ""},
		{"leaf EKU clientAuth only", []*chainCert{withLeaf("client", func(tm *x509.Certificate) { tm.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth} }, nil), inter}, a, "discord.test", ErrEKU, ""},
		{"intermediate EKU clientAuth only", []*chainCert{chainMake(t, "discord.test", leafTmpl(), chainEC(t, p256), ico), ico}, a, "discord.test", ErrEKU, ""},
		{"leaf unknown critical extension", []*chainCert{unknownCrit, inter}, a, "discord.test", ErrUnsupportedExtension, ""},
		{"leaf keyUsage without digitalSignature", []*chainCert{withLeaf("ke", func(tm *x509.Certificate) { tm.KeyUsage = x509.KeyUsageKeyEncipherment }, nil), inter}, a, "discord.test", ErrKeyUsage, "crypto/x509 does not check a leaf's keyUsage"},
		{"intermediate keyUsage without keyCertSign", []*chainCert{chainMake(t, "discord.test", leafTmpl(), chainEC(t, p256), incs), incs}, a, "discord.test", ErrKeyUsage, ""},
		{"name constraints", []*chainCert{chainMake(t, "discord.test", leafTmpl(), chainEC(t, p256), inc2), inc2}, a, "discord.test", ErrNameConstraints, "crypto/x509 enforces name constraints; the kernel refuses them"},
		{"four intermediates", ladderList(4), a, "discord.test", nil, ""},
		{"five intermediates", ladderList(5), a, "discord.test", ErrChainTooLong, "crypto/x509 has no depth limit"},
		{"RSA PKCS#1 SHA-256", []*chainCert{rsaLeaf(x509.SHA256WithRSA)}, []*chainCert{rsaRoot}, "discord.test", nil, ""},
		{"RSA PKCS#1 SHA-384", []*chainCert{rsaLeaf(x509.SHA384WithRSA)}, []*chainCert{rsaRoot}, "discord.test", nil, ""},
		{"RSA PSS SHA-256", []*chainCert{rsaLeaf(x509.SHA256WithRSAPSS)}, []*chainCert{rsaRoot}, "discord.test", nil, ""},
		{"RSA PSS SHA-384", []*chainCert{rsaLeaf(x509.SHA384WithRSAPSS)}, []*chainCert{rsaRoot}, "discord.test", nil, ""},
		{"RSA PKCS#1 SHA-512", []*chainCert{rsaLeaf(x509.SHA512WithRSA)}, []*chainCert{rsaRoot}, "discord.test", ErrUnsupportedAlgorithm, "the kernel takes SHA-256 and SHA-384 only"},
		{"ECDSA leaf under RSA intermediate", []*chainCert{ecUnderRSA, rsaInter}, a, "discord.test", nil, ""},
		{"Ed25519 leaf", []*chainCert{withLeaf("ed", func(*x509.Certificate) {}, edKey), inter}, a, "discord.test", ErrUnsupportedAlgorithm, "the kernel has no Ed25519"},
	}
}

func chainDERs(l []*chainCert) [][]byte {
	var out [][]byte
	for _, c := range l {
		if c != nil {
			out = append(out, c.der)
		}
	}
	return out
}

// TestX509ChainCryptoX509 checks generated chains (Discord's shape, RSA,
// and one per refusal) with the reference and with crypto/x509's Verify
// (serverAuth, the same anchors, time and host): each refusal has its
// reason, and crypto/x509 agrees on accept/refuse except where the case
// says why not.
func TestX509ChainCryptoX509(t *testing.T) {
	for _, tc := range chainCases(t) {
		list := chainDERs(tc.list)
		_, err := X509VerifyChain(list, chainDERs(tc.anchors), tc.host, chainNow.Unix())
		if err != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		if X509ChainReasonIndex(err) < 0 {
			t.Errorf("%s: %v has no number", tc.name, err)
		}
		goErr := goVerify(list, chainDERs(tc.anchors), tc.host)
		agree := (goErr == nil) == (err == nil)
		switch {
		case tc.differs == "" && !agree:
			t.Errorf("%s: reference %v, crypto/x509 %v", tc.name, err, goErr)
		case tc.differs != "" && agree:
			t.Errorf("%s: expected crypto/x509 to differ (%s), both said %v / %v", tc.name, tc.differs, err, goErr)
		}
	}
}

func goVerify(list, anchors [][]byte, host string) error {
	if len(list) == 0 {
		return ErrCertificateRequired
	}
	roots, inters := x509.NewCertPool(), x509.NewCertPool()
	for _, a := range anchors {
		c, err := x509.ParseCertificate(a)
		if err != nil {
			return err
		}
		roots.AddCert(c)
	}
	for _, d := range list[1:] {
		c, err := x509.ParseCertificate(d)
		if err != nil {
			return err
		}
		inters.AddCert(c)
	}
	leaf, err := x509.ParseCertificate(list[0])
	if err != nil {
		return err
	}
	_, err = leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: roots, Intermediates: inters,
		CurrentTime: chainNow, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	return err
}

// TestX509ChainCommitted checks the committed Discord-shaped chain of
// testdata/x509 (whose keys are gone): accepted for its names in its
// lifetime, refused with the named reason otherwise.
func TestX509ChainCommitted(t *testing.T) {
	read := func(n string) []byte {
		b, err := os.ReadFile(filepath.Join(X509TestdataDir, n))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	leaf, inter, root := read("test-leaf-p256.der"), read("test-int-p256.der"), read("test-root-p384.der")
	gts := read("GTS_Root_R4.der")
	now := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC).Unix()
	for _, tc := range []struct {
		list, anchors [][]byte
		host          string
		now           int64
		want          error
	}{
		{[][]byte{leaf, inter}, [][]byte{root}, "gateway.discord.test", now, nil},
		{[][]byte{leaf, inter}, [][]byte{gts, root}, "10.0.2.2", now, nil},
		{[][]byte{leaf, inter}, [][]byte{root}, "ops@discord.test", now, ErrNameMismatch},
		{[][]byte{leaf, inter}, [][]byte{root}, "discord.test", time.Date(2026, 6, 3, 0, 0, 0, 0, time.UTC).Unix(), ErrCertificateExpired},
		{[][]byte{leaf, inter}, [][]byte{root}, "discord.test", time.Date(2026, 3, 4, 5, 6, 6, 0, time.UTC).Unix(), ErrCertificateNotYetValid},
		{[][]byte{leaf, inter}, [][]byte{gts}, "discord.test", now, ErrUnknownCA},
		{[][]byte{leaf}, [][]byte{root}, "discord.test", now, ErrUnknownCA},
		{[][]byte{leaf, inter, inter, inter, inter, inter, inter, inter, inter}, [][]byte{root}, "discord.test", now, ErrChainTooLong},
		{[][]byte{leaf[:len(leaf)-1], inter}, [][]byte{root}, "discord.test", now, ErrDERMalformed},
	} {
		if _, err := X509VerifyChain(tc.list, tc.anchors, tc.host, tc.now); err != tc.want {
			t.Errorf("%s at %d: %v, want %v", tc.host, tc.now, err, tc.want)
		}
	}
}

// TestX509MatchName is the name rule on its own.
func TestX509MatchName(t *testing.T) {
	for _, tc := range []struct {
		pattern, host string
		want          bool
	}{
		{"discord.test", "discord.test", true},
		{"Discord.TEST", "discord.test", true},
		{"*.discord.test", "gateway.discord.test", true},
		{"*.discord.test", "discord.test", false},
		{"*.discord.test", "a.b.discord.test", false},
		{"*.test", "discord.test", false}, // a wildcard needs two more labels
		{"g*.discord.test", "gateway.discord.test", false},
		{"gateway.*.test", "gateway.discord.test", false},
		{"**.discord.test", "gateway.discord.test", false},
		{"discord.test.", "discord.test", false},
		{"discord.test", "discord.test.", true},
		{"discord..test", "discord..test", false},
		{"", "", false},
		{"x.discord.test", "X.DISCORD.TEST", true},
		{"\xc4\xb0.test", "i.test", false}, // ASCII folding only
		{"*.discord.test", "*.discord.test", false},
		{".discord.test", "x.discord.test", false},
	} {
		if got := X509MatchName([]byte(tc.pattern), tc.host); got != tc.want {
			t.Errorf("%q vs %q: %v", tc.pattern, tc.host, got)
		}
	}
}

// FuzzX509VerifyChain feeds any leaf and intermediate bytes and host under
// the committed root: never a panic, and an accepted chain is one
// crypto/x509 also parses.
func FuzzX509VerifyChain(f *testing.F) {
	read := func(n string) []byte {
		b, err := os.ReadFile(filepath.Join(X509TestdataDir, n))
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	leaf, inter, root := read("test-leaf-p256.der"), read("test-int-p256.der"), read("test-root-p384.der")
	f.Add(leaf, inter, "gateway.discord.test")
	f.Add(leaf, inter, "10.0.2.2")
	f.Add(read("test-rsa2048-20san.der"), inter, "shard7.gateway.test")
	now := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC).Unix()
	f.Fuzz(func(t *testing.T, l, i []byte, host string) {
		p, err := X509VerifyChain([][]byte{l, i}, [][]byte{root}, host, now)
		if err != nil {
			if X509ChainReasonIndex(err) < 0 {
				t.Fatalf("unnamed refusal %v", err)
			}
			return
		}
		for _, k := range p.Listed {
			if _, err := x509.ParseCertificate([][]byte{l, i}[k]); err != nil {
				t.Fatalf("accepted, crypto/x509: %v", err)
			}
		}
	})
}

// TestX509ChainCorpus re-checks the committed cases file: each case's
// reason is the one cases.txt records (what chainCases expected when the
// file was written), and the digest's corpus decodes. With
// DPXE_WRITE_X509CHAIN=1 it first writes both files from chainCases and
// the committed Discord-shaped chain (fresh keys, then discarded).
func TestX509ChainCorpus(t *testing.T) {
	txt := filepath.Join(filepath.Dir(X509ChainCorpusPath), "cases.txt")
	if os.Getenv("DPXE_WRITE_X509CHAIN") == "1" {
		var cases []X509ChainCase
		var lines string
		for _, tc := range chainCases(t) {
			cases = append(cases, X509ChainCase{Now: chainNow.Unix(), Host: tc.host, List: chainDERs(tc.list), Anchors: chainDERs(tc.anchors)})
			want := "ok"
			if tc.want != nil {
				want = tc.want.Error()
			}
			lines += want + "\t" + tc.name + "\n"
		}
		if err := os.WriteFile(X509ChainCorpusPath, EncodeX509ChainCases(cases), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(txt, []byte(lines), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := os.ReadFile(X509ChainCorpusPath)
	if err != nil {
		t.Fatal(err)
	}
	cases, err := DecodeX509ChainCases(raw)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(EncodeX509ChainCases(cases), raw) {
		t.Fatal("cases file does not re-encode to itself")
	}
	names, err := os.ReadFile(txt)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(names)), "\n")
	if len(lines) != len(cases) {
		t.Fatalf("%d cases, %d lines in cases.txt", len(cases), len(lines))
	}
	for i, c := range cases {
		want, name, _ := strings.Cut(lines[i], "\t")
		_, err := X509VerifyChain(c.List, c.Anchors, c.Host, c.Now)
		got := "ok"
		if err != nil {
			got = err.Error()
		}
		if got != want {
			t.Errorf("%s: %s, cases.txt says %s", name, got, want)
		}
	}
	d, n, err := X509ChainDigest(X509ChainCorpusPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("x509chain digest %016x over %d cases", d, n)
}

// TestX509IPv4 is the IP literal rule.
func TestX509IPv4(t *testing.T) {
	for _, tc := range []struct {
		host string
		ok   bool
	}{
		{"10.0.0.1", true}, {"0.0.0.0", true}, {"255.255.255.255", true},
		{"256.0.0.1", false}, {"010.0.0.1", false}, {"1.2.3", false}, {"1.2.3.4.5", false},
		{"1..2.3", false}, {"1.2.3.4.", false}, {"a.b.c.d", false}, {"", false}, {"1000.1.1.1", false},
	} {
		ip, ok := x509IPv4(tc.host)
		if ok != tc.ok {
			t.Errorf("%q: %v", tc.host, ok)
		}
		if ok && net.IP(ip[:]).String() != tc.host {
			t.Errorf("%q: %v", tc.host, ip)
		}
	}
}
