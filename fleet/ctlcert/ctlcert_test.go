package ctlcert

import (
	"crypto"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
)

var t0 = time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)

// TestPinIsSPKIHash: the pin is the SHA-256 of the SubjectPublicKeyInfo,
// computed here independently through the public key, in the boot
// config's form.
func TestPinIsSPKIHash(t *testing.T) {
	id, err := LoadOrCreate(t.TempDir(), []string{"10.0.0.1"}, t0)
	if err != nil {
		t.Fatal(err)
	}
	spki, err := x509.MarshalPKIXPublicKey(id.Cert.PrivateKey.(crypto.Signer).Public())
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(spki)
	if want := hex.EncodeToString(sum[:]); id.Pin != want {
		t.Fatalf("pin %s, want %s", id.Pin, want)
	}
	if err := appliance.ValidatePin(id.Pin); err != nil {
		t.Fatalf("the boot config refuses the pin: %v", err)
	}
}

// TestLoadOrCreateReuse: the first start makes a 0600 key and a
// certificate naming the hosts; the next start reuses both; new hosts
// re-issue the certificate over the same key (same pin); a certificate
// near its end is re-issued too.
func TestLoadOrCreateReuse(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "var")
	first, err := LoadOrCreate(dir, []string{"10.0.0.1", "ctl.lab"}, t0)
	if err != nil {
		t.Fatal(err)
	}
	if !first.KeyCreated || !first.CertIssued {
		t.Fatalf("first start: key created %v, cert issued %v", first.KeyCreated, first.CertIssued)
	}
	st, err := os.Stat(filepath.Join(dir, KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v, want 0600", st.Mode().Perm())
	}
	if !first.Leaf.IPAddresses[0].Equal(net.ParseIP("10.0.0.1")) || first.Leaf.DNSNames[0] != "ctl.lab" {
		t.Fatalf("SANs %v %v", first.Leaf.IPAddresses, first.Leaf.DNSNames)
	}

	again, err := LoadOrCreate(dir, []string{"ctl.lab", "10.0.0.1"}, t0.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if again.KeyCreated || again.CertIssued || again.Pin != first.Pin || !again.Leaf.Equal(first.Leaf) {
		t.Fatalf("restart: key created %v, cert issued %v, pin %s (was %s)", again.KeyCreated, again.CertIssued, again.Pin, first.Pin)
	}

	moved, err := LoadOrCreate(dir, []string{"10.0.0.2"}, t0.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if moved.KeyCreated || !moved.CertIssued || moved.Pin != first.Pin {
		t.Fatalf("new host: key created %v, cert issued %v, pin %s (was %s)", moved.KeyCreated, moved.CertIssued, moved.Pin, first.Pin)
	}

	late, err := LoadOrCreate(dir, []string{"10.0.0.2"}, moved.Leaf.NotAfter.Add(-Renew/2))
	if err != nil {
		t.Fatal(err)
	}
	if !late.CertIssued || late.Pin != first.Pin || !late.Leaf.NotAfter.After(moved.Leaf.NotAfter) {
		t.Fatalf("near its end: cert issued %v, pin same %v", late.CertIssued, late.Pin == first.Pin)
	}
}

// TestKeyReadableByOthersRefused: a self-generated key another user can
// read is refused at start, not used.
func TestKeyReadableByOthersRefused(t *testing.T) {
	dir := t.TempDir()
	if _, err := LoadOrCreate(dir, nil, t0); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, KeyFile), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreate(dir, nil, t0); !errors.Is(err, ErrKeyMode) {
		t.Fatalf("error %v, want ErrKeyMode", err)
	}
}

// TestServesPinnedKey: a crypto/tls server with the identity is reached
// by a client that checks only the pin, as a node does (no chain
// validation), and a client pinning another key is refused.
func TestServesPinnedKey(t *testing.T) {
	id, err := LoadOrCreate(t.TempDir(), []string{"127.0.0.1"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{id.Cert}, MinVersion: tls.VersionTLS13})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	dial := func(pin string) error {
		c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13,
			VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
				leaf, err := x509.ParseCertificate(raw[0])
				if err != nil {
					return err
				}
				if Pin(leaf) != pin {
					return errors.New("pin_mismatch")
				}
				return nil
			}})
		if err == nil {
			c.Close()
		}
		return err
	}
	if err := dial(id.Pin); err != nil {
		t.Fatalf("right pin: %v", err)
	}
	if err := dial(strings.Repeat("0", PinLen)); err == nil || !strings.Contains(err.Error(), "pin_mismatch") {
		t.Fatalf("wrong pin: %v", err)
	}
}

// TestLoadOperatorFiles: --tls-cert/--tls-key files give the same pin as
// the certificate they hold.
func TestLoadOperatorFiles(t *testing.T) {
	dir := t.TempDir()
	id, err := LoadOrCreate(dir, []string{"ctl.example"}, t0)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Load(filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if got.Pin != id.Pin {
		t.Fatalf("pin %s, want %s", got.Pin, id.Pin)
	}
	if _, err := Load(filepath.Join(dir, "missing.crt"), filepath.Join(dir, KeyFile)); err == nil || !strings.Contains(err.Error(), "missing.crt") {
		t.Fatalf("missing file: %v", err)
	}
}

func TestHosts(t *testing.T) {
	got := Hosts("10.1.2.3:8443", "127.0.0.1:8080", "10.1.2.3:80")
	if strings.Join(got, " ") != "10.1.2.3 127.0.0.1" {
		t.Fatalf("hosts %q", got)
	}
	wild := Hosts(":8443")
	if len(wild) < 3 || wild[0] != "127.0.0.1" || wild[2] != "localhost" {
		t.Fatalf("wildcard hosts %q", wild)
	}
}
