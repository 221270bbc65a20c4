package appliance

import (
	"bytes"
	"encoding/binary"
	"errors"
)

// The Go reference of the kernel's TLS 1.3 handshake messages (kernel/tls/
// handshake.inc), written from RFC 8446: the ClientHello the kernel sends
// (§4.1.2), the ServerHello and HelloRetryRequest it accepts (§4.1.3,
// §4.1.4), EncryptedExtensions (§4.3.1), the reassembly of handshake
// messages out of records (§4, §5.1) and the alert names (§6). No network
// and no state machine yet: the caller feeds messages.

// Handshake message types (RFC 8446 §4).
const (
	TLSHSClientHello         byte = 1
	TLSHSServerHello         byte = 2
	TLSHSEncryptedExtensions byte = 8
	TLSHSCertificate         byte = 11
	TLSHSCertificateVerify   byte = 15
	TLSHSFinished            byte = 20
)

// Extension types (RFC 8446 §4.2) the kernel sends or recognises.
const (
	tlsExtServerName          = 0  // RFC 6066 §3
	tlsExtMaxFragmentLength   = 1  // RFC 6066 §4
	tlsExtStatusRequest       = 5  // RFC 6066 §8
	tlsExtSupportedGroups     = 10 // RFC 8422, RFC 7919
	tlsExtSignatureAlgorithms = 13 // §4.2.3
	tlsExtUseSRTP             = 14 // RFC 5764
	tlsExtHeartbeat           = 15 // RFC 6520
	tlsExtALPN                = 16 // RFC 7301
	tlsExtSCT                 = 18 // RFC 6962
	tlsExtClientCertType      = 19 // RFC 7250
	tlsExtServerCertType      = 20 // RFC 7250
	tlsExtPadding             = 21 // RFC 7685
	tlsExtPreSharedKey        = 41 // §4.2.11
	tlsExtEarlyData           = 42 // §4.2.10
	tlsExtSupportedVersions   = 43 // §4.2.1
	tlsExtCookie              = 44 // §4.2.2
	tlsExtPSKModes            = 45 // §4.2.9
	tlsExtCertAuthorities     = 47 // §4.2.4
	tlsExtOIDFilters          = 48 // §4.2.5
	tlsExtPostHandshakeAuth   = 49 // §4.2.6
	tlsExtSigAlgsCert         = 50 // §4.2.3
	tlsExtKeyShare            = 51 // §4.2.8
)

// Groups (§4.2.7) and the version the kernel offers (§4.2.1).
const (
	TLSGroupX25519    uint16 = 0x001d
	TLSGroupSecp256r1 uint16 = 0x0017
	tlsVersion13             = 0x0304
	tlsSNIHostName           = 0 // RFC 6066 §3 NameType host_name
)

// Sizes the kernel uses.
const (
	TLSRandomLen    = 32  // §4.1.2 Random
	TLSSessionIDLen = 32  // the middlebox-compatible legacy_session_id (§D.4)
	TLSX25519Len    = 32  // RFC 7748 §6.1
	TLSSNIMax       = 253 // the longest DNS name in text form (RFC 1035 §2.3.4)
	// TLSClientHelloMax is the longest ClientHello the kernel builds: its
	// fixed part (167 bytes) and a TLSSNIMax-byte host name.
	TLSClientHelloMax   = tlsClientHelloFixed + TLSSNIMax
	tlsClientHelloFixed = 4 + 2 + TLSRandomLen + 1 + TLSSessionIDLen + 2 + 4 + 2 + 2 +
		9 + 7 + 10 + 42 + 18 // header, body without extensions, then each extension
	tlsHSHeaderLen = 4 // §4: msg_type, uint24 length
)

// TLSSignatureAlgorithms lists the signature schemes the kernel offers, in
// its order of preference (§4.2.3).
var TLSSignatureAlgorithms = []uint16{
	0x0403, // ecdsa_secp256r1_sha256
	0x0503, // ecdsa_secp384r1_sha384
	0x0804, // rsa_pss_rsae_sha256
	0x0805, // rsa_pss_rsae_sha384
	0x0401, // rsa_pkcs1_sha256
	0x0501, // rsa_pkcs1_sha384
}

// tlsHRRRandom is the Random of a HelloRetryRequest, SHA-256 of
// "HelloRetryRequest" (§4.1.3).
var tlsHRRRandom = []byte{
	0xcf, 0x21, 0xad, 0x74, 0xe5, 0x9a, 0x61, 0x11, 0xbe, 0x1d, 0x8c, 0x02, 0x1e, 0x65, 0xb8, 0x91,
	0xc2, 0xa2, 0x11, 0x16, 0x7a, 0xbb, 0x8c, 0x5e, 0x07, 0x9e, 0x09, 0xe2, 0xc8, 0xa8, 0x33, 0x9c,
}

// Handshake refusals, named as the alert the kernel would send (§6.2) or
// a local condition.
var (
	// ErrTLSIllegalParameter: a field that is well formed but wrong
	// (a suite, group, session id or version we did not offer, a
	// duplicate extension, an extension not allowed in the message).
	ErrTLSIllegalParameter = ErrTLSIllegalSuite
	// ErrTLSProtocolVersion: the server does not speak TLS 1.3.
	ErrTLSProtocolVersion = errors.New("protocol_version")
	// ErrTLSUnsupportedExtension: an extension we did not ask for (§4.2).
	ErrTLSUnsupportedExtension = errors.New("unsupported_extension")
	// ErrTLSMissingExtension: a ServerHello without key_share (§9.2).
	ErrTLSMissingExtension = errors.New("missing_extension")
	// ErrTLSHandshakeTooLarge: a handshake message longer than the
	// reader's maximum (local; the connection is closed).
	ErrTLSHandshakeTooLarge = errors.New("handshake_too_large")
	// ErrTLSBadHostName: a ClientHello with an empty host name or one
	// longer than TLSSNIMax (local).
	ErrTLSBadHostName = errors.New("bad_host_name")
)

// TLSHSReasons lists the handshake refusals in the order the kernel's
// self-test numbers them (0 is success).
var TLSHSReasons = []error{nil, ErrTLSIncomplete, ErrTLSDecodeError, ErrTLSIllegalParameter,
	ErrTLSProtocolVersion, ErrTLSUnsupportedExtension, ErrTLSMissingExtension,
	ErrTLSHandshakeTooLarge, ErrTLSBadHostName}

// TLSHSReasonIndex is err's position in TLSHSReasons, or -1.
func TLSHSReasonIndex(err error) int {
	for i, e := range TLSHSReasons {
		if e == err {
			return i
		}
	}
	return -1
}

// TLSClientHelloParams are the inputs of a ClientHello: the random and
// session id (from the DRBG in the kernel), the x25519 public key, the
// host name, and whether AES-GCM goes first (only with AES-NI).
type TLSClientHelloParams struct {
	Random    [TLSRandomLen]byte
	SessionID [TLSSessionIDLen]byte
	KeyShare  [TLSX25519Len]byte
	HostName  []byte
	PreferAES bool
	// After a HelloRetryRequest (§4.1.4): the second ClientHello carries
	// a secp256r1 share (04 || X || Y) instead of the x25519 one, and the
	// HRR's cookie when it sent one (§4.2.2). Both nil: the first.
	P256Share []byte
	Cookie    []byte
}

// TLSP256ShareLen is a secp256r1 key share, 04 || X || Y (§4.2.8.2).
const TLSP256ShareLen = 65

func appendU16(b []byte, v int) []byte { return binary.BigEndian.AppendUint16(b, uint16(v)) }

// BuildClientHello returns the ClientHello handshake message (with its
// 4-byte header), extensions in this order: server_name, supported_versions,
// supported_groups, key_share, signature_algorithms.
func BuildClientHello(p *TLSClientHelloParams) ([]byte, error) {
	n := len(p.HostName)
	if n == 0 || n > TLSSNIMax {
		return nil, ErrTLSBadHostName
	}
	group, share := TLSGroupX25519, p.KeyShare[:]
	if p.P256Share != nil {
		group, share = TLSGroupSecp256r1, p.P256Share
	}
	extra := len(share) - TLSX25519Len // the extensions' growth over the first ClientHello
	if len(p.Cookie) > 0 {
		extra += 6 + len(p.Cookie)
	}
	b := make([]byte, 0, tlsClientHelloFixed+n+extra)
	b = append(b, TLSHSClientHello, 0, 0, 0)
	b = appendU16(b, tlsLegacyVersion)
	b = append(b, p.Random[:]...)
	b = append(b, TLSSessionIDLen)
	b = append(b, p.SessionID[:]...)
	b = appendU16(b, 4)
	if p.PreferAES {
		b = appendU16(b, int(TLSSuiteAES128GCMSHA256))
		b = appendU16(b, int(TLSSuiteChaCha20Poly1305SHA256))
	} else {
		b = appendU16(b, int(TLSSuiteChaCha20Poly1305SHA256))
		b = appendU16(b, int(TLSSuiteAES128GCMSHA256))
	}
	b = append(b, 1, 0) // legacy_compression_methods = {null}
	b = appendU16(b, 86+n+extra)
	b = appendU16(b, tlsExtServerName) // ServerNameList of one host_name
	b = appendU16(b, n+5)
	b = appendU16(b, n+3)
	b = append(b, tlsSNIHostName)
	b = appendU16(b, n)
	b = append(b, p.HostName...)
	b = appendU16(b, tlsExtSupportedVersions)
	b = append(b, 0, 3, 2, 0x03, 0x04)
	b = appendU16(b, tlsExtSupportedGroups)
	b = append(b, 0, 6, 0, 4)
	b = appendU16(b, int(TLSGroupX25519))
	b = appendU16(b, int(TLSGroupSecp256r1))
	b = appendU16(b, tlsExtKeyShare)
	b = appendU16(b, len(share)+6)
	b = appendU16(b, len(share)+4)
	b = appendU16(b, int(group))
	b = appendU16(b, len(share))
	b = append(b, share...)
	b = appendU16(b, tlsExtSignatureAlgorithms)
	b = appendU16(b, 2+2*len(TLSSignatureAlgorithms))
	b = appendU16(b, 2*len(TLSSignatureAlgorithms))
	for _, s := range TLSSignatureAlgorithms {
		b = appendU16(b, int(s))
	}
	if len(p.Cookie) > 0 { // echoed as sent (§4.2.2), last
		b = appendU16(b, tlsExtCookie)
		b = appendU16(b, len(p.Cookie)+2)
		b = appendU16(b, len(p.Cookie))
		b = append(b, p.Cookie...)
	}
	body := len(b) - tlsHSHeaderLen
	b[1], b[2], b[3] = byte(body>>16), byte(body>>8), byte(body)
	return b, nil
}

// TLSServerHello is what ParseServerHello returns: the suite, whether it
// was a HelloRetryRequest, the group (the server's share's, or an HRR's
// selected_group, 0 when an HRR has none), the server's x25519 public key
// (ServerHello only) and an HRR's cookie (nil when none).
type TLSServerHello struct {
	Suite  uint16
	HRR    bool
	Group  uint16
	Key    []byte
	Cookie []byte
}

// tlsReader reads big-endian fields; any read past the end sets bad.
type tlsReader struct {
	b   []byte
	bad bool
}

func (r *tlsReader) bytes(n int) []byte {
	if r.bad || n > len(r.b) {
		r.bad = true
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *tlsReader) u8() int {
	v := r.bytes(1)
	if v == nil {
		return -1
	}
	return int(v[0])
}

func (r *tlsReader) u16() int {
	v := r.bytes(2)
	if v == nil {
		return -1
	}
	return int(binary.BigEndian.Uint16(v))
}

// tlsExtensions walks an extension block that must fill b exactly (a
// uint16 length, then type, length, data entries), calling f for each.
// Framing errors are decode_error; f's errors stop the walk.
func tlsExtensions(b []byte, f func(typ int, data []byte) error) error {
	r := tlsReader{b: b}
	n := r.u16()
	if r.bad || n != len(r.b) {
		return ErrTLSDecodeError
	}
	for len(r.b) > 0 {
		typ := r.u16()
		l := r.u16()
		data := r.bytes(l)
		if r.bad {
			return ErrTLSDecodeError
		}
		if err := f(typ, data); err != nil {
			return err
		}
	}
	return nil
}

// ParseServerHello checks a ServerHello body (after the 4-byte header)
// against the ClientHello we sent with sessionID, in this order:
//
//	shorter than version, random and session id length: decode_error;
//	legacy_version not 0x0303: protocol_version; the session id cut
//	short: decode_error; not our 32-byte session id: illegal_parameter;
//	the suite cut short: decode_error; a suite we did not offer:
//	illegal_parameter; the compression method cut short: decode_error, not
//	0: illegal_parameter; no extension block at all: protocol_version (a
//	TLS 1.2 server may send none); then the extensions in order, each
//	framed (else decode_error) and checked when met:
//	  supported_versions: length 2 (else decode_error), 0x0304 (else
//	  illegal_parameter, §4.2.1);
//	  key_share: ServerHello: group (2) + key_exchange<1..2^16-1> filling
//	  the data (else decode_error), group x25519 and a 32-byte key (after an HRR: secp256r1, 65 bytes; else
//	  illegal_parameter); HelloRetryRequest: length 2 (else decode_error),
//	  selected_group secp256r1 (x25519 had a share already, anything else
//	  was not offered: illegal_parameter, §4.1.4);
//	  cookie (HelloRetryRequest only): cookie<1..2^16-1> filling the data,
//	  else decode_error;
//	  a second copy of one of these: illegal_parameter;
//	  anything else (or a cookie in a ServerHello) is remembered;
//	after the walk: no supported_versions: protocol_version; something
//	remembered: unsupported_extension (§4.2); a ServerHello without
//	key_share: missing_extension; a HelloRetryRequest with neither key_share
//	nor cookie: illegal_parameter (it would change nothing, §4.1.4).
//
// The order puts protocol_version ahead of every extension a TLS 1.2
// server might add, so such a server is named as such.
func ParseServerHello(body []byte, sessionID []byte) (*TLSServerHello, error) {
	return parseServerHello(body, sessionID, TLSGroupX25519)
}

// ParseServerHelloAfterRetry checks the ServerHello that answers the
// second ClientHello (after a HelloRetryRequest) as ParseServerHello does,
// except that its key_share must be the group offered in that second
// ClientHello (secp256r1 with a 65-byte key after an HRR selecting it,
// x25519 with 32 bytes after a cookie-only HRR; else illegal_parameter)
// and that a second HelloRetryRequest is unexpected_message, named before
// anything else (§4.1.4). The caller checks that the suite is the HRR's.
func ParseServerHelloAfterRetry(body []byte, sessionID []byte, offered uint16) (*TLSServerHello, error) {
	if len(body) >= 2+TLSRandomLen && bytes.Equal(body[2:2+TLSRandomLen], tlsHRRRandom) {
		return nil, ErrTLSUnexpectedMessage
	}
	return parseServerHello(body, sessionID, offered)
}

func parseServerHello(body []byte, sessionID []byte, offered uint16) (*TLSServerHello, error) {
	r := tlsReader{b: body}
	if len(body) < 2+TLSRandomLen+1 {
		return nil, ErrTLSDecodeError
	}
	if r.u16() != tlsLegacyVersion {
		return nil, ErrTLSProtocolVersion
	}
	sh := &TLSServerHello{HRR: bytes.Equal(r.bytes(TLSRandomLen), tlsHRRRandom)}
	sid := r.bytes(r.u8())
	if r.bad {
		return nil, ErrTLSDecodeError
	}
	if len(sid) != TLSSessionIDLen || !bytes.Equal(sid, sessionID) {
		return nil, ErrTLSIllegalParameter
	}
	suite := r.u16()
	if r.bad {
		return nil, ErrTLSDecodeError
	}
	if suite != int(TLSSuiteAES128GCMSHA256) && suite != int(TLSSuiteChaCha20Poly1305SHA256) {
		return nil, ErrTLSIllegalParameter
	}
	sh.Suite = uint16(suite)
	comp := r.u8()
	if r.bad {
		return nil, ErrTLSDecodeError
	}
	if comp != 0 {
		return nil, ErrTLSIllegalParameter
	}
	if len(r.b) == 0 {
		return nil, ErrTLSProtocolVersion
	}
	var seen uint
	unsolicited := false
	err := tlsExtensions(r.b, func(typ int, data []byte) error {
		var bit uint
		switch typ {
		case tlsExtSupportedVersions:
			bit = 1
		case tlsExtKeyShare:
			bit = 2
		case tlsExtCookie:
			if !sh.HRR {
				unsolicited = true
				return nil
			}
			bit = 4
		default:
			unsolicited = true
			return nil
		}
		if seen&bit != 0 {
			return ErrTLSIllegalParameter
		}
		seen |= bit
		d := tlsReader{b: data}
		switch typ {
		case tlsExtSupportedVersions:
			if len(data) != 2 {
				return ErrTLSDecodeError
			}
			if d.u16() != tlsVersion13 {
				return ErrTLSIllegalParameter
			}
		case tlsExtKeyShare:
			if sh.HRR {
				if len(data) != 2 {
					return ErrTLSDecodeError
				}
				sh.Group = uint16(d.u16())
				if sh.Group != TLSGroupSecp256r1 {
					return ErrTLSIllegalParameter
				}
				return nil
			}
			g := d.u16()
			l := d.u16()
			if d.bad || l == 0 || l != len(d.b) {
				return ErrTLSDecodeError
			}
			if g != int(offered) || offered == TLSGroupX25519 && l != TLSX25519Len ||
				offered == TLSGroupSecp256r1 && l != TLSP256ShareLen {
				return ErrTLSIllegalParameter
			}
			sh.Group = uint16(g)
			sh.Key = d.b
		case tlsExtCookie:
			l := d.u16()
			if d.bad || l == 0 || l != len(d.b) {
				return ErrTLSDecodeError
			}
			sh.Cookie = d.b
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	switch {
	case seen&1 == 0:
		return nil, ErrTLSProtocolVersion
	case unsolicited:
		return nil, ErrTLSUnsupportedExtension
	case !sh.HRR && seen&2 == 0:
		return nil, ErrTLSMissingExtension
	case sh.HRR && seen&6 == 0:
		return nil, ErrTLSIllegalParameter
	}
	return sh, nil
}

// TLS EncryptedExtensions results: a bit per extension accepted.
const (
	TLSEEServerName      = 1 << 0 // the server used our host name (empty data, RFC 6066 §3)
	TLSEESupportedGroups = 1 << 1 // the server's groups (§4.2.7), skipped
)

// ParseEncryptedExtensions checks an EncryptedExtensions body: an extension
// block filling it (else decode_error), extensions walked in order:
// server_name with empty data and supported_groups with a well-formed
// non-empty even list (else decode_error) are accepted, a second copy of
// either is illegal_parameter; extensions RFC 8446 §4.2 allows in
// EncryptedExtensions that we did not offer (max_fragment_length,
// use_srtp, heartbeat, ALPN, client/server_certificate_type, early_data),
// and unknown ones, are unsupported_extension; known extensions that never
// appear there are illegal_parameter (§4.2). It returns TLSEE* bits.
func ParseEncryptedExtensions(body []byte) (int, error) {
	seen := 0
	err := tlsExtensions(body, func(typ int, data []byte) error {
		bit := 0
		switch typ {
		case tlsExtServerName:
			if len(data) != 0 {
				return ErrTLSDecodeError
			}
			bit = TLSEEServerName
		case tlsExtSupportedGroups:
			d := tlsReader{b: data}
			l := d.u16()
			if d.bad || l == 0 || l%2 != 0 || l != len(d.b) {
				return ErrTLSDecodeError
			}
			bit = TLSEESupportedGroups
		case tlsExtMaxFragmentLength, tlsExtUseSRTP, tlsExtHeartbeat, tlsExtALPN,
			tlsExtClientCertType, tlsExtServerCertType, tlsExtEarlyData:
			return ErrTLSUnsupportedExtension
		case tlsExtStatusRequest, tlsExtSignatureAlgorithms, tlsExtSCT, tlsExtPadding,
			tlsExtPreSharedKey, tlsExtSupportedVersions, tlsExtCookie, tlsExtPSKModes,
			tlsExtCertAuthorities, tlsExtOIDFilters, tlsExtPostHandshakeAuth,
			tlsExtSigAlgsCert, tlsExtKeyShare:
			return ErrTLSIllegalParameter
		default:
			return ErrTLSUnsupportedExtension
		}
		if seen&bit != 0 {
			return ErrTLSIllegalParameter
		}
		seen |= bit
		return nil
	})
	if err != nil {
		return 0, err
	}
	return seen, nil
}

// TLSHSReader reassembles handshake messages from record contents (§5.1:
// a message may span records, and a record may carry several). Its
// buffer holds one message of at most max body bytes and its header.
type TLSHSReader struct {
	buf []byte
	cap int
	max int
}

// NewTLSHSReader makes a reader for messages of at most max body bytes.
func NewTLSHSReader(max int) *TLSHSReader {
	return &TLSHSReader{cap: max + tlsHSHeaderLen, max: max}
}

// Feed takes as many of b's bytes as the buffer has room for and returns
// how many; the caller feeds the rest after Next has taken messages out.
func (h *TLSHSReader) Feed(b []byte) int {
	n := h.cap - len(h.buf)
	if n > len(b) {
		n = len(b)
	}
	h.buf = append(h.buf, b[:n]...)
	return n
}

// Next returns the next whole message (type, uint24 length, body), or
// incomplete (feed more), or handshake_too_large when the next message's
// header says more than max bytes (the reader then stays refused).
func (h *TLSHSReader) Next() ([]byte, error) {
	if len(h.buf) < tlsHSHeaderLen {
		return nil, ErrTLSIncomplete
	}
	n := int(h.buf[1])<<16 | int(h.buf[2])<<8 | int(h.buf[3])
	if n > h.max {
		return nil, ErrTLSHandshakeTooLarge
	}
	if len(h.buf) < tlsHSHeaderLen+n {
		return nil, ErrTLSIncomplete
	}
	msg := append([]byte(nil), h.buf[:tlsHSHeaderLen+n]...)
	h.buf = append(h.buf[:0], h.buf[tlsHSHeaderLen+n:]...)
	return msg, nil
}

// tlsAlertNames maps AlertDescription values (§6) to their names.
var tlsAlertNames = map[byte]string{
	0: "close_notify", 10: "unexpected_message", 20: "bad_record_mac", 22: "record_overflow",
	40: "handshake_failure", 42: "bad_certificate", 43: "unsupported_certificate",
	44: "certificate_revoked", 45: "certificate_expired", 46: "certificate_unknown",
	47: "illegal_parameter", 48: "unknown_ca", 49: "access_denied", 50: "decode_error",
	51: "decrypt_error", 70: "protocol_version", 71: "insufficient_security",
	80: "internal_error", 86: "inappropriate_fallback", 90: "user_canceled",
	109: "missing_extension", 110: "unsupported_extension", 112: "unrecognized_name",
	113: "bad_certificate_status_response", 115: "unknown_psk_identity",
	116: "certificate_required", 120: "no_application_protocol",
}

// TLSAlertName is an alert description's name (RFC 8446 §6), or
// "unknown_alert".
func TLSAlertName(code byte) string {
	if s, ok := tlsAlertNames[code]; ok {
		return s
	}
	return "unknown_alert"
}
