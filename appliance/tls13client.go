package appliance

import (
	"crypto/ecdh"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io"
)

// A TLS 1.3 client handshake built only from this package's references
// (ClientHello, ServerHello, key schedule, records, EncryptedExtensions,
// Certificate, X509VerifyChain, CertificateVerify, Finished): the order of
// steps the kernel's state machine (kernel/tls/client.inc) follows, tested
// against Go's crypto/tls server and openssl s_server. A HelloRetryRequest
// (§4.1.4) is answered once: selecting secp256r1, with a P-256 share; with
// a cookie only, with the same x25519 share; the cookie echoed. After the
// handshake (ReadRecord): NewSessionTicket skipped, KeyUpdate taken
// (TLSPostHandshake).

// Handshake message types (RFC 8446 §4).
const (
	tlsHSTypeServerHello     = 2
	tlsHSNewSessionTicket    = 4
	tlsHSEncryptedExtensions = 8
	tlsHSCertificate         = 11
	tlsHSCertificateVerify   = 15
	tlsContentCCS            = 20
	tlsHSMax                 = 1 << 14 // the largest handshake body taken (the kernel's TLSC_HS_MAX)
)

// TLSCookieMax is the longest HelloRetryRequest cookie echoed (the
// kernel's TLS_COOKIE_MAX: its ClientHello buffer); OpenSSL's stateless
// cookies are about 130 bytes, crypto/tls sends none.
const TLSCookieMax = 512

// ErrTLSCookieTooLarge: a HelloRetryRequest's cookie longer than
// TLSCookieMax (local; the alert sent is handshake_failure).
var ErrTLSCookieTooLarge = errors.New("cookie_too_large")

// ErrTLSBadKeyShare: our own P-256 scalar (from Rand, the DRBG in the
// kernel) is 0 or not below the group order (local, internal_error).
var ErrTLSBadKeyShare = errors.New("bad_key_share")

// TLSAlertError is an alert the server sent.
type TLSAlertError struct{ Name string }

func (e *TLSAlertError) Error() string { return "alert " + e.Name }

// TLSClientConfig is what a client connects with.
type TLSClientConfig struct {
	Host      string
	Now       int64    // Unix seconds, for validity
	Anchors   [][]byte // DER
	Rand      io.Reader
	PreferAES bool // offer TLS_AES_128_GCM_SHA256 first
}

// TLSClientConn is an established connection.
type TLSClientConn struct {
	rw     io.ReadWriter
	c      *TLS13
	Suite  uint16
	Group  uint16 // the key exchange's: x25519, or secp256r1 after a HelloRetryRequest
	Retry  bool   // the server sent a HelloRetryRequest
	Scheme int    // the CertificateVerify's SignatureScheme
	Path   *X509Path
	Listed int // certificates the server sent
	// CertBody, CVBody and CVTranscript are the server's Certificate and
	// CertificateVerify bodies and the transcript hash the latter signs
	// (kept for the kernel's test corpus).
	CertBody, CVBody, CVTranscript []byte
	buf                            []byte
}

func (t *TLSClientConn) record() (byte, []byte, error) {
	for {
		if n := TLSRecordLen(t.buf); n > 0 && len(t.buf) >= n {
			rec := t.buf[:n]
			t.buf = t.buf[n:]
			return rec[0], rec, nil
		}
		var b [4096]byte
		n, err := t.rw.Read(b[:])
		if n == 0 && err != nil {
			return 0, nil, err
		}
		t.buf = append(t.buf, b[:n]...)
	}
}

func (t *TLSClientConn) open(rec []byte) (byte, []byte, error) {
	typ, content, _, err := t.c.Open(rec)
	if err != nil {
		return 0, nil, err
	}
	if typ == TLSContentAlert {
		if len(content) != 2 {
			return 0, nil, ErrTLSDecodeError
		}
		return 0, nil, &TLSAlertError{Name: TLSAlertName(content[1])}
	}
	return typ, content, nil
}

// TLSClientConnect runs the handshake over rw; a refusal is one of this
// package's named errors (or a *TLSAlertError from the server).
func TLSClientConnect(rw io.ReadWriter, cfg TLSClientConfig) (*TLSClientConn, error) {
	var p TLSClientHelloParams
	if _, err := io.ReadFull(cfg.Rand, p.Random[:]); err != nil {
		return nil, err
	}
	if _, err := io.ReadFull(cfg.Rand, p.SessionID[:]); err != nil {
		return nil, err
	}
	// the private key is read from cfg.Rand (not GenerateKey, which
	// ignores its reader) so that a recorded flight can be replayed
	var k [32]byte
	if _, err := io.ReadFull(cfg.Rand, k[:]); err != nil {
		return nil, err
	}
	priv, err := ecdh.X25519().NewPrivateKey(k[:])
	if err != nil {
		return nil, err
	}
	copy(p.KeyShare[:], priv.PublicKey().Bytes())
	p.HostName = []byte(cfg.Host)
	p.PreferAES = cfg.PreferAES
	ch, err := BuildClientHello(&p)
	if err != nil {
		return nil, err
	}
	t := &TLSClientConn{rw: rw}
	rec := append([]byte{TLSContentHandshake, 3, 1, byte(len(ch) >> 8), byte(len(ch))}, ch...)
	if _, err := rw.Write(rec); err != nil {
		return nil, err
	}
	hs := NewTLSHSReader(tlsHSMax)
	sh, err := t.serverHello(hs, false)
	if err != nil {
		return nil, err
	}
	shp, err := ParseServerHello(sh[4:], p.SessionID[:])
	if err != nil {
		return nil, err
	}
	var shared []byte
	if shp.HRR {
		// §4.1.4: the transcript restarts with message_hash, the hash of
		// the first ClientHello (§4.4.1), then the HRR; the second
		// ClientHello differs only in its share and the echoed cookie
		if len(shp.Cookie) > TLSCookieMax {
			return nil, ErrTLSCookieTooLarge
		}
		if t.c, err = NewTLS13(shp.Suite, TLSClient); err != nil {
			return nil, err
		}
		t.c.AddTranscript(tlsMessageHash(ch))
		t.c.AddTranscript(sh)
		offered := TLSGroupX25519 // a cookie only: the same x25519 share
		var p256 *ecdh.PrivateKey
		if shp.Group == TLSGroupSecp256r1 {
			// the scalar is read from Rand only now (a recorded flight
			// carries it after the x25519 key)
			if _, err := io.ReadFull(cfg.Rand, k[:]); err != nil {
				return nil, err
			}
			if p256, err = ecdh.P256().NewPrivateKey(k[:]); err != nil {
				return nil, ErrTLSBadKeyShare
			}
			p.P256Share = p256.PublicKey().Bytes()
			offered = TLSGroupSecp256r1
		}
		p.Cookie = shp.Cookie
		if ch, err = BuildClientHello(&p); err != nil {
			return nil, err
		}
		rec := append([]byte{TLSContentHandshake, 3, 3, byte(len(ch) >> 8), byte(len(ch))}, ch...)
		if _, err := rw.Write(rec); err != nil {
			return nil, err
		}
		t.c.AddTranscript(ch)
		hrrSuite := shp.Suite
		if sh, err = t.serverHello(hs, true); err != nil {
			return nil, err
		}
		if shp, err = ParseServerHelloAfterRetry(sh[4:], p.SessionID[:], offered); err != nil {
			return nil, err
		}
		if shp.Suite != hrrSuite {
			return nil, ErrTLSIllegalParameter
		}
		if p256 != nil {
			peer, err := ecdh.P256().NewPublicKey(shp.Key)
			if err != nil {
				return nil, ErrTLSIllegalParameter
			}
			if shared, err = p256.ECDH(peer); err != nil {
				return nil, ErrTLSIllegalParameter
			}
		} else {
			peer, err := ecdh.X25519().NewPublicKey(shp.Key)
			if err != nil {
				return nil, ErrTLSIllegalParameter
			}
			if shared, err = priv.ECDH(peer); err != nil {
				return nil, ErrTLSIllegalParameter
			}
		}
		t.Retry = true
	} else {
		peer, err := ecdh.X25519().NewPublicKey(shp.Key)
		if err != nil {
			return nil, ErrTLSIllegalParameter
		}
		if shared, err = priv.ECDH(peer); err != nil {
			return nil, ErrTLSIllegalParameter
		}
		if t.c, err = NewTLS13(shp.Suite, TLSClient); err != nil {
			return nil, err
		}
		t.c.AddTranscript(ch)
	}
	t.Suite, t.Group = shp.Suite, shp.Group
	t.c.AddTranscript(sh)
	t.c.HandshakeSecrets(shared)

	// the encrypted flight: EncryptedExtensions, Certificate,
	// CertificateVerify, Finished, in that order
	var certs [][]byte
	var leaf *X509Cert
	for step := 0; step < 4; {
		msg, err := hs.Next()
		if err == ErrTLSIncomplete {
			typ, r, err := t.record()
			if err != nil {
				return nil, err
			}
			if typ == tlsContentCCS {
				// middlebox compatibility (§D.4): dropped when it is
				// the single byte 1 (§5), before the server's Finished
				if len(r) != TLSRecordHeaderLen+1 || r[TLSRecordHeaderLen] != 1 {
					return nil, ErrTLSUnexpectedMessage
				}
				continue
			}
			typ, content, err := t.open(r)
			if err != nil {
				return nil, err
			}
			if typ != TLSContentHandshake {
				return nil, ErrTLSUnexpectedMessage
			}
			hs.Feed(content)
			continue
		}
		if err != nil {
			return nil, err
		}
		want := []byte{tlsHSEncryptedExtensions, tlsHSCertificate, tlsHSCertificateVerify, tlsHandshakeFinished}[step]
		if msg[0] != want {
			return nil, ErrTLSUnexpectedMessage
		}
		body := msg[4:]
		switch step {
		case 0:
			if _, err := ParseEncryptedExtensions(body); err != nil {
				return nil, err
			}
		case 1:
			t.CertBody = append([]byte(nil), body...)
			if certs, err = ParseTLSCertificate(body); err != nil {
				return nil, err
			}
			if t.Path, err = X509VerifyChain(certs, cfg.Anchors, cfg.Host, cfg.Now); err != nil {
				return nil, err
			}
			t.Listed = len(certs)
			leaf, _ = ParseX509(certs[0])
		case 2:
			t.CVBody, t.CVTranscript = append([]byte(nil), body...), t.c.TranscriptHash()
			if t.Scheme, err = CheckTLSCertVerify(body, leaf, t.c.TranscriptHash()); err != nil {
				return nil, err
			}
		case 3:
			if len(body) != tlsHashLen {
				return nil, ErrTLSDecodeError
			}
			if !hmac.Equal(body, t.c.FinishedVerifyData(false)) {
				return nil, errors.New("decrypt_error")
			}
		}
		t.c.AddTranscript(msg)
		step++
	}
	t.c.ApplicationSecrets()
	fin := FinishedMessage(t.c.FinishedVerifyData(true))
	out := []byte{tlsContentCCS, 3, 3, 0, 1, 1} // §D.4: one ChangeCipherSpec
	sealed, err := t.c.Seal(TLSContentHandshake, fin, 0)
	if err != nil {
		return nil, err
	}
	if _, err := rw.Write(append(out, sealed...)); err != nil {
		return nil, err
	}
	t.c.AddTranscript(fin)
	t.c.ActivateRead()
	t.c.ActivateWrite()
	return t, nil
}

// tlsMessageHash is the message_hash message standing for the first
// ClientHello in the transcript after a HelloRetryRequest (§4.4.1):
// type 254, length 32, SHA-256 of the ClientHello (both suites hash with
// SHA-256).
func tlsMessageHash(ch []byte) []byte {
	h := sha256.Sum256(ch)
	return append([]byte{254, 0, 0, tlsHashLen}, h[:]...)
}

// serverHello reads the plaintext records up to a whole ServerHello (or
// HelloRetryRequest). After an HRR (retry) a ChangeCipherSpec of the
// single byte 1 is dropped (§D.4: the server's comes right after its
// HRR); before one, anything but a handshake record or an alert is
// unexpected_message.
func (t *TLSClientConn) serverHello(hs *TLSHSReader, retry bool) ([]byte, error) {
	for {
		sh, err := hs.Next()
		if err == nil {
			if sh[0] != tlsHSTypeServerHello {
				return nil, ErrTLSUnexpectedMessage
			}
			return sh, nil
		}
		if err != ErrTLSIncomplete {
			return nil, err
		}
		typ, r, err := t.record()
		if err != nil {
			return nil, err
		}
		switch {
		case typ == TLSContentAlert:
			if len(r) == 7 {
				return nil, &TLSAlertError{Name: TLSAlertName(r[6])}
			}
			return nil, ErrTLSDecodeError
		case typ == TLSContentHandshake:
			hs.Feed(r[TLSRecordHeaderLen:])
		case typ == tlsContentCCS && retry && len(r) == TLSRecordHeaderLen+1 && r[TLSRecordHeaderLen] == 1:
		default:
			return nil, ErrTLSUnexpectedMessage
		}
	}
}

// Write sends application data in records of at most 2^14 bytes.
func (t *TLSClientConn) Write(b []byte) (int, error) {
	for off := 0; off < len(b); {
		n := min(len(b)-off, 1<<14)
		rec, err := t.c.Seal(TLSContentApplicationData, b[off:off+n], 0)
		if err != nil {
			return off, err
		}
		if _, err := t.rw.Write(rec); err != nil {
			return off, err
		}
		off += n
	}
	return len(b), nil
}

// ReadRecord returns the next application data; handshake records go to
// TLSPostHandshake (its KeyUpdate answer is written at once); a
// close_notify is io.EOF.
func (t *TLSClientConn) ReadRecord() ([]byte, error) {
	for {
		_, r, err := t.record()
		if err != nil {
			return nil, err
		}
		typ, content, err := t.open(r)
		var ae *TLSAlertError
		if errors.As(err, &ae) && ae.Name == "close_notify" {
			return nil, io.EOF
		}
		if err != nil {
			return nil, err
		}
		switch typ {
		case TLSContentApplicationData:
			return content, nil
		case TLSContentHandshake:
			reply, err := TLSPostHandshake(t.c, content)
			if err != nil {
				return nil, err
			}
			if reply != nil {
				if _, err := t.rw.Write(reply); err != nil {
					return nil, err
				}
			}
		default:
			return nil, ErrTLSUnexpectedMessage
		}
	}
}

// KeyUpdates is how many KeyUpdate messages the server sent (each moved
// our read keys on).
func (t *TLSClientConn) KeyUpdates() int { return t.c.KeyUpdates }

// tlsHSKeyUpdate is the KeyUpdate handshake type (§4.6.3).
const tlsHSKeyUpdate = 24

// TLSPostHandshake takes one handshake record's content on an established
// connection (the kernel's tls_post_handshake), message by message, each
// whole inside the record:
//
//	fewer than 4 bytes left, or a length past the record's end: decode_error;
//	NewSessionTicket: accepted and ignored (we never resume);
//	KeyUpdate (§4.6.3): a body of other than 1 byte: decode_error; a value
//	other than update_not_requested (0) or update_requested (1):
//	illegal_parameter; anything after it in the record: unexpected_message
//	(§5.1: a handshake message must not span a key change); then, when
//	update_requested, our KeyUpdate(update_not_requested) sealed with the
//	current write keys (the reply) and the write keys moved on (§7.2);
//	then the read keys moved on;
//	any other message: unexpected_message.
//
// The record was opened with the read keys before the update, as §4.6.3
// says: the peer's next record is under the new ones.
func TLSPostHandshake(c *TLS13, content []byte) (reply []byte, err error) {
	for len(content) > 0 {
		if len(content) < tlsHSHeaderLen {
			return nil, ErrTLSDecodeError
		}
		n := int(binary.BigEndian.Uint32(content) & 0xffffff)
		if n > len(content)-tlsHSHeaderLen {
			return nil, ErrTLSDecodeError
		}
		msg := content[:tlsHSHeaderLen+n]
		content = content[tlsHSHeaderLen+n:]
		switch msg[0] {
		case tlsHSNewSessionTicket:
		case tlsHSKeyUpdate:
			if n != 1 {
				return nil, ErrTLSDecodeError
			}
			if msg[4] > 1 {
				return nil, ErrTLSIllegalParameter
			}
			if len(content) > 0 {
				return nil, ErrTLSUnexpectedMessage
			}
			if msg[4] == 1 {
				if reply, err = c.Seal(TLSContentHandshake, []byte{tlsHSKeyUpdate, 0, 0, 1, 0}, 0); err != nil {
					return nil, err
				}
				c.KeyUpdate(true)
			}
			c.KeyUpdate(false)
			c.KeyUpdates++
		default:
			return nil, ErrTLSUnexpectedMessage
		}
	}
	return reply, nil
}
