package appliance

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/x509"
	"errors"
	"math/big"
	"net/netip"
)

// Certificate path validation (RFC 5280 §6, narrowed; RFC 6125 §6.4 for
// names): the reference the kernel's chain check will mirror (issue 17).
// Every check works on ParseX509's fields and on byte comparisons, in a
// fixed order, so that the kernel and Go name the same reason for every
// input. Nothing here is secret.
//
// The rules:
//   - the server's list holds 1..X509MaxListed certificates, each parsed
//     by ParseX509 (its reason, when one is not a certificate);
//   - the path goes from the leaf (the list's first) upward: at each step
//     the anchors are tried first, then the list's unused certificates, in
//     order; a candidate is one whose subject equals the current
//     certificate's issuer byte for byte, and the first candidate whose key
//     verifies the current certificate's signature is taken;
//   - at most X509MaxIntermediates intermediates between leaf and anchor;
//   - every certificate of the path, anchor included: valid at now
//     (NotBefore <= now <= NotAfter), no nameConstraints, no other critical
//     extension the reader does not understand, extKeyUsage (if present)
//     listing serverAuth or anyExtendedKeyUsage;
//   - every issuer (intermediates and the anchor): basicConstraints cA,
//     keyUsage (if present) with keyCertSign, pathLen (if present) not
//     below the number of intermediates under it;
//   - the leaf: keyUsage (if present) with digitalSignature, a key the
//     kernel can use (P-256, P-384, RSA 2048..4096 with e = 65537), and a
//     name: a DNS host matches a subjectAltName dNSName case-insensitively,
//     label by label, where a pattern's left-most label may be a lone "*"
//     standing for one non-empty label; an IP host (v4 or v6 literal)
//     matches an iPAddress of the same bytes. No common-name fallback.
//   - signatures: ecdsa-with-SHA256/384 under a P-256 or P-384 key,
//     sha256/384WithRSAEncryption (PKCS#1 v1.5) and RSASSA-PSS with
//     SHA-256/384, MGF1 of the same hash and a salt of the hash's length
//     (the parameters compared as the exact DER Go and OpenSSL write).
//
// No revocation checking (docs/security.md).

// Limits of the chain check.
const (
	X509MaxListed        = 8 // certificates the server may send
	X509MaxIntermediates = 4
	x509RSAMinBits       = 2048
	x509RSAMaxBits       = 4096
	x509RSAExponent      = 65537
)

// keyUsage bits as X509Cert.KeyUsage holds them (first two bytes, big-endian).
const (
	x509KUDigitalSignature = 0x8000
	x509KUKeyCertSign      = 0x0400
)

var (
	oidNameConstraints = []byte{0x55, 0x1d, 0x1e} // 2.5.29.30
	oidECPublicKey     = []byte{0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01}
	oidP256            = []byte{0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}
	oidP384            = []byte{0x2b, 0x81, 0x04, 0x00, 0x22}
	oidRSAEncryption   = []byte{0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01}
	oidECDSASHA256     = []byte{0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02}
	oidECDSASHA384     = []byte{0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03}
	oidRSASHA256       = []byte{0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0b}
	oidRSASHA384       = []byte{0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0c}
	oidRSAPSS          = []byte{0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0a}
	derNull            = []byte{0x05, 0x00}
)

// x509PSSParams are the RSASSA-PSS-params (RFC 4055 §3.1) the check takes,
// whole AlgorithmIdentifier TLVs: SHA-256 or SHA-384, MGF1 with the same
// hash, salt length 32 or 48, trailerField default.
var x509PSSParams = map[crypto.Hash][]byte{
	crypto.SHA256: pssAlgID(0x01, 32),
	crypto.SHA384: pssAlgID(0x02, 48),
}

func pssAlgID(hashArc byte, salt byte) []byte {
	hashAlg := derEnc(tagSequence, derEnc(tagOID, []byte{0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, hashArc}), derNull)
	mgf := derEnc(tagSequence, derEnc(tagOID, []byte{0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x08}), hashAlg)
	params := derEnc(tagSequence, derEnc(0xa0, hashAlg), derEnc(0xa1, mgf), derEnc(0xa2, derEnc(tagInteger, []byte{salt})))
	return derEnc(tagSequence, derEnc(tagOID, oidRSAPSS), params)
}

// Chain refusals (the console's reason; TLS alerts in parentheses).
var (
	// ErrCertificateRequired: the server sent no certificate (certificate_required).
	ErrCertificateRequired = errors.New("certificate_required")
	// ErrChainTooLong: more than X509MaxListed certificates listed, or a
	// path that would need more than X509MaxIntermediates (bad_certificate).
	ErrChainTooLong = errors.New("chain_too_long")
	// ErrCertificateExpired: now is after a path certificate's notAfter.
	ErrCertificateExpired = errors.New("certificate_expired")
	// ErrCertificateNotYetValid: now is before a notBefore (certificate_expired).
	ErrCertificateNotYetValid = errors.New("certificate_not_yet_valid")
	// ErrNameMismatch: no subjectAltName of the leaf matches the host (bad_certificate).
	ErrNameMismatch = errors.New("name_mismatch")
	// ErrUnknownCA: no anchor or listed certificate is named as an issuer (unknown_ca).
	ErrUnknownCA = errors.New("unknown_ca")
	// ErrBadSignature: the named issuers' keys do not verify the signature (decrypt_error).
	ErrBadSignature = errors.New("bad_signature")
	// ErrUnsupportedAlgorithm: a signature algorithm or key the kernel does
	// not take (unsupported_certificate).
	ErrUnsupportedAlgorithm = errors.New("unsupported_algorithm")
	// ErrNotCA: an issuer without basicConstraints cA (bad_certificate).
	ErrNotCA = errors.New("not_ca")
	// ErrPathLen: an issuer's pathLenConstraint exceeded (bad_certificate).
	ErrPathLen = errors.New("path_len")
	// ErrKeyUsage: keyUsage without digitalSignature (leaf) or keyCertSign (issuer).
	ErrKeyUsage = errors.New("key_usage")
	// ErrEKU: extendedKeyUsage without serverAuth or anyExtendedKeyUsage.
	ErrEKU = errors.New("eku")
	// ErrNameConstraints: a nameConstraints extension, which is not enforced.
	ErrNameConstraints = errors.New("name_constraints")
	// ErrUnsupportedExtension: another critical extension not understood.
	ErrUnsupportedExtension = errors.New("unsupported_extension")
)

// X509ChainReasons numbers the chain check's refusals for the kernel's
// self-test, after X509Reasons (the parser's).
var X509ChainReasons = []error{ErrCertificateRequired, ErrChainTooLong, ErrCertificateExpired,
	ErrCertificateNotYetValid, ErrNameMismatch, ErrUnknownCA, ErrBadSignature, ErrUnsupportedAlgorithm,
	ErrNotCA, ErrPathLen, ErrKeyUsage, ErrEKU, ErrNameConstraints, ErrUnsupportedExtension}

// X509ChainReasonIndex is err's number: X509ReasonIndex for a parser's
// reason, len(X509Reasons)+i for X509ChainReasons[i], -1 otherwise.
func X509ChainReasonIndex(err error) int {
	if i := X509ReasonIndex(err); i >= 0 {
		return i
	}
	for i, e := range X509ChainReasons {
		if e == err {
			return len(X509Reasons) + i
		}
	}
	return -1
}

// X509Path is an accepted path: Listed holds the indexes in the server's
// list from the leaf up (the leaf is 0), Anchor the anchor's index.
type X509Path struct {
	Listed []int
	Anchor int
}

// X509VerifyChain validates the server's certificates (leaf first) for
// host (a DNS name or an IP literal) at now (Unix seconds) against the
// anchors (DER; each one must parse). See the rules above.
func X509VerifyChain(list, anchors [][]byte, host string, now int64) (*X509Path, error) {
	if len(list) == 0 {
		return nil, ErrCertificateRequired
	}
	if len(list) > X509MaxListed {
		return nil, ErrChainTooLong
	}
	certs := make([]*X509Cert, len(list))
	for i, der := range list {
		c, err := ParseX509(der)
		if err != nil {
			return nil, err
		}
		certs[i] = c
	}
	roots := make([]*X509Cert, len(anchors))
	for i, der := range anchors {
		c, err := ParseX509(der)
		if err != nil {
			return nil, err
		}
		roots[i] = c
	}
	leaf := certs[0]
	if err := x509CheckCert(leaf, now); err != nil {
		return nil, err
	}
	if leaf.Flags&X509KeyUsage != 0 && leaf.KeyUsage&x509KUDigitalSignature == 0 {
		return nil, ErrKeyUsage
	}
	if err := x509KeySupported(leaf); err != nil {
		return nil, err
	}
	if !X509MatchHost(leaf, host) {
		return nil, ErrNameMismatch
	}
	path := &X509Path{Listed: []int{0}, Anchor: -1}
	used := make([]bool, len(certs))
	used[0] = true
	cur := leaf
	for {
		below := len(path.Listed) - 1 // intermediates under the next issuer
		i, err := x509FindIssuer(cur, roots, nil)
		if err == nil {
			if err := x509CheckIssuer(roots[i], now, below); err != nil {
				return nil, err
			}
			path.Anchor = i
			return path, nil
		}
		if err != ErrUnknownCA {
			return nil, err
		}
		j, err := x509FindIssuer(cur, certs, used)
		if err != nil {
			return nil, err
		}
		if below == X509MaxIntermediates {
			return nil, ErrChainTooLong
		}
		if err := x509CheckIssuer(certs[j], now, below); err != nil {
			return nil, err
		}
		used[j] = true
		path.Listed = append(path.Listed, j)
		cur = certs[j]
	}
}

// x509FindIssuer is the first of cands (not used) whose subject is c's
// issuer and whose key verifies c. With no candidate, unknown_ca; with
// candidates that all fail, the first one's reason.
func x509FindIssuer(c *X509Cert, cands []*X509Cert, used []bool) (int, error) {
	var first error
	for i, p := range cands {
		if used != nil && used[i] || !bytes.Equal(p.Subject, c.Issuer) {
			continue
		}
		err := X509CheckSignature(c, p)
		if err == nil {
			return i, nil
		}
		if first == nil {
			first = err
		}
	}
	if first == nil {
		first = ErrUnknownCA
	}
	return -1, first
}

// x509CheckCert is what every certificate of the path must satisfy.
func x509CheckCert(c *X509Cert, now int64) error {
	if now > c.NotAfter {
		return ErrCertificateExpired
	}
	if now < c.NotBefore {
		return ErrCertificateNotYetValid
	}
	for _, x := range c.Extensions {
		if bytes.Equal(x.OID, oidNameConstraints) {
			return ErrNameConstraints
		}
	}
	if c.UnknownCritical != 0 {
		return ErrUnsupportedExtension
	}
	if c.Flags&X509ExtKeyUsage != 0 && c.Flags&(X509EKUServerAuth|X509EKUAny) == 0 {
		return ErrEKU
	}
	return nil
}

// x509CheckIssuer is what an intermediate or the anchor must satisfy, with
// below intermediates under it.
func x509CheckIssuer(c *X509Cert, now int64, below int) error {
	if err := x509CheckCert(c, now); err != nil {
		return err
	}
	if c.Flags&X509CA == 0 {
		return ErrNotCA
	}
	if c.Flags&X509KeyUsage != 0 && c.KeyUsage&x509KUKeyCertSign == 0 {
		return ErrKeyUsage
	}
	if c.PathLen >= 0 && below > c.PathLen {
		return ErrPathLen
	}
	return nil
}

// x509KeyKind is an SPKI's key: 256 or 384 for an EC curve, -1 for RSA, 0
// for anything else.
func x509KeyKind(c *X509Cert) int {
	switch {
	case bytes.Equal(c.SPKIOID, oidECPublicKey) && c.SPKIParams != nil:
		p, rest, err := derExpect(c.SPKIParams, tagOID)
		if err != nil || len(rest) != 0 {
			return 0
		}
		switch {
		case bytes.Equal(p.content, oidP256):
			return 256
		case bytes.Equal(p.content, oidP384):
			return 384
		}
	case bytes.Equal(c.SPKIOID, oidRSAEncryption) && bytes.Equal(c.SPKIParams, derNull):
		return -1
	}
	return 0
}

// x509RSAKey reads RSAPublicKey (RFC 8017 §A.1.1) from the SPKI's key:
// n (positive, minimal, 2048..4096 bits) and e = 65537.
func x509RSAKey(key []byte) (*rsa.PublicKey, error) {
	seq, rest, err := derExpect(key, tagSequence)
	if err != nil || len(rest) != 0 {
		return nil, ErrUnsupportedAlgorithm
	}
	n, rest, err := derExpect(seq.content, tagInteger)
	if err != nil {
		return nil, ErrUnsupportedAlgorithm
	}
	e, rest, err := derExpect(rest, tagInteger)
	if err != nil || len(rest) != 0 {
		return nil, ErrUnsupportedAlgorithm
	}
	nb := n.content
	if len(nb) == 0 || nb[0] >= 0x80 || len(nb) > 1 && nb[0] == 0 && nb[1] < 0x80 {
		return nil, ErrUnsupportedAlgorithm
	}
	if !bytes.Equal(e.content, []byte{0x01, 0x00, 0x01}) {
		return nil, ErrUnsupportedAlgorithm
	}
	nn := new(big.Int).SetBytes(nb)
	if nn.BitLen() < x509RSAMinBits || nn.BitLen() > x509RSAMaxBits {
		return nil, ErrUnsupportedAlgorithm
	}
	return &rsa.PublicKey{N: nn, E: x509RSAExponent}, nil
}

// x509KeySupported refuses a key the kernel cannot use.
func x509KeySupported(c *X509Cert) error {
	switch x509KeyKind(c) {
	case 256, 384:
		if _, err := x509.ParsePKIXPublicKey(c.SPKI); err != nil {
			return ErrUnsupportedAlgorithm
		}
		return nil
	case -1:
		_, err := x509RSAKey(c.SPKIKey)
		return err
	}
	return ErrUnsupportedAlgorithm
}

// X509CheckSignature verifies c's signature with issuer's key.
func X509CheckSignature(c, issuer *X509Cert) error {
	var h crypto.Hash
	kind := x509KeyKind(issuer)
	pss := false
	switch {
	case bytes.Equal(c.SigOID, oidECDSASHA256) && len(c.SigAlg) == 2+len(oidECDSASHA256)+2:
		h = crypto.SHA256
	case bytes.Equal(c.SigOID, oidECDSASHA384) && len(c.SigAlg) == 2+len(oidECDSASHA384)+2:
		h = crypto.SHA384
	case bytes.Equal(c.SigOID, oidRSASHA256) && bytes.Equal(c.SigAlg[2+2+len(oidRSASHA256):], derNull):
		h = crypto.SHA256
	case bytes.Equal(c.SigOID, oidRSASHA384) && bytes.Equal(c.SigAlg[2+2+len(oidRSASHA384):], derNull):
		h = crypto.SHA384
	case bytes.Equal(c.SigAlg, x509PSSParams[crypto.SHA256]):
		h, pss = crypto.SHA256, true
	case bytes.Equal(c.SigAlg, x509PSSParams[crypto.SHA384]):
		h, pss = crypto.SHA384, true
	default:
		return ErrUnsupportedAlgorithm
	}
	var digest []byte
	if h == crypto.SHA256 {
		d := sha256.Sum256(c.TBS)
		digest = d[:]
	} else {
		d := sha512.Sum384(c.TBS)
		digest = d[:]
	}
	rsaSig := bytes.HasPrefix(c.SigOID, oidRSAEncryption[:8])
	switch {
	case (kind == 256 || kind == 384) && !rsaSig:
		k, err := x509.ParsePKIXPublicKey(issuer.SPKI)
		if err != nil {
			return ErrUnsupportedAlgorithm
		}
		ek, ok := k.(*ecdsa.PublicKey)
		if !ok {
			return ErrUnsupportedAlgorithm
		}
		if !ecdsa.VerifyASN1(ek, digest, c.Signature) {
			return ErrBadSignature
		}
		return nil
	case kind == -1 && rsaSig:
		k, err := x509RSAKey(issuer.SPKIKey)
		if err != nil {
			return err
		}
		if pss {
			err = rsa.VerifyPSS(k, h, digest, c.Signature, &rsa.PSSOptions{SaltLength: h.Size(), Hash: h})
		} else {
			err = rsa.VerifyPKCS1v15(k, h, digest, c.Signature)
		}
		if err != nil {
			return ErrBadSignature
		}
		return nil
	}
	return ErrUnsupportedAlgorithm
}

// X509MatchHost reports whether c's subjectAltName names host: an IP
// literal against iPAddress entries (4 or 16 bytes), anything else against
// dNSName entries (see the rules above). Every GeneralName of the
// extension is looked at, not only the first X509MaxDNSNames.
func X509MatchHost(c *X509Cert, host string) bool {
	var san []byte
	for _, x := range c.Extensions {
		if bytes.Equal(x.OID, oidSubjectAltName) {
			san = x.Value
		}
	}
	if san == nil || host == "" {
		return false
	}
	seq, _, err := derExpect(san, tagSequence)
	if err != nil {
		return false
	}
	ip, ipErr := netip.ParseAddr(host)
	if ipErr == nil && ip.Zone() != "" {
		return false
	}
	for b := seq.content; len(b) > 0; {
		var gn derTLV
		if gn, b, err = derRead(b); err != nil {
			return false
		}
		switch {
		case ipErr == nil && gn.tag == tagIPAddress:
			if ip.Is4() && bytes.Equal(gn.content, ip.AsSlice()) ||
				ip.Is6() && len(gn.content) == 16 && bytes.Equal(gn.content, ip.AsSlice()) {
				return true
			}
		case ipErr != nil && gn.tag == tagDNSName:
			if X509MatchName(gn.content, host) {
				return true
			}
		}
	}
	return false
}

const tagIPAddress = 0x87 // GeneralName iPAddress [7] IMPLICIT OCTET STRING

// X509MatchName reports whether a dNSName pattern names host: the same
// number of non-empty labels, equal ASCII case-insensitively, except that
// the pattern's first label may be exactly "*" (any one label). One
// trailing dot on the host is ignored; none is allowed on the pattern.
func X509MatchName(pattern []byte, host string) bool {
	h := []byte(host)
	if len(h) > 0 && h[len(h)-1] == '.' {
		h = h[:len(h)-1]
	}
	if len(pattern) == 0 || len(h) == 0 || bytes.IndexByte(h, '*') >= 0 {
		return false
	}
	pl := bytes.Split(pattern, []byte{'.'})
	hl := bytes.Split(h, []byte{'.'})
	if len(pl) != len(hl) {
		return false
	}
	for i := range pl {
		if len(pl[i]) == 0 || len(hl[i]) == 0 {
			return false
		}
		if i == 0 && len(pl[i]) == 1 && pl[i][0] == '*' && len(pl) > 2 {
			continue
		}
		if !bytes.EqualFold(pl[i], hl[i]) {
			return false
		}
	}
	return true
}
