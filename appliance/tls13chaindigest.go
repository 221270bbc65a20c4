package appliance

import (
	"encoding/binary"
	"errors"
	"os"
)

// The kernel's chain-check self-test ("x509chain", kernel/selftest/
// tls_selftest.inc) over the 'X509CHN ' vector section: the committed
// cases of testdata/x509chain and damaged copies, each through
// X509VerifyChain.

// X509ChainCorpusPath is the committed cases file (from this package's
// directory); see the README beside it.
const X509ChainCorpusPath = "testdata/x509chain/cases.bin"

// X509ChainCase is one check: the time, the host, the server's list and
// the anchors.
type X509ChainCase struct {
	Now     int64
	Host    string
	List    [][]byte
	Anchors [][]byte
}

// x509ChainMutants is how many damaged copies each case gets.
const x509ChainMutants = 6

var errChainCorpus = errors.New("x509chain: malformed cases file")

// EncodeX509ChainCases writes cases in the section's format: per case u64
// now, u16 host length, host, u8 count and per certificate u32 length and
// DER, for the list then the anchors (integers little-endian).
func EncodeX509ChainCases(cases []X509ChainCase) []byte {
	var out []byte
	for _, c := range cases {
		out = binary.LittleEndian.AppendUint64(out, uint64(c.Now))
		out = binary.LittleEndian.AppendUint16(out, uint16(len(c.Host)))
		out = append(out, c.Host...)
		for _, l := range [][][]byte{c.List, c.Anchors} {
			out = append(out, byte(len(l)))
			for _, d := range l {
				out = binary.LittleEndian.AppendUint32(out, uint32(len(d)))
				out = append(out, d...)
			}
		}
	}
	return out
}

// DecodeX509ChainCases reads EncodeX509ChainCases's format.
func DecodeX509ChainCases(b []byte) ([]X509ChainCase, error) {
	var out []X509ChainCase
	take := func(n int) ([]byte, error) {
		if len(b) < n {
			return nil, errChainCorpus
		}
		v := b[:n]
		b = b[n:]
		return v, nil
	}
	for len(b) > 0 {
		var c X509ChainCase
		v, err := take(10)
		if err != nil {
			return nil, err
		}
		c.Now = int64(binary.LittleEndian.Uint64(v))
		h, err := take(int(binary.LittleEndian.Uint16(v[8:])))
		if err != nil {
			return nil, err
		}
		c.Host = string(h)
		for k := 0; k < 2; k++ {
			n, err := take(1)
			if err != nil {
				return nil, err
			}
			var l [][]byte
			for i := 0; i < int(n[0]); i++ {
				ln, err := take(4)
				if err != nil {
					return nil, err
				}
				d, err := take(int(binary.LittleEndian.Uint32(ln)))
				if err != nil {
					return nil, err
				}
				l = append(l, d)
			}
			if k == 0 {
				c.List = l
			} else {
				c.Anchors = l
			}
		}
		out = append(out, c)
	}
	return out, nil
}

// x509ChainCorpus is the committed cases, then for each of them
// x509ChainMutants copies with one byte of one listed certificate changed
// or one certificate cut short (splitmix64 from a fixed seed).
func x509ChainCorpus(path string) ([]X509ChainCase, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	base, err := DecodeX509ChainCases(raw)
	if err != nil {
		return nil, err
	}
	rng := &splitmix64{state: 0x7835303963686e21}
	out := append([]X509ChainCase(nil), base...)
	for _, c := range base {
		if len(c.List) == 0 {
			continue
		}
		for m := 0; m < x509ChainMutants; m++ {
			r := rng.next()
			list := append([][]byte(nil), c.List...)
			i := int(r % uint64(len(list)))
			d := append([]byte(nil), list[i]...)
			pos := int((r >> 8) % uint64(len(d)))
			if m%3 == 2 {
				d = d[:pos]
			} else {
				d[pos] ^= byte(r>>40) | 1
			}
			list[i] = d
			out = append(out, X509ChainCase{Now: c.Now, Host: c.Host, List: list, Anchors: c.Anchors})
		}
	}
	return out, nil
}

// X509ChainSection is the kernel's 'X509CHN ' vector section.
func X509ChainSection(path string) ([]byte, error) {
	cases, err := x509ChainCorpus(path)
	if err != nil {
		return nil, err
	}
	return EncodeX509ChainCases(cases), nil
}

// X509ChainDigest is the "x509chain" digest: per case the refusal's
// X509ChainReasonIndex (0: accepted), then for an accepted one the
// path's length, each listed index and the anchor's index. It also
// returns the number of cases.
func X509ChainDigest(path string) (uint64, int, error) {
	cases, err := x509ChainCorpus(path)
	if err != nil {
		return 0, 0, err
	}
	d := newDigest()
	for _, c := range cases {
		p, err := X509VerifyChain(c.List, c.Anchors, c.Host, c.Now)
		d.add(uint64(X509ChainReasonIndex(err)))
		if err != nil {
			continue
		}
		d.add(uint64(len(p.Listed)))
		for _, i := range p.Listed {
			d.add(uint64(i))
		}
		d.add(uint64(p.Anchor))
	}
	return uint64(d), len(cases), nil
}
