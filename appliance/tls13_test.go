package appliance

import (
	"bytes"
	"crypto/ecdh"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"testing"
)

const rfc8448File = "testdata/rfc8448-simple-1rtt.txt"

func loadRFC8448(t testing.TB) map[string][]byte {
	t.Helper()
	v, err := LoadRFC8448(rfc8448File)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func wantBytes(t *testing.T, v map[string][]byte, name string, got []byte) {
	t.Helper()
	want, ok := v[name]
	if !ok {
		t.Fatalf("%s: not in %s", name, rfc8448File)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s:\n got %x\nwant %x", name, got, want)
	}
}

// TestTLS13RFC8448 walks RFC 8448 §3 through the reference from the
// client's side: every published secret, key, IV, Finished and protected
// record.
func TestTLS13RFC8448(t *testing.T) {
	v := loadRFC8448(t)
	priv, err := ecdh.X25519().NewPrivateKey(v["client_private"])
	if err != nil {
		t.Fatal(err)
	}
	wantBytes(t, v, "client_public", priv.PublicKey().Bytes())
	pub, err := ecdh.X25519().NewPublicKey(v["server_public"])
	if err != nil {
		t.Fatal(err)
	}
	shared, err := priv.ECDH(pub)
	if err != nil {
		t.Fatal(err)
	}
	wantBytes(t, v, "shared_secret", shared)

	c, err := NewTLS13(TLSSuiteAES128GCMSHA256, TLSClient)
	if err != nil {
		t.Fatal(err)
	}
	wantBytes(t, v, "early_secret", c.Secret)
	wantBytes(t, v, "derived_handshake", c.derived())
	c.AddTranscript(v["client_hello"])
	c.AddTranscript(v["server_hello"])
	wantBytes(t, v, "hash_ch_sh", c.TranscriptHash())
	c.HandshakeSecrets(shared)
	wantBytes(t, v, "handshake_secret", c.Secret)
	wantBytes(t, v, "derived_master", c.derived())
	wantBytes(t, v, "client_hs_traffic", c.Write.Secret)
	wantBytes(t, v, "server_hs_traffic", c.Read.Secret)
	wantBytes(t, v, "client_hs_key", c.Write.Key)
	wantBytes(t, v, "client_hs_iv", c.Write.IV)
	wantBytes(t, v, "server_hs_key", c.Read.Key)
	wantBytes(t, v, "server_hs_iv", c.Read.IV)
	wantBytes(t, v, "server_finished_key", TLS13ExpandLabel(sha256.New, c.Read.Secret, "finished", nil, 32))
	wantBytes(t, v, "client_finished_key", TLS13ExpandLabel(sha256.New, c.Write.Secret, "finished", nil, 32))

	typ, flight, n, err := c.Open(v["server_flight_record"])
	if err != nil || typ != TLSContentHandshake || n != len(v["server_flight_record"]) {
		t.Fatalf("server flight: type %d, %d bytes used, %v", typ, n, err)
	}
	// EncryptedExtensions (40) + Certificate (445) + CertificateVerify
	// (136) + Finished (36), as the trace lists them.
	if len(flight) != 40+445+136+36 {
		t.Fatalf("server flight: %d bytes, want 657", len(flight))
	}
	wantBytes(t, v, "encrypted_extensions", flight[:40])
	cut := len(flight) - tlsFinishedMsgLen
	wantBytes(t, v, "server_finished", flight[cut+4:])
	c.AddTranscript(flight[:cut])
	wantBytes(t, v, "server_finished", c.FinishedVerifyData(false))
	c.AddTranscript(flight[cut:])
	wantBytes(t, v, "hash_ch_sf", c.TranscriptHash())

	c.ApplicationSecrets()
	wantBytes(t, v, "master_secret", c.Secret)
	wantBytes(t, v, "client_ap_traffic", c.ClientAppSecret)
	wantBytes(t, v, "server_ap_traffic", c.ServerAppSecret)
	wantBytes(t, v, "exporter_master", c.deriveSecret(c.Secret, "exp master", c.TranscriptHash()))
	fin := FinishedMessage(c.FinishedVerifyData(true))
	wantBytes(t, v, "client_finished", fin[4:])
	rec, err := c.Seal(TLSContentHandshake, fin, 0)
	if err != nil {
		t.Fatal(err)
	}
	wantBytes(t, v, "client_finished_record", rec)
	c.AddTranscript(fin)
	wantBytes(t, v, "hash_ch_cf", c.TranscriptHash())
	wantBytes(t, v, "resumption_master", c.deriveSecret(c.Secret, "res master", c.TranscriptHash()))

	c.ActivateRead()
	c.ActivateWrite()
	wantBytes(t, v, "client_ap_key", c.Write.Key)
	wantBytes(t, v, "client_ap_iv", c.Write.IV)
	wantBytes(t, v, "server_ap_key", c.Read.Key)
	wantBytes(t, v, "server_ap_iv", c.Read.IV)
	if rec, err = c.Seal(TLSContentApplicationData, v["app_payload"], 0); err != nil {
		t.Fatal(err)
	}
	wantBytes(t, v, "client_app_record", rec)
	c.Read.Seq = 1 // the server's first application record was a NewSessionTicket
	typ, got, _, err := c.Open(v["server_app_record"])
	if err != nil || typ != TLSContentApplicationData {
		t.Fatalf("server application record: type %d, %v", typ, err)
	}
	wantBytes(t, v, "app_payload", got)
}

// TestTLS13RFC8448Server plays the server's side: it seals the flight and
// the application record the trace shows, and opens the client's records.
func TestTLS13RFC8448Server(t *testing.T) {
	v := loadRFC8448(t)
	cl, _ := NewTLS13(TLSSuiteAES128GCMSHA256, TLSClient)
	sv, _ := NewTLS13(TLSSuiteAES128GCMSHA256, TLSServer)
	for _, c := range []*TLS13{cl, sv} {
		c.AddTranscript(v["client_hello"])
		c.AddTranscript(v["server_hello"])
		c.HandshakeSecrets(v["shared_secret"])
	}
	_, flight, _, err := cl.Open(v["server_flight_record"])
	if err != nil {
		t.Fatal(err)
	}
	rec, err := sv.Seal(TLSContentHandshake, flight, 0)
	if err != nil {
		t.Fatal(err)
	}
	wantBytes(t, v, "server_flight_record", rec)
	sv.AddTranscript(flight)
	sv.ApplicationSecrets()
	typ, fin, _, err := sv.Open(v["client_finished_record"])
	if err != nil || typ != TLSContentHandshake {
		t.Fatalf("client Finished record: type %d, %v", typ, err)
	}
	if want := FinishedMessage(sv.FinishedVerifyData(false)); !bytes.Equal(fin, want) {
		t.Errorf("client Finished: got %x, server expects %x", fin, want)
	}
	sv.ActivateRead()
	sv.ActivateWrite()
	sv.Write.Seq = 1
	if rec, err = sv.Seal(TLSContentApplicationData, v["app_payload"], 0); err != nil {
		t.Fatal(err)
	}
	wantBytes(t, v, "server_app_record", rec)
	_, got, _, err := sv.Open(v["client_app_record"])
	if err != nil {
		t.Fatal(err)
	}
	wantBytes(t, v, "app_payload", got)
}

// TestTLS13Refusals checks each refusal of the opener and the sealer by name,
// for both suites.
func TestTLS13Refusals(t *testing.T) {
	for _, suite := range []uint16{TLSSuiteAES128GCMSHA256, TLSSuiteChaCha20Poly1305SHA256} {
		pair := func() (*TLS13, *TLS13) {
			cl, _ := NewTLS13(suite, TLSClient)
			sv, _ := NewTLS13(suite, TLSServer)
			for _, c := range []*TLS13{cl, sv} {
				c.AddTranscript([]byte("hello"))
				c.HandshakeSecrets(bytes.Repeat([]byte{7}, 32))
			}
			return cl, sv
		}
		seal := func(c *TLS13, typ byte, n, pad int) []byte {
			rec, err := c.Seal(typ, bytes.Repeat([]byte{0xAB}, n), pad)
			if err != nil {
				t.Fatal(err)
			}
			return rec
		}
		setLen := func(b []byte, n int) []byte {
			binary.BigEndian.PutUint16(b[3:], uint16(n))
			return b
		}
		cases := []struct {
			name string
			rec  func(cl *TLS13) []byte
			want error
		}{
			{"intact", func(cl *TLS13) []byte { return seal(cl, 23, 100, 7) }, nil},
			{"largest", func(cl *TLS13) []byte { return seal(cl, 22, 1<<14, 0) }, nil},
			{"empty header", func(cl *TLS13) []byte { return nil }, ErrTLSIncomplete},
			{"short header", func(cl *TLS13) []byte { return seal(cl, 23, 10, 0)[:4] }, ErrTLSIncomplete},
			{"short body", func(cl *TLS13) []byte { r := seal(cl, 23, 10, 0); return r[:len(r)-1] }, ErrTLSIncomplete},
			{"bit flip", func(cl *TLS13) []byte { r := seal(cl, 23, 10, 0); r[9] ^= 4; return r }, ErrTLSBadRecordMAC},
			{"tag flip", func(cl *TLS13) []byte { r := seal(cl, 23, 10, 0); r[len(r)-1] ^= 1; return r }, ErrTLSBadRecordMAC},
			{"truncated", func(cl *TLS13) []byte { r := seal(cl, 23, 10, 0); return setLen(r[:len(r)-3], len(r)-8) }, ErrTLSBadRecordMAC},
			{"shorter than a tag", func(cl *TLS13) []byte { return setLen(seal(cl, 23, 0, 0)[:20], 15) }, ErrTLSDecodeError},
			{"header type", func(cl *TLS13) []byte { r := seal(cl, 23, 10, 0); r[0] = 22; return r }, ErrTLSUnexpectedMessage},
			{"header version", func(cl *TLS13) []byte { r := seal(cl, 23, 10, 0); r[2] = 1; return r }, ErrTLSDecodeError},
			{"ciphertext over 2^14+256", func(cl *TLS13) []byte {
				r := make([]byte, 5+1<<14+257)
				r[0], r[1], r[2] = 23, 3, 3
				return setLen(r, 1<<14+257)
			}, ErrTLSRecordOverflow},
			{"plaintext over 2^14+1", func(cl *TLS13) []byte {
				r := make([]byte, 5+1<<14+18)
				r[0], r[1], r[2] = 23, 3, 3
				return setLen(r, 1<<14+18)
			}, ErrTLSRecordOverflow},
			{"all zeros", func(cl *TLS13) []byte { return seal(cl, 0, 0, 40) }, ErrTLSUnexpectedMessage},
			{"content type 20", func(cl *TLS13) []byte { return seal(cl, 20, 1, 0) }, ErrTLSUnexpectedMessage},
			{"content type 24", func(cl *TLS13) []byte { return seal(cl, 24, 1, 0) }, ErrTLSUnexpectedMessage},
		}
		for _, tc := range cases {
			cl, sv := pair()
			_, _, _, err := sv.Open(tc.rec(cl))
			if err != tc.want {
				t.Errorf("suite %#x %s: got %v, want %v", suite, tc.name, err, tc.want)
			}
		}
		cl, sv := pair()
		if _, err := cl.Seal(23, make([]byte, 1<<14+1), 0); err != ErrTLSRecordOverflow {
			t.Errorf("suite %#x: sealing 2^14+1 bytes: %v, want record_overflow", suite, err)
		}
		if _, err := cl.Seal(23, make([]byte, 1<<14), 1); err != ErrTLSRecordOverflow {
			t.Errorf("suite %#x: sealing 2^14 bytes and a byte of padding: %v, want record_overflow", suite, err)
		}
		// A record opens once: replayed at the next sequence number it fails.
		rec := seal(cl, 23, 5, 0)
		if _, _, _, err := sv.Open(append([]byte(nil), rec...)); err != nil {
			t.Fatal(err)
		}
		if _, _, _, err := sv.Open(rec); err != ErrTLSBadRecordMAC {
			t.Errorf("suite %#x: replayed record: %v, want bad_record_mac", suite, err)
		}
		cl.Write.Seq = tlsSeqLast - 1
		sv.Read.Seq = tlsSeqLast - 1
		rec = seal(cl, 23, 5, 0)
		if _, _, _, err := sv.Open(rec); err != nil {
			t.Errorf("suite %#x: sequence 2^64-2: %v", suite, err)
		}
		if _, err := cl.Seal(23, nil, 0); err != ErrTLSSequenceExhausted {
			t.Errorf("suite %#x: seal at 2^64-1: %v, want sequence_exhausted", suite, err)
		}
		if _, _, _, err := sv.Open(rec); err != ErrTLSSequenceExhausted {
			t.Errorf("suite %#x: open at 2^64-1: %v, want sequence_exhausted", suite, err)
		}
		// KeyUpdate: both sides move on and records open again from 0.
		cl.KeyUpdate(true)
		sv.KeyUpdate(false)
		if cl.Write.Seq != 0 || !bytes.Equal(cl.Write.Key, sv.Read.Key) {
			t.Errorf("suite %#x: KeyUpdate: the sides disagree", suite)
		}
		if _, _, _, err := sv.Open(seal(cl, 23, 5, 0)); err != nil {
			t.Errorf("suite %#x: after KeyUpdate: %v", suite, err)
		}
	}
	if _, err := NewTLS13(0x1302, TLSClient); !errors.Is(err, ErrTLSIllegalSuite) {
		t.Errorf("TLS_AES_256_GCM_SHA384: %v, want illegal_parameter", err)
	}
}

// TestTLSRFC8448Digest checks that the replay digest runs and differs when a
// record byte does, so the kernel comparison can fail.
func TestTLSRFC8448Digest(t *testing.T) {
	v := loadRFC8448(t)
	a, err := TLSRFC8448Digest(v)
	if err != nil {
		t.Fatal(err)
	}
	v["server_app_record"] = append([]byte(nil), v["server_app_record"]...)
	v["server_app_record"][20] ^= 1
	b, err := TLSRFC8448Digest(v)
	if err != nil {
		t.Fatal(err)
	}
	if a == b {
		t.Error("the digest ignores the server's application record")
	}
	if TLSDigests(1)["tls13"] == TLSDigests(2)["tls13"] {
		t.Error("tls13 digest does not depend on the seed")
	}
}

// FuzzTLS13Open feeds arbitrary bytes to the opener: it never panics, and
// every refusal is one of the named reasons.
func FuzzTLS13Open(f *testing.F) {
	v := loadRFC8448(f)
	f.Add(v["server_flight_record"], false)
	f.Add(v["client_app_record"], true)
	f.Add([]byte{23, 3, 3, 0, 16}, false)
	f.Add([]byte{23, 3, 3, 0x41, 0x11}, true)
	f.Fuzz(func(t *testing.T, b []byte, chacha bool) {
		suite := TLSSuiteAES128GCMSHA256
		if chacha {
			suite = TLSSuiteChaCha20Poly1305SHA256
		}
		c, _ := NewTLS13(suite, TLSClient)
		c.AddTranscript(v["client_hello"])
		c.AddTranscript(v["server_hello"])
		c.HandshakeSecrets(v["shared_secret"])
		typ, content, n, err := c.Open(b)
		if err != nil {
			if TLSReasonIndex(err) <= 0 {
				t.Fatalf("unnamed refusal %v", err)
			}
			return
		}
		if n > len(b) || len(content) > TLSMaxInnerLen-1 || typ < TLSContentAlert || typ > TLSContentApplicationData {
			t.Fatalf("accepted: type %d, %d content bytes, %d used of %d", typ, len(content), n, len(b))
		}
	})
}
