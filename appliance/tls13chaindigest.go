package appliance

import (
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
	var w caseWriter
	for _, c := range cases {
		w.timeHost(c.Now, c.Host)
		w.list(c.List)
		w.list(c.Anchors)
	}
	return w.out
}

// DecodeX509ChainCases reads EncodeX509ChainCases's format.
func DecodeX509ChainCases(b []byte) ([]X509ChainCase, error) {
	var out []X509ChainCase
	r := caseReader{b}
	for r.more() {
		var c X509ChainCase
		var err error
		if c.Now, c.Host, err = r.timeHost(); err != nil {
			return nil, err
		}
		if c.List, err = r.list(); err != nil {
			return nil, err
		}
		if c.Anchors, err = r.list(); err != nil {
			return nil, err
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
