package appliance

import (
	"bytes"
	"crypto/ecdh"
	"encoding/asn1"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math/big"
	"reflect"
	"strings"
	"testing"
	"testing/cryptotest"
)

func mustHex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The references the digests rely on give RFC 7748 §6.1's answer: the Go
// side of the comparison is the standard library, not a copy of the kernel.
func TestCryptoAsymReferenceRFC7748(t *testing.T) {
	alice, err := ecdh.X25519().NewPrivateKey(mustHex(t, "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a"))
	if err != nil {
		t.Fatal(err)
	}
	bob, err := ecdh.X25519().NewPublicKey(mustHex(t, "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f"))
	if err != nil {
		t.Fatal(err)
	}
	shared, err := alice.ECDH(bob)
	if err != nil {
		t.Fatal(err)
	}
	if want := mustHex(t, "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742"); !bytes.Equal(shared, want) {
		t.Fatalf("X25519 shared %x, want %x", shared, want)
	}
}

func TestCryptoAsymDigestsStable(t *testing.T) {
	a, b := CryptoAsymDigests(1), CryptoAsymDigests(1)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("digests of seed 1 differ between runs: %v, %v", a, b)
	}
	c := CryptoAsymDigests(2)
	for _, name := range AsymDigestNames {
		if _, ok := a[name]; !ok {
			t.Errorf("no digest %s", name)
		}
		if a[name] == c[name] {
			t.Errorf("digest %s is the same for seeds 1 and 2", name)
		}
	}
}

// Every kind of generated key-exchange case occurs with the outcome its
// kind should have, so the digests cover the kernel's refusal paths.
func TestCryptoAsymCaseKinds(t *testing.T) {
	seen := map[string]int{}
	note := func(what string) { seen[what]++ }
	for seed := uint32(0); seed < 16; seed++ {
		rng := &splitmix64{state: uint64(seed)}
		d := newDigest()
		for i := 0; i < AsymX25519Cases; i++ {
			x25519Case(rng, &d, note)
		}
		rng = &splitmix64{state: uint64(seed)}
		for i := 0; i < AsymP256Cases; i++ {
			p256ECDHCase(rng, &d, note)
		}
	}
	for _, want := range []string{"u kind 0: ok", "u kind 1: zero", "u kind 1: ok", "u kind 2: zero", "u kind 2: ok", "u kind 3: ok",
		"peer kind 0: ok", "peer kind 1: refused", "peer kind 2: refused", "peer kind 3: ok"} {
		if seen[want] == 0 {
			t.Errorf("no case %q in 16 seeds", want)
		}
	}
	for _, never := range []string{"u kind 0: zero", "peer kind 0: refused", "peer kind 3: refused"} {
		if seen[never] != 0 {
			t.Errorf("%d cases %q", seen[never], never)
		}
	}
	t.Logf("%v", seen)
}

func TestEncodeAsymSection(t *testing.T) {
	b, err := EncodeAsymSection([]AsymRecord{{ID: 7, Fields: [][]byte{{1, 2}, {}}}, {ID: 9, Fields: [][]byte{{3}}}})
	if err != nil {
		t.Fatal(err)
	}
	want := []byte{2, 0, 0, 0, 7, 0, 0, 0, 2, 0, 1, 2, 0, 0, 9, 0, 0, 0, 1, 0, 3}
	if !bytes.Equal(b, want) {
		t.Fatalf("section % x, want % x", b, want)
	}
	if _, err := EncodeAsymSection([]AsymRecord{{Fields: [][]byte{make([]byte, 0x10000)}}}); err == nil {
		t.Error("a 65536-byte field was encoded")
	}
	if _, err := EncodeAsymSection(make([]AsymRecord, AsymMaxRecords+1)); err == nil {
		t.Error("more records than the kernel takes were encoded")
	}
}

func TestParseAsymReport(t *testing.T) {
	serial := "cryptotest asym vectors WPX25519 cases=3 results=a4x\r\n" +
		"cryptotest asym cycles WPX25519 ops=1 per_op=1234\n" +
		"cryptotest asym time vectors ms=12\n" +
		"cryptotest asym vectors EMPTY000 cases=0 results=\n" +
		"cryptotest FAIL asym something\n"
	rep, err := ParseAsymReport(serial)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Results["WPX25519"] != "a4x" || rep.Cycles["WPX25519"] != (AsymCycles{1, 1234}) || rep.Times["vectors"] != 12 {
		t.Fatalf("report %+v", rep)
	}
	if r, ok := rep.Results["EMPTY000"]; !ok || r != "" {
		t.Fatalf("empty section: %q %v", r, ok)
	}
	for _, bad := range []string{
		"cryptotest asym vectors T cases=2 results=a\n",
		"cryptotest asym vectors T count=1 results=a\n",
		"cryptotest asym cycles T ops=x per_op=1\n",
	} {
		if _, err := ParseAsymReport(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestParseECDSASignatureDER(t *testing.T) {
	long := append([]byte{0x30, 0x81, 0x86, 0x02, 0x41, 0x00}, bytes.Repeat([]byte{0x80}, 64)...)
	long = append(long, append([]byte{0x02, 0x41, 0x00}, bytes.Repeat([]byte{0x81}, 64)...)...)
	for _, tc := range []struct {
		name string
		der  string
		r, s string
		err  error
	}{
		{"minimal", "3006020101020102", "01", "02", nil},
		{"sign bytes", "3008020200ff020200fe", "ff", "fe", nil},
		{"zero", "3006020100020100", "00", "00", nil},
		{"not a sequence", "3106020101020102", "", "", ErrSigSequence},
		{"empty", "", "", "", ErrSigSequence},
		{"sequence too long", "3007020101020102", "", "", ErrSigOverrun},
		{"trailing after sequence", "300602010102010200", "", "", ErrSigTrailing},
		{"trailing inside", "3007020101020102ff", "", "", ErrSigTrailing},
		{"indefinite length", "3080020101020102", "", "", ErrSigLength},
		{"long form for a short length", "308106020101020102", "", "", ErrSigLength},
		{"3-byte length", "30830000060201010201 02", "", "", ErrSigLength},
		{"not an integer", "3006030101020102", "", "", ErrSigInteger},
		{"s missing", "3003020101", "", "", ErrSigInteger},
		{"empty integer", "30050200020102", "", "", ErrSigEmpty},
		{"negative r", "3006020180020102", "", "", ErrSigNegative},
		{"padded r", "300702020001020102", "", "", ErrSigPadding},
		{"integer past the end", "3006020501020102", "", "", ErrSigOverrun},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, s, err := ParseECDSASignatureDER(mustHex(t, strings.ReplaceAll(tc.der, " ", "")))
			if !errors.Is(err, tc.err) {
				t.Fatalf("error %v, want %v", err, tc.err)
			}
			if err == nil && (hex.EncodeToString(r) != tc.r || hex.EncodeToString(s) != tc.s) {
				t.Fatalf("r %x s %x, want %s %s", r, s, tc.r, tc.s)
			}
		})
	}
	r, s, err := ParseECDSASignatureDER(long)
	if err != nil || len(r) != 64 || len(s) != 64 || r[0] != 0x80 || s[0] != 0x81 {
		t.Fatalf("long-form signature: r %x s %x err %v", r, s, err)
	}
}

// ecdsaSigASN1 is Ecdsa-Sig-Value for encoding/asn1.
type ecdsaSigASN1 struct{ R, S *big.Int }

// FuzzParseECDSASignatureDER checks the strict parser against encoding/asn1:
// what it accepts, asn1 decodes to the same non-negative r and s and
// re-encodes to the same bytes (so it was DER); what asn1 decodes to
// non-negative values and re-encodes to the input, it accepts.
func FuzzParseECDSASignatureDER(f *testing.F) {
	for _, s := range []string{"3006020101020102", "3008020200ff020200fe", "3080020101020102", "300702020001020102", "3006020180020102"} {
		b, _ := hex.DecodeString(s)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, der []byte) {
		r, s, err := ParseECDSASignatureDER(der)
		var v ecdsaSigASN1
		rest, aerr := asn1.Unmarshal(der, &v)
		canonical := aerr == nil && len(rest) == 0 && v.R.Sign() >= 0 && v.S.Sign() >= 0
		if canonical {
			re, merr := asn1.Marshal(v)
			canonical = merr == nil && bytes.Equal(re, der)
		}
		if err == nil {
			if !canonical {
				t.Fatalf("% x accepted, but it is not canonical DER of two non-negative integers", der)
			}
			if new(big.Int).SetBytes(r).Cmp(v.R) != 0 || new(big.Int).SetBytes(s).Cmp(v.S) != 0 {
				t.Fatalf("% x: r %x s %x, asn1 says %x %x", der, r, s, v.R, v.S)
			}
		} else if canonical {
			t.Fatalf("% x refused (%v), but it is DER of r %x s %x", der, err, v.R, v.S)
		}
	})
}

func TestAsymSigCases(t *testing.T) {
	cryptotest.SetGlobalRandom(t, 1) // PSS salts come from crypto/rand
	a, err := AsymSigCases(5)
	if err != nil {
		t.Fatal(err)
	}
	cryptotest.SetGlobalRandom(t, 1)
	b, err := AsymSigCases(5)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Error("AsymSigCases(5) differs between calls")
	}
	for name, cases := range map[string][]AsymSigCase{"ecdsa-p256": a.ECDSAP256, "ecdsa-p384": a.ECDSAP384, "rsa-pkcs1": a.RSAPKCS1, "rsa-pss": a.RSAPSS} {
		valid, invalid := 0, 0
		whats := map[string]bool{}
		for _, c := range cases {
			if c.Valid {
				valid++
			} else {
				invalid++
			}
			whats[c.What] = true
			want := map[string]int{"rsa-pkcs1": 5, "rsa-pss": 6}[name]
			if want == 0 {
				want = 4
			}
			if len(c.Record.Fields) != want {
				t.Fatalf("%s case %d has %d fields, want %d", name, c.Record.ID, len(c.Record.Fields), want)
			}
		}
		if valid == 0 || invalid == 0 {
			t.Errorf("%s: %d valid and %d invalid cases: both verdicts must occur", name, valid, invalid)
		}
		if len(whats) < 4 {
			t.Errorf("%s: only %d ways of making a case: %v", name, len(whats), whats)
		}
		t.Logf("%s: %d valid, %d invalid, %d kinds", name, valid, invalid, len(whats))
	}
	// an unchanged signature is valid; a flipped hash bit is not
	for _, c := range a.ECDSAP256 {
		if c.What == "as signed" && !c.Valid || c.What == "hash bit flipped" && c.Valid || c.What == "s replaced by n - s" && !c.Valid {
			t.Errorf("ecdsa-p256 case %d (%s): valid %v", c.Record.ID, c.What, c.Valid)
		}
	}
	for _, c := range append(a.RSAPKCS1, a.RSAPSS...) {
		e := binary.LittleEndian.Uint64(c.Record.Fields[1])
		if e != 65537 || len(c.Record.Fields[2])*8 < 2048 {
			t.Errorf("rsa case %d: e %d, modulus %d bytes", c.Record.ID, e, len(c.Record.Fields[2]))
		}
		if strings.HasPrefix(c.What, "as signed") != c.Valid {
			t.Errorf("rsa case %d (%s): valid %v", c.Record.ID, c.What, c.Valid)
		}
	}
	if AsymVerdictDigest(a.RSAPKCS1) == AsymVerdictDigest(a.ECDSAP256) {
		t.Error("two sections with different verdicts share a digest")
	}
}

func TestAsymResultsDigest(t *testing.T) {
	cases := []AsymSigCase{{Valid: true}, {Valid: false}, {Valid: true}}
	if AsymResultsDigest("a5a") != AsymVerdictDigest(cases) {
		t.Error("a results string and the same verdicts fold differently")
	}
	if AsymResultsDigest("a2a") != AsymResultsDigest("a5a") {
		t.Error("the refusal reason must not change the verdict digest")
	}
}

func TestAsymPrimeAndKey(t *testing.T) {
	rng := &splitmix64{state: 3}
	p := asymPrime(rng, 512)
	if p.BitLen() != 512 || !p.ProbablyPrime(20) {
		t.Fatalf("asymPrime(512) = %x", p)
	}
	if p := asymPrime(rng, 333); p.BitLen() != 333 || p.Bit(331) != 1 || !p.ProbablyPrime(20) {
		t.Fatalf("asymPrime(333) = %x", p)
	}
	for _, bits := range []int{2048, 2049} {
		k, err := asymRSAKey(&splitmix64{state: 4}, bits)
		if err != nil {
			t.Fatal(err)
		}
		if k.N.BitLen() != bits || k.E != 65537 {
			t.Fatalf("key of %d bits, e %d; want %d bits", k.N.BitLen(), k.E, bits)
		}
	}
}
