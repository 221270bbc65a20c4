package appliance

import (
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
)

// Go references for the kernel's lib/ primitives (kernel/lib/sha1.inc,
// base64.inc, ws.inc): what the WebSocket client of a shard computes, and
// the self-test digests of kernel/selftest/lib_selftest.inc. SHA-1 and
// base64 come from the standard library, so the kernel is compared with an
// independent implementation.

// LibSelfTestCases is how many pseudo-random cases the kernel's lib/
// self-test runs per digest.
const LibSelfTestCases = 2048

// LibDigestNames names the lib/ digests in the order the kernel prints them.
var LibDigestNames = []string{"sha1", "base64"}

// fillRandom fills b with splitmix64 words, little-endian, as the kernel's
// lib_st_fill: one next() per started 8 bytes.
func fillRandom(rng *splitmix64, b []byte) {
	var w [8]byte
	for i := 0; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(w[:], rng.next())
		copy(b[i:], w[:])
	}
}

// digestBytes folds a byte string as the kernel's lib_st_digest_bytes: its
// length, then every 8 bytes as a little-endian word, the last zero-padded.
func digestBytes(d *digest, b []byte) {
	d.add(uint64(len(b)))
	for i := 0; i < len(b); i += 8 {
		var w [8]byte
		copy(w[:], b[i:])
		d.add(binary.LittleEndian.Uint64(w[:]))
	}
}

// LibDigests computes, for a seed, every "selftest digest" line of the
// kernel's lib/ self-test. Each digest restarts the splitmix64 stream from
// the seed.
//
//   - sha1: r = next(); n = (r >> 32) % 2100 when r & 3 == 0, else % 200;
//     n random bytes; the 20-byte SHA-1 is folded.
//   - base64: n = (next() >> 32) % 100 random bytes; the encoding is folded.
func LibDigests(seed uint32) map[string]uint64 {
	out := map[string]uint64{}
	run := func(name string, one func(rng *splitmix64, d *digest)) {
		rng := &splitmix64{state: uint64(seed)}
		d := newDigest()
		for i := 0; i < LibSelfTestCases; i++ {
			one(rng, &d)
		}
		out[name] = uint64(d)
	}
	run("sha1", func(rng *splitmix64, d *digest) {
		r := rng.next()
		lim := uint64(200)
		if r&3 == 0 {
			lim = 2100
		}
		b := make([]byte, (r>>32)%lim)
		fillRandom(rng, b)
		h := sha1.Sum(b)
		digestBytes(d, h[:])
	})
	run("base64", func(rng *splitmix64, d *digest) {
		b := make([]byte, (rng.next()>>32)%100)
		fillRandom(rng, b)
		digestBytes(d, []byte(base64.StdEncoding.EncodeToString(b)))
	})
	return out
}
