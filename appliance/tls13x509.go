package appliance

import (
	"bytes"
	"errors"
)

// The Go reference of the kernel's X.509 reader (kernel/tls/x509.inc),
// written from RFC 5280 §4.1-4.2 and X.690 §8, §10 (DER): it splits a
// certificate into the fields path validation will need, checks their
// DER framing and tags, and converts the validity times. It verifies
// nothing (signatures, names, usages and dates come with path validation).

// DER tags (X.690 §8; RFC 5280 §4.1).
const (
	tagBoolean     = 0x01
	tagInteger     = 0x02
	tagBitString   = 0x03
	tagOctetString = 0x04
	tagOID         = 0x06
	tagUTCTime     = 0x17
	tagGenTime     = 0x18
	tagSequence    = 0x30
	tagVersion     = 0xa0 // [0] EXPLICIT Version
	tagIssuerUID   = 0x81 // [1] IMPLICIT UniqueIdentifier
	tagSubjectUID  = 0x82 // [2] IMPLICIT UniqueIdentifier
	tagExtensions  = 0xa3 // [3] EXPLICIT Extensions
	tagDNSName     = 0x82 // GeneralName [2] IMPLICIT IA5String
)

// Limits of the kernel's X509_CERT.
const (
	X509MaxExtensions = 24 // extensions kept; more is refused
	X509MaxDNSNames   = 16 // dNSNames kept; more are counted
	x509MaxSerial     = 21 // 20 octets (RFC 5280 §4.1.2.2) and a sign byte
	x509Version3      = 2
	x509MinYear       = 1950 // UTCTime's first year (RFC 5280 §4.1.2.5.1)
)

var (
	oidSubjectAltName   = []byte{0x55, 0x1d, 0x11}                               // 2.5.29.17
	oidBasicConstraints = []byte{0x55, 0x1d, 0x13}                               // 2.5.29.19
	oidKeyUsage         = []byte{0x55, 0x1d, 0x0f}                               // 2.5.29.15
	oidExtKeyUsage      = []byte{0x55, 0x1d, 0x25}                               // 2.5.29.37
	oidEKUServerAuth    = []byte{0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x01} // 1.3.6.1.5.5.7.3.1
	oidEKUAny           = []byte{0x55, 0x1d, 0x25, 0x00}                         // 2.5.29.37.0
)

// X509Cert.Flags: what the extensions the reader understands say (RFC
// 5280 §4.2.1.3, §4.2.1.9, §4.2.1.12).
const (
	X509BasicConstraints = 1 << 0 // basicConstraints present
	X509CA               = 1 << 1 // cA TRUE
	X509KeyUsage         = 1 << 2 // keyUsage present (bits in KeyUsage)
	X509ExtKeyUsage      = 1 << 3 // extendedKeyUsage present
	X509EKUServerAuth    = 1 << 4 // id-kp-serverAuth listed
	X509EKUAny           = 1 << 5 // anyExtendedKeyUsage listed
)

// X.509 refusals (local reasons; a TLS client sends bad_certificate).
var (
	// ErrDERMalformed: a TLV that is not DER: cut short, indefinite or
	// non-minimal length, a length over 2^24 - 1, a multi-byte tag.
	ErrDERMalformed = errors.New("der_malformed")
	// ErrX509Malformed: well-framed DER that is not a certificate: a wrong
	// tag, bytes left in a SEQUENCE, a bad BOOLEAN or BIT STRING, an empty
	// extension list or SAN, a serial of 0 or over 21 bytes or not minimal, the two
	// signature algorithms differing.
	ErrX509Malformed = errors.New("x509_malformed")
	// ErrX509Version: not an X.509 v3 certificate.
	ErrX509Version = errors.New("x509_version")
	// ErrX509Time: a validity time that is not UTCTime YYMMDDHHMMSSZ or
	// GeneralizedTime YYYYMMDDHHMMSSZ of a real date from 1950 on.
	ErrX509Time = errors.New("x509_time")
	// ErrX509DuplicateExtension: one extension twice (RFC 5280 §4.2).
	ErrX509DuplicateExtension = errors.New("x509_duplicate_extension")
	// ErrX509TooManyExtensions: more than X509MaxExtensions.
	ErrX509TooManyExtensions = errors.New("x509_too_many_extensions")
)

// X509Reasons lists the refusals in the order the kernel's self-test
// numbers them (0 is success).
var X509Reasons = []error{nil, ErrDERMalformed, ErrX509Malformed, ErrX509Version, ErrX509Time,
	ErrX509DuplicateExtension, ErrX509TooManyExtensions}

// X509ReasonIndex is err's position in X509Reasons, or -1.
func X509ReasonIndex(err error) int {
	for i, e := range X509Reasons {
		if e == err {
			return i
		}
	}
	return -1
}

// X509Extension is one extension: its OID's content bytes, criticality
// and the extnValue OCTET STRING's content.
type X509Extension struct {
	OID      []byte
	Critical bool
	Value    []byte
}

// X509Cert is a certificate split into fields; every slice points into
// the DER it came from. Whole TLVs: TBS (what the signature covers),
// SigAlg (the outer AlgorithmIdentifier, equal to the TBS's), Issuer,
// Subject, SPKI, SPKIParams (nil when absent). Contents: Serial, SigOID,
// SPKIOID, SPKIKey and Signature (BIT STRINGs without the unused-bits
// byte). Times in seconds from 1970-01-01T00:00:00Z.
type X509Cert struct {
	TBS, SigAlg, SigOID, Signature []byte
	Serial, Issuer, Subject        []byte
	NotBefore, NotAfter            int64
	SPKI, SPKIOID, SPKIParams      []byte
	SPKIKey                        []byte
	Extensions                     []X509Extension
	DNSNames                       [][]byte // the first X509MaxDNSNames
	DNSCount                       int      // all dNSNames of subjectAltName
	// Flags are X509BasicConstraints..X509EKUAny; PathLen is
	// basicConstraints' pathLenConstraint (0..255), -1 when absent;
	// KeyUsage the keyUsage BIT STRING's first two bytes, big-endian
	// (digitalSignature is 0x8000, decipherOnly 0x0080); UnknownCritical
	// counts critical extensions the reader does not understand (path
	// validation will refuse them; nameConstraints is one of them).
	Flags           int
	PathLen         int
	KeyUsage        int
	UnknownCritical int
}

// derTLV is one element: its tag, the whole TLV and its content.
type derTLV struct {
	tag          byte
	all, content []byte
}

// derRead reads the TLV at the start of b (X.690 §8.1, DER §10.1): one
// tag byte (the multi-byte form is refused), a definite length in the
// short form, or in 1-3 bytes with no leading zero and at least 128;
// the content must be there. It returns the element and what follows.
func derRead(b []byte) (derTLV, []byte, error) {
	if len(b) < 2 || b[0]&0x1f == 0x1f {
		return derTLV{}, nil, ErrDERMalformed
	}
	n, hdr := int(b[1]), 2
	if n >= 0x80 {
		k := n & 0x7f
		if k == 0 || k > 3 || len(b) < 2+k || b[2] == 0 {
			return derTLV{}, nil, ErrDERMalformed
		}
		n = 0
		for _, c := range b[2 : 2+k] {
			n = n<<8 | int(c)
		}
		if n < 0x80 {
			return derTLV{}, nil, ErrDERMalformed
		}
		hdr += k
	}
	if len(b)-hdr < n {
		return derTLV{}, nil, ErrDERMalformed
	}
	return derTLV{tag: b[0], all: b[:hdr+n], content: b[hdr : hdr+n]}, b[hdr+n:], nil
}

// derExpect reads a TLV and wants tag: framing errors first, then the tag.
func derExpect(b []byte, tag byte) (derTLV, []byte, error) {
	t, rest, err := derRead(b)
	if err != nil {
		return t, nil, err
	}
	if t.tag != tag {
		return t, nil, ErrX509Malformed
	}
	return t, rest, nil
}

// x509AlgID reads an AlgorithmIdentifier's content: a non-empty OID and
// at most one parameters element of any tag, nothing more.
func x509AlgID(b []byte) (oid, params []byte, err error) {
	o, rest, err := derExpect(b, tagOID)
	if err != nil {
		return nil, nil, err
	}
	if len(o.content) == 0 {
		return nil, nil, ErrX509Malformed
	}
	if len(rest) > 0 {
		p, r2, err := derRead(rest)
		if err != nil {
			return nil, nil, err
		}
		if len(r2) != 0 {
			return nil, nil, ErrX509Malformed
		}
		params = p.all
	}
	return o.content, params, nil
}

// x509BitString is a BIT STRING's content without its unused-bits byte,
// which must be 0 (keys and signatures are whole bytes).
func x509BitString(t derTLV) ([]byte, error) {
	if len(t.content) == 0 || t.content[0] != 0 {
		return nil, ErrX509Malformed
	}
	return t.content[1:], nil
}

// x509Digits reads n decimal digits.
func x509Digits(b []byte) (int, bool) {
	v := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int(c-'0')
	}
	return v, true
}

var x509MonthDays = [12]int{31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31}
var x509DaysBefore = [12]int{0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334}

func x509Leap(y int) bool { return y%4 == 0 && (y%100 != 0 || y%400 == 0) }

// x509Time converts a UTCTime (YYMMDDHHMMSSZ, YY < 50 is 20YY) or a
// GeneralizedTime (YYYYMMDDHHMMSSZ) to Unix seconds (RFC 5280 §4.1.2.5):
// a wrong tag is x509_malformed; a wrong length, a non-digit, no Z, a
// year before 1950, a month, day, hour, minute or second out of range
// (no leap second) is x509_time.
func x509Time(t derTLV) (int64, error) {
	var y int
	var rest []byte
	var ok bool
	switch t.tag {
	case tagUTCTime:
		if len(t.content) != 13 {
			return 0, ErrX509Time
		}
		if y, ok = x509Digits(t.content[:2]); !ok {
			return 0, ErrX509Time
		}
		y += 1900
		if y < x509MinYear {
			y += 100
		}
		rest = t.content[2:]
	case tagGenTime:
		if len(t.content) != 15 {
			return 0, ErrX509Time
		}
		if y, ok = x509Digits(t.content[:4]); !ok {
			return 0, ErrX509Time
		}
		rest = t.content[4:]
	default:
		return 0, ErrX509Malformed
	}
	var f [5]int
	for i := range f {
		if f[i], ok = x509Digits(rest[2*i : 2*i+2]); !ok {
			return 0, ErrX509Time
		}
	}
	mo, d, h, mi, s := f[0], f[1], f[2], f[3], f[4]
	if rest[10] != 'Z' || y < x509MinYear || mo < 1 || mo > 12 || d < 1 || h > 23 || mi > 59 || s > 59 {
		return 0, ErrX509Time
	}
	dim := x509MonthDays[mo-1]
	leap := 0
	if x509Leap(y) {
		leap = 1
		if mo == 2 {
			dim++
		}
	}
	if d > dim {
		return 0, ErrX509Time
	}
	days := 365*(y-1970) + (y-1)/4 - (y-1)/100 + (y-1)/400 - (1969/4 - 1969/100 + 1969/400) +
		x509DaysBefore[mo-1] + d - 1
	if mo > 2 {
		days += leap
	}
	return int64(days)*86400 + int64(h)*3600 + int64(mi)*60 + int64(s), nil
}

// ParseX509 splits a DER certificate (RFC 5280 §4.1) into an X509Cert,
// in this order: the outer SEQUENCE filling der; its tbsCertificate
// SEQUENCE, signatureAlgorithm SEQUENCE and signature BIT STRING, nothing
// more; the signature's unused bits 0; the outer AlgorithmIdentifier;
// then the TBS: version [0] holding INTEGER 2 (else x509_version),
// serialNumber (1-21 bytes, minimal), signature (an AlgorithmIdentifier whose TLV
// equals the outer one), issuer SEQUENCE, validity (two times, nothing
// more), subject SEQUENCE, subjectPublicKeyInfo (AlgorithmIdentifier and
// a BIT STRING, nothing more), then optionally issuerUniqueID [1],
// subjectUniqueID [2], extensions [3] in that order, nothing more.
// Extensions: one non-empty SEQUENCE filling [3]; each Extension an OID,
// an optional BOOLEAN that DER only allows as TRUE (01 01 ff), an OCTET
// STRING, nothing more; the 25th is x509_too_many_extensions, an OID seen
// before x509_duplicate_extension; subjectAltName's value one non-empty
// SEQUENCE of GeneralNames (DER-framed, any tag) filling it, of which the
// dNSNames are counted and the first 16 kept; basicConstraints, keyUsage
// and extendedKeyUsage are read into Flags, PathLen and KeyUsage (see
// their functions); other critical extensions are counted. Framing errors are
// der_malformed wherever they occur, and come before the tag's check.
func ParseX509(der []byte) (*X509Cert, error) {
	c := &X509Cert{PathLen: -1}
	outer, rest, err := derExpect(der, tagSequence)
	if err != nil {
		return nil, err
	}
	if len(rest) != 0 {
		return nil, ErrX509Malformed
	}
	tbs, rest, err := derExpect(outer.content, tagSequence)
	if err != nil {
		return nil, err
	}
	alg, rest, err := derExpect(rest, tagSequence)
	if err != nil {
		return nil, err
	}
	sig, rest, err := derExpect(rest, tagBitString)
	if err != nil {
		return nil, err
	}
	if len(rest) != 0 {
		return nil, ErrX509Malformed
	}
	if c.Signature, err = x509BitString(sig); err != nil {
		return nil, err
	}
	if c.SigOID, _, err = x509AlgID(alg.content); err != nil {
		return nil, err
	}
	c.TBS, c.SigAlg = tbs.all, alg.all

	b := tbs.content
	ver, b, err := derRead(b)
	if err != nil {
		return nil, err
	}
	if ver.tag != tagVersion {
		return nil, ErrX509Version
	}
	vi, vrest, err := derExpect(ver.content, tagInteger)
	if err != nil {
		return nil, err
	}
	if len(vrest) != 0 {
		return nil, ErrX509Malformed
	}
	if len(vi.content) != 1 || vi.content[0] != x509Version3 {
		return nil, ErrX509Version
	}
	serial, b, err := derExpect(b, tagInteger)
	if err != nil {
		return nil, err
	}
	sc := serial.content
	if len(sc) == 0 || len(sc) > x509MaxSerial ||
		len(sc) > 1 && (sc[0] == 0 && sc[1] < 0x80 || sc[0] == 0xff && sc[1] >= 0x80) {
		return nil, ErrX509Malformed // empty, too long, or not minimal (X.690 §8.3.2)
	}
	c.Serial = serial.content
	talg, b, err := derExpect(b, tagSequence)
	if err != nil {
		return nil, err
	}
	if _, _, err = x509AlgID(talg.content); err != nil {
		return nil, err
	}
	if !bytes.Equal(talg.all, alg.all) {
		return nil, ErrX509Malformed
	}
	issuer, b, err := derExpect(b, tagSequence)
	if err != nil {
		return nil, err
	}
	c.Issuer = issuer.all
	validity, b, err := derExpect(b, tagSequence)
	if err != nil {
		return nil, err
	}
	nb, vr, err := derRead(validity.content)
	if err != nil {
		return nil, err
	}
	if c.NotBefore, err = x509Time(nb); err != nil {
		return nil, err
	}
	na, vr, err := derRead(vr)
	if err != nil {
		return nil, err
	}
	if c.NotAfter, err = x509Time(na); err != nil {
		return nil, err
	}
	if len(vr) != 0 {
		return nil, ErrX509Malformed
	}
	subject, b, err := derExpect(b, tagSequence)
	if err != nil {
		return nil, err
	}
	c.Subject = subject.all
	spki, b, err := derExpect(b, tagSequence)
	if err != nil {
		return nil, err
	}
	c.SPKI = spki.all
	kalg, kr, err := derExpect(spki.content, tagSequence)
	if err != nil {
		return nil, err
	}
	if c.SPKIOID, c.SPKIParams, err = x509AlgID(kalg.content); err != nil {
		return nil, err
	}
	key, kr, err := derExpect(kr, tagBitString)
	if err != nil {
		return nil, err
	}
	if len(kr) != 0 {
		return nil, ErrX509Malformed
	}
	if c.SPKIKey, err = x509BitString(key); err != nil {
		return nil, err
	}
	if len(b) == 0 {
		return c, nil
	}
	t, b, err := derRead(b)
	if err != nil {
		return nil, err
	}
	for _, optional := range []byte{tagIssuerUID, tagSubjectUID} {
		if t.tag == optional {
			if len(b) == 0 {
				return c, nil
			}
			if t, b, err = derRead(b); err != nil {
				return nil, err
			}
		}
	}
	if t.tag != tagExtensions || len(b) != 0 {
		return nil, ErrX509Malformed
	}
	if err := x509Extensions(c, t.content); err != nil {
		return nil, err
	}
	return c, nil
}

func x509Extensions(c *X509Cert, b []byte) error {
	seq, rest, err := derExpect(b, tagSequence)
	if err != nil {
		return err
	}
	if len(rest) != 0 || len(seq.content) == 0 {
		return ErrX509Malformed
	}
	for b = seq.content; len(b) > 0; {
		var ext derTLV
		if ext, b, err = derExpect(b, tagSequence); err != nil {
			return err
		}
		oid, r, err := derExpect(ext.content, tagOID)
		if err != nil {
			return err
		}
		if len(oid.content) == 0 {
			return ErrX509Malformed
		}
		e := X509Extension{OID: oid.content}
		t, r, err := derRead(r)
		if err != nil {
			return err
		}
		if t.tag == tagBoolean {
			if len(t.content) != 1 || t.content[0] != 0xff {
				return ErrX509Malformed
			}
			e.Critical = true
			if t, r, err = derRead(r); err != nil {
				return err
			}
		}
		if t.tag != tagOctetString || len(r) != 0 {
			return ErrX509Malformed
		}
		e.Value = t.content
		if len(c.Extensions) == X509MaxExtensions {
			return ErrX509TooManyExtensions
		}
		for _, prev := range c.Extensions {
			if bytes.Equal(prev.OID, e.OID) {
				return ErrX509DuplicateExtension
			}
		}
		c.Extensions = append(c.Extensions, e)
		switch {
		case bytes.Equal(e.OID, oidSubjectAltName):
			err = x509SAN(c, e.Value)
		case bytes.Equal(e.OID, oidBasicConstraints):
			err = x509BasicConstraints(c, e.Value)
		case bytes.Equal(e.OID, oidKeyUsage):
			err = x509KeyUsage(c, e.Value)
		case bytes.Equal(e.OID, oidExtKeyUsage):
			err = x509ExtKeyUsage(c, e.Value)
		case e.Critical:
			c.UnknownCritical++
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// x509BasicConstraints: a SEQUENCE filling the value, holding an optional
// BOOLEAN that DER only allows as TRUE, then an optional INTEGER 0..255
// in minimal form, nothing more (RFC 5280 §4.2.1.9).
func x509BasicConstraints(c *X509Cert, b []byte) error {
	seq, rest, err := derExpect(b, tagSequence)
	if err != nil {
		return err
	}
	if len(rest) != 0 {
		return ErrX509Malformed
	}
	c.Flags |= X509BasicConstraints
	b = seq.content
	if len(b) == 0 {
		return nil
	}
	t, b, err := derRead(b)
	if err != nil {
		return err
	}
	if t.tag == tagBoolean {
		if len(t.content) != 1 || t.content[0] != 0xff {
			return ErrX509Malformed
		}
		c.Flags |= X509CA
		if len(b) == 0 {
			return nil
		}
		if t, b, err = derRead(b); err != nil {
			return err
		}
	}
	v := t.content
	if t.tag != tagInteger || len(b) != 0 {
		return ErrX509Malformed
	}
	switch {
	case len(v) == 1 && v[0] < 0x80:
		c.PathLen = int(v[0])
	case len(v) == 2 && v[0] == 0 && v[1] >= 0x80:
		c.PathLen = int(v[1])
	default:
		return ErrX509Malformed
	}
	return nil
}

// x509KeyUsage: a BIT STRING filling the value with one or two bytes of
// bits and at most 7 unused bits (RFC 5280 §4.2.1.3).
func x509KeyUsage(c *X509Cert, b []byte) error {
	t, rest, err := derExpect(b, tagBitString)
	if err != nil {
		return err
	}
	v := t.content
	if len(rest) != 0 || len(v) < 2 || len(v) > 3 || v[0] > 7 {
		return ErrX509Malformed
	}
	c.Flags |= X509KeyUsage
	c.KeyUsage = int(v[1]) << 8
	if len(v) == 3 {
		c.KeyUsage |= int(v[2])
	}
	return nil
}

// x509ExtKeyUsage: one non-empty SEQUENCE of non-empty OIDs filling the
// value (RFC 5280 §4.2.1.12).
func x509ExtKeyUsage(c *X509Cert, b []byte) error {
	seq, rest, err := derExpect(b, tagSequence)
	if err != nil {
		return err
	}
	if len(rest) != 0 || len(seq.content) == 0 {
		return ErrX509Malformed
	}
	c.Flags |= X509ExtKeyUsage
	for b = seq.content; len(b) > 0; {
		var o derTLV
		if o, b, err = derExpect(b, tagOID); err != nil {
			return err
		}
		switch {
		case len(o.content) == 0:
			return ErrX509Malformed
		case bytes.Equal(o.content, oidEKUServerAuth):
			c.Flags |= X509EKUServerAuth
		case bytes.Equal(o.content, oidEKUAny):
			c.Flags |= X509EKUAny
		}
	}
	return nil
}

func x509SAN(c *X509Cert, b []byte) error {
	seq, rest, err := derExpect(b, tagSequence)
	if err != nil {
		return err
	}
	if len(rest) != 0 || len(seq.content) == 0 {
		return ErrX509Malformed
	}
	for b = seq.content; len(b) > 0; {
		var gn derTLV
		if gn, b, err = derRead(b); err != nil {
			return err
		}
		if gn.tag == tagDNSName {
			if c.DNSCount < X509MaxDNSNames {
				c.DNSNames = append(c.DNSNames, gn.content)
			}
			c.DNSCount++
		}
	}
	return nil
}
