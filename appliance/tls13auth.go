package appliance

import (
	"os"
)

// TLSServerAuth is the server's authentication as the kernel's
// tls_server_auth runs it: the Certificate body split
// (ParseTLSCertificate), the chain validated (X509VerifyChain), then the
// CertificateVerify body checked against the leaf and the transcript hash
// (CheckTLSCertVerify). It returns the path and the scheme.
func TLSServerAuth(certBody, cvBody, transcript []byte, host string, now int64, anchors [][]byte) (*X509Path, int, error) {
	certs, err := ParseTLSCertificate(certBody)
	if err != nil {
		return nil, 0, err
	}
	path, err := X509VerifyChain(certs, anchors, host, now)
	if err != nil {
		return nil, 0, err
	}
	leaf, err := ParseX509(certs[0])
	if err != nil {
		return nil, 0, err
	}
	scheme, err := CheckTLSCertVerify(cvBody, leaf, transcript)
	if err != nil {
		return nil, 0, err
	}
	return path, scheme, nil
}

// TLSAuthReasonIndex numbers TLSServerAuth's refusals: X509ChainReasonIndex,
// then decode_error, illegal_parameter, unsupported_extension.
func TLSAuthReasonIndex(err error) int {
	if i := X509ChainReasonIndex(err); i >= 0 {
		return i
	}
	base := len(X509Reasons) + len(X509ChainReasons)
	for i, e := range []error{ErrTLSDecodeError, ErrTLSIllegalParameter, ErrTLSUnsupportedExtension} {
		if e == err {
			return base + i
		}
	}
	return -1
}

// TLSAuthCorpusPath holds server flights recorded from real peers (Go's
// crypto/tls and openssl s_server) by the reference client.
const TLSAuthCorpusPath = "testdata/tlsauth/cases.bin"

// TLSAuthCase is one recorded authentication: the check's inputs.
type TLSAuthCase struct {
	Now                            int64
	Host                           string
	Anchors                        [][]byte
	CertBody, CVBody, CVTranscript []byte
}

// EncodeTLSAuthCases writes per case: u64 now, u16 host length, host, u8
// anchors and per anchor u32 length and DER, then u32 length and bytes of
// the Certificate body, the CertificateVerify body and the 32-byte
// transcript hash (little-endian).
func EncodeTLSAuthCases(cases []TLSAuthCase) []byte {
	var w caseWriter
	for _, c := range cases {
		w.timeHost(c.Now, c.Host)
		w.list(c.Anchors)
		w.blob(c.CertBody)
		w.blob(c.CVBody)
		w.bytes(c.CVTranscript)
	}
	return w.out
}

// DecodeTLSAuthCases reads EncodeTLSAuthCases's format.
func DecodeTLSAuthCases(b []byte) ([]TLSAuthCase, error) {
	var out []TLSAuthCase
	r := caseReader{b}
	for r.more() {
		var c TLSAuthCase
		var err error
		if c.Now, c.Host, err = r.timeHost(); err != nil {
			return nil, err
		}
		if c.Anchors, err = r.list(); err != nil {
			return nil, err
		}
		if c.CertBody, err = r.blob(); err != nil {
			return nil, err
		}
		if c.CVBody, err = r.blob(); err != nil {
			return nil, err
		}
		if c.CVTranscript, err = r.take(tlsHashLen); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// tlsAuthCorpus is the recorded cases, then per case: the host changed
// (one more label), the time moved past the leaf's life, and eight copies
// with one byte of the Certificate or CertificateVerify body changed.
func tlsAuthCorpus(path string) ([]TLSAuthCase, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	base, err := DecodeTLSAuthCases(raw)
	if err != nil {
		return nil, err
	}
	rng := &splitmix64{state: 0x746c7361757468}
	out := append([]TLSAuthCase(nil), base...)
	for _, c := range base {
		h := c
		h.Host = "x." + c.Host
		out = append(out, h)
		late := c
		late.Now = c.Now + 400*24*3600
		out = append(out, late)
		for m := 0; m < 8; m++ {
			r := rng.next()
			d := c
			if m%2 == 0 {
				d.CertBody = append([]byte(nil), c.CertBody...)
				d.CertBody[(r>>8)%uint64(len(d.CertBody))] ^= byte(r>>40) | 1
			} else {
				d.CVBody = append([]byte(nil), c.CVBody...)
				d.CVBody[(r>>8)%uint64(len(d.CVBody))] ^= byte(r>>40) | 1
			}
			out = append(out, d)
		}
	}
	return out, nil
}

// TLSAuthSection is the kernel's 'TLSAUTH ' vector section.
func TLSAuthSection(path string) ([]byte, error) {
	cases, err := tlsAuthCorpus(path)
	if err != nil {
		return nil, err
	}
	return EncodeTLSAuthCases(cases), nil
}

// TLSAuthDigest is the "tls13-auth" digest: per case TLSAuthReasonIndex;
// for an accepted one the path's length, each listed index, the anchor and
// the scheme. It also returns the number of cases.
func TLSAuthDigest(path string) (uint64, int, error) {
	cases, err := tlsAuthCorpus(path)
	if err != nil {
		return 0, 0, err
	}
	d := newDigest()
	for _, c := range cases {
		p, scheme, err := TLSServerAuth(c.CertBody, c.CVBody, c.CVTranscript, c.Host, c.Now, c.Anchors)
		d.add(uint64(TLSAuthReasonIndex(err)))
		if err != nil {
			continue
		}
		d.add(uint64(len(p.Listed)))
		for _, i := range p.Listed {
			d.add(uint64(i))
		}
		d.add(uint64(p.Anchor))
		d.add(uint64(scheme))
	}
	return uint64(d), len(cases), nil
}
