package appliance

import (
	"encoding/binary"
)

// The digests of the kernel's handshake-message self-test (kernel/selftest/
// tls_selftest.inc, "tls13-ch" and "tls13-hs"), computed with the Go
// reference of tls13hs.go.

// Kinds of entries in the 'TLSHS   ' vector section.
const (
	tlsHSKindServerHello         = 1                // our session id (32 bytes), then a ServerHello body
	tlsHSKindEncryptedExtensions = 2                // an EncryptedExtensions body
	tlsHSKindFraming             = 3                // u32 max, u32 chunk, then a byte stream
	tlsHSCorpusSeed              = 0x7473_3133_6873 // fixed: the corpus is the same every run
)

// tlsHSServerHello builds a ServerHello body: version, the HRR random or
// 32 bytes of 0x5a, the session id, suite, compression and the extensions
// (each already framed), in a block of their own.
func tlsHSServerHello(version int, hrr bool, sid []byte, suite, comp int, exts ...[]byte) []byte {
	b := appendU16(nil, version)
	if hrr {
		b = append(b, tlsHRRRandom...)
	} else {
		for i := 0; i < TLSRandomLen; i++ {
			b = append(b, 0x5a)
		}
	}
	b = append(b, byte(len(sid)))
	b = append(b, sid...)
	b = appendU16(b, suite)
	b = append(b, byte(comp))
	var e []byte
	for _, x := range exts {
		e = append(e, x...)
	}
	b = appendU16(b, len(e))
	return append(b, e...)
}

func tlsExt(typ int, data []byte) []byte {
	return append(appendU16(appendU16(nil, typ), len(data)), data...)
}

// tlsHSCorpusEntries is the handshake corpus, each entry a kind byte and
// its payload: valid ServerHellos and HelloRetryRequests (both suites,
// extension orders, cookies) and, from each, every truncation and 48
// random single-byte changes; hand-made refusals; EncryptedExtensions the
// same way; framing streams of random messages fed in chunks of 1 byte to
// the whole, under maxima that fit and that do not.
func tlsHSCorpusEntries() [][]byte {
	rng := &splitmix64{state: tlsHSCorpusSeed}
	sid := make([]byte, TLSSessionIDLen)
	fillRandom(rng, sid)
	key := make([]byte, TLSX25519Len)
	fillRandom(rng, key)
	sv := tlsExt(tlsExtSupportedVersions, []byte{3, 4})
	ks := tlsExt(tlsExtKeyShare, append([]byte{0, 0x1d, 0, 32}, key...))
	hrrKS := tlsExt(tlsExtKeyShare, []byte{0, 0x17})
	cookie := tlsExt(tlsExtCookie, []byte{0, 3, 1, 2, 3})
	var out [][]byte
	sh := func(body []byte) { out = append(out, append(append([]byte{tlsHSKindServerHello}, sid...), body...)) }
	ee := func(body []byte) { out = append(out, append([]byte{tlsHSKindEncryptedExtensions}, body...)) }
	damage := func(add func([]byte), body []byte) {
		add(body)
		for n := 0; n < len(body); n++ {
			add(body[:n])
		}
		for i := 0; i < 48; i++ {
			r := rng.next()
			b := append([]byte(nil), body...)
			b[r%uint64(len(b))] = byte(r >> 32)
			add(b)
		}
	}
	valid := [][]byte{
		tlsHSServerHello(0x0303, false, sid, 0x1301, 0, sv, ks),
		tlsHSServerHello(0x0303, false, sid, 0x1303, 0, ks, sv),
		tlsHSServerHello(0x0303, true, sid, 0x1303, 0, sv, hrrKS),
		tlsHSServerHello(0x0303, true, sid, 0x1301, 0, cookie, sv, hrrKS),
	}
	for _, b := range valid {
		damage(sh, b)
	}
	for _, b := range [][]byte{
		tlsHSServerHello(0x0302, false, sid, 0x1303, 0, sv, ks),
		tlsHSServerHello(0x0303, false, key, 0x1303, 0, sv, ks),
		tlsHSServerHello(0x0303, false, nil, 0x1303, 0, sv, ks),
		tlsHSServerHello(0x0303, false, sid, 0x1302, 0, sv, ks),
		tlsHSServerHello(0x0303, false, sid, 0x1303, 1, sv, ks),
		tlsHSServerHello(0x0303, false, sid, 0x1303, 0)[:2+32+1+32+3],
		tlsHSServerHello(0x0303, false, sid, 0x1303, 0, tlsExt(0xff01, []byte{0})),
		tlsHSServerHello(0x0303, false, sid, 0x1303, 0, tlsExt(tlsExtSupportedVersions, []byte{3, 3}), ks),
		tlsHSServerHello(0x0303, false, sid, 0x1303, 0, sv, ks, ks),
		tlsHSServerHello(0x0303, false, sid, 0x1303, 0, sv, sv, ks),
		tlsHSServerHello(0x0303, true, sid, 0x1303, 0, sv, cookie, cookie),
		tlsHSServerHello(0x0303, false, sid, 0x1303, 0, sv, ks, cookie),
		tlsHSServerHello(0x0303, false, sid, 0x1303, 0, sv, ks, tlsExt(tlsExtPreSharedKey, []byte{0, 0})),
		tlsHSServerHello(0x0303, false, sid, 0x1303, 0, tlsExt(0x1234, nil), sv, ks),
		tlsHSServerHello(0x0303, false, sid, 0x1303, 0, sv),
		tlsHSServerHello(0x0303, false, sid, 0x1303, 0, sv, tlsExt(tlsExtKeyShare, append([]byte{0, 0x17, 0, 65}, make([]byte, 65)...))),
		tlsHSServerHello(0x0303, false, sid, 0x1303, 0, sv, tlsExt(tlsExtKeyShare, append([]byte{0, 0x1d, 0, 31}, key[:31]...))),
		tlsHSServerHello(0x0303, false, sid, 0x1303, 0, sv, tlsExt(tlsExtKeyShare, []byte{0, 0x1d, 0, 0})),
		tlsHSServerHello(0x0303, true, sid, 0x1303, 0, sv, tlsExt(tlsExtKeyShare, []byte{0, 0x1d})),
		tlsHSServerHello(0x0303, true, sid, 0x1303, 0, sv, tlsExt(tlsExtKeyShare, []byte{0, 0x18})),
		tlsHSServerHello(0x0303, true, sid, 0x1303, 0, sv),
		tlsHSServerHello(0x0303, true, sid, 0x1303, 0, sv, tlsExt(tlsExtCookie, []byte{0, 0})),
		append(tlsHSServerHello(0x0303, false, sid, 0x1303, 0, sv, ks), 0),
		append(tlsHSServerHello(0x0303, false, sid, 0x1303, 0), 0xff, 0xff, 0, 43),
	} {
		sh(b)
	}
	sni := tlsExt(tlsExtServerName, nil)
	groups := tlsExt(tlsExtSupportedGroups, []byte{0, 6, 0, 0x1d, 0, 0x17, 0, 0x18})
	block := func(exts ...[]byte) []byte {
		var e []byte
		for _, x := range exts {
			e = append(e, x...)
		}
		return append(appendU16(nil, len(e)), e...)
	}
	for _, b := range [][]byte{block(), block(sni), block(groups, sni)} {
		damage(ee, b)
	}
	for _, typ := range []int{1, 5, 13, 14, 15, 16, 18, 19, 20, 21, 28, 41, 42, 43, 44, 45, 47, 48, 49, 50, 51, 0xff01, 0x3374} {
		ee(block(sni, tlsExt(typ, []byte{0, 0})))
	}
	ee(block(sni, sni))
	ee(block(groups, groups))
	ee(block(tlsExt(tlsExtServerName, []byte{0})))
	ee(block(tlsExt(tlsExtSupportedGroups, []byte{0, 3, 0, 0x1d, 0})))
	ee(block(tlsExt(tlsExtSupportedGroups, []byte{0, 0})))
	ee([]byte{0xff, 0xff, 0, 0})

	for i := 0; i < 64; i++ {
		r := rng.next()
		var stream []byte
		for m := 0; m < int(1+r%5); m++ {
			n := int(rng.next() % 700)
			msg := []byte{byte(1 + m), byte(n >> 16), byte(n >> 8), byte(n)}
			body := make([]byte, n)
			fillRandom(rng, body)
			stream = append(stream, append(msg, body...)...)
		}
		switch r >> 8 % 4 {
		case 1: // ends mid-message
			stream = stream[:int((r>>16)%uint64(len(stream)))]
		case 2: // a header of 2^24 - 1 bytes
			stream = append(stream, 11, 0xff, 0xff, 0xff, 1, 2, 3)
		}
		maxes := []int{1 << 14, 1 << 14, 300, 699}
		chunks := []int{1, 3, 7, 100, 1000, 1 << 14}
		f := binary.LittleEndian.AppendUint32([]byte{tlsHSKindFraming}, uint32(maxes[r>>24%4]))
		f = binary.LittleEndian.AppendUint32(f, uint32(chunks[r>>32%6]))
		out = append(out, append(f, stream...))
	}
	for _, n := range []int{0, 99, 100, 101} { // at the maximum of 100, either side, and empty
		for _, chunk := range []uint32{1, 7, 1000} {
			f := binary.LittleEndian.AppendUint32([]byte{tlsHSKindFraming}, 100)
			f = binary.LittleEndian.AppendUint32(f, chunk)
			f = append(f, 20, 0, byte(n>>8), byte(n))
			f = append(f, make([]byte, n)...)
			out = append(out, append(f, 24, 0, 0, 1, 0))
		}
	}
	return out
}

// TLSHSSection is the kernel's 'TLSHS   ' vector section: the corpus's
// entries, each as u32 little-endian length and bytes.
func TLSHSSection() []byte {
	var out []byte
	for _, e := range tlsHSCorpusEntries() {
		out = binary.LittleEndian.AppendUint32(out, uint32(len(e)))
		out = append(out, e...)
	}
	return out
}

// tlsHSFrameDigest feeds stream to a reader of max-byte messages, chunk
// bytes at a time: after each feed it folds the bytes taken, then every
// whole message (0 and its bytes) and the reason that stopped Next; it
// ends after handshake_too_large, at the stream's end, or when a feed
// takes nothing.
func tlsHSFrameDigest(d *digest, stream []byte, chunk, max int) {
	h := NewTLSHSReader(max)
	off := 0
	for {
		take := 0
		if off < len(stream) {
			take = h.Feed(stream[off:min(off+chunk, len(stream))])
			d.add(uint64(take))
			off += take
		}
		var err error
		for {
			var msg []byte
			if msg, err = h.Next(); err != nil {
				break
			}
			d.add(0)
			digestBytes(d, msg)
		}
		d.add(uint64(TLSHSReasonIndex(err)))
		if err == ErrTLSHandshakeTooLarge || off == len(stream) || take == 0 {
			return
		}
	}
}

// TLSHSDigest is the "tls13-hs" digest over a 'TLSHS   ' section's
// entries: for each, its kind, then
//   - a ServerHello: the reason's index in TLSHSReasons; when accepted the
//     suite, 1 for a HelloRetryRequest (else 0), the group, the key and
//     the cookie (each as bytes, empty when absent);
//   - EncryptedExtensions: the reason's index, then the TLSEE* bits (0 on
//     a refusal);
//   - a framing stream: as tlsHSFrameDigest.
func TLSHSDigest() uint64 {
	d := newDigest()
	for _, e := range tlsHSCorpusEntries() {
		d.add(uint64(e[0]))
		switch e[0] {
		case tlsHSKindServerHello:
			sh, err := ParseServerHello(e[1+TLSSessionIDLen:], e[1:1+TLSSessionIDLen])
			d.add(uint64(TLSHSReasonIndex(err)))
			if err == nil {
				hrr := uint64(0)
				if sh.HRR {
					hrr = 1
				}
				d.add(uint64(sh.Suite))
				d.add(hrr)
				d.add(uint64(sh.Group))
				digestBytes(&d, sh.Key)
				digestBytes(&d, sh.Cookie)
			}
		case tlsHSKindEncryptedExtensions:
			bits, err := ParseEncryptedExtensions(e[1:])
			d.add(uint64(TLSHSReasonIndex(err)))
			d.add(uint64(bits))
		case tlsHSKindFraming:
			max := binary.LittleEndian.Uint32(e[1:])
			chunk := binary.LittleEndian.Uint32(e[5:])
			tlsHSFrameDigest(&d, e[9:], int(chunk), int(max))
		}
	}
	return uint64(d)
}

// TLSClientHelloDigest is the "tls13-ch" digest: CryptoSelfTestCases
// cases from the splitmix64 stream of seed, each
//
//	r = next(); AES first when r & 1; host name length (r >> 8) & 255
//	(0, 254 and 255 are refused); random and session id (64 bytes), the
//	key share (32), the host name, each filled from the stream; fold the
//	reason's index in TLSHSReasons and the message (empty on a refusal),
//	then the name of alert (r >> 16) & 255 (RFC 8446 §6).
func TLSClientHelloDigest(seed uint32) uint64 {
	rng := &splitmix64{state: uint64(seed)}
	d := newDigest()
	for i := 0; i < CryptoSelfTestCases; i++ {
		r := rng.next()
		p := &TLSClientHelloParams{PreferAES: r&1 != 0, HostName: make([]byte, r>>8&255)}
		rs := make([]byte, TLSRandomLen+TLSSessionIDLen)
		fillRandom(rng, rs)
		copy(p.Random[:], rs)
		copy(p.SessionID[:], rs[TLSRandomLen:])
		fillRandom(rng, p.KeyShare[:])
		fillRandom(rng, p.HostName)
		ch, err := BuildClientHello(p)
		d.add(uint64(TLSHSReasonIndex(err)))
		digestBytes(&d, ch)
		digestBytes(&d, []byte(TLSAlertName(byte(r>>16))))
	}
	return uint64(d)
}
