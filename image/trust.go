package image

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"

	"github.com/discord-pxe/dpxe/appliance"
)

// The TLS trust anchors compiled into kernel.bin (issue 17): the kernel's
// x509_verify_chain ends every path at one of them. The default set is
// trust/default.pem (see trust/README.md for where each root comes from);
// `dpxe build --trust PEMFILE` replaces it.

//go:embed trust/default.pem
var DefaultTrustPEM []byte

// DefaultTrustName names the default set in the manifest.
const DefaultTrustName = "default (image/trust/default.pem)"

// AnchorsFile is the blob the kernel includes (tls/anchors.inc: incbin),
// written into the source tree before nasm runs: per anchor a u32
// little-endian length and the DER.
const AnchorsFile = "tls/anchors.bin"

// ErrTrust means a trust bundle the build refuses.
var ErrTrust = errors.New("trust anchors")

// TrustSource is one PEM bundle: a name for the manifest and its bytes.
type TrustSource struct {
	Name string
	PEM  []byte
}

// TrustInfo is the manifest's record of the anchors: the SHA-256 of
// AnchorsFile (the kernel prints the same at boot), where they came from,
// and each anchor.
type TrustInfo struct {
	SHA256  string       `json:"sha256"`
	Sources []string     `json:"sources"`
	Anchors []AnchorInfo `json:"anchors"`
}

// AnchorInfo is one anchor: its subject and the SHA-256 of its DER.
type AnchorInfo struct {
	Subject string `json:"subject"`
	SHA256  string `json:"sha256"`
}

// TrustAnchors reads the CERTIFICATE blocks of the bundles in order, drops
// repeats, and checks each with appliance.X509CheckAnchor; at most
// appliance.X509MaxAnchors, at least one. It returns the blob for
// AnchorsFile and the manifest's record.
func TrustAnchors(sources []TrustSource) ([]byte, *TrustInfo, error) {
	info := &TrustInfo{Sources: []string{}, Anchors: []AnchorInfo{}}
	var ders [][]byte
	for _, s := range sources {
		info.Sources = append(info.Sources, s.Name)
		rest := s.PEM
		n := 0
		for {
			var b *pem.Block
			b, rest = pem.Decode(rest)
			if b == nil {
				break
			}
			if b.Type != "CERTIFICATE" {
				continue
			}
			n++
			if err := appliance.X509CheckAnchor(b.Bytes); err != nil {
				return nil, nil, fmt.Errorf("%w: %s: certificate %d: the kernel cannot use it: %v", ErrTrust, s.Name, n, err)
			}
			dup := false
			for _, d := range ders {
				dup = dup || bytes.Equal(d, b.Bytes)
			}
			if dup {
				continue
			}
			ders = append(ders, b.Bytes)
			subject := "?"
			if c, err := x509.ParseCertificate(b.Bytes); err == nil {
				subject = c.Subject.String()
			}
			sum := sha256.Sum256(b.Bytes)
			info.Anchors = append(info.Anchors, AnchorInfo{Subject: subject, SHA256: hex.EncodeToString(sum[:])})
		}
		if n == 0 {
			return nil, nil, fmt.Errorf("%w: %s: no CERTIFICATE block", ErrTrust, s.Name)
		}
	}
	if len(ders) == 0 {
		return nil, nil, fmt.Errorf("%w: none given", ErrTrust)
	}
	if len(ders) > appliance.X509MaxAnchors {
		return nil, nil, fmt.Errorf("%w: %d anchors, the kernel holds at most %d", ErrTrust, len(ders), appliance.X509MaxAnchors)
	}
	var blob []byte
	for _, d := range ders {
		blob = binary.LittleEndian.AppendUint32(blob, uint32(len(d)))
		blob = append(blob, d...)
	}
	sum := sha256.Sum256(blob)
	info.SHA256 = hex.EncodeToString(sum[:])
	return blob, info, nil
}
