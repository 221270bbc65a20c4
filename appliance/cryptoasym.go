package appliance

import (
	"bytes"
	"crypto"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/binary"
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"strings"
	"sync"
)

// Go references for the kernel's public-key primitives (kernel/crypto/asym.inc)
// and the self-test of kernel/selftest/crypto_asym_selftest.inc: the
// differential digests of the key exchanges, the vector sections the
// kernel reads, the signature cases Go makes for it and the DER parser the
// kernel's X.509 layer will mirror. Every reference result comes from the
// standard library (crypto/ecdh, crypto/ecdsa, crypto/rsa), so the kernel
// is compared with an independent implementation.

// Case counts of the kernel's key-exchange digests.
const (
	AsymX25519Cases = 256 // "x25519"
	AsymP256Cases   = 96  // "p256-ecdh"
)

// AsymDigestNames names the key-exchange digests in the order the kernel
// prints them.
var AsymDigestNames = []string{"x25519", "p256-ecdh"}

// AsymMaxRecords is the most records a vector section may hold
// (ASYM_ST_MAX_CASES, the kernel's results buffer).
const AsymMaxRecords = 1024

// Result characters of the kernel's "cryptotest asym vectors" lines.
const (
	AsymResultAccepted = 'a' // accepted; for a key exchange, with the expected secret
	AsymResultOther    = 'x' // a key exchange accepted with another secret
)

// AsymReason names the kernel's refusal reasons (ASYM_ERR_* in
// kernel/crypto/asym.inc) by their result character '1'..'7'.
var AsymReason = map[byte]string{
	'1': "length",
	'2': "range",
	'3': "point",
	'4': "zero secret or identity",
	'5': "bad signature",
	'6': "key not taken",
	'7': "hash",
}

// Kernel refusal reasons as result characters, for the tests that expect a
// particular one.
const (
	AsymRefusedPoint  = '3'
	AsymRefusedZero   = '4'
	AsymRefusedBadSig = '5'
)

// AsymHashSHA256 and AsymHashSHA384 are the kernel's hash identifiers
// (ASYM_HASH_* in kernel/crypto/asym.inc), the first field of an RSA record.
const (
	AsymHashSHA256 = 1
	AsymHashSHA384 = 2
)

// p25519LE is 2^255 - 19, little-endian.
var p25519LE = func() []byte {
	b := bytes.Repeat([]byte{0xFF}, 32)
	b[0], b[31] = 0xED, 0x7F
	return b
}()

// CryptoAsymDigests computes, for a seed, the key-exchange digests the
// kernel's public-key self-test prints. Each digest restarts the splitmix64
// stream from the seed; "fold" means digest.add, bytes go through
// digestBytes.
//
//   - x25519: k = 4 words; r = next(); u by r & 7: 0 the base point 9, 1
//     the integer (r >> 8) & 3, 2 p + ((r >> 8) & 3) (a non-canonical
//     encoding), else 4 words (bit 255 random). X25519(k, u): fold 1 when
//     the secret is all zero (refused), else 0 and the secret.
//   - p256-ecdh: d = 4 words, big-endian; fold 1 and end the case when d is
//     0 or >= n, else 0 and d G (65 bytes). r = next(); the peer by r & 3:
//     0 e G for e = 4 more words, 1 04 || 8 words, 2 e G with bit
//     (r >> 8) % 520 flipped, 3 d G; kinds 0 and 2 fold 1 and end when e is
//     refused. Fold 1 when ECDH(d, peer) is refused, else 0 and the secret.
func CryptoAsymDigests(seed uint32) map[string]uint64 {
	out := map[string]uint64{}
	run := func(name string, cases int, one func(rng *splitmix64, d *digest)) {
		rng := &splitmix64{state: uint64(seed)}
		d := newDigest()
		for i := 0; i < cases; i++ {
			one(rng, &d)
		}
		out[name] = uint64(d)
	}
	run("x25519", AsymX25519Cases, func(rng *splitmix64, d *digest) { x25519Case(rng, d, nil) })
	run("p256-ecdh", AsymP256Cases, func(rng *splitmix64, d *digest) { p256ECDHCase(rng, d, nil) })
	return out
}

// asymNote reports a generated case's kind and outcome to the tests that
// check every kind occurs; nil in the digests.
func asymNote(note func(string), what string) {
	if note != nil {
		note(what)
	}
}

func x25519Case(rng *splitmix64, d *digest, note func(string)) {
	k := make([]byte, 32)
	fillRandom(rng, k)
	r := rng.next()
	u := make([]byte, 32)
	small := byte(r >> 8 & 3)
	switch r & 7 {
	case 0:
		u[0] = 9
	case 1:
		u[0] = small
	case 2:
		copy(u, p25519LE)
		u[0] += small
	default:
		fillRandom(rng, u)
	}
	priv, err := ecdh.X25519().NewPrivateKey(k)
	if err != nil {
		panic(err) // any 32 bytes are an X25519 private key
	}
	pub, err := ecdh.X25519().NewPublicKey(u)
	if err != nil {
		panic(err) // and any 32 bytes a public one
	}
	shared, err := priv.ECDH(pub)
	if err != nil {
		asymNote(note, fmt.Sprintf("u kind %d: zero", min(r&7, 3)))
		d.add(1) // the all-zero secret of a low-order u
		return
	}
	asymNote(note, fmt.Sprintf("u kind %d: ok", min(r&7, 3)))
	d.add(0)
	digestBytes(d, shared)
}

func p256ECDHCase(rng *splitmix64, d *digest, note func(string)) {
	k := make([]byte, 32)
	fillRandom(rng, k)
	priv, err := ecdh.P256().NewPrivateKey(k)
	if err != nil {
		asymNote(note, "d refused")
		d.add(1)
		return
	}
	pub := priv.PublicKey().Bytes()
	d.add(0)
	digestBytes(d, pub)
	r := rng.next()
	kind := r & 3
	var peer []byte
	switch kind {
	case 1:
		peer = make([]byte, 65)
		peer[0] = 4
		fillRandom(rng, peer[1:])
	case 3:
		peer = pub
	default:
		e := make([]byte, 32)
		fillRandom(rng, e)
		ep, err := ecdh.P256().NewPrivateKey(e)
		if err != nil {
			asymNote(note, "e refused")
			d.add(1)
			return
		}
		peer = bytes.Clone(ep.PublicKey().Bytes())
		if kind == 2 {
			bit := r >> 8 % (65 * 8)
			peer[bit/8] ^= 1 << (bit % 8)
		}
	}
	pp, err := ecdh.P256().NewPublicKey(peer)
	if err == nil {
		var shared []byte
		if shared, err = priv.ECDH(pp); err == nil {
			asymNote(note, fmt.Sprintf("peer kind %d: ok", kind))
			d.add(0)
			digestBytes(d, shared)
			return
		}
	}
	asymNote(note, fmt.Sprintf("peer kind %d: refused", kind))
	d.add(1)
}

// AsymRecord is one record of a vector section: an id (the Wycheproof
// tcId, or a case index) and the fields its section's kind expects.
type AsymRecord struct {
	ID     uint32
	Fields [][]byte
}

// EncodeAsymSection encodes records as the kernel reads a section: u32
// record count, then per record the u32 id and each field as a u16 length
// and its bytes, all little-endian.
func EncodeAsymSection(recs []AsymRecord) ([]byte, error) {
	if len(recs) > AsymMaxRecords {
		return nil, fmt.Errorf("asym section: %d records, the kernel takes at most %d", len(recs), AsymMaxRecords)
	}
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(recs)))
	for _, r := range recs {
		b = binary.LittleEndian.AppendUint32(b, r.ID)
		for i, f := range r.Fields {
			if len(f) > 0xFFFF {
				return nil, fmt.Errorf("asym section: record %d field %d is %d bytes, at most 65535", r.ID, i, len(f))
			}
			b = binary.LittleEndian.AppendUint16(b, uint16(len(f)))
			b = append(b, f...)
		}
	}
	return b, nil
}

// AsymCycles is one "cryptotest asym cycles" line: accepted operations of a
// section and their mean TSC cycles.
type AsymCycles struct{ Ops, PerOp uint64 }

// AsymReport is what the kernel's public-key self-test printed.
type AsymReport struct {
	Results map[string]string     // section tag -> one result character per record
	Cycles  map[string]AsymCycles // section tag -> cycles per accepted operation
	Times   map[string]uint64     // phase -> milliseconds
}

// ParseAsymReport reads the "cryptotest asym vectors", "cryptotest asym
// cycles" and "cryptotest asym time" lines of a run.
func ParseAsymReport(serial string) (*AsymReport, error) {
	rep := &AsymReport{Results: map[string]string{}, Cycles: map[string]AsymCycles{}, Times: map[string]uint64{}}
	for _, line := range strings.Split(serial, "\n") {
		f := strings.Fields(strings.TrimRight(line, "\r"))
		if len(f) < 3 || f[0] != "cryptotest" || f[1] != "asym" {
			continue
		}
		kv := func(field, key string) (string, error) {
			v, ok := strings.CutPrefix(field, key+"=")
			if !ok {
				return "", fmt.Errorf("asym line %q: want %s=", line, key)
			}
			return v, nil
		}
		num := func(field, key string) (uint64, error) {
			v, err := kv(field, key)
			if err != nil {
				return 0, err
			}
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("asym line %q: %s: %v", line, key, err)
			}
			return n, nil
		}
		switch {
		case f[2] == "vectors" && len(f) == 6:
			n, err := num(f[4], "cases")
			if err != nil {
				return nil, err
			}
			res, err := kv(f[5], "results")
			if err != nil {
				return nil, err
			}
			if uint64(len(res)) != n {
				return nil, fmt.Errorf("asym line %q: %d results for %d cases", line, len(res), n)
			}
			rep.Results[f[3]] = res
		case f[2] == "vectors" && len(f) == 5: // a section of no records
			rep.Results[f[3]] = ""
		case f[2] == "cycles" && len(f) == 6:
			ops, err := num(f[4], "ops")
			if err != nil {
				return nil, err
			}
			per, err := num(f[5], "per_op")
			if err != nil {
				return nil, err
			}
			rep.Cycles[f[3]] = AsymCycles{Ops: ops, PerOp: per}
		case f[2] == "time" && len(f) == 5:
			ms, err := num(f[4], "ms")
			if err != nil {
				return nil, err
			}
			rep.Times[f[3]] = ms
		}
	}
	return rep, nil
}

// Errors of ParseECDSASignatureDER: one per X.690 DER rule for
// Ecdsa-Sig-Value ::= SEQUENCE { r INTEGER, s INTEGER } (RFC 5480 §2.2 via
// RFC 3279 §2.2.3). The kernel's X.509 layer will refuse the same inputs.
var (
	ErrSigSequence = errors.New("ecdsa signature: byte 0 is not a SEQUENCE (0x30)")
	ErrSigLength   = errors.New("ecdsa signature: a length is truncated, indefinite, longer than 2 bytes or not minimal")
	ErrSigOverrun  = errors.New("ecdsa signature: a length runs past the end")
	ErrSigTrailing = errors.New("ecdsa signature: bytes after s or after the SEQUENCE")
	ErrSigInteger  = errors.New("ecdsa signature: r or s is not an INTEGER (0x02)")
	ErrSigEmpty    = errors.New("ecdsa signature: r or s has no content bytes")
	ErrSigNegative = errors.New("ecdsa signature: r or s is negative")
	ErrSigPadding  = errors.New("ecdsa signature: r or s has a superfluous leading zero byte")
)

// derLength reads a DER length at b[i:]: short form, or 0x81/0x82 with the
// minimal number of bytes (ECDSA signatures are never 64 KiB).
func derLength(b []byte, i int) (n, next int, err error) {
	if i >= len(b) {
		return 0, 0, ErrSigLength
	}
	l := int(b[i])
	i++
	switch {
	case l < 0x80:
		n = l
	case l == 0x81:
		if i >= len(b) || b[i] < 0x80 {
			return 0, 0, ErrSigLength
		}
		n = int(b[i])
		i++
	case l == 0x82:
		if i+1 >= len(b) || b[i] == 0 {
			return 0, 0, ErrSigLength
		}
		n = int(b[i])<<8 | int(b[i+1])
		i += 2
		if n < 0x100 {
			return 0, 0, ErrSigLength
		}
	default:
		return 0, 0, ErrSigLength
	}
	if n > len(b)-i {
		return 0, 0, ErrSigOverrun
	}
	return n, i, nil
}

// derInteger reads a positive DER INTEGER at b[i:] and returns its
// magnitude (the sign byte, if any, removed).
func derInteger(b []byte, i int) (v []byte, next int, err error) {
	if i >= len(b) || b[i] != 0x02 {
		return nil, 0, ErrSigInteger
	}
	n, i, err := derLength(b, i+1)
	if err != nil {
		return nil, 0, err
	}
	c := b[i : i+n]
	switch {
	case n == 0:
		return nil, 0, ErrSigEmpty
	case c[0]&0x80 != 0:
		return nil, 0, ErrSigNegative
	case n > 1 && c[0] == 0 && c[1]&0x80 == 0:
		return nil, 0, ErrSigPadding
	}
	if n > 1 && c[0] == 0 {
		c = c[1:]
	}
	return c, i + n, nil
}

// ParseECDSASignatureDER decodes a DER ECDSA signature into r and s as
// big-endian magnitudes, strictly: one SEQUENCE of two INTEGERs, minimal
// lengths, no leading zero beyond the one a high bit needs, no negative
// value, nothing after. Range checks (0 < r, s < n) are the verifier's.
func ParseECDSASignatureDER(der []byte) (r, s []byte, err error) {
	if len(der) == 0 || der[0] != 0x30 {
		return nil, nil, ErrSigSequence
	}
	n, i, err := derLength(der, 1)
	if err != nil {
		return nil, nil, err
	}
	if i+n != len(der) {
		return nil, nil, ErrSigTrailing
	}
	if r, i, err = derInteger(der, i); err != nil {
		return nil, nil, err
	}
	if s, i, err = derInteger(der, i); err != nil {
		return nil, nil, err
	}
	if i != len(der) {
		return nil, nil, ErrSigTrailing
	}
	return r, s, nil
}

// AsymSigCase is one signature for the kernel to verify, with Go's verdict.
type AsymSigCase struct {
	Record AsymRecord // the section record (ECDSA: hash, r, s, key; RSA: see rsaRecord)
	Valid  bool       // crypto/ecdsa or crypto/rsa accepts it
	What   string     // how it was made, for failure messages
}

// AsymSigSet holds the Go-made signature sections of the self-test.
type AsymSigSet struct {
	ECDSAP256 []AsymSigCase // tag RNE256S2, digest "ecdsa-p256": P-256, SHA-256
	ECDSAP384 []AsymSigCase // tag RNE384S3, digest "ecdsa-p384": P-384, SHA-384
	RSAPKCS1  []AsymSigCase // tag RNRSA1V5, digest "rsa-pkcs1": 2048/2049/3072/4096 bits, SHA-256/384
	RSAPSS    []AsymSigCase // tag RNRSAPSS, digest "rsa-pss": the same keys, MGF1 with the same hash
}

// Case counts of the Go-made signature sections.
const (
	AsymECDSAP256Cases = 128
	AsymECDSAP384Cases = 64
	AsymRSAPKCS1Cases  = 64
	AsymRSAPSSCases    = 64
)

// AsymVerdictDigest folds Go's verdicts as the kernel folds its own: 0 for
// an accepted signature, 1 for a refused one, in order.
func AsymVerdictDigest(cases []AsymSigCase) uint64 {
	d := newDigest()
	for _, c := range cases {
		if c.Valid {
			d.add(0)
		} else {
			d.add(1)
		}
	}
	return uint64(d)
}

// AsymSigCases makes the signature sections for a seed. Keys come from the
// seed's splitmix64 stream (ECDSA: ecdsa.ParseRawPrivateKey of random bytes;
// RSA: primes found from random starting points), messages too; ECDSA
// signs deterministically (RFC 6979) and RSA PKCS #1 v1.5 is deterministic,
// so a seed always gives the same cases. PSS salts come from crypto/rand
// (Go 1.26 ignores a custom reader): the same seed gives the same keys,
// messages, changes and verdicts but other signature bytes, unless the
// caller is a test that set testing/cryptotest.SetGlobalRandom. About half
// the cases are changed after signing (a flipped bit in the hash, r, s or
// signature, s replaced by n - s (still valid), another key, r or s out of
// range, a longer hash, the other hash claimed, a signature one byte long
// or equal to n, a salt length one off), and Go's verifier decides each.
func AsymSigCases(seed uint32) (*AsymSigSet, error) {
	set := &AsymSigSet{}
	var err error
	if set.ECDSAP256, err = ecdsaCases(seed, elliptic.P256(), crypto.SHA256, AsymECDSAP256Cases); err != nil {
		return nil, err
	}
	if set.ECDSAP384, err = ecdsaCases(seed, elliptic.P384(), crypto.SHA384, AsymECDSAP384Cases); err != nil {
		return nil, err
	}
	if set.RSAPKCS1, err = rsaPKCS1Cases(seed, AsymRSAPKCS1Cases); err != nil {
		return nil, err
	}
	if set.RSAPSS, err = rsaPSSCases(seed, AsymRSAPSSCases); err != nil {
		return nil, err
	}
	return set, nil
}

// asymHash hashes msg with SHA-256 or SHA-384.
func asymHash(h crypto.Hash, msg []byte) []byte {
	if h == crypto.SHA384 {
		s := sha512.Sum384(msg)
		return s[:]
	}
	s := sha256.Sum256(msg)
	return s[:]
}

// flipBit returns a copy of b with bit i (of 8 len(b)) inverted.
func flipBit(b []byte, i uint64) []byte {
	c := bytes.Clone(b)
	i %= uint64(8 * len(c))
	c[i/8] ^= 1 << (i % 8)
	return c
}

const asymSigKeys = 4 // keys per ECDSA section

func ecdsaCases(seed uint32, curve elliptic.Curve, h crypto.Hash, n int) ([]AsymSigCase, error) {
	rng := &splitmix64{state: uint64(seed)}
	size := (curve.Params().BitSize + 7) / 8
	order := curve.Params().N
	var keys []*ecdsa.PrivateKey
	var pubs [][]byte
	for len(keys) < asymSigKeys {
		raw := make([]byte, size)
		fillRandom(rng, raw)
		k, err := ecdsa.ParseRawPrivateKey(curve, raw)
		if err != nil {
			continue // 0 or >= n: draw again
		}
		pub, err := k.PublicKey.Bytes()
		if err != nil {
			return nil, err
		}
		keys = append(keys, k)
		pubs = append(pubs, pub)
	}
	var out []AsymSigCase
	for i := 0; i < n; i++ {
		r := rng.next()
		ki := int(r % asymSigKeys)
		msg := make([]byte, r>>8%200)
		fillRandom(rng, msg)
		hash := asymHash(h, msg)
		der, err := keys[ki].Sign(nil, hash, h) // nil: RFC 6979
		if err != nil {
			return nil, err
		}
		sr, ss, err := ParseECDSASignatureDER(der)
		if err != nil {
			return nil, fmt.Errorf("Go's own ECDSA signature: %v", err)
		}
		pub := pubs[ki]
		what := "as signed"
		sub := r >> 40
		switch r >> 32 & 15 {
		case 8:
			hash, what = flipBit(hash, sub), "hash bit flipped"
		case 9:
			sr, what = flipBit(sr, sub), "r bit flipped"
		case 10:
			ss, what = flipBit(ss, sub), "s bit flipped"
		case 11:
			ss, what = new(big.Int).Sub(order, new(big.Int).SetBytes(ss)).Bytes(), "s replaced by n - s"
		case 12:
			pub, what = pubs[(ki+1)%asymSigKeys], "another key"
		case 13:
			switch sub & 3 {
			case 0:
				sr, what = []byte{0}, "r = 0"
			case 1:
				ss, what = order.Bytes(), "s = n"
			case 2:
				sr, what = new(big.Int).Add(order, new(big.Int).SetBytes(sr)).Bytes(), "r + n"
			default:
				ss, what = append(make([]byte, 3), ss...), "s with leading zero bytes"
			}
		case 14:
			hash, what = append(bytes.Clone(hash), byte(sub), byte(sub>>8)), "a longer hash (its leftmost bytes count)"
		}
		key, err := ecdsa.ParseUncompressedPublicKey(curve, pub)
		if err != nil {
			return nil, err
		}
		valid := ecdsa.Verify(key, hash, new(big.Int).SetBytes(sr), new(big.Int).SetBytes(ss))
		out = append(out, AsymSigCase{
			Record: AsymRecord{ID: uint32(i), Fields: [][]byte{hash, sr, ss, pub}},
			Valid:  valid,
			What:   what,
		})
	}
	return out, nil
}

// asymSmallPrimes are the odd primes below 2^14, for the prime search's sieve.
var asymSmallPrimes = func() []uint64 {
	var ps []uint64
	for n := uint64(3); n < 1<<14; n += 2 {
		prime := true
		for _, p := range ps {
			if p*p > n {
				break
			}
			if n%p == 0 {
				prime = false
				break
			}
		}
		if prime {
			ps = append(ps, n)
		}
	}
	return ps
}()

// asymPrime returns the first prime at or after a random odd start of
// exactly bits bits with its top two bits set (so two of them make a
// modulus of exactly their summed bit lengths), skipping candidates with a
// small factor.
func asymPrime(rng *splitmix64, bits int) *big.Int {
	b := make([]byte, (bits+7)/8)
	fillRandom(rng, b)
	start := new(big.Int).SetBytes(b)
	start.Rsh(start, uint(len(b)*8-bits))
	start.SetBit(start, bits-1, 1)
	start.SetBit(start, bits-2, 1)
	start.SetBit(start, 0, 1)
	rem := make([]uint64, len(asymSmallPrimes))
	var m big.Int
	for i, p := range asymSmallPrimes {
		rem[i] = m.Mod(start, new(big.Int).SetUint64(p)).Uint64()
	}
	for delta := uint64(0); ; delta += 2 {
		small := false
		for i, p := range asymSmallPrimes {
			if (rem[i]+delta)%p == 0 {
				small = true
				break
			}
		}
		if small {
			continue
		}
		c := new(big.Int).Add(start, new(big.Int).SetUint64(delta))
		if c.ProbablyPrime(20) {
			return c
		}
	}
}

// asymRSAKey makes an RSA key of exactly bits bits with e = 65537 from the
// stream (crypto/rsa's GenerateKey ignores its reader since Go 1.26).
func asymRSAKey(rng *splitmix64, bits int) (*rsa.PrivateKey, error) {
	e := big.NewInt(65537)
	one := big.NewInt(1)
	for {
		p := asymPrime(rng, bits/2)
		q := asymPrime(rng, bits-bits/2)
		n := new(big.Int).Mul(p, q)
		if p.Cmp(q) == 0 || n.BitLen() != bits {
			continue
		}
		phi := new(big.Int).Mul(new(big.Int).Sub(p, one), new(big.Int).Sub(q, one))
		d := new(big.Int).ModInverse(e, phi)
		if d == nil {
			continue // e divides p-1 or q-1
		}
		key := &rsa.PrivateKey{PublicKey: rsa.PublicKey{N: n, E: 65537}, D: d, Primes: []*big.Int{p, q}}
		key.Precompute()
		if err := key.Validate(); err != nil {
			return nil, err
		}
		return key, nil
	}
}

// asymRSABits are the key sizes of the RSA sections, one key each: the
// three TLS meets, and 2049 bits, where PSS's emLen is one byte short of
// the modulus (RFC 8017 §8.1.2 step 2c, §9.1.2 step 6 with no bit to
// clear).
var asymRSABits = []int{2048, 2049, 3072, 4096}

// asymRSAKeyCache keeps the keys made for a seed: the prime search takes
// a second or two, and the e2e test and the unit tests ask more than once.
var asymRSAKeyCache sync.Map // uint32 -> []*rsa.PrivateKey

// asymRSAKeys makes (once per process) the RSA sections' keys from the
// seed. Safe for concurrent use.
func asymRSAKeys(seed uint32) ([]*rsa.PrivateKey, error) {
	if keys, ok := asymRSAKeyCache.Load(seed); ok {
		return keys.([]*rsa.PrivateKey), nil
	}
	rng := &splitmix64{state: uint64(seed) ^ 0x5253414B45595321} // "RSAKEYS!": not the ECDSA stream
	var keys []*rsa.PrivateKey
	for _, bits := range asymRSABits {
		k, err := asymRSAKey(rng, bits)
		if err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	asymRSAKeyCache.Store(seed, keys)
	return keys, nil
}

// rsaRecord lays out an RSA record: hash id (1 byte), e (8 bytes,
// little-endian), n, signature, digest, and for PSS the salt length (2
// bytes, little-endian).
func rsaRecord(id uint32, hashID byte, pub *rsa.PublicKey, sig, digest []byte) AsymRecord {
	return AsymRecord{ID: id, Fields: [][]byte{
		{hashID},
		binary.LittleEndian.AppendUint64(nil, uint64(pub.E)),
		pub.N.Bytes(),
		sig,
		digest,
	}}
}

func rsaPKCS1Cases(seed uint32, n int) ([]AsymSigCase, error) {
	keys, err := asymRSAKeys(seed)
	if err != nil {
		return nil, err
	}
	rng := &splitmix64{state: uint64(seed)}
	var out []AsymSigCase
	for i := 0; i < n; i++ {
		r := rng.next()
		key := keys[r%uint64(len(keys))]
		h, id, other, otherID := crypto.SHA256, byte(AsymHashSHA256), crypto.SHA384, byte(AsymHashSHA384)
		if r>>4&1 == 1 {
			h, id, other, otherID = other, otherID, h, id
		}
		msg := make([]byte, r>>8%300)
		fillRandom(rng, msg)
		digest := asymHash(h, msg)
		sig, err := rsa.SignPKCS1v15(nil, key, h, digest)
		if err != nil {
			return nil, err
		}
		claim, claimID, what := h, id, "as signed"
		sub := r >> 40
		switch r >> 32 & 7 {
		case 4:
			sig, what = flipBit(sig, sub), "signature bit flipped"
		case 5:
			digest, what = flipBit(digest, sub), "digest bit flipped"
		case 6:
			claim, claimID, digest, what = other, otherID, asymHash(other, msg), "checked as the other hash"
		case 7:
			if sub&1 == 0 {
				sig, what = append([]byte{0}, sig...), "signature one byte longer"
			} else {
				sig, what = key.N.Bytes(), "signature = n"
			}
		}
		valid := rsa.VerifyPKCS1v15(&key.PublicKey, claim, digest, sig) == nil
		out = append(out, AsymSigCase{Record: rsaRecord(uint32(i), claimID, &key.PublicKey, sig, digest), Valid: valid, What: what})
	}
	return out, nil
}

func rsaPSSCases(seed uint32, n int) ([]AsymSigCase, error) {
	keys, err := asymRSAKeys(seed)
	if err != nil {
		return nil, err
	}
	rng := &splitmix64{state: uint64(seed) ^ 0x5053535341535421} // "PSSSALT!": not the PKCS #1 stream
	var out []AsymSigCase
	for i := 0; i < n; i++ {
		r := rng.next()
		key := keys[r%uint64(len(keys))]
		h, id, other, otherID := crypto.SHA256, byte(AsymHashSHA256), crypto.SHA384, byte(AsymHashSHA384)
		if r>>4&1 == 1 {
			h, id, other, otherID = other, otherID, h, id
		}
		msg := make([]byte, r>>8%300)
		fillRandom(rng, msg)
		digest := asymHash(h, msg)
		// the salt: the hash length (TLS 1.3), 20 bytes, or as long as
		// the encoding allows (emLen - hLen - 2)
		sLen, what := h.Size(), "as signed, salt = hash length"
		switch r >> 5 & 3 {
		case 1:
			sLen, what = 20, "as signed, 20-byte salt"
		case 2:
			emLen := (key.N.BitLen() - 1 + 7) / 8
			sLen, what = emLen-h.Size()-2, "as signed, the longest salt"
		}
		sig, err := rsa.SignPSS(rand.Reader, key, h, digest, &rsa.PSSOptions{SaltLength: sLen})
		if err != nil {
			return nil, err
		}
		claim, claimID, claimLen := h, id, sLen
		sub := r >> 40
		switch r >> 32 & 7 {
		case 4:
			sig, what = flipBit(sig, sub), "signature bit flipped"
		case 5:
			digest, what = flipBit(digest, sub), "digest bit flipped"
		case 6:
			if sub&1 == 0 || claimLen == 1 {
				claimLen, what = claimLen+1, "salt length one more than signed"
			} else {
				claimLen, what = claimLen-1, "salt length one less than signed"
			}
		case 7:
			claim, claimID, digest, what = other, otherID, asymHash(other, msg), "checked as the other hash"
		}
		// SaltLength 0 would mean "any" to Go, but claimLen is never 0
		valid := rsa.VerifyPSS(&key.PublicKey, claim, digest, sig, &rsa.PSSOptions{SaltLength: claimLen}) == nil
		rec := rsaRecord(uint32(i), claimID, &key.PublicKey, sig, digest)
		rec.Fields = append(rec.Fields, binary.LittleEndian.AppendUint16(nil, uint16(claimLen)))
		out = append(out, AsymSigCase{Record: rec, Valid: valid, What: what})
	}
	return out, nil
}

// AsymResultsDigest folds a kernel results string as its verdict digest
// does: 0 for 'a', 1 for anything else.
func AsymResultsDigest(results string) uint64 {
	d := newDigest()
	for i := 0; i < len(results); i++ {
		if results[i] == AsymResultAccepted {
			d.add(0)
		} else {
			d.add(1)
		}
	}
	return uint64(d)
}
