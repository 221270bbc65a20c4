package e2e

import (
	"crypto"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/discord-pxe/dpxe/appliance"
)

// The public-key self-test (kernel/selftest/crypto_asym_selftest.inc) reads
// Wycheproof vectors and Go-made signatures from the crypto vector module
// and prints one result character per record; this file builds those
// sections and checks every result against what the file (or Go) says,
// naming the tcId. Go parses what the kernel need not: DER signatures into
// r and s (appliance.ParseECDSASignatureDER: the kernel's X.509 layer will
// need that parser), keys into raw integers and points (the X.509 layer
// will need SubjectPublicKeyInfo, RSAPublicKey and the EC point inside a
// BIT STRING), hex into bytes, and messages into their hashes (the kernel's
// SHA-256/384 are the sym layer's, which the kernel uses inside RSA-PSS).

// asymWycheproofDir holds the Wycheproof files (C2SP/wycheproof, Apache 2.0;
// see its README.md and LICENSE).
var asymWycheproofDir = filepath.Join("testdata", "wycheproof")

// asymCase is a record sent to the kernel and what its answer must be.
type asymCase struct {
	tcID    int
	result  string // "valid", "invalid", "acceptable" (Wycheproof) or "go-valid"/"go-invalid"
	flags   []string
	comment string
	// accept: the kernel must answer 'a'; otherwise it must refuse, and
	// refusal, when not 0, is the one reason it must give.
	accept  bool
	refusal byte
}

// asymSection is one vector section: the records and their expectations.
type asymSection struct {
	tag     string
	file    string
	records []appliance.AsymRecord
	cases   []asymCase
	// decided counts Wycheproof cases Go refused itself (malformed DER
	// signatures) without sending them to the kernel.
	decided int
}

// asymWycheproofFile is the part of a Wycheproof file these tests read.
type asymWycheproofFile struct {
	Algorithm  string `json:"algorithm"`
	TestGroups []struct {
		Sha       string          `json:"sha"`
		MgfSha    string          `json:"mgfSha"`
		SLen      int             `json:"sLen"`
		PublicKey json.RawMessage `json:"publicKey"`
		Tests     []struct {
			TcID    int      `json:"tcId"`
			Comment string   `json:"comment"`
			Flags   []string `json:"flags"`
			Private string   `json:"private"`
			Public  string   `json:"public"`
			Shared  string   `json:"shared"`
			Msg     string   `json:"msg"`
			Sig     string   `json:"sig"`
			Result  string   `json:"result"`
		} `json:"tests"`
	} `json:"testGroups"`
}

// (unhex, hex to bytes, is kernelcrypto_sym_test.go's.)

// fixedBE is a big-endian integer string (possibly with a sign byte) as
// exactly n bytes.
func fixedBE(b []byte, n int) ([]byte, error) {
	for len(b) > n && b[0] == 0 {
		b = b[1:]
	}
	if len(b) > n {
		return nil, fmt.Errorf("integer of %d bytes does not fit %d", len(b), n)
	}
	return append(make([]byte, n-len(b)), b...), nil
}

func hashOf(name string, msg []byte) (crypto.Hash, []byte, byte, error) {
	switch name {
	case "SHA-256":
		h := sha256.Sum256(msg)
		return crypto.SHA256, h[:], appliance.AsymHashSHA256, nil
	case "SHA-384":
		h := sha512.Sum384(msg)
		return crypto.SHA384, h[:], appliance.AsymHashSHA384, nil
	}
	return 0, nil, 0, fmt.Errorf("hash %q not used by TLS 1.3 here", name)
}

func readWycheproof(file string) (*asymWycheproofFile, error) {
	b, err := os.ReadFile(filepath.Join(asymWycheproofDir, file))
	if err != nil {
		return nil, err
	}
	var f asymWycheproofFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%s: %v", file, err)
	}
	return &f, nil
}

// wycheproofX25519 builds WPX25519. Policy for "acceptable" (RFC 7748 §5:
// every u is an input, the top bit masked, non-canonical values reduced):
// accepted with the file's secret, except the all-zero secret, which the
// kernel refuses (RFC 7748 §6.1, RFC 8446 §7.4.2) with reason 4.
func wycheproofX25519(file string) (*asymSection, error) {
	f, err := readWycheproof(file)
	if err != nil {
		return nil, err
	}
	s := &asymSection{tag: "WPX25519", file: file}
	zero := strings.Repeat("00", 32)
	for _, g := range f.TestGroups {
		for _, t := range g.Tests {
			c := asymCase{tcID: t.TcID, result: t.Result, flags: t.Flags, comment: t.Comment}
			switch {
			case t.Result == "invalid":
			case t.Shared == zero:
				c.refusal = appliance.AsymRefusedZero
			default:
				c.accept = true
			}
			s.cases = append(s.cases, c)
			s.records = append(s.records, appliance.AsymRecord{ID: uint32(t.TcID), Fields: [][]byte{unhex(t.Private), unhex(t.Public), unhex(t.Shared)}})
		}
	}
	return s, nil
}

// wycheproofP256DH builds WPP256DH. Policy for "acceptable" (a compressed
// public point): refused with reason 3, as TLS 1.3 allows only the
// uncompressed form (RFC 8446 §4.2.8.2).
func wycheproofP256DH(file string) (*asymSection, error) {
	f, err := readWycheproof(file)
	if err != nil {
		return nil, err
	}
	s := &asymSection{tag: "WPP256DH", file: file}
	for _, g := range f.TestGroups {
		for _, t := range g.Tests {
			priv, err := fixedBE(unhex(t.Private), 32)
			if err != nil {
				return nil, fmt.Errorf("%s tcId %d private: %v", file, t.TcID, err)
			}
			shared := unhex(t.Shared)
			if len(shared) == 0 {
				shared = make([]byte, 32) // invalid cases have none; the kernel wants 32 bytes
			}
			c := asymCase{tcID: t.TcID, result: t.Result, flags: t.Flags, comment: t.Comment, accept: t.Result == "valid"}
			if t.Result == "acceptable" {
				c.refusal = appliance.AsymRefusedPoint
			}
			s.cases = append(s.cases, c)
			s.records = append(s.records, appliance.AsymRecord{ID: uint32(t.TcID), Fields: [][]byte{priv, unhex(t.Public), shared}})
		}
	}
	return s, nil
}

// wycheproofECDSA builds an ECDSA section. Signatures whose DER the strict
// parser refuses are decided by Go (they must be invalid) and not sent.
func wycheproofECDSA(tag, file string) (*asymSection, error) {
	f, err := readWycheproof(file)
	if err != nil {
		return nil, err
	}
	s := &asymSection{tag: tag, file: file}
	for _, g := range f.TestGroups {
		var key struct {
			Uncompressed string `json:"uncompressed"`
		}
		if err := json.Unmarshal(g.PublicKey, &key); err != nil {
			return nil, err
		}
		for _, t := range g.Tests {
			_, hash, _, err := hashOf(g.Sha, unhex(t.Msg))
			if err != nil {
				return nil, err
			}
			r, sv, err := appliance.ParseECDSASignatureDER(unhex(t.Sig))
			if err != nil {
				if t.Result == "valid" {
					return nil, fmt.Errorf("%s tcId %d (valid): the DER parser refused it: %v", file, t.TcID, err)
				}
				s.decided++
				continue
			}
			if t.Result == "acceptable" {
				return nil, fmt.Errorf("%s tcId %d: an acceptable ECDSA case needs a policy here", file, t.TcID)
			}
			s.cases = append(s.cases, asymCase{tcID: t.TcID, result: t.Result, flags: t.Flags, comment: t.Comment, accept: t.Result == "valid"})
			s.records = append(s.records, appliance.AsymRecord{ID: uint32(t.TcID), Fields: [][]byte{hash, r, sv, unhex(key.Uncompressed)}})
		}
	}
	return s, nil
}

// wycheproofRSA builds an RSA PKCS #1 v1.5 section. Policy for
// "acceptable" (a DigestInfo without the NULL parameters): refused with
// reason 5, as the kernel compares the one encoding RFC 8017 §9.2 builds.
func wycheproofRSA(tag, file string) (*asymSection, error) {
	f, err := readWycheproof(file)
	if err != nil {
		return nil, err
	}
	s := &asymSection{tag: tag, file: file}
	for _, g := range f.TestGroups {
		var key struct {
			Modulus  string `json:"modulus"`
			Exponent string `json:"publicExponent"`
		}
		if err := json.Unmarshal(g.PublicKey, &key); err != nil {
			return nil, err
		}
		e, err := fixedBE(unhex(key.Exponent), 8)
		if err != nil {
			return nil, fmt.Errorf("%s: exponent: %v", file, err)
		}
		eLE := binary.LittleEndian.AppendUint64(nil, binary.BigEndian.Uint64(e))
		for _, t := range g.Tests {
			_, hash, id, err := hashOf(g.Sha, unhex(t.Msg))
			if err != nil {
				return nil, err
			}
			c := asymCase{tcID: t.TcID, result: t.Result, flags: t.Flags, comment: t.Comment, accept: t.Result == "valid"}
			if t.Result == "acceptable" {
				c.refusal = appliance.AsymRefusedBadSig
			}
			s.cases = append(s.cases, c)
			s.records = append(s.records, appliance.AsymRecord{ID: uint32(t.TcID), Fields: [][]byte{{id}, eLE, unhex(key.Modulus), unhex(t.Sig), hash}})
		}
	}
	return s, nil
}

// wycheproofPSS builds an RSASSA-PSS section; every group's MGF1 uses the
// signature's hash and its salt length goes in each record.
func wycheproofPSS(tag, file string) (*asymSection, error) {
	f, err := readWycheproof(file)
	if err != nil {
		return nil, err
	}
	s := &asymSection{tag: tag, file: file}
	for _, g := range f.TestGroups {
		var key struct {
			Modulus  string `json:"modulus"`
			Exponent string `json:"publicExponent"`
		}
		if err := json.Unmarshal(g.PublicKey, &key); err != nil {
			return nil, err
		}
		if g.MgfSha != g.Sha {
			return nil, fmt.Errorf("%s: MGF1 with %s under %s: the kernel uses one hash for both", file, g.MgfSha, g.Sha)
		}
		e, err := fixedBE(unhex(key.Exponent), 8)
		if err != nil {
			return nil, fmt.Errorf("%s: exponent: %v", file, err)
		}
		eLE := binary.LittleEndian.AppendUint64(nil, binary.BigEndian.Uint64(e))
		salt := binary.LittleEndian.AppendUint16(nil, uint16(g.SLen))
		for _, t := range g.Tests {
			_, hash, id, err := hashOf(g.Sha, unhex(t.Msg))
			if err != nil {
				return nil, err
			}
			if t.Result == "acceptable" {
				return nil, fmt.Errorf("%s tcId %d: an acceptable PSS case needs a policy here", file, t.TcID)
			}
			s.cases = append(s.cases, asymCase{tcID: t.TcID, result: t.Result, flags: t.Flags, comment: t.Comment, accept: t.Result == "valid"})
			s.records = append(s.records, appliance.AsymRecord{ID: uint32(t.TcID), Fields: [][]byte{{id}, eLE, unhex(key.Modulus), unhex(t.Sig), hash, salt}})
		}
	}
	return s, nil
}

// goSigSection turns Go-made signature cases into a section.
func goSigSection(tag string, cases []appliance.AsymSigCase) *asymSection {
	s := &asymSection{tag: tag, file: "Go"}
	for i, c := range cases {
		res := "go-invalid"
		if c.Valid {
			res = "go-valid"
		}
		s.cases = append(s.cases, asymCase{tcID: i, result: res, comment: c.What, accept: c.Valid})
		s.records = append(s.records, c.Record)
	}
	return s
}

// asymSigDigests names the digest of each Go-made section.
var asymSigDigests = map[string]string{"RNE256S2": "ecdsa-p256", "RNE384S3": "ecdsa-p384", "RNRSA1V5": "rsa-pkcs1", "RNRSAPSS": "rsa-pss"}

var (
	asymOnce     sync.Once
	asymSections map[string]*asymSection
	asymSigs     *appliance.AsymSigSet
	asymErr      error
)

// asymLoad builds every public-key section once per process (the module
// builder and the checks must see the same cases).
func asymLoad() (map[string]*asymSection, error) {
	asymOnce.Do(func() {
		out := map[string]*asymSection{}
		add := func(s *asymSection, err error) {
			if err != nil && asymErr == nil {
				asymErr = err
			}
			if s != nil {
				out[s.tag] = s
			}
		}
		add(wycheproofX25519("x25519_test.json"))
		add(wycheproofP256DH("ecdh_secp256r1_ecpoint_test.json"))
		add(wycheproofECDSA("WPE256S2", "ecdsa_secp256r1_sha256_test.json"))
		add(wycheproofECDSA("WPE384S3", "ecdsa_secp384r1_sha384_test.json"))
		add(wycheproofECDSA("WPE384S2", "ecdsa_secp384r1_sha256_test.json"))
		add(wycheproofRSA("WPR2K256", "rsa_signature_2048_sha256_test.json"))
		add(wycheproofRSA("WPR2K384", "rsa_signature_2048_sha384_test.json"))
		add(wycheproofRSA("WPR3K256", "rsa_signature_3072_sha256_test.json"))
		add(wycheproofRSA("WPR4K384", "rsa_signature_4096_sha384_test.json"))
		add(wycheproofPSS("WPS2K256", "rsa_pss_2048_sha256_mgf1_32_test.json"))
		add(wycheproofPSS("WPS3K256", "rsa_pss_3072_sha256_mgf1_32_test.json"))
		add(wycheproofPSS("WPS4K384", "rsa_pss_4096_sha384_mgf1_48_test.json"))
		asymSigs, asymErr = appliance.AsymSigCases(selfTestSeed)
		if asymErr == nil {
			add(goSigSection("RNE256S2", asymSigs.ECDSAP256), nil)
			add(goSigSection("RNE384S3", asymSigs.ECDSAP384), nil)
			add(goSigSection("RNRSA1V5", asymSigs.RSAPKCS1), nil)
			add(goSigSection("RNRSAPSS", asymSigs.RSAPSS), nil)
		}
		asymSections = out
	})
	return asymSections, asymErr
}

// asymTags lists the public-key sections in the order the kernel runs them.
var asymTags = []string{"WPX25519", "WPP256DH", "WPE256S2", "WPE384S3", "WPE384S2",
	"WPR2K256", "WPR2K384", "WPR3K256", "WPR4K384", "RNE256S2", "RNE384S3", "RNRSA1V5",
	"WPS2K256", "WPS3K256", "WPS4K384", "RNRSAPSS"}

func init() {
	for _, tag := range asymTags {
		cryptoSections[tag] = func() ([]byte, error) {
			secs, err := asymLoad()
			if err != nil {
				return nil, err
			}
			s := secs[tag]
			if s == nil {
				return nil, fmt.Errorf("no public-key section %s", tag)
			}
			return appliance.EncodeAsymSection(s.records)
		}
	}
}

// describe says what a result character means.
func describeAsym(r byte) string {
	switch r {
	case appliance.AsymResultAccepted:
		return "accepted"
	case appliance.AsymResultOther:
		return "accepted with another secret"
	}
	if why, ok := appliance.AsymReason[r]; ok {
		return "refused (" + why + ")"
	}
	return fmt.Sprintf("answered %q", r)
}

// checkAsymSection compares a section's results with its cases, naming the
// tcId of every disagreement.
func checkAsymSection(t *testing.T, cpu string, s *asymSection, results string) {
	t.Helper()
	if len(results) != len(s.cases) {
		t.Errorf("%s %s (%s): %d results for %d records", cpu, s.tag, s.file, len(results), len(s.cases))
		return
	}
	bad := 0
	for i, c := range s.cases {
		got := results[i]
		var ok bool
		var want string
		switch {
		case c.accept:
			ok, want = got == appliance.AsymResultAccepted, "accepted"
		case c.refusal != 0:
			ok, want = got == c.refusal, "refused ("+appliance.AsymReason[c.refusal]+")"
		default:
			_, refused := appliance.AsymReason[got]
			ok, want = refused, "refused"
		}
		if !ok {
			bad++
			t.Errorf("%s %s (%s) tcId %d [%s] %s %v: kernel %s, want %s", cpu, s.tag, s.file, c.tcID, c.result, c.comment, c.flags, describeAsym(got), want)
		}
	}
	t.Logf("%s %s (%s): %d records as expected of %d (%d more decided by Go's DER parser)", cpu, s.tag, s.file, len(s.cases)-bad, len(s.cases), s.decided)
}

// TestKernelCryptoAsym checks the kernel's public-key self-test on every CPU
// model: every Wycheproof case and Go-made signature as expected, the
// key-exchange digests equal to appliance.CryptoAsymDigests, the verdict
// digests equal to Go's; the cycles per operation are logged.
func TestKernelCryptoAsym(t *testing.T) {
	secs, err := asymLoad()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("self-test seed %d (set DPXE_SELFTEST_SEED to repeat)", selfTestSeed)
	for _, cpu := range cryptoCPUs {
		t.Run(cpu, func(t *testing.T) {
			res := cryptoSelfTest(t, cpu)
			for _, f := range cryptoFailures(res) {
				if strings.HasPrefix(f, "cryptotest FAIL asym") {
					t.Errorf("%s", f)
				}
			}
			rep, err := appliance.ParseAsymReport(res.Serial)
			if err != nil {
				t.Fatal(err)
			}
			for _, tag := range asymTags {
				results, ok := rep.Results[tag]
				if !ok {
					t.Errorf("%s: no \"cryptotest asym vectors %s\" line", cpu, tag)
					continue
				}
				checkAsymSection(t, cpu, secs[tag], results)
				if name, ok := asymSigDigests[tag]; ok {
					checkAsymVerdictDigest(t, cpu, res.Serial, name, secs[tag], results)
				}
			}
			st, err := appliance.ParseSelfTestReport(res.Serial)
			if err != nil {
				t.Fatal(err)
			}
			want := appliance.CryptoAsymDigests(selfTestSeed)
			for _, name := range appliance.AsymDigestNames {
				got, ok := st.Digests[name]
				switch {
				case !ok:
					t.Errorf("%s: no \"selftest digest %s\" line", cpu, name)
				case got != want[name]:
					t.Errorf("%s: digest %s (seed %d): kernel %016x, Go %016x", cpu, name, selfTestSeed, got, want[name])
				default:
					t.Logf("%s: digest %s %016x, as Go", cpu, name, got)
				}
			}
			tags := make([]string, 0, len(rep.Cycles))
			for tag := range rep.Cycles {
				tags = append(tags, tag)
			}
			slices.Sort(tags)
			for _, tag := range tags {
				c := rep.Cycles[tag]
				t.Logf("%s: %s %s: %d cycles per operation (%d accepted operations)", cpu, tag, asymOps[tag], c.PerOp, c.Ops)
			}
			for phase, ms := range rep.Times {
				t.Logf("%s: phase %s %d ms", cpu, phase, ms)
			}
		})
	}
}

// asymOps names the operation each section times, for the handshake
// benchmark's budget.
var asymOps = map[string]string{
	"WPX25519": "X25519", "WPP256DH": "P-256 ECDH (point check + shared secret)",
	"WPE256S2": "ECDSA P-256/SHA-256 verify", "WPE384S3": "ECDSA P-384/SHA-384 verify", "WPE384S2": "ECDSA P-384/SHA-256 verify",
	"WPR2K256": "RSA-2048 PKCS#1 v1.5 verify", "WPR2K384": "RSA-2048 PKCS#1 v1.5 verify", "WPR3K256": "RSA-3072 PKCS#1 v1.5 verify",
	"WPR4K384": "RSA-4096 PKCS#1 v1.5 verify", "WPS2K256": "RSA-2048 PSS verify", "WPS3K256": "RSA-3072 PSS verify",
	"WPS4K384": "RSA-4096 PSS verify", "RNE256S2": "ECDSA P-256 verify (Go-made)", "RNE384S3": "ECDSA P-384 verify (Go-made)",
	"RNRSA1V5": "RSA 2048-4096 PKCS#1 v1.5 verify (Go-made)", "RNRSAPSS": "RSA 2048-4096 PSS verify (Go-made)",
}

// checkAsymVerdictDigest compares a Go-made section's verdict digest with
// Go's verdicts.
func checkAsymVerdictDigest(t *testing.T, cpu, serial, name string, s *asymSection, results string) {
	t.Helper()
	st, err := appliance.ParseSelfTestReport(serial)
	if err != nil {
		t.Fatal(err)
	}
	var cases []appliance.AsymSigCase
	for _, c := range s.cases {
		cases = append(cases, appliance.AsymSigCase{Valid: c.accept})
	}
	want := appliance.AsymVerdictDigest(cases)
	got, ok := st.Digests[name]
	switch {
	case !ok:
		t.Errorf("%s: no \"selftest digest %s\" line", cpu, name)
	case got != appliance.AsymResultsDigest(results):
		t.Errorf("%s: digest %s %016x does not fold its own results", cpu, name, got)
	case got != want:
		t.Errorf("%s: digest %s: kernel %016x, Go %016x", cpu, name, got, want)
	default:
		t.Logf("%s: digest %s %016x over %d signatures, as Go", cpu, name, got, len(cases))
	}
}
