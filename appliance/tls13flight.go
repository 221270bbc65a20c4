package appliance

import (
	"bytes"
	"crypto/elliptic"
	"errors"
	"io"
	"os"
)

// Whole client handshakes recorded from real servers, replayed through
// the reference client (TLSClientConnect, ReadRecord) and, in the kernel's
// crypto boot, through the state machine of kernel/tls/client.inc
// ("selftest digest tls13-client"): both must name the same verdict and
// produce the same bytes.

// TLSFlightCorpusPath holds the recorded exchanges.
const TLSFlightCorpusPath = "testdata/tlsflight/cases.bin"

// TLSFlightRandLen is what the client draws: random, session id, x25519
// private key, and the P-256 scalar a HelloRetryRequest selecting
// secp256r1 asks for (read only then).
const TLSFlightRandLen = 128

// ErrTLSFlightEnd is the end of a recorded flight before the verdict
// ("eof" in the kernel's digest).
var ErrTLSFlightEnd = errors.New("eof")

// TLSFlightCase is one recorded exchange: the client's inputs and every
// byte the server sent (handshake, tickets, the response, close_notify).
type TLSFlightCase struct {
	Now       int64
	Host      string
	Anchors   [][]byte
	Rand      [TLSFlightRandLen]byte
	PreferAES bool
	Server    []byte
}

// EncodeTLSFlightCases writes per case (little-endian): u64 now, u16 host
// length, host, u8 anchors and per anchor u32 length and DER, the 128
// client bytes, u8 PreferAES, u32 length and the server's bytes.
func EncodeTLSFlightCases(cases []TLSFlightCase) []byte {
	var w caseWriter
	for _, c := range cases {
		w.timeHost(c.Now, c.Host)
		w.list(c.Anchors)
		w.bytes(c.Rand[:])
		if c.PreferAES {
			w.byte(1)
		} else {
			w.byte(0)
		}
		w.blob(c.Server)
	}
	return w.out
}

// DecodeTLSFlightCases reads EncodeTLSFlightCases's format.
func DecodeTLSFlightCases(b []byte) ([]TLSFlightCase, error) {
	var out []TLSFlightCase
	r := caseReader{b}
	for r.more() {
		var c TLSFlightCase
		var err error
		if c.Now, c.Host, err = r.timeHost(); err != nil {
			return nil, err
		}
		if c.Anchors, err = r.list(); err != nil {
			return nil, err
		}
		rnd, err := r.take(TLSFlightRandLen + 1)
		if err != nil {
			return nil, err
		}
		copy(c.Rand[:], rnd)
		c.PreferAES = rnd[TLSFlightRandLen] == 1
		if c.Server, err = r.blob(); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// flightConn replays a server's bytes and keeps what the client writes.
type flightConn struct {
	in  *bytes.Reader
	out []byte
}

func (f *flightConn) Read(b []byte) (int, error) {
	n, _ := f.in.Read(b)
	if n == 0 {
		return 0, ErrTLSFlightEnd
	}
	return n, nil
}

func (f *flightConn) Write(b []byte) (int, error) {
	f.out = append(f.out, b...)
	return len(b), nil
}

// TLSFlightResult is what a replay gives.
type TLSFlightResult struct {
	Err       error // nil: the server's close_notify ended it
	PeerAlert bool  // Err is an alert the server sent
	Conn      *TLSClientConn
	Out       []byte // every byte the client sent
	Data      []byte // the application data received
}

// ReplayTLSFlight runs the reference client against a recorded flight:
// the handshake, then records up to close_notify.
func ReplayTLSFlight(c TLSFlightCase) TLSFlightResult {
	f := &flightConn{in: bytes.NewReader(c.Server)}
	cl, err := TLSClientConnect(f, TLSClientConfig{Host: c.Host, Now: c.Now, Anchors: c.Anchors,
		Rand: bytes.NewReader(c.Rand[:]), PreferAES: c.PreferAES})
	res := TLSFlightResult{Conn: cl}
	for err == nil {
		var d []byte
		d, err = cl.ReadRecord()
		res.Data = append(res.Data, d...)
	}
	if err == io.EOF {
		err = nil
	}
	var ae *TLSAlertError
	if errors.As(err, &ae) {
		res.PeerAlert = true
		err = errors.New(ae.Name)
	}
	res.Err, res.Out = err, f.out
	return res
}

// tlsFlightCorpus is the recorded cases, then per case: the host with one
// more label (the ClientHello, so the transcript and the handshake keys,
// change with it: bad_record_mac), the time past the leaf's life, the
// flight cut at 8 places, and 24 copies with one byte changed; then the
// first case's client against made-up HelloRetryRequests
// (tlsSynthRetries).
func tlsFlightCorpus(path string) ([]TLSFlightCase, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	base, err := DecodeTLSFlightCases(raw)
	if err != nil {
		return nil, err
	}
	rng := &splitmix64{state: 0x746c73666c74}
	out := append([]TLSFlightCase(nil), base...)
	for _, c := range base {
		h := c
		h.Host = "x." + c.Host
		out = append(out, h)
		late := c
		late.Now = c.Now + 400*24*3600
		out = append(out, late)
		for m := 0; m < 8; m++ {
			d := c
			d.Server = c.Server[:rng.next()%uint64(len(c.Server))]
			out = append(out, d)
		}
		for m := 0; m < 24; m++ {
			r := rng.next()
			d := c
			d.Server = append([]byte(nil), c.Server...)
			d.Server[(r>>8)%uint64(len(d.Server))] ^= byte(r>>40) | 1
			out = append(out, d)
		}
	}
	return append(out, tlsSynthRetries(base[0])...), nil
}

// tlsSynthRetries is c's client facing made-up servers that answer with
// HelloRetryRequests, well formed and not (§4.1.4): a second HRR, one
// selecting x25519 or secp384r1, one changing nothing, a cookie over
// TLSCookieMax and one of exactly TLSCookieMax, a ChangeCipherSpec other
// than the byte 1, a ServerHello after it with another suite, with an
// x25519 share or a point off the curve after secp256r1, with a P-256
// share after a cookie-only HRR; and two that derive the handshake keys
// from a good share (P-256's generator, x25519's base point) before the
// flight ends.
func tlsSynthRetries(c TLSFlightCase) []TLSFlightCase {
	sid := c.Rand[TLSRandomLen : TLSRandomLen+TLSSessionIDLen]
	chacha, aes := TLSSuiteChaCha20Poly1305SHA256, TLSSuiteAES128GCMSHA256
	ext := func(typ int, data []byte) []byte {
		return append(appendU16(appendU16(nil, typ), len(data)), data...)
	}
	hello := func(random []byte, suite uint16, exts ...[]byte) []byte {
		var e []byte
		e = append(e, ext(tlsExtSupportedVersions, []byte{3, 4})...)
		for _, x := range exts {
			e = append(e, x...)
		}
		b := append([]byte{3, 3}, random...)
		b = append(append(b, byte(len(sid))), sid...)
		b = append(appendU16(b, int(suite)), 0)
		b = append(appendU16(b, len(e)), e...)
		msg := append([]byte{TLSHSServerHello, 0, byte(len(b) >> 8), byte(len(b))}, b...)
		return append([]byte{TLSContentHandshake, 3, 3, byte(len(msg) >> 8), byte(len(msg))}, msg...)
	}
	group := func(g uint16) []byte { return ext(tlsExtKeyShare, appendU16(nil, int(g))) }
	cookie := func(n int) []byte {
		ck := make([]byte, n)
		for i := range ck {
			ck[i] = byte(i * 7)
		}
		return ext(tlsExtCookie, append(appendU16(nil, n), ck...))
	}
	share := func(g uint16, key []byte) []byte {
		return ext(tlsExtKeyShare, append(appendU16(appendU16(nil, int(g)), len(key)), key...))
	}
	hrr := func(suite uint16, exts ...[]byte) []byte { return hello(tlsHRRRandom, suite, exts...) }
	sh := func(suite uint16, g uint16, key []byte) []byte {
		return hello(bytes.Repeat([]byte{0x5a}, TLSRandomLen), suite, share(g, key))
	}
	ccs := []byte{tlsContentCCS, 3, 3, 0, 1, 1}
	gen := elliptic.Marshal(elliptic.P256(), elliptic.P256().Params().Gx, elliptic.P256().Params().Gy)
	offCurve := append([]byte{4}, make([]byte, 64)...)
	offCurve[64] = 1
	base := make([]byte, TLSX25519Len)
	base[0] = 9
	join := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	p256 := hrr(chacha, group(TLSGroupSecp256r1))
	only := hrr(chacha, cookie(40))
	var out []TLSFlightCase
	for _, server := range [][]byte{
		join(p256, ccs, hrr(chacha, group(TLSGroupSecp256r1))),
		hrr(chacha, group(TLSGroupX25519)),
		hrr(chacha, group(0x0018)),
		hrr(chacha),
		hrr(chacha, group(TLSGroupSecp256r1), cookie(TLSCookieMax+1)),
		join(hrr(aes, group(TLSGroupSecp256r1), cookie(TLSCookieMax)), ccs),
		join(p256, []byte{tlsContentCCS, 3, 3, 0, 2, 1, 1}),
		join(p256, ccs, sh(aes, TLSGroupSecp256r1, gen)),
		join(p256, ccs, sh(chacha, TLSGroupX25519, base)),
		join(p256, ccs, sh(chacha, TLSGroupSecp256r1, offCurve)),
		join(only, sh(chacha, TLSGroupSecp256r1, gen)),
		join(p256, ccs, sh(chacha, TLSGroupSecp256r1, gen)),
		join(only, ccs, sh(chacha, TLSGroupX25519, base)),
	} {
		d := c
		d.Server = server
		out = append(out, d)
	}
	return out
}

// TLSFlightSection is the kernel's 'TLSFLT  ' vector section.
func TLSFlightSection(path string) ([]byte, error) {
	cases, err := tlsFlightCorpus(path)
	if err != nil {
		return nil, err
	}
	return EncodeTLSFlightCases(cases), nil
}

// TLSFlightDigest is the "tls13-client" digest: per case every byte the
// client sent, the application data's bytes and their count, the
// verdict's name (each byte, then its length; "ok" for the server's
// close_notify) and whether the server sent it as an alert; once the
// handshake is done the suite, the CertificateVerify's scheme, the
// certificates listed and on the path. It also returns the number of
// cases.
func TLSFlightDigest(path string) (uint64, int, error) {
	cases, err := tlsFlightCorpus(path)
	if err != nil {
		return 0, 0, err
	}
	d := newDigest()
	for _, c := range cases {
		r := ReplayTLSFlight(c)
		for _, b := range r.Out {
			d.add(uint64(b))
		}
		for _, b := range r.Data {
			d.add(uint64(b))
		}
		d.add(uint64(len(r.Data)))
		name := "ok"
		if r.Err != nil {
			name = r.Err.Error()
		}
		for i := 0; i < len(name); i++ {
			d.add(uint64(name[i]))
		}
		d.add(uint64(len(name)))
		if r.PeerAlert {
			d.add(1)
		} else {
			d.add(0)
		}
		if r.Conn != nil {
			d.add(uint64(r.Conn.Suite))
			d.add(uint64(r.Conn.Scheme))
			d.add(uint64(r.Conn.Listed))
			d.add(uint64(len(r.Conn.Path.Listed)))
		}
	}
	return uint64(d), len(cases), nil
}
