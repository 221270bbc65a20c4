package appliance

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/binary"
	"hash"
	"io"

	"golang.org/x/crypto/chacha20"
	"golang.org/x/crypto/chacha20poly1305"
	"golang.org/x/crypto/hkdf"
	"golang.org/x/crypto/poly1305"
)

// Go references for the kernel's symmetric cryptography (kernel/crypto/):
// the "selftest digest" lines of kernel/selftest/crypto_sym_selftest.inc,
// computed with the standard library and golang.org/x/crypto, so the
// kernel's NASM is compared with independent implementations. Only the
// TLS 1.3 framing (HkdfLabel, RFC 8446 §7.1) and the DRBG's construction
// are written here, because no library has them in the form the kernel
// exposes.

// CryptoSelfTestCases is how many pseudo-random cases the kernel's crypto
// self-test runs per digest.
const CryptoSelfTestCases = 2048

// CryptoDigestNames names the symmetric crypto digests in the order the
// kernel prints them.
var CryptoDigestNames = []string{
	"sha256", "sha384", "sha512", "hmac256", "hmac384", "hkdf256", "hkdf384", "tls13label",
	"chacha20", "poly1305", "chacha20poly1305", "aesgcm-soft", "aesgcm", "drbg",
}

// cryptoHash returns the constructor of the kernel's hash number n
// (0 SHA-256, 1 SHA-384, 2 SHA-512).
func cryptoHash(n int) func() hash.Hash {
	switch n {
	case 0:
		return sha256.New
	case 1:
		return sha512.New384
	}
	return sha512.New
}

// TLS13ExpandLabel is HKDF-Expand-Label(secret, label, context, length) of
// RFC 8446 §7.1: HKDF-Expand with info = uint16 length || opaque
// "tls13 "+label<7..255> || opaque context<0..255>. It panics on a label
// or context longer than 255 bytes, or a length HKDF cannot produce.
func TLS13ExpandLabel(h func() hash.Hash, secret []byte, label string, context []byte, length int) []byte {
	full := "tls13 " + label
	if len(full) > 255 || len(context) > 255 {
		panic("TLS13ExpandLabel: label or context longer than 255 bytes")
	}
	info := make([]byte, 0, 4+len(full)+len(context))
	info = binary.BigEndian.AppendUint16(info, uint16(length))
	info = append(info, byte(len(full)))
	info = append(info, full...)
	info = append(info, byte(len(context)))
	info = append(info, context...)
	out := make([]byte, length)
	if _, err := io.ReadFull(hkdf.Expand(h, secret, info), out); err != nil {
		panic("TLS13ExpandLabel: " + err.Error())
	}
	return out
}

// TLS13DeriveSecret is Derive-Secret(secret, label, messages) of RFC 8446
// §7.1: HKDF-Expand-Label(secret, label, Hash(messages), Hash.length).
func TLS13DeriveSecret(h func() hash.Hash, secret []byte, label string, messages []byte) []byte {
	th := h()
	th.Write(messages)
	return TLS13ExpandLabel(h, secret, label, th.Sum(nil), th.Size())
}

// CryptoDigests computes, for a seed, every "selftest digest" line of the
// kernel's symmetric crypto self-test. Each digest restarts the splitmix64
// stream from the seed; random bytes come from fillRandom and outputs are
// folded with digestBytes, as in LibDigests.
//
//   - sha256, sha384, sha512: r = next(); n = (r >> 32) % 2100 when
//     r & 3 == 0, else % 300; n random bytes; two cut points next() % (n+1)
//     (the kernel hashes the three pieces incrementally); the digest is
//     folded.
//   - hmac256, hmac384: r = next(); key length (r >> 8) % 200 (SHA-256) or
//     % 300 (SHA-384), message length (r >> 32) % 600; the key's random
//     bytes, then the message's; a cut point next() % (n+1) (the kernel
//     MACs the two pieces incrementally); the tag is folded.
//   - hkdf256, hkdf384: r = next(); IKM length (r >> 8 & 255) % 100, salt
//     (r >> 16 & 255) % 100, info (r >> 24 & 255) % 100, L (r >> 40) % 1200;
//     random IKM, salt, info; the PRK is folded, then the OKM.
//   - tls13label: r = next(); hash SHA-256 when r & 1 == 0, else SHA-384;
//     label length (r >> 8 & 255) % 20, context (r >> 16 & 255) % 70, L
//     (r >> 24 & 255) % 100, messages (r >> 32) % 300; random secret
//     (HashLen bytes), label, context, messages; HKDF-Expand-Label(secret,
//     label, context, L) is folded, then Derive-Secret(secret, label,
//     messages).
//   - chacha20: r = next(); length (r >> 32) % 1100, first block counter
//     (r >> 8) & 0xFFFFFF; random key (32 bytes), nonce (12), input; the
//     output is folded.
//   - poly1305: r = next(); n = (r >> 32) % 600; random key (32), message;
//     two cut points next() % (n+1) (three incremental updates); the tag
//     is folded.
//   - chacha20poly1305: r = next(); message length (r >> 32) % 1100, AAD
//     length (r >> 8 & 255) % 80; random key (32 bytes), nonce (12), AAD,
//     message; the sealed ciphertext || tag is folded; when r & 3 == 0 bit
//     (r >> 44) % (len * 8) of it is flipped; Open's verdict is folded as 1
//     (opened) or 0 (refused).
//   - aesgcm-soft, aesgcm: the same with AES-128-GCM (16-byte key); the
//     kernel runs it on its software path, then on the CPU's (AES-NI and
//     PCLMULQDQ when present), and both must equal crypto/aes with
//     cipher.NewGCM.
//   - drbg: the generator's construction with the CPU's sources off
//     (DRBG mirrors it): r = next(); seed length (r >> 8 & 255) % 64,
//     random seed, init; (r >> 16 & 65535) % 300 bytes generated and
//     folded; reseed input length (r >> 32 & 255) % 48, random, reseed;
//     (r >> 40 & 65535) % 300 bytes generated and folded; the key folded.
func CryptoDigests(seed uint32) map[string]uint64 {
	out := map[string]uint64{}
	run := func(name string, one func(rng *splitmix64, d *digest)) {
		rng := &splitmix64{state: uint64(seed)}
		d := newDigest()
		for i := 0; i < CryptoSelfTestCases; i++ {
			one(rng, &d)
		}
		out[name] = uint64(d)
	}
	for i, name := range []string{"sha256", "sha384", "sha512"} {
		h := cryptoHash(i)
		run(name, func(rng *splitmix64, d *digest) {
			r := rng.next()
			lim := uint64(300)
			if r&3 == 0 {
				lim = 2100
			}
			b := make([]byte, (r>>32)%lim)
			fillRandom(rng, b)
			n := uint64(len(b)) + 1
			a, c := rng.next()%n, rng.next()%n
			if a > c {
				a, c = c, a
			}
			x := h()
			x.Write(b[:a])
			x.Write(b[a:c])
			x.Write(b[c:])
			digestBytes(d, x.Sum(nil))
		})
	}
	for i, name := range []string{"hmac256", "hmac384"} {
		h, keyMax := cryptoHash(i), uint64(200+100*i)
		run(name, func(rng *splitmix64, d *digest) {
			r := rng.next()
			key := make([]byte, (r>>8)%keyMax)
			msg := make([]byte, (r>>32)%600)
			fillRandom(rng, key)
			fillRandom(rng, msg)
			rng.next() // the kernel's cut point
			m := hmac.New(h, key)
			m.Write(msg)
			digestBytes(d, m.Sum(nil))
		})
	}
	for i, name := range []string{"hkdf256", "hkdf384"} {
		h := cryptoHash(i)
		run(name, func(rng *splitmix64, d *digest) {
			r := rng.next()
			ikm := make([]byte, (r>>8&255)%100)
			salt := make([]byte, (r>>16&255)%100)
			info := make([]byte, (r>>24&255)%100)
			okm := make([]byte, (r>>40)%1200)
			fillRandom(rng, ikm)
			fillRandom(rng, salt)
			fillRandom(rng, info)
			prk := hkdf.Extract(h, ikm, salt)
			digestBytes(d, prk)
			if _, err := io.ReadFull(hkdf.Expand(h, prk, info), okm); err != nil {
				panic(err) // 1199 < 255 * 32: never
			}
			digestBytes(d, okm)
		})
	}
	run("tls13label", func(rng *splitmix64, d *digest) {
		r := rng.next()
		h := cryptoHash(int(r & 1))
		secret := make([]byte, h().Size())
		label := make([]byte, (r>>8&255)%20)
		context := make([]byte, (r>>16&255)%70)
		length := int((r >> 24 & 255) % 100)
		msgs := make([]byte, (r>>32)%300)
		fillRandom(rng, secret)
		fillRandom(rng, label)
		fillRandom(rng, context)
		fillRandom(rng, msgs)
		digestBytes(d, TLS13ExpandLabel(h, secret, string(label), context, length))
		digestBytes(d, TLS13DeriveSecret(h, secret, string(label), msgs))
	})
	run("chacha20", func(rng *splitmix64, d *digest) {
		r := rng.next()
		in := make([]byte, (r>>32)%1100)
		key, nonce := make([]byte, 32), make([]byte, 12)
		fillRandom(rng, key)
		fillRandom(rng, nonce)
		fillRandom(rng, in)
		c, err := chacha20.NewUnauthenticatedCipher(key, nonce)
		if err != nil {
			panic(err)
		}
		c.SetCounter(uint32(r >> 8 & 0xFFFFFF))
		c.XORKeyStream(in, in)
		digestBytes(d, in)
	})
	run("poly1305", func(rng *splitmix64, d *digest) {
		r := rng.next()
		var key [32]byte
		msg := make([]byte, (r>>32)%600)
		fillRandom(rng, key[:])
		fillRandom(rng, msg)
		rng.next() // the kernel's cut points
		rng.next()
		var tag [16]byte
		poly1305.Sum(&tag, msg, &key)
		digestBytes(d, tag[:])
	})
	run("chacha20poly1305", func(rng *splitmix64, d *digest) {
		aeadCase(rng, d, chacha20poly1305.KeySize, func(key []byte) cipher.AEAD {
			a, err := chacha20poly1305.New(key)
			if err != nil {
				panic(err)
			}
			return a
		})
	})
	run("aesgcm", func(rng *splitmix64, d *digest) {
		aeadCase(rng, d, 16, func(key []byte) cipher.AEAD {
			b, err := aes.NewCipher(key)
			if err != nil {
				panic(err)
			}
			g, err := cipher.NewGCM(b)
			if err != nil {
				panic(err)
			}
			return g
		})
	})
	out["aesgcm-soft"] = out["aesgcm"]
	run("drbg", func(rng *splitmix64, d *digest) {
		r := rng.next()
		seed := make([]byte, (r>>8&255)%64)
		fillRandom(rng, seed)
		var g DRBG
		g.Init(seed)
		digestBytes(d, g.Generate(int((r>>16&65535)%300)))
		in := make([]byte, (r>>32&255)%48)
		fillRandom(rng, in)
		g.Reseed(in)
		digestBytes(d, g.Generate(int((r>>40&65535)%300)))
		digestBytes(d, g.key[:])
	})
	return out
}

// DRBG is the Go mirror of the kernel's generator (kernel/crypto/drbg.inc)
// without its CPU sources: the state is a 32-byte key K; mix(tag, in) sets
// K = HMAC-SHA256(K, "dpxe-drbg-v1" || tag || in); Init(seed) is K = 0,
// mix('S', seed); Reseed(in) is mix('R', in); Generate(n) takes the
// ChaCha20 keystream under K with a zero nonce, block 0's first 32 bytes
// as the next K and blocks 1.. as the output. It exists to test the
// kernel's construction and is not a source of randomness.
type DRBG struct{ key [32]byte }

func (g *DRBG) mix(tag byte, in []byte) {
	m := hmac.New(sha256.New, g.key[:])
	m.Write([]byte("dpxe-drbg-v1"))
	m.Write([]byte{tag})
	m.Write(in)
	copy(g.key[:], m.Sum(nil))
}

// Init restarts the generator from seed.
func (g *DRBG) Init(seed []byte) {
	g.key = [32]byte{}
	g.mix('S', seed)
}

// Reseed mixes in into the state.
func (g *DRBG) Reseed(in []byte) { g.mix('R', in) }

// Generate returns n bytes and replaces the key.
func (g *DRBG) Generate(n int) []byte {
	c, err := chacha20.NewUnauthenticatedCipher(g.key[:], make([]byte, chacha20.NonceSize))
	if err != nil {
		panic(err)
	}
	block := make([]byte, 64)
	c.XORKeyStream(block, block)
	out := make([]byte, n)
	c.XORKeyStream(out, out)
	copy(g.key[:], block[:32])
	return out
}

// aeadCase is one AEAD digest case (see CryptoDigests).
func aeadCase(rng *splitmix64, d *digest, keyLen int, mk func([]byte) cipher.AEAD) {
	r := rng.next()
	msg := make([]byte, (r>>32)%1100)
	aad := make([]byte, (r>>8&255)%80)
	key, nonce := make([]byte, keyLen), make([]byte, 12)
	fillRandom(rng, key)
	fillRandom(rng, nonce)
	fillRandom(rng, aad)
	fillRandom(rng, msg)
	a := mk(key)
	sealed := a.Seal(nil, nonce, msg, aad)
	digestBytes(d, sealed)
	if r&3 == 0 {
		bit := (r >> 44) % uint64(len(sealed)*8)
		sealed[bit/8] ^= 1 << (bit % 8)
	}
	if _, err := a.Open(nil, nonce, sealed, aad); err == nil {
		d.add(1)
	} else {
		d.add(0)
	}
}
