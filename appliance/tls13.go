package appliance

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"hash"

	"golang.org/x/crypto/chacha20poly1305"
	"golang.org/x/crypto/hkdf"
)

// The Go reference of the kernel's TLS 1.3 key schedule and record
// protection (kernel/tls/): written from RFC 8446 with the standard
// library and golang.org/x/crypto as primitives, checked against RFC 8448
// §3 (tls13_test.go), and compared with the kernel through the digests of
// TLSDigests. It has no handshake messages, no certificates and no network:
// the caller feeds the transcript and the (EC)DHE shared secret.

// TLS 1.3 cipher suites the kernel implements (RFC 8446 §B.4); both hash
// with SHA-256.
const (
	TLSSuiteAES128GCMSHA256        uint16 = 0x1301
	TLSSuiteChaCha20Poly1305SHA256 uint16 = 0x1303
)

// Record-layer constants (RFC 8446 §5).
const (
	TLSContentAlert           byte = 21 // §B.1 ContentType
	TLSContentHandshake       byte = 22
	TLSContentApplicationData byte = 23 // also every TLSCiphertext's opaque_type (§5.2)

	TLSRecordHeaderLen = 5           // §5.1: type, legacy_record_version, length
	TLSMaxInnerLen     = 1<<14 + 1   // §5.4: TLSInnerPlaintext, 2^14 content + type
	TLSMaxCiphertext   = 1<<14 + 256 // §5.2: the largest TLSCiphertext.length
	TLSTagLen          = 16          // both AEADs expand a record by 16 bytes
	TLSIVLen           = 12          // §5.3: iv_length of both AEADs

	tlsLegacyVersion     = 0x0303          // §5.2: legacy_record_version
	tlsHashLen           = sha256.Size     // both suites hash with SHA-256 (§B.4)
	tlsSeqLast           = ^uint64(0)      // never used, so the counter never wraps (§5.3)
	tlsSeqBytes          = 8               // §5.3: a 64-bit sequence number
	tlsFinishedMsgLen    = 4 + tlsHashLen  // a Finished: type, uint24 length, verify_data
	tlsHandshakeFinished = 20              // §4 HandshakeType finished
	tlsKeyAES128         = 16              // §B.4: key_length of TLS_AES_128_GCM_SHA256
	tlsKeyChaCha         = 32              // RFC 8439's 256-bit key
	tlsLowestInnerType   = TLSContentAlert // §5: alert, handshake, application_data
)

// Record refusals. Each error's text is the reason the kernel names (a TLS
// alert description of RFC 8446 §6.2, or a local condition).
var (
	// ErrTLSIncomplete: fewer bytes than the header says; read more.
	ErrTLSIncomplete = errors.New("incomplete")
	// ErrTLSDecodeError: a record that is not a TLSCiphertext (legacy
	// version other than 0x0303, or shorter than the AEAD tag).
	ErrTLSDecodeError = errors.New("decode_error")
	// ErrTLSRecordOverflow: TLSCiphertext.length over 2^14 + 256, or an
	// inner plaintext over 2^14 + 1 bytes (§5.2, §5.4).
	ErrTLSRecordOverflow = errors.New("record_overflow")
	// ErrTLSBadRecordMAC: the AEAD refused the record (§5.2).
	ErrTLSBadRecordMAC = errors.New("bad_record_mac")
	// ErrTLSUnexpectedMessage: an opaque_type other than
	// application_data, an inner plaintext of zeros only, or an inner
	// content type TLS 1.3 does not protect (§5, §5.4).
	ErrTLSUnexpectedMessage = errors.New("unexpected_message")
	// ErrTLSSequenceExhausted: the 64-bit sequence number would wrap (§5.3).
	ErrTLSSequenceExhausted = errors.New("sequence_exhausted")
	// ErrTLSIllegalSuite: a cipher suite the kernel does not implement.
	ErrTLSIllegalSuite = errors.New("illegal_parameter")
)

// TLSReasons lists the refusals in the order the kernel's self-test numbers
// them (0 is success).
var TLSReasons = []error{nil, ErrTLSIncomplete, ErrTLSDecodeError, ErrTLSRecordOverflow,
	ErrTLSBadRecordMAC, ErrTLSUnexpectedMessage, ErrTLSSequenceExhausted}

// TLSReasonIndex is err's position in TLSReasons, or -1.
func TLSReasonIndex(err error) int {
	for i, e := range TLSReasons {
		if e == err {
			return i
		}
	}
	return -1
}

// TLSRole says which traffic secrets a connection writes with.
type TLSRole int

// Roles: a client writes with the client_* secrets, a server with the
// server_* ones.
const (
	TLSClient TLSRole = 0
	TLSServer TLSRole = 1
)

// TLSTrafficKeys is one direction's protection: the traffic secret it was
// derived from, the write key and IV (§7.3) and the next sequence number.
type TLSTrafficKeys struct {
	Secret []byte
	Key    []byte
	IV     []byte
	Seq    uint64
	aead   cipher.AEAD
}

// TLS13 is one connection's key schedule and record protection. The zero
// value is not usable; NewTLS13 makes one.
type TLS13 struct {
	Suite uint16
	Role  TLSRole
	// Secret is the stage's secret: early, then handshake, then master.
	Secret []byte
	// ClientAppSecret and ServerAppSecret hold the application traffic
	// secrets from TLS13.ApplicationSecrets until they are activated.
	ClientAppSecret, ServerAppSecret []byte
	Read, Write                      TLSTrafficKeys
	// KeyUpdates counts the peer's KeyUpdate messages taken
	// (TLSPostHandshake; the kernel's TLS_CONN.updates).
	KeyUpdates int
	transcript hash.Hash
}

// NewTLS13 starts a connection: an empty transcript and the early secret
// of a handshake without PSK, HKDF-Extract(0, 0) (§7.1).
func NewTLS13(suite uint16, role TLSRole) (*TLS13, error) {
	if suite != TLSSuiteAES128GCMSHA256 && suite != TLSSuiteChaCha20Poly1305SHA256 {
		return nil, ErrTLSIllegalSuite
	}
	c := &TLS13{Suite: suite, Role: role, transcript: sha256.New()}
	c.Secret = hkdf.Extract(sha256.New, make([]byte, tlsHashLen), nil)
	return c, nil
}

// AddTranscript appends handshake messages (with their 4-byte headers) to
// the transcript.
func (c *TLS13) AddTranscript(msg []byte) { c.transcript.Write(msg) }

// TranscriptHash is Transcript-Hash of the messages so far (§4.4.1); the
// running hash goes on.
func (c *TLS13) TranscriptHash() []byte { return c.transcript.Sum(nil) }

func (c *TLS13) deriveSecret(secret []byte, label string, hashed []byte) []byte {
	return TLS13ExpandLabel(sha256.New, secret, label, hashed, tlsHashLen)
}

func (c *TLS13) derived() []byte {
	empty := sha256.Sum256(nil)
	return c.deriveSecret(c.Secret, "derived", empty[:])
}

// HandshakeSecrets moves to the handshake secret, HKDF-Extract(
// Derive-Secret(early, "derived", ""), shared), and installs the handshake
// traffic secrets from the transcript ClientHello..ServerHello: the own
// one for writing, the peer's for reading.
func (c *TLS13) HandshakeSecrets(shared []byte) {
	c.Secret = hkdf.Extract(sha256.New, shared, c.derived())
	th := c.TranscriptHash()
	cs := c.deriveSecret(c.Secret, "c hs traffic", th)
	ss := c.deriveSecret(c.Secret, "s hs traffic", th)
	c.install(cs, ss)
}

// ApplicationSecrets moves to the master secret, HKDF-Extract(
// Derive-Secret(handshake, "derived", ""), 0), and derives the
// application traffic secrets from the transcript ClientHello..server
// Finished. They take effect with ActivateRead and ActivateWrite, since a
// client still writes its Finished with the handshake keys.
func (c *TLS13) ApplicationSecrets() {
	c.Secret = hkdf.Extract(sha256.New, make([]byte, tlsHashLen), c.derived())
	th := c.TranscriptHash()
	c.ClientAppSecret = c.deriveSecret(c.Secret, "c ap traffic", th)
	c.ServerAppSecret = c.deriveSecret(c.Secret, "s ap traffic", th)
}

func (c *TLS13) install(client, server []byte) {
	if c.Role == TLSClient {
		c.Write, c.Read = c.keys(client), c.keys(server)
	} else {
		c.Write, c.Read = c.keys(server), c.keys(client)
	}
}

// ActivateRead installs the peer's application traffic secret for reading.
func (c *TLS13) ActivateRead() {
	if c.Role == TLSClient {
		c.Read = c.keys(c.ServerAppSecret)
	} else {
		c.Read = c.keys(c.ClientAppSecret)
	}
}

// ActivateWrite installs the own application traffic secret for writing.
func (c *TLS13) ActivateWrite() {
	if c.Role == TLSClient {
		c.Write = c.keys(c.ClientAppSecret)
	} else {
		c.Write = c.keys(c.ServerAppSecret)
	}
}

// keys derives a direction's key and IV from a traffic secret (§7.3).
func (c *TLS13) keys(secret []byte) TLSTrafficKeys {
	keyLen := tlsKeyAES128
	if c.Suite == TLSSuiteChaCha20Poly1305SHA256 {
		keyLen = tlsKeyChaCha
	}
	k := TLSTrafficKeys{
		Secret: append([]byte(nil), secret...),
		Key:    TLS13ExpandLabel(sha256.New, secret, "key", nil, keyLen),
		IV:     TLS13ExpandLabel(sha256.New, secret, "iv", nil, TLSIVLen),
	}
	var err error
	if c.Suite == TLSSuiteChaCha20Poly1305SHA256 {
		k.aead, err = chacha20poly1305.New(k.Key)
	} else {
		var b cipher.Block
		if b, err = aes.NewCipher(k.Key); err == nil {
			k.aead, err = cipher.NewGCM(b)
		}
	}
	if err != nil {
		panic("TLS13: " + err.Error()) // the key lengths above are the ciphers' own
	}
	return k
}

// KeyUpdate replaces a direction's traffic secret with HKDF-Expand-Label(
// secret, "traffic upd", "", Hash.length) and its keys, sequence 0 (§7.2).
func (c *TLS13) KeyUpdate(write bool) {
	d := &c.Read
	if write {
		d = &c.Write
	}
	*d = c.keys(TLS13ExpandLabel(sha256.New, d.Secret, "traffic upd", nil, tlsHashLen))
}

// FinishedVerifyData is HMAC(finished_key, Transcript-Hash(...)) with
// finished_key = HKDF-Expand-Label(base, "finished", "", Hash.length)
// (§4.4.4); the base key is the write traffic secret when own, the read
// one otherwise (the Finished expected from the peer).
func (c *TLS13) FinishedVerifyData(own bool) []byte {
	base := c.Read.Secret
	if own {
		base = c.Write.Secret
	}
	key := TLS13ExpandLabel(sha256.New, base, "finished", nil, tlsHashLen)
	m := hmac.New(sha256.New, key)
	m.Write(c.TranscriptHash())
	return m.Sum(nil)
}

// nonce is the per-record nonce: the IV XOR the sequence number, big-endian,
// left-padded to the IV's length (§5.3).
func (k *TLSTrafficKeys) nonce() []byte {
	n := append([]byte(nil), k.IV...)
	var seq [tlsSeqBytes]byte
	binary.BigEndian.PutUint64(seq[:], k.Seq)
	for i := range seq {
		n[TLSIVLen-tlsSeqBytes+i] ^= seq[i]
	}
	return n
}

// Seal protects content of type typ with pad zero bytes of padding
// (§5.2, §5.4) and returns the whole TLSCiphertext. Any type byte is sealed
// (type 0 with no content makes the all-zero inner plaintext tests need).
func (c *TLS13) Seal(typ byte, content []byte, pad int) ([]byte, error) {
	k := &c.Write
	inner := len(content) + 1 + pad
	if pad < 0 || inner > TLSMaxInnerLen {
		return nil, ErrTLSRecordOverflow
	}
	if k.Seq == tlsSeqLast {
		return nil, ErrTLSSequenceExhausted
	}
	rec := make([]byte, TLSRecordHeaderLen, TLSRecordHeaderLen+inner+TLSTagLen)
	rec[0] = TLSContentApplicationData
	binary.BigEndian.PutUint16(rec[1:], tlsLegacyVersion)
	binary.BigEndian.PutUint16(rec[3:], uint16(inner+TLSTagLen))
	pt := make([]byte, inner)
	copy(pt, content)
	pt[len(content)] = typ
	rec = k.aead.Seal(rec, k.nonce(), pt, rec[:TLSRecordHeaderLen])
	k.Seq++
	return rec, nil
}

// TLSRecordLen says how long the record at the front of b is, or 0 while
// its header is incomplete.
func TLSRecordLen(b []byte) int {
	if len(b) < TLSRecordHeaderLen {
		return 0
	}
	return TLSRecordHeaderLen + int(binary.BigEndian.Uint16(b[3:]))
}

// Open checks and decrypts the record at the front of b (§5.2): its type,
// content and the bytes it took. The checks run in the kernel's order:
// header present, opaque_type, legacy version, length limit, whole record
// present, room for the tag, inner length limit, sequence, AEAD, content
// type. The sequence number advances once the AEAD has accepted the record.
func (c *TLS13) Open(b []byte) (typ byte, content []byte, n int, err error) {
	k := &c.Read
	if len(b) < TLSRecordHeaderLen {
		return 0, nil, 0, ErrTLSIncomplete
	}
	if b[0] != TLSContentApplicationData {
		return 0, nil, 0, ErrTLSUnexpectedMessage
	}
	if binary.BigEndian.Uint16(b[1:]) != tlsLegacyVersion {
		return 0, nil, 0, ErrTLSDecodeError
	}
	length := int(binary.BigEndian.Uint16(b[3:]))
	if length > TLSMaxCiphertext {
		return 0, nil, 0, ErrTLSRecordOverflow
	}
	if len(b) < TLSRecordHeaderLen+length {
		return 0, nil, 0, ErrTLSIncomplete
	}
	if length < TLSTagLen {
		return 0, nil, 0, ErrTLSDecodeError
	}
	if length-TLSTagLen > TLSMaxInnerLen {
		return 0, nil, 0, ErrTLSRecordOverflow
	}
	if k.Seq == tlsSeqLast {
		return 0, nil, 0, ErrTLSSequenceExhausted
	}
	n = TLSRecordHeaderLen + length
	pt, err := k.aead.Open(nil, k.nonce(), b[TLSRecordHeaderLen:n], b[:TLSRecordHeaderLen])
	if err != nil {
		return 0, nil, 0, ErrTLSBadRecordMAC
	}
	k.Seq++
	end := len(pt) - 1
	for end >= 0 && pt[end] == 0 {
		end--
	}
	if end < 0 {
		return 0, nil, 0, ErrTLSUnexpectedMessage
	}
	typ = pt[end]
	if typ < tlsLowestInnerType || typ > TLSContentApplicationData {
		return 0, nil, 0, ErrTLSUnexpectedMessage
	}
	return typ, pt[:end], n, nil
}

// FinishedMessage frames verify_data as a Finished handshake message.
func FinishedMessage(verifyData []byte) []byte {
	return append([]byte{tlsHandshakeFinished, 0, 0, byte(len(verifyData))}, verifyData...)
}
