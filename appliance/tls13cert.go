package appliance

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/sha512"
	"math/big"
)

// The server's Certificate and CertificateVerify messages (RFC 8446
// §4.4.2, §4.4.3): the references of the kernel's tls_parse_certificate
// and tls_check_cert_verify (kernel/tls/certmsg.inc). Both take a
// message's body (after the 4-byte handshake header).

// TLS 1.3 SignatureSchemes the client offers for CertificateVerify
// (handshake.inc's signature_algorithms; rsa_pkcs1_* are for certificates
// only, §4.2.3).
const (
	TLSSigECDSAP256SHA256 = 0x0403
	TLSSigECDSAP384SHA384 = 0x0503
	TLSSigRSAPSSSHA256    = 0x0804
	TLSSigRSAPSSSHA384    = 0x0805
)

// tlsCVContext is the context string of a server's CertificateVerify (§4.4.3).
const tlsCVContext = "TLS 1.3, server CertificateVerify"

// ParseTLSCertificate splits a Certificate body: certificate_request_context
// <0..255> (not empty: illegal_parameter, §4.4.2), certificate_list
// <0..2^24-1> filling the rest (decode_error otherwise), each
// CertificateEntry a cert_data <1..2^24-1> and extensions <0..2^16-1>
// (framing errors: decode_error; extensions present: unsupported_extension,
// since the client asks for none); a 9th entry is chain_too_long, none is
// certificate_required. It returns the certificates' DER, pointing into body.
func ParseTLSCertificate(body []byte) ([][]byte, error) {
	if len(body) < 1 {
		return nil, ErrTLSDecodeError
	}
	if body[0] != 0 {
		return nil, ErrTLSIllegalParameter
	}
	b := body[1:]
	if len(b) < 3 {
		return nil, ErrTLSDecodeError
	}
	n := int(b[0])<<16 | int(b[1])<<8 | int(b[2])
	b = b[3:]
	if n != len(b) {
		return nil, ErrTLSDecodeError
	}
	var out [][]byte
	for len(b) > 0 {
		if len(out) == X509MaxListed {
			return nil, ErrChainTooLong
		}
		if len(b) < 3 {
			return nil, ErrTLSDecodeError
		}
		cl := int(b[0])<<16 | int(b[1])<<8 | int(b[2])
		b = b[3:]
		if cl == 0 || cl > len(b) {
			return nil, ErrTLSDecodeError
		}
		cert := b[:cl]
		b = b[cl:]
		if len(b) < 2 {
			return nil, ErrTLSDecodeError
		}
		el := int(b[0])<<8 | int(b[1])
		b = b[2:]
		if el > len(b) {
			return nil, ErrTLSDecodeError
		}
		if el != 0 {
			return nil, ErrTLSUnsupportedExtension
		}
		out = append(out, cert)
	}
	if len(out) == 0 {
		return nil, ErrCertificateRequired
	}
	return out, nil
}

// TLSCertVerifyContent is what a server's CertificateVerify signs: 64
// spaces, the context string, a zero byte and the transcript hash (§4.4.3).
func TLSCertVerifyContent(transcript []byte) []byte {
	c := bytes.Repeat([]byte{0x20}, 64)
	c = append(c, tlsCVContext...)
	c = append(c, 0)
	return append(c, transcript...)
}

// CheckTLSCertVerify checks a CertificateVerify body against the leaf and
// the transcript hash up to the Certificate message: algorithm (u16),
// signature <0..2^16-1>, nothing more (decode_error); a scheme the client
// offered (illegal_parameter) and that fits the leaf's key: P-256 for
// 0x0403, P-384 for 0x0503, RSA for 0x0804/0x0805 (illegal_parameter);
// then the signature (ECDSA-Sig-Value as in certificates; PSS with a salt
// of the hash's length): bad_signature. It returns the scheme.
func CheckTLSCertVerify(body []byte, leaf *X509Cert, transcript []byte) (int, error) {
	if len(body) < 4 {
		return 0, ErrTLSDecodeError
	}
	scheme := int(body[0])<<8 | int(body[1])
	sl := int(body[2])<<8 | int(body[3])
	if sl != len(body)-4 {
		return 0, ErrTLSDecodeError
	}
	sig := body[4:]
	kind := x509KeyKind(leaf)
	var h crypto.Hash
	switch scheme {
	case TLSSigECDSAP256SHA256:
		h = crypto.SHA256
		if kind != 256 {
			return 0, ErrTLSIllegalParameter
		}
	case TLSSigECDSAP384SHA384:
		h = crypto.SHA384
		if kind != 384 {
			return 0, ErrTLSIllegalParameter
		}
	case TLSSigRSAPSSSHA256, TLSSigRSAPSSSHA384:
		h = crypto.SHA256
		if scheme == TLSSigRSAPSSSHA384 {
			h = crypto.SHA384
		}
		if kind != -1 {
			return 0, ErrTLSIllegalParameter
		}
	default:
		return 0, ErrTLSIllegalParameter
	}
	content := TLSCertVerifyContent(transcript)
	var digest []byte
	if h == crypto.SHA256 {
		d := sha256.Sum256(content)
		digest = d[:]
	} else {
		d := sha512.Sum384(content)
		digest = d[:]
	}
	if kind == -1 {
		k, err := x509RSAKey(leaf.SPKIKey)
		if err != nil {
			return 0, err
		}
		if rsa.VerifyPSS(k, h, digest, sig, &rsa.PSSOptions{SaltLength: h.Size(), Hash: h}) != nil {
			return 0, ErrBadSignature
		}
		return scheme, nil
	}
	k, err := x509ECKey(leaf)
	if err != nil {
		return 0, err
	}
	r, s, ok := x509ECDSASig(sig)
	if !ok || !ecdsa.Verify(k, digest, new(big.Int).SetBytes(r), new(big.Int).SetBytes(s)) {
		return 0, ErrBadSignature
	}
	return scheme, nil
}
