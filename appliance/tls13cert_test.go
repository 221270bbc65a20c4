package appliance

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// certMsg encodes a Certificate body: context, then each certificate
// with the given extensions bytes.
func certMsg(ctx []byte, certs [][]byte, ext []byte) []byte {
	var list []byte
	for _, c := range certs {
		list = append(list, byte(len(c)>>16), byte(len(c)>>8), byte(len(c)))
		list = append(list, c...)
		list = append(list, byte(len(ext)>>8), byte(len(ext)))
		list = append(list, ext...)
	}
	out := append([]byte{byte(len(ctx))}, ctx...)
	out = append(out, byte(len(list)>>16), byte(len(list)>>8), byte(len(list)))
	return append(out, list...)
}

func cvMsg(scheme int, sig []byte) []byte {
	return append([]byte{byte(scheme >> 8), byte(scheme), byte(len(sig) >> 8), byte(len(sig))}, sig...)
}

// tlsCertCases are the Certificate and CertificateVerify cases, each with
// the reason wanted; CertificateVerify signatures made with Go's crypto
// over TLSCertVerifyContent.
func tlsCertCases(t *testing.T) ([]TLSCertCase, []error, []string) {
	var cases []TLSCertCase
	var want []error
	var names []string
	add := func(name string, c TLSCertCase, err error) {
		cases, want, names = append(cases, c), append(want, err), append(names, name)
	}
	leaf := chainMake(t, "discord.test", leafTmpl(), chainEC(t, elliptic.P256()), nil).der
	other := chainMake(t, "other", leafTmpl(), chainEC(t, elliptic.P384()), nil).der
	add("one", TLSCertCase{Kind: 1, Body: certMsg(nil, [][]byte{leaf}, nil)}, nil)
	add("two", TLSCertCase{Kind: 1, Body: certMsg(nil, [][]byte{leaf, other}, nil)}, nil)
	add("eight", TLSCertCase{Kind: 1, Body: certMsg(nil, [][]byte{leaf, leaf, leaf, leaf, leaf, leaf, leaf, other}, nil)}, nil)
	add("nine", TLSCertCase{Kind: 1, Body: certMsg(nil, [][]byte{leaf, leaf, leaf, leaf, leaf, leaf, leaf, leaf, other}, nil)}, ErrChainTooLong)
	add("none", TLSCertCase{Kind: 1, Body: certMsg(nil, nil, nil)}, ErrCertificateRequired)
	add("context", TLSCertCase{Kind: 1, Body: certMsg([]byte{1}, [][]byte{leaf}, nil)}, ErrTLSIllegalParameter)
	add("extension", TLSCertCase{Kind: 1, Body: certMsg(nil, [][]byte{leaf}, []byte{0, 5, 0, 0})}, ErrTLSUnsupportedExtension)
	add("empty cert", TLSCertCase{Kind: 1, Body: certMsg(nil, [][]byte{{}}, nil)}, ErrTLSDecodeError)
	add("trailing", TLSCertCase{Kind: 1, Body: append(certMsg(nil, [][]byte{leaf}, nil), 0)}, ErrTLSDecodeError)
	add("empty body", TLSCertCase{Kind: 1, Body: nil}, ErrTLSDecodeError)

	var tr [32]byte
	copy(tr[:], bytes.Repeat([]byte{0x5a}, 32))
	sign := func(k crypto.Signer, h crypto.Hash, pss bool) []byte {
		c := TLSCertVerifyContent(tr[:])
		var d []byte
		if h == crypto.SHA256 {
			x := sha256.Sum256(c)
			d = x[:]
		} else {
			x := sha512.Sum384(c)
			d = x[:]
		}
		var opts crypto.SignerOpts = h
		if pss {
			opts = &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash, Hash: h}
		}
		s, err := k.Sign(rand.Reader, d, opts)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	k256, k384, krsa := chainEC(t, elliptic.P256()), chainEC(t, elliptic.P384()), chainRSA(t, 1)
	l256 := chainMake(t, "p256", leafTmpl(), k256, nil).der
	l384 := chainMake(t, "p384", leafTmpl(), k384, nil).der
	lrsa := chainMake(t, "rsa", leafTmpl(), krsa, nil).der
	cv := func(name string, leaf []byte, body []byte, err error) {
		add(name, TLSCertCase{Kind: 2, Leaf: leaf, Body: body, Transcript: tr}, err)
	}
	s256 := sign(k256, crypto.SHA256, false)
	cv("ecdsa p256", l256, cvMsg(TLSSigECDSAP256SHA256, s256), nil)
	cv("ecdsa p384", l384, cvMsg(TLSSigECDSAP384SHA384, sign(k384, crypto.SHA384, false)), nil)
	cv("pss sha256", lrsa, cvMsg(TLSSigRSAPSSSHA256, sign(krsa, crypto.SHA256, true)), nil)
	cv("pss sha384", lrsa, cvMsg(TLSSigRSAPSSSHA384, sign(krsa, crypto.SHA384, true)), nil)
	cv("p256 key, p384 scheme", l256, cvMsg(TLSSigECDSAP384SHA384, s256), ErrTLSIllegalParameter)
	cv("rsa key, ecdsa scheme", lrsa, cvMsg(TLSSigECDSAP256SHA256, s256), ErrTLSIllegalParameter)
	cv("pkcs1 scheme", lrsa, cvMsg(0x0401, sign(krsa, crypto.SHA256, false)), ErrTLSIllegalParameter)
	cv("other key", l384, cvMsg(TLSSigECDSAP256SHA256, s256), ErrTLSIllegalParameter)
	bad := append([]byte(nil), s256...)
	bad[len(bad)-1] ^= 1
	cv("bad signature", l256, cvMsg(TLSSigECDSAP256SHA256, bad), ErrBadSignature)
	cv("signature of another transcript", l256, cvMsg(TLSSigECDSAP256SHA256, sign(k256, crypto.SHA384, false)), ErrBadSignature)
	cv("trailing", l256, append(cvMsg(TLSSigECDSAP256SHA256, s256), 0), ErrTLSDecodeError)
	cv("short", l256, []byte{4, 3, 0}, ErrTLSDecodeError)
	return cases, want, names
}

// TestTLSCertMessages checks the Certificate and CertificateVerify cases:
// each verdict, and each accepted CertificateVerify also verifies with
// crypto/x509's key and Go's verifiers.
func TestTLSCertMessages(t *testing.T) {
	cases, want, names := tlsCertCases(t)
	for i, c := range cases {
		var err error
		if c.Kind == 1 {
			_, err = ParseTLSCertificate(c.Body)
		} else {
			leaf, perr := ParseX509(c.Leaf)
			if perr != nil {
				t.Fatal(perr)
			}
			_, err = CheckTLSCertVerify(c.Body, leaf, c.Transcript[:])
			if err == nil {
				g, _ := x509.ParseCertificate(c.Leaf)
				if k, ok := g.PublicKey.(*ecdsa.PublicKey); ok && c.Body[0] == 4 {
					d := sha256.Sum256(TLSCertVerifyContent(c.Transcript[:]))
					if !ecdsa.VerifyASN1(k, d[:], c.Body[4:]) {
						t.Errorf("%s: accepted, crypto/ecdsa refuses", names[i])
					}
				}
			}
		}
		if err != want[i] {
			t.Errorf("%s: %v, want %v", names[i], err, want[i])
		}
		if TLSCertReasonIndex(err) < 0 {
			t.Errorf("%s: %v has no number", names[i], err)
		}
	}
}

// TestTLSCertCorpus re-checks the committed cases (their names and
// reasons in cases.txt); DPXE_WRITE_TLSCERT=1 writes both first.
func TestTLSCertCorpus(t *testing.T) {
	txt := filepath.Join(filepath.Dir(TLSCertCorpusPath), "cases.txt")
	if os.Getenv("DPXE_WRITE_TLSCERT") == "1" {
		cases, want, names := tlsCertCases(t)
		var lines string
		for i := range cases {
			w := "ok"
			if want[i] != nil {
				w = want[i].Error()
			}
			lines += w + "\t" + names[i] + "\n"
		}
		if err := os.WriteFile(TLSCertCorpusPath, EncodeTLSCertCases(cases), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(txt, []byte(lines), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := os.ReadFile(TLSCertCorpusPath)
	if err != nil {
		t.Fatal(err)
	}
	cases, err := DecodeTLSCertCases(raw)
	if err != nil {
		t.Fatal(err)
	}
	names, err := os.ReadFile(txt)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(names)), "\n")
	if len(lines) != len(cases) {
		t.Fatalf("%d cases, %d lines", len(cases), len(lines))
	}
	for i, c := range cases {
		w, name, _ := strings.Cut(lines[i], "\t")
		var err error
		if c.Kind == 1 {
			_, err = ParseTLSCertificate(c.Body)
		} else {
			leaf, _ := ParseX509(c.Leaf)
			_, err = CheckTLSCertVerify(c.Body, leaf, c.Transcript[:])
		}
		got := "ok"
		if err != nil {
			got = err.Error()
		}
		if got != w {
			t.Errorf("%s: %s, cases.txt says %s", name, got, w)
		}
	}
	d, n, err := TLSCertDigest(TLSCertCorpusPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("tls13-cert digest %016x over %d cases", d, n)
}

// FuzzParseTLSCertificate: no panic, every refusal named, and what is
// accepted re-encodes to the same body.
func FuzzParseTLSCertificate(f *testing.F) {
	f.Add(certMsg(nil, [][]byte{{1, 2, 3}}, nil))
	f.Add(certMsg([]byte{1}, [][]byte{{1}}, []byte{0, 0}))
	f.Fuzz(func(t *testing.T, body []byte) {
		certs, err := ParseTLSCertificate(body)
		if err != nil {
			if TLSCertReasonIndex(err) < 0 {
				t.Fatalf("unnamed %v", err)
			}
			return
		}
		if !bytes.Equal(certMsg(nil, certs, nil), body) {
			t.Fatal("accepted body does not re-encode")
		}
	})
}
