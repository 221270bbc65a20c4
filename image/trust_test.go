package image

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestTrustAnchorsDefault reads the committed default set: the roots the
// research names for Discord's and Cloudflare's chains, each taken by the
// kernel's reader, and each DER's SHA-256 listed in trust/README.md.
func TestTrustAnchorsDefault(t *testing.T) {
	blob, info, err := TrustAnchors([]TrustSource{{Name: DefaultTrustName, PEM: DefaultTrustPEM}})
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(blob)
	if info.SHA256 != hex.EncodeToString(sum[:]) {
		t.Errorf("trust.sha256 %s is not the blob's", info.SHA256)
	}
	readme, err := os.ReadFile(filepath.Join("trust", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var subjects []string
	for _, a := range info.Anchors {
		subjects = append(subjects, a.Subject)
		if !bytes.Contains(readme, []byte(a.SHA256)) {
			t.Errorf("%s (%s) is not in trust/README.md", a.Subject, a.SHA256)
		}
	}
	all := strings.Join(subjects, "\n")
	for _, want := range []string{"CN=GTS Root R1", "CN=GTS Root R4", "CN=ISRG Root X1", "CN=ISRG Root X2"} {
		if !strings.Contains(all, want) {
			t.Errorf("the default set lacks %s", want)
		}
	}
	// the same bundle twice adds nothing
	blob2, info2, err := TrustAnchors([]TrustSource{{Name: "a", PEM: DefaultTrustPEM}, {Name: "b", PEM: DefaultTrustPEM}})
	if err != nil || !bytes.Equal(blob, blob2) || len(info2.Sources) != 2 {
		t.Errorf("repeated bundle: %v, equal blob %v", err, bytes.Equal(blob, blob2))
	}
}

// TestTrustAnchorsRefusals: a bundle the kernel could not use is refused
// at build time, naming the file and the reason.
func TestTrustAnchorsRefusals(t *testing.T) {
	der := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join("..", "appliance", "testdata", "x509", name))
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: b})
	}
	for _, tc := range []struct {
		name string
		pem  []byte
		want string
	}{
		{"leaf.pem", der("test-leaf-p256.der"), "not_ca"},
		{"empty.pem", []byte("nothing here\n"), "no CERTIFICATE block"},
		{"cut.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{0x30, 0x03, 0x02, 0x01}}), "der_malformed"},
	} {
		_, _, err := TrustAnchors([]TrustSource{{Name: tc.name, PEM: tc.pem}})
		if !errors.Is(err, ErrTrust) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.name) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	if _, _, err := TrustAnchors(nil); !errors.Is(err, ErrTrust) {
		t.Errorf("no bundle: %v", err)
	}
	// more than the kernel holds: the default set and five fresh CAs
	big := append([]byte(nil), DefaultTrustPEM...)
	for i := 0; i < 5; i++ {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{SerialNumber: big1(int64(i + 1)), Subject: pkix.Name{CommonName: "extra CA"},
			NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), BasicConstraintsValid: true, IsCA: true,
			KeyUsage: x509.KeyUsageCertSign}
		d, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, k.Public(), k)
		if err != nil {
			t.Fatal(err)
		}
		big = append(big, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: d})...)
		_, info, err := TrustAnchors([]TrustSource{{Name: "big.pem", PEM: big}})
		switch n := 13 + i; {
		case n <= 16 && (err != nil || len(info.Anchors) != n):
			t.Errorf("%d anchors: %v", n, err)
		case n > 16 && (!errors.Is(err, ErrTrust) || !strings.Contains(err.Error(), "at most 16")):
			t.Errorf("%d anchors: %v", n, err)
		}
	}
}

func big1(v int64) *big.Int { return big.NewInt(v) }
