package appliance

import (
	"bytes"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net"
	"slices"
	"testing"
	"time"
)

// testServerCert is a self-signed ECDSA P-256 certificate for
// "gateway.test", enough for a crypto/tls server to answer.
func testServerCert(t testing.TB) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "gateway.test"},
		DNSNames:     []string{"gateway.test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// readRecord reads one TLSPlaintext/TLSCiphertext record off r.
func readRecord(t *testing.T, r io.Reader) []byte {
	t.Helper()
	hdr := make([]byte, TLSRecordHeaderLen)
	if _, err := io.ReadFull(r, hdr); err != nil {
		t.Fatalf("reading a record header: %v", err)
	}
	body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
	if _, err := io.ReadFull(r, body); err != nil {
		t.Fatalf("reading a record body: %v", err)
	}
	return append(hdr, body...)
}

// plaintextRecord frames a handshake message as one TLSPlaintext record
// (§5.1), legacy_record_version 0x0301 as a first ClientHello may use.
func plaintextRecord(msg []byte) []byte {
	return append([]byte{TLSContentHandshake, 3, 1, byte(len(msg) >> 8), byte(len(msg))}, msg...)
}

// crossServer runs a crypto/tls server on one end of a pipe; it returns
// the client end and the ClientHelloInfo the server saw (read it after
// the server's first flight arrived).
func crossServer(t *testing.T, cfg *tls.Config) (net.Conn, *tls.ClientHelloInfo, chan error) {
	t.Helper()
	cli, srv := net.Pipe()
	info := new(tls.ClientHelloInfo)
	cfg.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		*info = *h
		info.SupportedVersions = slices.Clone(h.SupportedVersions)
		return nil, nil
	}
	done := make(chan error, 1)
	go func() { done <- tls.Server(srv, cfg).Handshake() }()
	t.Cleanup(func() { cli.Close(); srv.Close(); <-done })
	return cli, info, done
}

func newParams(t *testing.T, preferAES bool) (*TLSClientHelloParams, *ecdh.PrivateKey) {
	t.Helper()
	priv, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p := &TLSClientHelloParams{HostName: []byte("gateway.test"), PreferAES: preferAES}
	rand.Read(p.Random[:])
	rand.Read(p.SessionID[:])
	copy(p.KeyShare[:], priv.PublicKey().Bytes())
	return p, priv
}

// TestClientHelloCryptoTLS sends our ClientHello to a crypto/tls server
// and reads its whole first flight: the server sees our host name, suites
// in our order, groups, signature schemes and TLS 1.3 only; our parser
// accepts its ServerHello (the suite the server chose, its x25519 share);
// with the shared secret the step-1 reference opens the flight, our
// reader splits it into EncryptedExtensions, Certificate,
// CertificateVerify and Finished, our parser accepts the
// EncryptedExtensions, and the server's Finished is the one we compute.
func TestClientHelloCryptoTLS(t *testing.T) {
	cert := testServerCert(t)
	for _, preferAES := range []bool{false, true} {
		p, priv := newParams(t, preferAES)
		ch, err := BuildClientHello(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(ch) != tlsClientHelloFixed+len(p.HostName) {
			t.Errorf("ClientHello of %d bytes, want %d", len(ch), tlsClientHelloFixed+len(p.HostName))
		}
		cli, info, _ := crossServer(t, &tls.Config{Certificates: []tls.Certificate{cert}})
		go cli.Write(plaintextRecord(ch))
		rec := readRecord(t, cli)
		if info.ServerName != "gateway.test" {
			t.Errorf("server saw SNI %q", info.ServerName)
		}
		wantSuites := []uint16{TLSSuiteChaCha20Poly1305SHA256, TLSSuiteAES128GCMSHA256}
		if preferAES {
			wantSuites[0], wantSuites[1] = wantSuites[1], wantSuites[0]
		}
		if !slices.Equal(info.CipherSuites, wantSuites) {
			t.Errorf("server saw suites %04x, want %04x", info.CipherSuites, wantSuites)
		}
		if !slices.Equal(info.SupportedCurves, []tls.CurveID{tls.X25519, tls.CurveP256}) {
			t.Errorf("server saw groups %v", info.SupportedCurves)
		}
		var schemes []uint16
		for _, s := range info.SignatureSchemes {
			schemes = append(schemes, uint16(s))
		}
		if !slices.Equal(schemes, TLSSignatureAlgorithms) {
			t.Errorf("server saw signature schemes %04x", schemes)
		}
		if !slices.Equal(info.SupportedVersions, []uint16{tls.VersionTLS13}) {
			t.Errorf("server saw versions %04x", info.SupportedVersions)
		}

		if rec[0] != TLSContentHandshake {
			t.Fatalf("server's first record has type %d", rec[0])
		}
		hs := NewTLSHSReader(1 << 14)
		hs.Feed(rec[TLSRecordHeaderLen:])
		shMsg, err := hs.Next()
		if err != nil || shMsg[0] != TLSHSServerHello {
			t.Fatalf("no ServerHello: %v %x", err, shMsg)
		}
		sh, err := ParseServerHello(shMsg[tlsHSHeaderLen:], p.SessionID[:])
		if err != nil {
			t.Fatalf("ParseServerHello of crypto/tls's answer: %v", err)
		}
		if sh.HRR || sh.Group != TLSGroupX25519 || len(sh.Key) != TLSX25519Len {
			t.Fatalf("ServerHello parsed as %+v", sh)
		}
		if !preferAES && sh.Suite != TLSSuiteChaCha20Poly1305SHA256 {
			t.Errorf("ChaCha20 first, the server chose %04x", sh.Suite)
		}
		t.Logf("preferAES=%v: crypto/tls chose suite %04x", preferAES, sh.Suite)

		peer, err := ecdh.X25519().NewPublicKey(sh.Key)
		if err != nil {
			t.Fatal(err)
		}
		shared, err := priv.ECDH(peer)
		if err != nil {
			t.Fatal(err)
		}
		c, err := NewTLS13(sh.Suite, TLSClient)
		if err != nil {
			t.Fatal(err)
		}
		c.AddTranscript(ch)
		c.AddTranscript(shMsg)
		c.HandshakeSecrets(shared)
		var types []byte
		for len(types) == 0 || types[len(types)-1] != TLSHSFinished {
			rec := readRecord(t, cli)
			if rec[0] == 20 { // change_cipher_spec (§D.4): the server answers our session id
				continue
			}
			typ, content, _, err := c.Open(rec)
			if err != nil || typ != TLSContentHandshake {
				t.Fatalf("opening the server's flight: type %d, %v", typ, err)
			}
			for len(content) > 0 {
				k := hs.Feed(content)
				content = content[k:]
				for {
					msg, err := hs.Next()
					if err == ErrTLSIncomplete {
						break
					}
					if err != nil {
						t.Fatalf("reader: %v", err)
					}
					types = append(types, msg[0])
					switch msg[0] {
					case TLSHSEncryptedExtensions:
						if _, err := ParseEncryptedExtensions(msg[tlsHSHeaderLen:]); err != nil {
							t.Errorf("ParseEncryptedExtensions of crypto/tls's: %v (%x)", err, msg)
						}
					case TLSHSFinished:
						if want := c.FinishedVerifyData(false); !bytes.Equal(msg[tlsHSHeaderLen:], want) {
							t.Errorf("server Finished %x, want %x", msg[tlsHSHeaderLen:], want)
						}
					}
					c.AddTranscript(msg)
				}
			}
		}
		want := []byte{TLSHSEncryptedExtensions, TLSHSCertificate, TLSHSCertificateVerify, TLSHSFinished}
		if !bytes.Equal(types, want) {
			t.Errorf("server flight messages %v, want %v", types, want)
		}
	}
}

// TestHelloRetryRequestCryptoTLS: a crypto/tls server that only takes
// P-256 answers our x25519 share with a HelloRetryRequest; our parser
// names it as one, with selected_group secp256r1.
func TestHelloRetryRequestCryptoTLS(t *testing.T) {
	p, _ := newParams(t, false)
	ch, _ := BuildClientHello(p)
	cli, _, _ := crossServer(t, &tls.Config{Certificates: []tls.Certificate{testServerCert(t)},
		CurvePreferences: []tls.CurveID{tls.CurveP256}})
	go cli.Write(plaintextRecord(ch))
	rec := readRecord(t, cli)
	hs := NewTLSHSReader(1 << 14)
	hs.Feed(rec[TLSRecordHeaderLen:])
	msg, err := hs.Next()
	if err != nil {
		t.Fatal(err)
	}
	sh, err := ParseServerHello(msg[tlsHSHeaderLen:], p.SessionID[:])
	if err != nil {
		t.Fatalf("ParseServerHello of crypto/tls's HelloRetryRequest: %v", err)
	}
	if !sh.HRR || sh.Group != TLSGroupSecp256r1 || sh.Key != nil {
		t.Errorf("HelloRetryRequest parsed as %+v", sh)
	}
}

// TestTLS12ServerRefusesUs: a crypto/tls server capped at TLS 1.2 cannot
// answer a ClientHello that offers TLS 1.3 only; its alert is
// protocol_version, which the names table names.
func TestTLS12ServerRefusesUs(t *testing.T) {
	p, _ := newParams(t, false)
	ch, _ := BuildClientHello(p)
	cli, _, _ := crossServer(t, &tls.Config{Certificates: []tls.Certificate{testServerCert(t)},
		MaxVersion: tls.VersionTLS12})
	go cli.Write(plaintextRecord(ch))
	rec := readRecord(t, cli)
	if rec[0] != TLSContentAlert || len(rec) != 7 || TLSAlertName(rec[6]) != "protocol_version" {
		t.Errorf("TLS 1.2 server answered %x", rec)
	}
}

// TestBuildClientHelloHostNames: the host name's bounds.
func TestBuildClientHelloHostNames(t *testing.T) {
	for _, n := range []int{0, 1, TLSSNIMax, TLSSNIMax + 1} {
		p := &TLSClientHelloParams{HostName: bytes.Repeat([]byte{'a'}, n)}
		ch, err := BuildClientHello(p)
		ok := n >= 1 && n <= TLSSNIMax
		if (err == nil) != ok {
			t.Errorf("host name of %d bytes: %v", n, err)
		}
		if ok && len(ch) > TLSClientHelloMax {
			t.Errorf("ClientHello of %d bytes over TLSClientHelloMax", len(ch))
		}
	}
}

// TestServerHelloRefusals: one case per refusal, each named, built by
// changing a valid ServerHello (tlsHSServerHello, the corpus's builder).
func TestServerHelloRefusals(t *testing.T) {
	sid := bytes.Repeat([]byte{7}, 32)
	key := bytes.Repeat([]byte{9}, 32)
	ext := func(typ int, data []byte) []byte {
		return append([]byte{byte(typ >> 8), byte(typ), byte(len(data) >> 8), byte(len(data))}, data...)
	}
	sv := ext(tlsExtSupportedVersions, []byte{3, 4})
	ks := ext(tlsExtKeyShare, append([]byte{0, 0x1d, 0, 32}, key...))
	cases := []struct {
		name string
		body []byte
		err  error
	}{
		{"valid", tlsHSServerHello(0x0303, false, sid, 0x1303, 0, sv, ks), nil},
		{"valid, keys reversed", tlsHSServerHello(0x0303, false, sid, 0x1301, 0, ks, sv), nil},
		{"HRR", tlsHSServerHello(0x0303, true, sid, 0x1301, 0, sv, ext(tlsExtKeyShare, []byte{0, 0x17})), nil},
		{"HRR cookie only", tlsHSServerHello(0x0303, true, sid, 0x1301, 0, sv, ext(tlsExtCookie, []byte{0, 1, 5})), nil},
		{"short", []byte{3, 3, 1}, ErrTLSDecodeError},
		{"TLS 1.1", tlsHSServerHello(0x0302, false, sid, 0x1303, 0, sv, ks), ErrTLSProtocolVersion},
		{"wrong session id", tlsHSServerHello(0x0303, false, key, 0x1303, 0, sv, ks), ErrTLSIllegalParameter},
		{"empty session id", tlsHSServerHello(0x0303, false, nil, 0x1303, 0, sv, ks), ErrTLSIllegalParameter},
		{"AES-256", tlsHSServerHello(0x0303, false, sid, 0x1302, 0, sv, ks), ErrTLSIllegalParameter},
		{"compression", tlsHSServerHello(0x0303, false, sid, 0x1303, 1, sv, ks), ErrTLSIllegalParameter},
		{"TLS 1.2, no extensions", tlsHSServerHello(0x0303, false, sid, 0x1303, 0)[:2+32+1+32+3], ErrTLSProtocolVersion},
		{"TLS 1.2, renegotiation_info", tlsHSServerHello(0x0303, false, sid, 0x1303, 0, ext(0xff01, []byte{0})), ErrTLSProtocolVersion},
		{"supported_versions 1.2", tlsHSServerHello(0x0303, false, sid, 0x1303, 0, ext(tlsExtSupportedVersions, []byte{3, 3}), ks), ErrTLSIllegalParameter},
		{"supported_versions long", tlsHSServerHello(0x0303, false, sid, 0x1303, 0, ext(tlsExtSupportedVersions, []byte{3, 4, 0}), ks), ErrTLSDecodeError},
		{"duplicate key_share", tlsHSServerHello(0x0303, false, sid, 0x1303, 0, sv, ks, ks), ErrTLSIllegalParameter},
		{"cookie in ServerHello", tlsHSServerHello(0x0303, false, sid, 0x1303, 0, sv, ks, ext(tlsExtCookie, []byte{0, 1, 5})), ErrTLSUnsupportedExtension},
		{"pre_shared_key", tlsHSServerHello(0x0303, false, sid, 0x1303, 0, sv, ks, ext(tlsExtPreSharedKey, []byte{0, 0})), ErrTLSUnsupportedExtension},
		{"no key_share", tlsHSServerHello(0x0303, false, sid, 0x1303, 0, sv), ErrTLSMissingExtension},
		{"P-256 share", tlsHSServerHello(0x0303, false, sid, 0x1303, 0, sv, ext(tlsExtKeyShare, append([]byte{0, 0x17, 0, 65}, make([]byte, 65)...))), ErrTLSIllegalParameter},
		{"31-byte share", tlsHSServerHello(0x0303, false, sid, 0x1303, 0, sv, ext(tlsExtKeyShare, append([]byte{0, 0x1d, 0, 31}, key[:31]...))), ErrTLSIllegalParameter},
		{"share length past the data", tlsHSServerHello(0x0303, false, sid, 0x1303, 0, sv, ext(tlsExtKeyShare, append([]byte{0, 0x1d, 0, 33}, key...))), ErrTLSDecodeError},
		{"HRR x25519", tlsHSServerHello(0x0303, true, sid, 0x1301, 0, sv, ext(tlsExtKeyShare, []byte{0, 0x1d})), ErrTLSIllegalParameter},
		{"HRR changes nothing", tlsHSServerHello(0x0303, true, sid, 0x1301, 0, sv), ErrTLSIllegalParameter},
		{"HRR empty cookie", tlsHSServerHello(0x0303, true, sid, 0x1301, 0, sv, ext(tlsExtCookie, []byte{0, 0})), ErrTLSDecodeError},
		{"extension past the end", append(tlsHSServerHello(0x0303, false, sid, 0x1303, 0, sv, ks), 0), ErrTLSDecodeError},
	}
	for _, c := range cases {
		_, err := ParseServerHello(c.body, sid)
		if err != c.err {
			t.Errorf("%s: %v, want %v", c.name, err, c.err)
		}
	}
}

// TestEncryptedExtensionsRefusals: one case per verdict.
func TestEncryptedExtensionsRefusals(t *testing.T) {
	cases := []struct {
		body []byte
		bits int
		err  error
	}{
		{[]byte{0, 0}, 0, nil},
		{[]byte{0, 4, 0, 0, 0, 0}, TLSEEServerName, nil},
		{[]byte{0, 14, 0, 0, 0, 0, 0, 10, 0, 6, 0, 4, 0, 0x1d, 0, 0x17}, TLSEEServerName | TLSEESupportedGroups, nil},
		{[]byte{0}, 0, ErrTLSDecodeError},
		{[]byte{0, 5, 0, 0, 0, 0}, 0, ErrTLSDecodeError},
		{[]byte{0, 5, 0, 0, 0, 1, 0}, 0, ErrTLSDecodeError},
		{[]byte{0, 8, 0, 0, 0, 0, 0, 0, 0, 0}, 0, ErrTLSIllegalParameter},
		{[]byte{0, 7, 0, 10, 0, 3, 0, 1, 0}, 0, ErrTLSDecodeError},
		{[]byte{0, 6, 0, 16, 0, 2, 0, 0}, 0, ErrTLSUnsupportedExtension},
		{[]byte{0, 4, 0, 51, 0, 0}, 0, ErrTLSIllegalParameter},
		{[]byte{0, 4, 0x12, 0x34, 0, 0}, 0, ErrTLSUnsupportedExtension},
		{[]byte{0, 4, 0, 28, 0, 0}, 0, ErrTLSUnsupportedExtension}, // record_size_limit (RFC 8448 sends it)
	}
	for _, c := range cases {
		bits, err := ParseEncryptedExtensions(c.body)
		if err != c.err || bits != c.bits {
			t.Errorf("%x: %d %v, want %d %v", c.body, bits, err, c.bits, c.err)
		}
	}
}

// TestHSReader: messages split one byte at a time and several per feed
// come out whole; a header over the maximum is refused.
func TestHSReader(t *testing.T) {
	stream := []byte{1, 0, 0, 2, 'a', 'b', 2, 0, 0, 0, 8, 0, 0, 1, 'z'}
	for _, chunk := range []int{1, 2, 5, len(stream)} {
		h := NewTLSHSReader(16)
		var got [][]byte
		for off := 0; off < len(stream); {
			off += h.Feed(stream[off:min(off+chunk, len(stream))])
			for {
				m, err := h.Next()
				if err != nil {
					break
				}
				got = append(got, m)
			}
		}
		if len(got) != 3 || string(got[0]) != "\x01\x00\x00\x02ab" || string(got[2]) != "\x08\x00\x00\x01z" {
			t.Errorf("chunk %d: %q", chunk, got)
		}
	}
	h := NewTLSHSReader(16)
	h.Feed([]byte{11, 0, 0, 17})
	if _, err := h.Next(); err != ErrTLSHandshakeTooLarge {
		t.Errorf("17 bytes over a 16-byte maximum: %v", err)
	}
	if TLSAlertName(110) != "unsupported_extension" || TLSAlertName(255) != "unknown_alert" {
		t.Error("alert names")
	}
}

func FuzzParseServerHello(f *testing.F) {
	for _, e := range tlsHSCorpusEntries() {
		if e[0] == tlsHSKindServerHello {
			f.Add(e[1+TLSSessionIDLen:], e[1:1+TLSSessionIDLen])
		}
	}
	f.Fuzz(func(t *testing.T, body, sid []byte) {
		sh, err := ParseServerHello(body, sid)
		if TLSHSReasonIndex(err) < 0 {
			t.Fatalf("unnamed refusal %v", err)
		}
		if err == nil && (sh.Suite>>8 != 0x13 || (!sh.HRR && len(sh.Key) != TLSX25519Len)) {
			t.Fatalf("accepted %+v", sh)
		}
	})
}

func FuzzParseEncryptedExtensions(f *testing.F) {
	for _, e := range tlsHSCorpusEntries() {
		if e[0] == tlsHSKindEncryptedExtensions {
			f.Add(e[1:])
		}
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		_, err := ParseEncryptedExtensions(body)
		if TLSHSReasonIndex(err) < 0 {
			t.Fatalf("unnamed refusal %v", err)
		}
	})
}

func FuzzTLSHSReader(f *testing.F) {
	f.Add([]byte{1, 0, 0, 2, 'a', 'b', 2, 0, 0, 0}, uint16(3), uint16(16))
	f.Fuzz(func(t *testing.T, stream []byte, chunk, max uint16) {
		var d digest
		tlsHSFrameDigest(&d, stream, int(chunk)+1, int(max))
	})
}
