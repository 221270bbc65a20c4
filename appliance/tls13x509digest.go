package appliance

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"sort"
)

// The digest of the kernel's X.509 reader self-test ("x509", kernel/
// selftest/tls_selftest.inc) over the 'X509DER ' vector section, computed
// with the Go reference of tls13x509.go.

// X509TestdataDir holds the corpus's certificates (from this package's
// directory): Debian's copies of real roots and generated test chains;
// see its README.
const X509TestdataDir = "testdata/x509"

// derEnc encodes one DER element (short or long definite length).
func derEnc(tag byte, parts ...[]byte) []byte {
	var c []byte
	for _, p := range parts {
		c = append(c, p...)
	}
	n := len(c)
	switch {
	case n < 0x80:
		return append([]byte{tag, byte(n)}, c...)
	case n < 0x100:
		return append([]byte{tag, 0x81, byte(n)}, c...)
	case n < 0x10000:
		return append([]byte{tag, 0x82, byte(n >> 8), byte(n)}, c...)
	}
	return append([]byte{tag, 0x83, byte(n >> 16), byte(n >> 8), byte(n)}, c...)
}

// x509Synth builds a small certificate from parts; each nil part takes a
// valid default.
type x509Synth struct {
	version, serial, sigAlg, outerAlg, validity, spki, tail, exts, trailer []byte
}

func (s x509Synth) der() []byte {
	alg := derEnc(tagSequence, derEnc(tagOID, []byte{0x2a, 0x86, 0x48, 0xce, 0x3d, 4, 3, 2})) // ecdsa-with-SHA256
	def := func(v, d []byte) []byte {
		if v == nil {
			return d
		}
		return v
	}
	name := derEnc(tagSequence, derEnc(0x31, derEnc(tagSequence, derEnc(tagOID, []byte{0x55, 4, 3}), derEnc(0x0c, []byte("dpxe")))))
	tbs := derEnc(tagSequence,
		def(s.version, derEnc(tagVersion, derEnc(tagInteger, []byte{2}))),
		def(s.serial, derEnc(tagInteger, []byte{1})),
		def(s.sigAlg, alg), name,
		def(s.validity, derEnc(tagSequence, derEnc(tagUTCTime, []byte("260304050607Z")), derEnc(tagGenTime, []byte("20560229123045Z")))),
		name,
		def(s.spki, derEnc(tagSequence, derEnc(tagSequence, derEnc(tagOID, []byte{0x2a, 0x86, 0x48, 0xce, 0x3d, 2, 1}), derEnc(tagOID, []byte{0x2a, 0x86, 0x48, 0xce, 0x3d, 3, 1, 7})), derEnc(tagBitString, []byte{0, 4, 1, 2, 3}))),
		s.tail,
		def(s.exts, derEnc(tagExtensions, derEnc(tagSequence, x509Ext(oidSubjectAltName, true, derEnc(tagSequence, derEnc(tagDNSName, []byte("a.test")), derEnc(0x87, []byte{10, 0, 0, 1})))))))
	return append(derEnc(tagSequence, tbs, def(s.outerAlg, alg), derEnc(tagBitString, []byte{0, 0xaa, 0xbb})), s.trailer...)
}

func x509Ext(oid []byte, critical bool, value []byte) []byte {
	var c []byte
	if critical {
		c = []byte{tagBoolean, 1, 0xff}
	}
	return derEnc(tagSequence, derEnc(tagOID, oid), c, derEnc(tagOctetString, value))
}

// x509SynthCases are hand-made certificates, one or more per check.
func x509SynthCases() [][]byte {
	san := func(names ...[]byte) []byte {
		var gs []byte
		for _, n := range names {
			gs = append(gs, derEnc(tagDNSName, n)...)
		}
		return derEnc(tagExtensions, derEnc(tagSequence, x509Ext(oidSubjectAltName, false, derEnc(tagSequence, gs))))
	}
	exts := func(list ...[]byte) []byte {
		var c []byte
		for _, e := range list {
			c = append(c, e...)
		}
		return derEnc(tagExtensions, derEnc(tagSequence, c))
	}
	many := func(n int) []byte {
		var l [][]byte
		for i := 0; i < n; i++ {
			l = append(l, x509Ext([]byte{0x2b, 6, 1, byte(i)}, false, []byte{5, 0}))
		}
		return exts(l...)
	}
	var names [][]byte
	for i := 0; i < 20; i++ {
		names = append(names, []byte{'n', byte('a' + i)})
	}
	v := func(a, b []byte, ta, tb byte) []byte {
		return derEnc(tagSequence, derEnc(ta, a), derEnc(tb, b))
	}
	out := [][]byte{
		x509Synth{}.der(),
		x509Synth{exts: []byte{}}.der(),                           // no extensions
		x509Synth{tail: derEnc(tagIssuerUID, []byte{0, 1})}.der(), // issuerUniqueID
		x509Synth{tail: append(derEnc(tagIssuerUID, []byte{0}), derEnc(tagSubjectUID, []byte{0})...)}.der(),
		x509Synth{tail: append(derEnc(tagSubjectUID, []byte{0}), derEnc(tagIssuerUID, []byte{0})...)}.der(),
		x509Synth{exts: []byte{}, tail: derEnc(tagSubjectUID, []byte{0})}.der(),
		x509Synth{version: derEnc(tagVersion, derEnc(tagInteger, []byte{1}))}.der(),
		x509Synth{version: derEnc(tagVersion, derEnc(tagInteger, []byte{0, 2}))}.der(),
		x509Synth{version: derEnc(tagVersion, derEnc(tagOctetString, []byte{2}))}.der(),
		x509Synth{version: derEnc(tagVersion, derEnc(tagInteger, []byte{2}), []byte{5, 0})}.der(),
		x509Synth{version: []byte{}}.der(), // v1: no [0]
		x509Synth{serial: derEnc(tagInteger, nil)}.der(),
		x509Synth{serial: derEnc(tagInteger, make([]byte, 21))}.der(),
		x509Synth{serial: derEnc(tagInteger, make([]byte, 22))}.der(),
		x509Synth{serial: derEnc(tagInteger, append([]byte{0}, bytes.Repeat([]byte{0x80}, 20)...))}.der(),
		x509Synth{serial: derEnc(tagInteger, []byte{0xff, 0x7f})}.der(),
		x509Synth{serial: derEnc(tagInteger, []byte{0xff, 0x80})}.der(),
		x509Synth{outerAlg: derEnc(tagSequence, derEnc(tagOID, []byte{0x2a, 0x86, 0x48, 0xce, 0x3d, 4, 3, 3}))}.der(),
		x509Synth{sigAlg: derEnc(tagSequence, derEnc(tagOID, []byte{0x2a, 0x86, 0x48, 0xce, 0x3d, 4, 3, 2}), []byte{5, 0}), outerAlg: derEnc(tagSequence, derEnc(tagOID, []byte{0x2a, 0x86, 0x48, 0xce, 0x3d, 4, 3, 2}), []byte{5, 0})}.der(),
		x509Synth{sigAlg: derEnc(tagSequence, derEnc(tagOID, nil)), outerAlg: derEnc(tagSequence, derEnc(tagOID, nil))}.der(),
		x509Synth{sigAlg: derEnc(tagSequence, derEnc(tagOID, []byte{1}), []byte{5, 0, 5, 0}), outerAlg: derEnc(tagSequence, derEnc(tagOID, []byte{1}), []byte{5, 0, 5, 0})}.der(),
		x509Synth{spki: derEnc(tagSequence, derEnc(tagSequence, derEnc(tagOID, []byte{1})), derEnc(tagBitString, []byte{1, 4}))}.der(),
		x509Synth{spki: derEnc(tagSequence, derEnc(tagSequence, derEnc(tagOID, []byte{1})), derEnc(tagBitString, nil))}.der(),
		x509Synth{spki: derEnc(tagSequence, derEnc(tagSequence, derEnc(tagOID, []byte{1})), derEnc(tagBitString, []byte{0}), []byte{5, 0})}.der(),
		x509Synth{exts: san(names...)}.der(),
		x509Synth{exts: san(names[:16]...)}.der(),
		x509Synth{exts: derEnc(tagExtensions, derEnc(tagSequence, x509Ext(oidSubjectAltName, false, derEnc(tagSequence))))}.der(),
		x509Synth{exts: derEnc(tagExtensions, derEnc(tagSequence, x509Ext(oidSubjectAltName, false, append(derEnc(tagSequence, derEnc(tagDNSName, []byte("x"))), 0))))}.der(),
		x509Synth{exts: derEnc(tagExtensions, derEnc(tagSequence))}.der(),
		x509Synth{exts: derEnc(tagExtensions, derEnc(tagSequence, x509Ext([]byte{1}, false, nil)), []byte{5, 0})}.der(),
		x509Synth{exts: exts(derEnc(tagSequence, derEnc(tagOID, []byte{0x55, 0x1d, 0x13}), []byte{1, 1, 0}, derEnc(tagOctetString, []byte{0x30, 0})))}.der(),
		x509Synth{exts: exts(derEnc(tagSequence, derEnc(tagOID, []byte{0x55, 0x1d, 0x13}), []byte{1, 1, 1}, derEnc(tagOctetString, []byte{0x30, 0})))}.der(),
		x509Synth{exts: exts(derEnc(tagSequence, derEnc(tagOID, []byte{0x55, 0x1d, 0x13}), derEnc(tagOctetString, nil), []byte{5, 0}))}.der(),
		x509Synth{exts: exts(derEnc(tagSequence, derEnc(tagOID, nil), derEnc(tagOctetString, nil)))}.der(),
		x509Synth{exts: exts(derEnc(tagSequence, derEnc(tagOID, []byte{0x55, 0x1d, 0x13}), derEnc(tagInteger, []byte{1})))}.der(),
		x509Synth{exts: exts(x509Ext(oidBasicConstraints, true, derEnc(tagSequence)), x509Ext(oidKeyUsage, true, []byte{3, 2, 7, 0x80}), x509Ext(oidBasicConstraints, false, derEnc(tagSequence)))}.der(),
		x509Synth{exts: many(24)}.der(),
		x509Synth{exts: many(25)}.der(),
		x509Synth{tail: derEnc(tagSequence)}.der(),
		x509Synth{trailer: []byte{0}}.der(),
	}
	for _, tv := range []struct {
		a, b   string
		ta, tb byte
	}{
		{"991231235959Z", "491231235959Z", tagUTCTime, tagUTCTime},
		{"500101000000Z", "20491231235959Z", tagUTCTime, tagGenTime},
		{"000229000000Z", "99991231235959Z", tagUTCTime, tagGenTime},
		{"20000229000000Z", "21000301000000Z", tagGenTime, tagGenTime},
		{"010229000000Z", "260101000000Z", tagUTCTime, tagUTCTime},   // 2001 is not leap
		{"21000229000000Z", "260101000000Z", tagGenTime, tagUTCTime}, // nor is 2100
		{"260431000000Z", "260101000000Z", tagUTCTime, tagUTCTime},
		{"261301000000Z", "260101000000Z", tagUTCTime, tagUTCTime},
		{"260001000000Z", "260101000000Z", tagUTCTime, tagUTCTime},
		{"260100000000Z", "260101000000Z", tagUTCTime, tagUTCTime},
		{"260101240000Z", "260101000000Z", tagUTCTime, tagUTCTime},
		{"260101006000Z", "260101000000Z", tagUTCTime, tagUTCTime},
		{"260101000060Z", "260101000000Z", tagUTCTime, tagUTCTime},
		{"2601010000001", "260101000000Z", tagUTCTime, tagUTCTime},
		{"26010100000Z", "260101000000Z", tagUTCTime, tagUTCTime},
		{"2601010000000Z", "260101000000Z", tagUTCTime, tagUTCTime},
		{"2a0101000000Z", "260101000000Z", tagUTCTime, tagUTCTime},
		{"19491231235959Z", "260101000000Z", tagGenTime, tagUTCTime},
		{"1950010100000Z", "260101000000Z", tagGenTime, tagUTCTime},
		{"260101000000Z", "260101000000Z", tagOctetString, tagUTCTime},
		{"260101000000Z", "260101000000Z", tagUTCTime, tagOctetString},
	} {
		out = append(out, x509Synth{validity: v([]byte(tv.a), []byte(tv.b), tv.ta, tv.tb)}.der())
	}
	out = append(out, x509Synth{validity: derEnc(tagSequence, derEnc(tagUTCTime, []byte("260101000000Z")))}.der())
	out = append(out, x509Synth{validity: derEnc(tagSequence, derEnc(tagUTCTime, []byte("260101000000Z")), derEnc(tagUTCTime, []byte("260101000000Z")), []byte{5, 0})}.der())
	// DER framing of the outer element
	base := x509Synth{}.der()
	body := base[2:]
	if base[1] == 0x81 {
		body = base[3:]
	}
	out = append(out,
		append([]byte{0x30, 0x80}, body...),
		append([]byte{0x30, 0x84, 0, 0, 0, byte(len(body))}, body...),
		append([]byte{0x30, 0x82, 0, byte(len(body))}, body...),
		append([]byte{0x30, 0x81, 0x05}, body...),
		append([]byte{0x3f, 0x81, byte(len(body))}, body...),
		[]byte{0x30}, []byte{}, []byte{0x30, 0x83, 0xff, 0xff, 0xff},
	)
	return out
}

// x509SynthExtCases are hand-made certificates for the extensions the
// reader understands: basicConstraints, keyUsage, extendedKeyUsage, and
// critical ones it does not.
func x509SynthExtCases() [][]byte {
	exts := func(list ...[]byte) []byte {
		var c []byte
		for _, e := range list {
			c = append(c, e...)
		}
		return derEnc(tagExtensions, derEnc(tagSequence, c))
	}
	var out [][]byte
	bc := func(v []byte) []byte { return x509Synth{exts: exts(x509Ext(oidBasicConstraints, true, v))}.der() }
	ku := func(v []byte) []byte { return x509Synth{exts: exts(x509Ext(oidKeyUsage, true, v))}.der() }
	eku := func(v []byte) []byte { return x509Synth{exts: exts(x509Ext(oidExtKeyUsage, false, v))}.der() }
	out = append(out,
		bc(derEnc(tagSequence)), bc(derEnc(tagSequence, []byte{1, 1, 0xff})),
		bc(derEnc(tagSequence, []byte{1, 1, 0xff, 2, 1, 0})), bc(derEnc(tagSequence, []byte{2, 1, 127})),
		bc(derEnc(tagSequence, []byte{1, 1, 0xff, 2, 2, 0, 0xff})), bc(derEnc(tagSequence, []byte{2, 2, 0, 0x7f})),
		bc(derEnc(tagSequence, []byte{2, 2, 1, 0})), bc(derEnc(tagSequence, []byte{2, 1, 0x80})),
		bc(derEnc(tagSequence, []byte{1, 1, 0})), bc(derEnc(tagSequence, []byte{1, 1, 0xff, 1, 1, 0xff})),
		bc(derEnc(tagSequence, []byte{2, 1, 0, 2, 1, 0})), bc(derEnc(tagSequence, []byte{2, 0})),
		bc(append(derEnc(tagSequence), 0)), bc(derEnc(tagOctetString)), bc(nil),
		ku([]byte{3, 2, 7, 0x80}), ku([]byte{3, 3, 7, 0x86, 0x80}), ku([]byte{3, 2, 1, 0x06}),
		ku([]byte{3, 1, 0}), ku([]byte{3, 2, 8, 0}), ku([]byte{3, 4, 0, 1, 2, 3}), ku([]byte{3, 2, 0, 1, 0}),
		ku([]byte{4, 2, 0, 1}),
		eku(derEnc(tagSequence, derEnc(tagOID, oidEKUServerAuth))),
		eku(derEnc(tagSequence, derEnc(tagOID, []byte{0x2b, 6, 1, 5, 5, 7, 3, 2}), derEnc(tagOID, oidEKUAny))),
		eku(derEnc(tagSequence)), eku(derEnc(tagSequence, derEnc(tagOID))), eku(derEnc(tagSequence, derEnc(tagInteger, []byte{1}))),
		eku(append(derEnc(tagSequence, derEnc(tagOID, oidEKUServerAuth)), 0)),
		x509Synth{exts: exts(x509Ext([]byte{0x55, 0x1d, 0x1e}, true, derEnc(tagSequence)), x509Ext([]byte{0x55, 0x1d, 0x20}, false, derEnc(tagSequence)), x509Ext([]byte{0x2b, 6, 1, 4, 1, 0x82, 0x37, 1}, true, nil))}.der(),
		x509Synth{exts: exts(x509Ext([]byte{0x55, 0x1d}, true, nil), x509Ext([]byte{0x55, 0x1d, 0x13, 0}, true, nil))}.der(),
	)
	return out
}

// x509CorpusEntries is the X.509 corpus: every certificate of testdata/x509
// in name order and the hand-made ones; each certificate whole, cut at
// lengths under 40, every 5th length and the last 40, and with 64 random
// single-byte changes; then the hand-made ones.
func x509CorpusEntries(dir string) ([][]byte, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.der"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var certs [][]byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		certs = append(certs, b)
	}
	rng := &splitmix64{state: 0x783530392d646572}
	var out [][]byte
	for _, c := range append(certs, x509Synth{}.der()) {
		out = append(out, c)
		for n := 0; n < len(c); n++ {
			if n < 40 || n%5 == 0 || n >= len(c)-40 {
				out = append(out, c[:n])
			}
		}
		for i := 0; i < 64; i++ {
			r := rng.next()
			b := append([]byte(nil), c...)
			b[r%uint64(len(b))] = byte(r >> 32)
			out = append(out, b)
		}
	}
	out = append(out, x509SynthCases()...)
	return append(out, x509SynthExtCases()...), nil
}

// X509Section is the kernel's 'X509DER ' vector section: the corpus's
// entries, each as u32 little-endian length and bytes.
func X509Section(dir string) ([]byte, error) {
	entries, err := x509CorpusEntries(dir)
	if err != nil {
		return nil, err
	}
	var out []byte
	for _, e := range entries {
		out = binary.LittleEndian.AppendUint32(out, uint32(len(e)))
		out = append(out, e...)
	}
	return out, nil
}

// X509Digest is the "x509" digest over the corpus: for each entry the
// reason's index in X509Reasons, then for an accepted certificate TBS,
// SigAlg, SigOID, Signature, Serial, Issuer, Subject (as bytes),
// NotBefore, NotAfter, SPKI, SPKIOID, SPKIParams, SPKIKey, the number of
// extensions and each one's OID, criticality (1/0) and value, DNSCount
// and the kept dNSNames, Flags, PathLen (as a 64-bit two's complement),
// KeyUsage and UnknownCritical. It also returns the number of entries.
func X509Digest(dir string) (uint64, int, error) {
	entries, err := x509CorpusEntries(dir)
	if err != nil {
		return 0, 0, err
	}
	d := newDigest()
	for _, e := range entries {
		c, err := ParseX509(e)
		d.add(uint64(X509ReasonIndex(err)))
		if err != nil {
			continue
		}
		for _, f := range [][]byte{c.TBS, c.SigAlg, c.SigOID, c.Signature, c.Serial, c.Issuer, c.Subject} {
			digestBytes(&d, f)
		}
		d.add(uint64(c.NotBefore))
		d.add(uint64(c.NotAfter))
		for _, f := range [][]byte{c.SPKI, c.SPKIOID, c.SPKIParams, c.SPKIKey} {
			digestBytes(&d, f)
		}
		d.add(uint64(len(c.Extensions)))
		for _, x := range c.Extensions {
			digestBytes(&d, x.OID)
			crit := uint64(0)
			if x.Critical {
				crit = 1
			}
			d.add(crit)
			digestBytes(&d, x.Value)
		}
		d.add(uint64(c.DNSCount))
		for _, n := range c.DNSNames {
			digestBytes(&d, n)
		}
		d.add(uint64(c.Flags))
		d.add(uint64(int64(c.PathLen)))
		d.add(uint64(c.KeyUsage))
		d.add(uint64(c.UnknownCritical))
	}
	return uint64(d), len(entries), nil
}
