package appliance

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
)

// The digests of the kernel's TLS self-test (kernel/selftest/
// tls_selftest.inc), computed with the Go reference of tls13.go.

// TLSKernelConnBytes is the size of the kernel's TLS_CONN (kernel/tls/
// tls.inc), a connection's whole TLS state, as docs/kernel.md states it;
// the kernel's TLS self-test prints it and TestKernelTLS compares.
const TLSKernelConnBytes = 832

// TLSDigestNames names the TLS digests in the order the kernel prints them.
var TLSDigestNames = []string{"tls13-rfc8448", "tls13", "tls13-ch", "tls13-hs", "x509", "x509chain", "tls13-cert", "tls13-auth", "tls13-client", "tls13-post"}

// TLSRFC8448Fields lists, in order, the RFC 8448 values the kernel's replay
// takes from its vector section (each as u32 little-endian length and
// bytes); LoadRFC8448 reads them.
var TLSRFC8448Fields = []string{"shared_secret", "client_hello", "server_hello", "server_flight_record", "server_app_record"}

// LoadRFC8448 reads a "name = hex" file such as
// testdata/rfc8448-simple-1rtt.txt ('#' starts a comment line; spaces
// inside a value are ignored).
func LoadRFC8448(path string) (map[string][]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string][]byte{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		t := strings.TrimSpace(sc.Text())
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		name, val, ok := strings.Cut(t, "=")
		if !ok {
			return nil, fmt.Errorf("%s:%d: no '='", path, line)
		}
		name = strings.TrimSpace(name)
		b, err := hex.DecodeString(strings.ReplaceAll(val, " ", ""))
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %s: %w", path, line, name, err)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("%s:%d: %s given twice", path, line, name)
		}
		out[name] = b
	}
	return out, sc.Err()
}

// TLSRFC8448Section is the kernel's vector section for the replay:
// TLSRFC8448Fields, each as u32 little-endian length and bytes.
func TLSRFC8448Section(v map[string][]byte) ([]byte, error) {
	var out []byte
	for _, name := range TLSRFC8448Fields {
		b, ok := v[name]
		if !ok {
			return nil, fmt.Errorf("RFC 8448 values: no %s", name)
		}
		out = binary.LittleEndian.AppendUint32(out, uint32(len(b)))
		out = append(out, b...)
	}
	return out, nil
}

// foldKeys folds a direction's traffic secret, key and IV.
func foldKeys(d *digest, k *TLSTrafficKeys) {
	digestBytes(d, k.Secret)
	digestBytes(d, k.Key)
	digestBytes(d, k.IV)
}

// foldOpen opens b with c and folds the reason's index, the content type,
// the bytes used and the content (0, 0 and nothing on a refusal).
func foldOpen(d *digest, c *TLS13, b []byte) {
	typ, content, n, err := c.Open(b)
	d.add(uint64(TLSReasonIndex(err)))
	d.add(uint64(typ))
	d.add(uint64(n))
	digestBytes(d, content)
}

// TLSRFC8448Digest replays RFC 8448 §3 as the kernel's self-test does and
// returns the "tls13-rfc8448" digest. A client connection
// (TLS_AES_128_GCM_SHA256) folds, in order:
//   - its early secret;
//   - after ClientHello, ServerHello and the shared secret: the handshake
//     secret, then its write and read traffic secrets, keys and IVs;
//   - the opened server flight (reason, type, bytes used, content);
//   - with the transcript through CertificateVerify: the server Finished it
//     expects, and 1 if the flight's Finished carries it (else 0); then the
//     Finished message joins the transcript;
//   - the master secret, the client and server application secrets;
//   - its own Finished verify_data, and that Finished sealed (handshake
//     keys, sequence 0); the Finished joins the transcript;
//   - after activating the application keys: write, then read traffic
//     secret, key and IV; the 50-byte payload 00..31 sealed as
//     application_data;
//   - the server's application record opened at read sequence 1, then the
//     read sequence (2);
//   - a seal at write sequence 2^64-1 and an open at read sequence 2^64-1:
//     each refusal's index.
func TLSRFC8448Digest(v map[string][]byte) (uint64, error) {
	for _, name := range TLSRFC8448Fields {
		if _, ok := v[name]; !ok {
			return 0, fmt.Errorf("RFC 8448 values: no %s", name)
		}
	}
	d := newDigest()
	c, err := NewTLS13(TLSSuiteAES128GCMSHA256, TLSClient)
	if err != nil {
		return 0, err
	}
	digestBytes(&d, c.Secret)
	c.AddTranscript(v["client_hello"])
	c.AddTranscript(v["server_hello"])
	c.HandshakeSecrets(v["shared_secret"])
	digestBytes(&d, c.Secret)
	foldKeys(&d, &c.Write)
	foldKeys(&d, &c.Read)
	typ, flight, n, err := c.Open(v["server_flight_record"])
	d.add(uint64(TLSReasonIndex(err)))
	d.add(uint64(typ))
	d.add(uint64(n))
	digestBytes(&d, flight)
	if len(flight) < tlsFinishedMsgLen {
		return 0, fmt.Errorf("RFC 8448 server flight: %d bytes opened", len(flight))
	}
	cut := len(flight) - tlsFinishedMsgLen
	c.AddTranscript(flight[:cut])
	want := c.FinishedVerifyData(false)
	digestBytes(&d, want)
	if string(flight[cut+4:]) == string(want) {
		d.add(1)
	} else {
		d.add(0)
	}
	c.AddTranscript(flight[cut:])
	c.ApplicationSecrets()
	digestBytes(&d, c.Secret)
	digestBytes(&d, c.ClientAppSecret)
	digestBytes(&d, c.ServerAppSecret)
	fin := FinishedMessage(c.FinishedVerifyData(true))
	digestBytes(&d, fin[4:])
	rec, err := c.Seal(TLSContentHandshake, fin, 0)
	if err != nil {
		return 0, err
	}
	digestBytes(&d, rec)
	c.AddTranscript(fin)
	c.ActivateRead()
	c.ActivateWrite()
	foldKeys(&d, &c.Write)
	foldKeys(&d, &c.Read)
	payload := make([]byte, 50)
	for i := range payload {
		payload[i] = byte(i)
	}
	if rec, err = c.Seal(TLSContentApplicationData, payload, 0); err != nil {
		return 0, err
	}
	digestBytes(&d, rec)
	c.Read.Seq = 1
	foldOpen(&d, c, v["server_app_record"])
	d.add(c.Read.Seq)
	c.Write.Seq = tlsSeqLast
	_, err = c.Seal(TLSContentApplicationData, payload, 0)
	d.add(uint64(TLSReasonIndex(err)))
	c.Read.Seq = tlsSeqLast
	_, _, _, err = c.Open(v["server_app_record"])
	d.add(uint64(TLSReasonIndex(err)))
	return uint64(d), nil
}

// TLSDigests computes, for a seed, the "tls13" digest of the kernel's TLS
// self-test over CryptoSelfTestCases cases from the splitmix64 stream:
//
//	r = next(); suite AES-128-GCM when r & 1 == 0, else ChaCha20-Poly1305;
//	lengths: "ClientHello" (r >> 8 & 255) % 200, "ServerHello"
//	(r >> 16 & 255) % 120, "the rest of the server's flight"
//	(r >> 24 & 255) % 100; random shared secret (32 bytes), then those
//	three messages;
//	a client and a server connection both hash the first two and derive
//	the handshake secrets; fold the client's handshake secret, its write
//	and read traffic secrets, keys and IVs;
//	record step, client to server (below);
//	fold the client's own Finished and the server's expected one (equal);
//	both hash the third message, derive the application secrets and
//	activate them; fold the client's master secret, write and read keys;
//	when r & 2 != 0 the client updates its write keys and the server its
//	read keys (KeyUpdate) and the client's new write keys are folded;
//	record step, server to client.
//
// A record step: r2 = next(), r3 = next(); content length n =
// (r2 >> 8 & 0xFFFF) % 1200, or % 16385 when r2 & 15 == 0; padding
// (r2 >> 32 & 255) % 64, cut to 16384 - n when the inner plaintext would
// pass 2^14 + 1; type 21 + (r2 >> 40 & 255) % 3; mode (r2 >> 48 & 255) % 8;
// random content. Mode 6 first seals type 0 with no content and r3 % 32
// bytes of padding (an all-zero inner plaintext) and folds the index of
// the opener's refusal. Then the record is sealed and folded. Modes 1-5
// and 7 open a damaged copy first and fold the refusal's index: 1 flips
// bit (r3 >> 32) & 7 of byte 5 + r3 % (len - 5); 2 cuts k = 1 + r3 % 16
// bytes off the end and off the header's length; 3 offers only r3 % len
// bytes; 4 sets the length to 2^14 + 257 + r3 % 1000; 5 sets the
// opaque_type to 22; 7 sets the legacy version to 0x0301. Last the intact
// record is opened: reason index, type, bytes used, content.
func TLSDigests(seed uint32) map[string]uint64 {
	rng := &splitmix64{state: uint64(seed)}
	d := newDigest()
	for i := 0; i < CryptoSelfTestCases; i++ {
		tlsCase(rng, &d)
	}
	return map[string]uint64{"tls13": uint64(d), "tls13-ch": TLSClientHelloDigest(seed), "tls13-hs": TLSHSDigest()}
}

func tlsCase(rng *splitmix64, d *digest) {
	r := rng.next()
	suite := TLSSuiteAES128GCMSHA256
	if r&1 != 0 {
		suite = TLSSuiteChaCha20Poly1305SHA256
	}
	shared := make([]byte, 32)
	ch := make([]byte, (r>>8&255)%200)
	sh := make([]byte, (r>>16&255)%120)
	rest := make([]byte, (r>>24&255)%100)
	fillRandom(rng, shared)
	fillRandom(rng, ch)
	fillRandom(rng, sh)
	fillRandom(rng, rest)
	cl, _ := NewTLS13(suite, TLSClient)
	sv, _ := NewTLS13(suite, TLSServer)
	for _, c := range []*TLS13{cl, sv} {
		c.AddTranscript(ch)
		c.AddTranscript(sh)
		c.HandshakeSecrets(shared)
	}
	digestBytes(d, cl.Secret)
	foldKeys(d, &cl.Write)
	foldKeys(d, &cl.Read)
	tlsRecordStep(rng, d, cl, sv)
	digestBytes(d, cl.FinishedVerifyData(true))
	digestBytes(d, sv.FinishedVerifyData(false))
	for _, c := range []*TLS13{cl, sv} {
		c.AddTranscript(rest)
		c.ApplicationSecrets()
		c.ActivateRead()
		c.ActivateWrite()
	}
	digestBytes(d, cl.Secret)
	foldKeys(d, &cl.Write)
	foldKeys(d, &cl.Read)
	if r&2 != 0 {
		cl.KeyUpdate(true)
		sv.KeyUpdate(false)
		foldKeys(d, &cl.Write)
	}
	tlsRecordStep(rng, d, sv, cl)
}

func tlsRecordStep(rng *splitmix64, d *digest, w, rd *TLS13) {
	r2 := rng.next()
	r3 := rng.next()
	n := (r2 >> 8 & 0xFFFF) % 1200
	if r2&15 == 0 {
		n = (r2 >> 8 & 0xFFFF) % (1<<14 + 1)
	}
	pad := (r2 >> 32 & 255) % 64
	if n+1+pad > TLSMaxInnerLen {
		pad = TLSMaxInnerLen - 1 - n
	}
	typ := byte(21 + (r2>>40&255)%3)
	mode := (r2 >> 48 & 255) % 8
	content := make([]byte, n)
	fillRandom(rng, content)
	if mode == 6 {
		z, err := w.Seal(0, nil, int(r3%32))
		if err != nil {
			panic(err)
		}
		_, _, _, err = rd.Open(z)
		d.add(uint64(TLSReasonIndex(err)))
	}
	rec, err := w.Seal(typ, content, int(pad))
	if err != nil {
		panic(err) // the lengths above always fit
	}
	digestBytes(d, rec)
	if mode != 0 && mode != 6 {
		bad := append([]byte(nil), rec...)
		avail := len(bad)
		switch mode {
		case 1:
			bad[5+r3%uint64(len(bad)-5)] ^= 1 << (r3 >> 32 & 7)
		case 2:
			k := int(1 + r3%16)
			binary.BigEndian.PutUint16(bad[3:], uint16(len(bad)-TLSRecordHeaderLen-k))
			avail -= k
		case 3:
			avail = int(r3 % uint64(len(bad)))
		case 4:
			binary.BigEndian.PutUint16(bad[3:], uint16(TLSMaxCiphertext+1+r3%1000))
		case 5:
			bad[0] = TLSContentHandshake
		case 7:
			bad[2] = 1
		}
		_, _, _, err := rd.Open(bad[:avail])
		d.add(uint64(TLSReasonIndex(err)))
	}
	foldOpen(d, rd, rec)
}
