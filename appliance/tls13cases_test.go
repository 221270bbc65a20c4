package appliance

import (
	"bytes"
	"os"
	"testing"
)

// TestCaseFilesRoundTrip: each committed case file decodes and encodes
// back to the same bytes (so the kernel's vector sections, which are made
// by the encoders, read what the files say), and a file that ends one
// byte early is refused rather than read short.
func TestCaseFilesRoundTrip(t *testing.T) {
	for _, f := range []struct {
		path  string
		again func([]byte) ([]byte, int, error)
	}{
		{"testdata/x509chain/cases.bin", func(b []byte) ([]byte, int, error) {
			c, err := DecodeX509ChainCases(b)
			return EncodeX509ChainCases(c), len(c), err
		}},
		{"testdata/tlscert/cases.bin", func(b []byte) ([]byte, int, error) {
			c, err := DecodeTLSCertCases(b)
			return EncodeTLSCertCases(c), len(c), err
		}},
		{"testdata/tlsauth/cases.bin", func(b []byte) ([]byte, int, error) {
			c, err := DecodeTLSAuthCases(b)
			return EncodeTLSAuthCases(c), len(c), err
		}},
		{"testdata/tlsflight/cases.bin", func(b []byte) ([]byte, int, error) {
			c, err := DecodeTLSFlightCases(b)
			return EncodeTLSFlightCases(c), len(c), err
		}},
	} {
		raw, err := os.ReadFile(f.path)
		if err != nil {
			t.Fatal(err)
		}
		out, n, err := f.again(raw)
		if err != nil || n == 0 {
			t.Fatalf("%s: %d cases, %v", f.path, n, err)
		}
		if !bytes.Equal(out, raw) {
			t.Errorf("%s: %d cases encode to %d bytes, not the file's %d", f.path, n, len(out), len(raw))
		}
		if _, _, err := f.again(raw[:len(raw)-1]); err == nil {
			t.Errorf("%s: a file one byte short was read without an error", f.path)
		}
	}
}
