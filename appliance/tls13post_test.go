package appliance

import "testing"

// TestTLSPostHandshake names each fixed case's verdict and checks that
// an update_requested KeyUpdate is answered with a sealed KeyUpdate and
// that every accepted KeyUpdate moves the read secret on.
func TestTLSPostHandshake(t *testing.T) {
	want := []string{"ok", "ok", "ok", "ok", "decode_error", "decode_error", "illegal_parameter", "illegal_parameter",
		"unexpected_message", "ok", "decode_error", "decode_error", "decode_error", "unexpected_message", "unexpected_message",
		"ok", "decode_error", "ok", "ok"}
	c, _ := NewTLS13(TLSSuiteChaCha20Poly1305SHA256, TLSClient)
	c.HandshakeSecrets(tlsPostShared())
	c.ApplicationSecrets()
	c.ActivateRead()
	c.ActivateWrite()
	cases := TLSPostCases()
	for i, w := range want {
		before := string(c.Read.Secret)
		updates := c.KeyUpdates
		reply, err := TLSPostHandshake(c, cases[i])
		got := "ok"
		if err != nil {
			got = err.Error()
		}
		if got != w {
			t.Errorf("case %d %x: %s, want %s", i, cases[i], got, w)
		}
		isKU := err == nil && len(cases[i]) >= 5 && cases[i][len(cases[i])-5] == tlsHSKeyUpdate
		if isKU != (c.KeyUpdates == updates+1) || isKU == (string(c.Read.Secret) == before) {
			t.Errorf("case %d: updates %d -> %d, read secret moved %v", i, updates, c.KeyUpdates, string(c.Read.Secret) != before)
		}
		if requested := isKU && cases[i][len(cases[i])-1] == 1; requested != (reply != nil) {
			t.Errorf("case %d: reply %x", i, reply)
		} else if reply != nil && (len(reply) != TLSRecordHeaderLen+5+1+16 || reply[0] != TLSContentApplicationData) {
			t.Errorf("case %d: reply %x, want a sealed 27-byte record", i, reply)
		}
	}
	t.Logf("tls13-post digest %016x over %d cases", TLSPostDigest(), len(cases))
}

// FuzzTLSPostHandshake: any record content gets a named verdict and no
// panic; a refusal leaves the keys as they were.
func FuzzTLSPostHandshake(f *testing.F) {
	for _, c := range TLSPostCases() {
		f.Add(c)
	}
	f.Fuzz(func(t *testing.T, content []byte) {
		c, _ := NewTLS13(TLSSuiteChaCha20Poly1305SHA256, TLSClient)
		c.HandshakeSecrets(tlsPostShared())
		c.ApplicationSecrets()
		c.ActivateRead()
		c.ActivateWrite()
		rd, wr := string(c.Read.Secret), string(c.Write.Secret)
		_, err := TLSPostHandshake(c, content)
		if err != nil {
			switch err {
			case ErrTLSDecodeError, ErrTLSIllegalParameter, ErrTLSUnexpectedMessage:
			default:
				t.Fatalf("%x: unnamed %v", content, err)
			}
			if string(c.Read.Secret) != rd || string(c.Write.Secret) != wr {
				t.Fatalf("%x: refused but the keys moved", content)
			}
		}
	})
}
