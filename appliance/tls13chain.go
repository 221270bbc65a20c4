package appliance

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/sha512"
	"errors"
	"math/big"
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
	X509MaxAnchors       = 16 // trust anchors the kernel holds
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

// pssAlgID is an RSASSA-PSS AlgorithmIdentifier (RFC 4055 §3.1) as Go and
// OpenSSL write it: the hash (SHA-256 or SHA-384, by its arc), MGF1 with
// the same hash, a salt of the hash's length, trailerField default.
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
	// ErrTooManyAnchors: more than X509MaxAnchors anchors (a build error).
	ErrTooManyAnchors = errors.New("too_many_anchors")
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
	ErrNotCA, ErrPathLen, ErrKeyUsage, ErrEKU, ErrNameConstraints, ErrUnsupportedExtension, ErrTooManyAnchors}

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
	if len(anchors) > X509MaxAnchors {
		return nil, ErrTooManyAnchors
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
// for anything else (the parameters compared as whole TLVs).
func x509KeyKind(c *X509Cert) int {
	switch {
	case bytes.Equal(c.SPKIOID, oidECPublicKey) && bytes.Equal(c.SPKIParams, derEnc(tagOID, oidP256)):
		return 256
	case bytes.Equal(c.SPKIOID, oidECPublicKey) && bytes.Equal(c.SPKIParams, derEnc(tagOID, oidP384)):
		return 384
	case bytes.Equal(c.SPKIOID, oidRSAEncryption) && bytes.Equal(c.SPKIParams, derNull):
		return -1
	}
	return 0
}

// x509ECKey is the SPKI's point on its curve (SEC 1 uncompressed, on the
// curve), or unsupported_algorithm.
func x509ECKey(c *X509Cert) (*ecdsa.PublicKey, error) {
	curve := elliptic.P256()
	switch x509KeyKind(c) {
	case 256:
	case 384:
		curve = elliptic.P384()
	default:
		return nil, ErrUnsupportedAlgorithm
	}
	k, err := ecdsa.ParseUncompressedPublicKey(curve, c.SPKIKey)
	if err != nil {
		return nil, ErrUnsupportedAlgorithm
	}
	return k, nil
}

// x509RSAKey reads RSAPublicKey (RFC 8017 §A.1.1) from the SPKI's key:
// SEQUENCE { INTEGER n, INTEGER e } and nothing more, n positive and
// minimal with 2048..4096 bits, e's content exactly 01 00 01.
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

// x509KeySupported refuses a leaf key the kernel cannot use.
func x509KeySupported(c *X509Cert) error {
	switch x509KeyKind(c) {
	case 256, 384:
		_, err := x509ECKey(c)
		return err
	case -1:
		_, err := x509RSAKey(c.SPKIKey)
		return err
	}
	return ErrUnsupportedAlgorithm
}

// Signature algorithm kinds of x509SigAlgs.
const (
	x509SigECDSA = 1
	x509SigPKCS1 = 2
	x509SigPSS   = 3
)

// x509SigAlgs are the signature AlgorithmIdentifiers taken, as whole TLVs
// (the kernel's table x509_sig_algs, in the same order).
var x509SigAlgs = []struct {
	alg  []byte
	hash crypto.Hash
	kind int
}{
	{derEnc(tagSequence, derEnc(tagOID, oidECDSASHA256)), crypto.SHA256, x509SigECDSA},
	{derEnc(tagSequence, derEnc(tagOID, oidECDSASHA384)), crypto.SHA384, x509SigECDSA},
	{derEnc(tagSequence, derEnc(tagOID, oidRSASHA256), derNull), crypto.SHA256, x509SigPKCS1},
	{derEnc(tagSequence, derEnc(tagOID, oidRSASHA384), derNull), crypto.SHA384, x509SigPKCS1},
	{pssAlgID(0x01, 32), crypto.SHA256, x509SigPSS},
	{pssAlgID(0x02, 48), crypto.SHA384, x509SigPSS},
}

// x509ECDSASig splits an ECDSA-Sig-Value (SEC 1 §C.8): SEQUENCE { INTEGER
// r, INTEGER s } and nothing more, each INTEGER minimal and not negative.
func x509ECDSASig(sig []byte) (r, s []byte, ok bool) {
	seq, rest, err := derExpect(sig, tagSequence)
	if err != nil || len(rest) != 0 {
		return nil, nil, false
	}
	b := seq.content
	var out [2][]byte
	for i := range out {
		var n derTLV
		if n, b, err = derExpect(b, tagInteger); err != nil {
			return nil, nil, false
		}
		c := n.content
		if len(c) == 0 || c[0] >= 0x80 || len(c) > 1 && c[0] == 0 && c[1] < 0x80 {
			return nil, nil, false
		}
		out[i] = c
	}
	if len(b) != 0 {
		return nil, nil, false
	}
	return out[0], out[1], true
}

// X509CheckSignature verifies c's signature with issuer's key: the
// algorithm from x509SigAlgs (unsupported_algorithm otherwise), the TBS
// hashed, then an EC key for ECDSA or an RSA key for PKCS#1 and PSS
// (unsupported_algorithm when the key is of the other kind or not taken),
// then the signature (bad_signature).
func X509CheckSignature(c, issuer *X509Cert) error {
	alg := -1
	for i, a := range x509SigAlgs {
		if bytes.Equal(c.SigAlg, a.alg) {
			alg = i
			break
		}
	}
	if alg < 0 {
		return ErrUnsupportedAlgorithm
	}
	h, kind := x509SigAlgs[alg].hash, x509SigAlgs[alg].kind
	var digest []byte
	if h == crypto.SHA256 {
		d := sha256.Sum256(c.TBS)
		digest = d[:]
	} else {
		d := sha512.Sum384(c.TBS)
		digest = d[:]
	}
	kk := x509KeyKind(issuer)
	switch {
	case kind == x509SigECDSA && (kk == 256 || kk == 384):
		k, err := x509ECKey(issuer)
		if err != nil {
			return err
		}
		r, s, ok := x509ECDSASig(c.Signature)
		if !ok {
			return ErrBadSignature
		}
		if !ecdsa.Verify(k, digest, new(big.Int).SetBytes(r), new(big.Int).SetBytes(s)) {
			return ErrBadSignature
		}
		return nil
	case kind != x509SigECDSA && kk == -1:
		k, err := x509RSAKey(issuer.SPKIKey)
		if err != nil {
			return err
		}
		if kind == x509SigPSS {
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

// X509MatchHost reports whether c's subjectAltName names host: a dotted
// IPv4 literal (x509IPv4) against iPAddress entries, anything else against
// dNSName entries (X509MatchName). Every GeneralName of the extension is
// looked at, not only the first X509MaxDNSNames. The kernel has no IPv6:
// "fd00::1" is a DNS name here, and matches only a dNSName of those bytes.
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
	ip, isIP := x509IPv4(host)
	for b := seq.content; len(b) > 0; {
		var gn derTLV
		if gn, b, err = derRead(b); err != nil {
			return false
		}
		switch {
		case isIP && gn.tag == tagIPAddress:
			if bytes.Equal(gn.content, ip[:]) {
				return true
			}
		case !isIP && gn.tag == tagDNSName:
			if X509MatchName(gn.content, host) {
				return true
			}
		}
	}
	return false
}

const tagIPAddress = 0x87 // GeneralName iPAddress [7] IMPLICIT OCTET STRING

// x509IPv4 reads a dotted-quad: four decimal parts of 1-3 digits, no
// leading zero but in "0", each at most 255, nothing else.
func x509IPv4(host string) ([4]byte, bool) {
	var ip [4]byte
	part, digits, val := 0, 0, 0
	for i := 0; i <= len(host); i++ {
		if i == len(host) || host[i] == '.' {
			if digits == 0 || part == 4 {
				return ip, false
			}
			ip[part] = byte(val)
			part, digits, val = part+1, 0, 0
			continue
		}
		ch := host[i]
		if ch < '0' || ch > '9' || digits == 1 && val == 0 || digits == 3 {
			return ip, false
		}
		val = val*10 + int(ch-'0')
		digits++
		if val > 255 {
			return ip, false
		}
	}
	return ip, part == 4
}

// X509MatchName reports whether a dNSName pattern names host. One trailing
// dot on the host is dropped; then both must be non-empty with no empty
// label, the host without '*', with the same number of dots. A pattern
// starting "*." with at least two more labels matches when what follows
// its "*" equals what follows the host's first label; any other pattern
// when it equals the host. Equal is ASCII case-insensitive.
func X509MatchName(pattern []byte, host string) bool {
	h := []byte(host)
	if len(h) > 0 && h[len(h)-1] == '.' {
		h = h[:len(h)-1]
	}
	if len(pattern) == 0 || len(h) == 0 || bytes.IndexByte(h, '*') >= 0 {
		return false
	}
	dots := func(b []byte) int {
		if b[0] == '.' || b[len(b)-1] == '.' || bytes.Contains(b, []byte("..")) {
			return -1
		}
		return bytes.Count(b, []byte{'.'})
	}
	pd, hd := dots(pattern), dots(h)
	if pd < 0 || hd < 0 || pd != hd {
		return false
	}
	if len(pattern) >= 2 && pattern[0] == '*' && pattern[1] == '.' && pd >= 2 {
		pattern = pattern[1:]
		h = h[bytes.IndexByte(h, '.'):]
	}
	if len(pattern) != len(h) {
		return false
	}
	for i := range h {
		if x509Lower(pattern[i]) != x509Lower(h[i]) {
			return false
		}
	}
	return true
}

func x509Lower(b byte) byte {
	if b >= 'A' && b <= 'Z' {
		return b + 'a' - 'A'
	}
	return b
}

// X509CheckAnchor is what the build wants of a trust anchor: the kernel's
// reader takes it (ParseX509), it is a CA (basicConstraints cA), and its key
// is one the kernel can verify with (P-256, P-384, RSA 2048..4096 with
// e = 65537). Its validity is checked when it is used, not here.
func X509CheckAnchor(der []byte) error {
	c, err := ParseX509(der)
	if err != nil {
		return err
	}
	if c.Flags&X509CA == 0 {
		return ErrNotCA
	}
	return x509KeySupported(c)
}
