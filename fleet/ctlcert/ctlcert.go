// Package ctlcert owns the controller's TLS identity: the key and
// certificate `dpxe serve` answers HTTPS with, and the pin nodes check it
// against.
//
// The pin is the SHA-256 of the certificate's SubjectPublicKeyInfo (DER),
// written as 64 lower-case hex digits: the value of the boot config key
// controller_pin=. It names the key, not the certificate, so a certificate
// re-issued for new host names over the same key keeps the pin.
//
// Without --tls-cert/--tls-key, `dpxe serve` keeps its own ECDSA P-256 key
// and a self-signed certificate beside its database (KeyFile, CertFile),
// made on first start with mode 0600 and reused afterwards. Nodes do not
// validate that certificate against any authority: they pin its key
// (docs/security.md).
package ctlcert

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// File names of the self-generated identity, in the directory serve keeps
// its files in (beside the SQLite database).
const (
	KeyFile  = "controller-tls.key"
	CertFile = "controller-tls.crt"
)

// Validity of a self-generated certificate. Nodes pin the key and do not
// check the dates of a pinned certificate; operators' clients that do are
// served a certificate re-issued over the same key when this one nears
// its end (Renew before NotAfter).
const (
	Validity = 10 * 365 * 24 * time.Hour
	Renew    = 30 * 24 * time.Hour
	// backdate covers clocks that lag the controller's a little.
	backdate = time.Hour
)

// PinLen is the length of a pin in hex digits.
const PinLen = 2 * sha256.Size

// Errors.
var (
	// ErrNoKey: a certificate or key file holds no usable PEM block.
	ErrNoKey = errors.New("no PEM key or certificate found")
	// ErrKeyMode: the self-generated key file can be read by others.
	ErrKeyMode = errors.New("key file is readable by group or others (want mode 0600)")
)

// Identity is what `dpxe serve` answers HTTPS with.
type Identity struct {
	// Cert is the certificate chain and key for tls.Config.
	Cert tls.Certificate
	// Leaf is the parsed first certificate.
	Leaf *x509.Certificate
	// Pin is the leaf's SubjectPublicKeyInfo SHA-256, hex.
	Pin string
	// KeyCreated and CertIssued say that this start made a new key (a new
	// pin: boot configs must be rewritten) or a new certificate over the
	// old key (same pin).
	KeyCreated, CertIssued bool
}

// Pin returns the pin of a certificate: the SHA-256 of its
// SubjectPublicKeyInfo, hex.
func Pin(cert *x509.Certificate) string {
	return PinSPKI(cert.RawSubjectPublicKeyInfo)
}

// PinSPKI returns the pin of a DER SubjectPublicKeyInfo.
func PinSPKI(spki []byte) string {
	sum := sha256.Sum256(spki)
	return hex.EncodeToString(sum[:])
}

// Load reads an operator's certificate chain and key (PEM files, as
// --tls-cert and --tls-key, or --nats-tls-cert and --nats-tls-key, give
// them); its errors name the files, the caller the flags.
func Load(certFile, keyFile string) (*Identity, error) {
	c, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("certificate %s / key %s: %w", certFile, keyFile, err)
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("certificate %s: %w", certFile, err)
	}
	c.Leaf = leaf
	return &Identity{Cert: c, Leaf: leaf, Pin: Pin(leaf)}, nil
}

// LoadOrCreate returns the self-generated identity kept in dir: the key
// from KeyFile (made, P-256, mode 0600, when there is none), and the
// certificate from CertFile when it is over that key, names every host in
// hosts (IP addresses or DNS names) and is not within Renew of its end;
// otherwise a new self-signed certificate over the same key, written back.
func LoadOrCreate(dir string, hosts []string, now time.Time) (*Identity, error) {
	id := &Identity{}
	keyPath := filepath.Join(dir, KeyFile)
	key, err := readKey(keyPath)
	if errors.Is(err, os.ErrNotExist) {
		key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		if err := writeKey(keyPath, key); err != nil {
			return nil, err
		}
		id.KeyCreated = true
	} else if err != nil {
		return nil, err
	}
	certPath := filepath.Join(dir, CertFile)
	leaf, der := readCert(certPath)
	if leaf == nil || !sameKey(leaf, key) || !covers(leaf, hosts) || now.Add(Renew).After(leaf.NotAfter) {
		der, err = issue(key, hosts, now)
		if err != nil {
			return nil, err
		}
		if leaf, err = x509.ParseCertificate(der); err != nil {
			return nil, err
		}
		if err := writeFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
			return nil, err
		}
		id.CertIssued = true
	}
	id.Leaf = leaf
	id.Pin = Pin(leaf)
	id.Cert = tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
	return id, nil
}

// readKey reads the self-generated key; a key others may read is refused
// (it would let them impersonate the controller).
func readKey(path string) (*ecdsa.PrivateKey, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%s: %w", path, ErrKeyMode)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, fmt.Errorf("%s: %w", path, ErrNoKey)
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	ek, ok := k.(*ecdsa.PrivateKey)
	if !ok || ek.Curve != elliptic.P256() {
		return nil, fmt.Errorf("%s: not an ECDSA P-256 key", path)
	}
	return ek, nil
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	return writeFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)
}

// writeFile writes through a temporary file and a rename, so a crash
// never leaves half a key.
func writeFile(path string, b []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return err
	}
	if err := os.Chmod(tmp, mode); err != nil { // WriteFile keeps an old file's mode
		return err
	}
	return os.Rename(tmp, path)
}

// readCert returns the certificate in path, or nil when there is none
// usable (it is then issued again).
func readCert(path string) (*x509.Certificate, []byte) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, nil
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, nil
	}
	return c, blk.Bytes
}

func sameKey(c *x509.Certificate, key *ecdsa.PrivateKey) bool {
	pub, ok := c.PublicKey.(*ecdsa.PublicKey)
	return ok && pub.Equal(key.Public())
}

// covers says whether c names every host.
func covers(c *x509.Certificate, hosts []string) bool {
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			if !slices.ContainsFunc(c.IPAddresses, ip.Equal) {
				return false
			}
		} else if !slices.Contains(c.DNSNames, h) {
			return false
		}
	}
	return true
}

// issue makes a self-signed serverAuth certificate for hosts over key.
func issue(key crypto.Signer, hosts []string, now time.Time) ([]byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "dpxe controller", Organization: []string{"Discord-PXE"}},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(Validity),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
}

// Hosts returns the names a self-generated certificate should carry for a
// controller listening on addrs (host:port): their hosts, with the
// loopback names and this machine's host name for wildcard addresses.
func Hosts(addrs ...string) []string {
	var out []string
	add := func(h string) {
		if h != "" && !slices.Contains(out, h) {
			out = append(out, h)
		}
	}
	for _, a := range addrs {
		h, _, err := net.SplitHostPort(a)
		if err != nil {
			continue
		}
		if ip := net.ParseIP(h); h == "" || ip != nil && ip.IsUnspecified() {
			add("127.0.0.1")
			add("::1")
			add("localhost")
			if hn, err := os.Hostname(); err == nil {
				add(hn)
			}
			continue
		}
		add(h)
	}
	return out
}
