package appliance

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"
)

// TestCryptoDigestsComplete wants one digest per name, the same twice for a
// seed, and different seeds to give different digests.
func TestCryptoDigestsComplete(t *testing.T) {
	a, b, c := CryptoDigests(1), CryptoDigests(1), CryptoDigests(2)
	if len(a) != len(CryptoDigestNames) {
		t.Fatalf("%d digests, %d names", len(a), len(CryptoDigestNames))
	}
	for _, name := range CryptoDigestNames {
		if _, ok := a[name]; !ok {
			t.Errorf("no digest %s", name)
		}
		if a[name] != b[name] {
			t.Errorf("digest %s differs between two runs of one seed", name)
		}
		if a[name] == c[name] {
			t.Errorf("digest %s is the same for seeds 1 and 2", name)
		}
	}
}

// TestTLS13ExpandLabel checks the HkdfLabel framing against RFC 8448 §3:
// the early secret's "derived" secret and the server handshake traffic
// key and IV.
func TestTLS13ExpandLabel(t *testing.T) {
	unhex := func(s string) []byte {
		b, err := hex.DecodeString(s)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	early := unhex("33ad0a1c607ec03b09e6cd9893680ce210adf300aa1f2660e1b22e10f170f92a")
	shts := unhex("b67b7d690cc16c4e75e54213cb2d37b4e9c912bcded9105d42befd59d391ad38")
	for _, c := range []struct {
		name, got, want string
	}{
		{"derived", hex.EncodeToString(TLS13DeriveSecret(sha256.New, early, "derived", nil)), "6f2615a108c702c5678f54fc9dbab69716c076189c48250cebeac3576c3611ba"},
		{"key", hex.EncodeToString(TLS13ExpandLabel(sha256.New, shts, "key", nil, 16)), "3fce516009c21727d0f2e4e86ee403bc"},
		{"iv", hex.EncodeToString(TLS13ExpandLabel(sha256.New, shts, "iv", nil, 12)), "5d313eb2671276ee13000b30"},
	} {
		if c.got != c.want {
			t.Errorf("%s: %s, RFC 8448 says %s", c.name, c.got, c.want)
		}
	}
}
