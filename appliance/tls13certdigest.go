package appliance

import (
	"os"
)

// The kernel's Certificate / CertificateVerify self-test ("tls13-cert",
// kernel/selftest/tls_selftest.inc) over the 'TLSCERT ' section: the
// committed cases of testdata/tlscert and damaged copies.

// TLSCertCorpusPath is the committed cases file (from this package's directory).
const TLSCertCorpusPath = "testdata/tlscert/cases.bin"

// TLSCertCase is a Certificate body (Kind 1) or a CertificateVerify body
// with the leaf and the 32-byte transcript hash (Kind 2).
type TLSCertCase struct {
	Kind       byte
	Body       []byte
	Leaf       []byte
	Transcript [32]byte
}

// TLSCertReasons numbers the refusals of both messages (0 is success).
var TLSCertReasons = []error{nil, ErrTLSDecodeError, ErrTLSIllegalParameter, ErrTLSUnsupportedExtension,
	ErrChainTooLong, ErrCertificateRequired, ErrBadSignature, ErrUnsupportedAlgorithm}

// TLSCertReasonIndex is err's position in TLSCertReasons, or -1.
func TLSCertReasonIndex(err error) int {
	for i, e := range TLSCertReasons {
		if e == err {
			return i
		}
	}
	return -1
}

// EncodeTLSCertCases writes the section's format: per case u8 kind; kind 1:
// u32 length and body; kind 2: u32 length and leaf DER, the 32-byte
// transcript hash, u32 length and body (little-endian).
func EncodeTLSCertCases(cases []TLSCertCase) []byte {
	var w caseWriter
	for _, c := range cases {
		w.byte(c.Kind)
		if c.Kind == 2 {
			w.blob(c.Leaf)
			w.bytes(c.Transcript[:])
		}
		w.blob(c.Body)
	}
	return w.out
}

// DecodeTLSCertCases reads EncodeTLSCertCases's format.
func DecodeTLSCertCases(b []byte) ([]TLSCertCase, error) {
	var out []TLSCertCase
	r := caseReader{b}
	for r.more() {
		k, _ := r.byte()
		c := TLSCertCase{Kind: k}
		var err error
		if c.Kind == 2 {
			if c.Leaf, err = r.blob(); err != nil {
				return nil, err
			}
			t, err := r.take(32)
			if err != nil {
				return nil, err
			}
			copy(c.Transcript[:], t)
		} else if c.Kind != 1 {
			return nil, errChainCorpus
		}
		if c.Body, err = r.blob(); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// tlsCertCorpus is the committed cases, then six damaged copies of each
// body (a changed byte, or cut short every third time).
func tlsCertCorpus(path string) ([]TLSCertCase, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	base, err := DecodeTLSCertCases(raw)
	if err != nil {
		return nil, err
	}
	rng := &splitmix64{state: 0x746c7363657274}
	out := append([]TLSCertCase(nil), base...)
	for _, c := range base {
		if len(c.Body) == 0 {
			continue
		}
		for m := 0; m < 6; m++ {
			r := rng.next()
			d := append([]byte(nil), c.Body...)
			pos := int((r >> 8) % uint64(len(d)))
			if m%3 == 2 {
				d = d[:pos]
			} else {
				d[pos] ^= byte(r>>40) | 1
			}
			mc := c
			mc.Body = d
			out = append(out, mc)
		}
	}
	return out, nil
}

// TLSCertSection is the kernel's 'TLSCERT ' vector section.
func TLSCertSection(path string) ([]byte, error) {
	cases, err := tlsCertCorpus(path)
	if err != nil {
		return nil, err
	}
	return EncodeTLSCertCases(cases), nil
}

// TLSCertDigest is the "tls13-cert" digest: per case the reason's
// TLSCertReasonIndex; then for an accepted Certificate the count and each
// certificate's offset in the body and length, for an accepted
// CertificateVerify the scheme. A leaf the reader refuses counts as
// unsupported_algorithm. It also returns the number of cases.
func TLSCertDigest(path string) (uint64, int, error) {
	cases, err := tlsCertCorpus(path)
	if err != nil {
		return 0, 0, err
	}
	d := newDigest()
	for _, c := range cases {
		if c.Kind == 1 {
			body := c.Body[:len(c.Body):len(c.Body)] // so that cap gives offsets
			certs, err := ParseTLSCertificate(body)
			d.add(uint64(TLSCertReasonIndex(err)))
			if err != nil {
				continue
			}
			d.add(uint64(len(certs)))
			for _, x := range certs {
				d.add(uint64(len(body) - cap(x)))
				d.add(uint64(len(x)))
			}
			continue
		}
		leaf, err := ParseX509(c.Leaf)
		if err != nil {
			d.add(uint64(TLSCertReasonIndex(ErrUnsupportedAlgorithm)))
			continue
		}
		scheme, err := CheckTLSCertVerify(c.Body, leaf, c.Transcript[:])
		d.add(uint64(TLSCertReasonIndex(err)))
		if err == nil {
			d.add(uint64(scheme))
		}
	}
	return uint64(d), len(cases), nil
}
