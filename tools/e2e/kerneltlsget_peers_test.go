package e2e

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/image/qemu"
	"github.com/discord-pxe/dpxe/kernel"
	"github.com/discord-pxe/dpxe/tools/netns"
)

// peerCA is a test authority that can issue several leaves under one
// intermediate: ECDSA (a P-384 root, an ECDSA-SHA384 P-384 intermediate,
// P-256 leaves, Discord's shape) or RSA-2048 throughout.
type peerCA struct {
	rootPEM    []byte
	inter      *x509.Certificate
	interDER   []byte
	interKey   crypto.Signer
	rsa        bool
	nextSerial int64
}

func newPeerCA(t *testing.T, rootName string, useRSA bool) *peerCA {
	t.Helper()
	key := func() crypto.Signer {
		if useRSA {
			k, err := rsa.GenerateKey(rand.Reader, 2048)
			if err != nil {
				t.Fatal(err)
			}
			return k
		}
		k, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
		return k
	}
	now := time.Now()
	ca := func(serial int64, cn string) *x509.Certificate {
		return &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
			KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}
	}
	rootKey, interKey := key(), key()
	rootT := ca(1, rootName)
	rootDER, err := x509.CreateCertificate(rand.Reader, rootT, rootT, rootKey.Public(), rootKey)
	if err != nil {
		t.Fatal(err)
	}
	root, _ := x509.ParseCertificate(rootDER)
	interDER, err := x509.CreateCertificate(rand.Reader, ca(2, rootName+" intermediate"), root, interKey.Public(), rootKey)
	if err != nil {
		t.Fatal(err)
	}
	inter, _ := x509.ParseCertificate(interDER)
	return &peerCA{rootPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: rootDER}),
		inter: inter, interDER: interDER, interKey: interKey, rsa: useRSA, nextSerial: 10}
}

// leaf issues a serverAuth leaf for name valid from notBefore to notAfter;
// the chain is the leaf and the intermediate.
func (c *peerCA) leaf(t *testing.T, name string, notBefore, notAfter time.Time) tls.Certificate {
	t.Helper()
	var key crypto.Signer
	if c.rsa {
		key, _ = rsa.GenerateKey(rand.Reader, 2048)
	} else {
		key, _ = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	}
	c.nextSerial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(c.nextSerial), Subject: pkix.Name{CommonName: name},
		DNSNames: []string{name}, NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.inter, key.Public(), c.interKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der, c.interDER}, PrivateKey: key}
}

// writePEM writes cert's chain and key as PEM files for a command-line
// server and returns their paths.
func writePEM(t *testing.T, dir, label string, cert tls.Certificate) (chainFile, keyFile string) {
	t.Helper()
	var chain bytes.Buffer
	for _, der := range cert.Certificate {
		pem.Encode(&chain, &pem.Block{Type: "CERTIFICATE", Bytes: der})
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	chainFile, keyFile = filepath.Join(dir, label+".chain.pem"), filepath.Join(dir, label+".key.pem")
	if err := os.WriteFile(chainFile, chain.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return chainFile, keyFile
}

// recordFault is what a peerServer's proxy does to the server's records.
type recordFault int

const (
	faultNone     recordFault = iota
	faultFlipHS               // flip a byte of the server's first encrypted record (EncryptedExtensions...)
	faultFlipApp              // flip a byte of the first record after the client's request
	faultTruncApp             // forward half of the second record after the request, then FIN
)

// peerServer is a Go crypto/tls server in the namespace whose accept loop
// is ours: each connection's plaintext (what the client sent after a
// completed handshake) is counted, and its records can pass through a
// faulting proxy (net.Pipe between the TCP connection and tls.Server).
type peerServer struct {
	cfg     *tls.Config
	body    []byte
	host    string // the Host header and SNI the request must carry
	fault   recordFault
	conns   atomic.Int32 // TCP connections accepted
	shakes  atomic.Int32 // handshakes completed
	plain   atomic.Int64 // request bytes decrypted
	faulted atomic.Int32 // records the proxy changed
	mu      sync.Mutex
	sni     []string
	certs   []int // per handshake, the client certificates it sent
	errs    []string
}

func startPeerServer(t *testing.T, nsName, addr string, s *peerServer) *peerServer {
	t.Helper()
	ln, err := listenInNetns(nsName, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.conns.Add(1)
			go s.handle(c)
		}
	}()
	return s
}

func (s *peerServer) logErr(err error) {
	s.mu.Lock()
	s.errs = append(s.errs, err.Error())
	s.mu.Unlock()
}

func (s *peerServer) handle(raw net.Conn) {
	defer raw.Close()
	raw.SetDeadline(time.Now().Add(60 * time.Second))
	var conn net.Conn = raw
	if s.fault != faultNone {
		inner, outer := net.Pipe()
		defer inner.Close()
		go s.proxy(raw, outer)
		conn = inner
	}
	tc := tls.Server(conn, s.cfg)
	if err := tc.Handshake(); err != nil {
		s.logErr(err)
		return
	}
	s.shakes.Add(1)
	st := tc.ConnectionState()
	s.mu.Lock()
	s.sni = append(s.sni, st.ServerName)
	s.certs = append(s.certs, len(st.PeerCertificates))
	s.mu.Unlock()
	br := bufio.NewReader(&countingReader{r: tc, n: &s.plain})
	req, err := http.ReadRequest(br)
	if err != nil {
		s.logErr(err)
		return
	}
	status := "200 OK"
	if req.Host != s.host || st.ServerName != s.host || req.URL.Path != "/api/v10/gateway" {
		status = "404 Not Found"
	}
	fmt.Fprintf(tc, "HTTP/1.1 %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n", status, len(s.body))
	tc.Write(s.body)
	tc.Close() // close_notify
}

type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// proxy copies records between the kernel's TCP connection (raw) and the
// TLS server's end of the pipe (srv), parsing each direction into records
// (5-byte header, length) and applying s.fault to the server's.
func (s *peerServer) proxy(raw, srv net.Conn) {
	defer srv.Close()
	var clientApp atomic.Int32 // client application_data records: its Finished, then the request
	go func() {
		defer srv.Close()
		for {
			rec, err := readRecord(raw)
			if err != nil {
				return
			}
			if rec[0] == 23 {
				clientApp.Add(1)
			}
			if _, err := srv.Write(rec); err != nil {
				return
			}
		}
	}()
	afterReq := 0
	for {
		rec, err := readRecord(srv)
		if err != nil {
			return
		}
		if rec[0] == 23 {
			switch {
			case s.fault == faultFlipHS && s.faulted.Load() == 0:
				rec[len(rec)/2+2] ^= 0x01
				s.faulted.Add(1)
			case s.fault == faultFlipApp && clientApp.Load() >= 2 && s.faulted.Load() == 0:
				rec[len(rec)/2+2] ^= 0x01
				s.faulted.Add(1)
			case s.fault == faultTruncApp && clientApp.Load() >= 2:
				afterReq++
				if afterReq == 2 {
					raw.Write(rec[:len(rec)/2])
					s.faulted.Add(1)
					raw.(*net.TCPConn).CloseWrite() // the FIN, inside the record
					io.Copy(io.Discard, io.LimitReader(raw, 1<<20))
					return
				}
			}
		}
		if _, err := raw.Write(rec); err != nil {
			return
		}
	}
}

// readRecord reads one TLS record (header and fragment) from r.
func readRecord(r io.Reader) ([]byte, error) {
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint16(hdr[3:5]))
	if n > 1<<14+256 {
		return nil, fmt.Errorf("record of %d bytes", n)
	}
	rec := make([]byte, 5+n)
	copy(rec, hdr)
	_, err := io.ReadFull(r, rec[5:])
	return rec, err
}

// startInNetns starts a command-line server in the namespace (from dir
// when not empty) and waits (bounded) until it accepts TCP connections on
// addr; the test's cleanup stops it.
func startInNetns(t testing.TB, ctx context.Context, ns *netns.NS, dir, addr string, name string, args ...string) {
	t.Helper()
	cmd := ns.Command(ctx, name, args...)
	cmd.Dir = dir
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Cancel(); cmd.Wait() })
	for i := 0; i < 100; i++ { // bounded: until it listens
		err := inNetns(ns.Name, func() error {
			c, err := net.DialTimeout("tcp4", addr, time.Second)
			if err == nil {
				c.Close()
			}
			return err
		})
		if err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s did not listen on %s: %s", name, addr, out.String())
}

// askDNS sends one A query for name to server:53 from inside the
// namespace and returns the RCODE and addresses (for the readiness poll
// and to check the server's answers are the ones the kernel should get).
func askDNS(nsName, server, name string) (dnsmessage.RCode, []netip.Addr, error) {
	var rcode dnsmessage.RCode
	var addrs []netip.Addr
	err := inNetns(nsName, func() error {
		c, err := net.DialTimeout("udp4", server+":53", time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		q := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 7, RecursionDesired: true})
		q.StartQuestions()
		q.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name + "."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
		msg, _ := q.Finish()
		c.SetDeadline(time.Now().Add(500 * time.Millisecond))
		if _, err := c.Write(msg); err != nil {
			return err
		}
		buf := make([]byte, 1500)
		n, err := c.Read(buf)
		if err != nil {
			return err
		}
		var p dnsmessage.Parser
		h, err := p.Start(buf[:n])
		if err != nil {
			return err
		}
		rcode = h.RCode
		p.SkipAllQuestions()
		for {
			a, err := p.AnswerHeader()
			if err != nil {
				break
			}
			if a.Type != dnsmessage.TypeA {
				p.SkipAnswer()
				continue
			}
			r, err := p.AResource()
			if err != nil {
				break
			}
			addrs = append(addrs, netip.AddrFrom4(r.A))
		}
		return nil
	})
	return rcode, addrs, err
}

// TestKernelTLSGetPeers boots tlsget= against more real peers than
// TestKernelTLSGet, all from one image whose anchors are two test roots
// (ECDSA P-384 and RSA-2048), in a namespace where dnsmasq hands out
// leases naming itself as the DNS server and answers for tls.test:
//   - host names: https://tls.test:PORT/... resolved by the kernel's DNS
//     resolver (the lease's server), the name used as SNI, Host and the
//     name the leaf must carry; an unknown name (NXDOMAIN) and a name
//     whose query is never answered (dnsmasq forwards *.invalid to an
//     address nobody holds) are refused reason=dns before any TCP
//     connection;
//   - gnutls-serv with a TLS 1.3-only priority string: ChaCha20-Poly1305 and
//     AES-128-GCM on x25519 with the ECDSA chain, the RSA-2048 chain
//     (rsa_pss_rsae_sha256), and secp256r1 only (a HelloRetryRequest,
//     answered); each sends a CertificateRequest (gnutls-serv's default),
//     answered with an empty Certificate;
//   - a Go crypto/tls server with ClientAuth RequestClientCert: it must
//     see an empty client certificate list, then the GET;
//   - live refusals from a Go crypto/tls server the test drives itself:
//     an expired leaf, a not-yet-valid leaf, a leaf whose signature bytes
//     are corrupted, a chain without its intermediate, a byte flipped in
//     the server's first encrypted handshake record, a byte flipped in an
//     application-data record after the request, and a stream cut inside
//     a record after the request. Each prints its reason line and ends
//     QEMU with the fail status; on the handshake refusals the server
//     decrypted no request byte.
//
// (TestKernelTLSGet covers live: wrong name, unknown root, a TLS 1.2-only
// server, HelloRetryRequest.)
func TestKernelTLSGetPeers(t *testing.T) {
	if err := netns.Available(); err != nil {
		t.Skip(err)
	}
	needQEMU(t, qemu.SeaBIOS)
	if _, err := exec.LookPath("dnsmasq"); err != nil {
		t.Skip("no dnsmasq (tools/scripts/deps.sh installs dnsmasq-base)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	const name = "tls.test"
	ecCA := newPeerCA(t, "tlsget peers ecdsa root", false)
	rsaCA := newPeerCA(t, "tlsget peers rsa root", true)
	dir := t.TempDir()
	start := time.Now()
	if _, err := image.Build(ctx, image.Options{Sources: kernel.Sources, OutDir: dir,
		Trust: []image.TrustSource{{Name: "peers-ecdsa-root", PEM: ecCA.rootPEM}, {Name: "peers-rsa-root", PEM: rsaCA.rootPEM}}}); err != nil {
		t.Fatal(err)
	}
	t.Logf("test image with two test roots as its anchors: %v", time.Since(start).Round(time.Millisecond))

	const subnet = "10.77.94"
	ns, err := netns.New(ctx, netip.MustParsePrefix(subnet+".1/24"))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := ns.AddTap(ctx, "tap0"); err != nil {
		t.Fatal(err)
	}
	// dnsmasq: DHCP (the lease names it as the DNS server, option 6) and
	// DNS, authoritative for .test (--local): tls.test has an A record,
	// every other .test name is NXDOMAIN.
	dnsmasq := ns.Command(ctx, "dnsmasq", "--no-daemon", "--conf-file=/dev/null", "--no-hosts", "--no-resolv",
		"--interface=br0", "--bind-interfaces", "--listen-address="+subnet+".1", "--no-ping", "--pid-file=",
		"--local=/test/", "--host-record="+name+","+subnet+".1", "--log-queries",
		"--server=/invalid/"+subnet+".9", // nobody at .9: queries for *.invalid are never answered
		"--dhcp-leasefile="+filepath.Join(dir, "leases"),
		"--dhcp-range="+subnet+".100,"+subnet+".150,255.255.255.0,2m",
		"--dhcp-option=3,"+subnet+".1", "--dhcp-option=6,"+subnet+".1")
	var dlog lockedBuffer
	dnsmasq.Stdout, dnsmasq.Stderr = &dlog, &dlog
	if err := dnsmasq.Start(); err != nil {
		t.Fatalf("dnsmasq: %v", err)
	}
	t.Cleanup(func() { dnsmasq.Cancel(); dnsmasq.Wait() })
	for i := 0; ; i++ { // bounded: until dnsmasq answers
		rc, addrs, err := askDNS(ns.Name, subnet+".1", name)
		if err == nil && rc == dnsmessage.RCodeSuccess && len(addrs) == 1 && addrs[0].String() == subnet+".1" {
			break
		}
		if i == 100 {
			t.Fatalf("dnsmasq does not answer %s: %v %v %v\n%s", name, rc, addrs, err, dlog.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if rc, _, err := askDNS(ns.Name, subnet+".1", "missing.test"); err != nil || rc != dnsmessage.RCodeNameError {
		t.Fatalf("dnsmasq answers missing.test with %v %v, want NXDOMAIN", rc, err)
	}

	body := make([]byte, 40000) // several records
	rng := mrand.New(mrand.NewPCG(17, 94))
	for i := range body {
		body[i] = byte(rng.Uint32())
	}
	sum := sha256.Sum256(body)
	now := time.Now()
	good := ecCA.leaf(t, name, now.Add(-time.Hour), now.Add(24*time.Hour))
	expired := ecCA.leaf(t, name, now.Add(-48*time.Hour), now.Add(-time.Hour))
	notYet := ecCA.leaf(t, name, now.Add(24*time.Hour), now.Add(48*time.Hour))
	badSig := ecCA.leaf(t, name, now.Add(-time.Hour), now.Add(24*time.Hour))
	badSig.Certificate[0] = append([]byte(nil), badSig.Certificate[0]...)
	badSig.Certificate[0][len(badSig.Certificate[0])-1] ^= 0x01 // the last byte of the ECDSA signature's s
	if l, err := x509.ParseCertificate(badSig.Certificate[0]); err != nil {
		t.Fatalf("the corrupted leaf no longer parses: %v", err)
	} else if l.CheckSignatureFrom(ecCA.inter) == nil {
		t.Fatal("the corrupted leaf's signature still verifies")
	}
	noInter := good
	noInter.Certificate = good.Certificate[:1]

	goPeer := func(port int, cert tls.Certificate, fault recordFault) *peerServer {
		return startPeerServer(t, ns.Name, fmt.Sprintf("%s.1:%d", subnet, port), &peerServer{
			cfg:  &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13, SessionTicketsDisabled: true},
			body: body, host: name, fault: fault})
	}
	type tcase struct {
		label, url string
		dhcp       bool
		reason     string      // "" for ok
		srv        *peerServer // a Go peer: its connection is checked
		suite, sig string
		group      string // "" for x25519
		dnsWhy     string // refused by the resolver with this reason, before connecting
		inFlight   bool   // the request was sent before the fault
	}
	u := func(port int) string { return fmt.Sprintf("https://%s.1:%d/api/v10/gateway,%s", subnet, port, name) }
	cases := []tcase{}
	dnsSrv := goPeer(9443, good, faultNone)
	cases = append(cases,
		tcase{label: "dns-name", url: "https://" + name + ":9443/api/v10/gateway", dhcp: true, srv: dnsSrv, sig: "ecdsa_secp256r1_sha256"},
		tcase{label: "dns-nxdomain", url: "https://missing.test:9443/api/v10/gateway", dhcp: true, reason: "dns",
			dnsWhy: "DNS: no such name (NXDOMAIN)"},
		tcase{label: "dns-timeout", url: "https://slow.invalid:9443/api/v10/gateway", dhcp: true, reason: "dns",
			dnsWhy: "DNS: no answer from the server"},
		tcase{label: "expired", url: u(9450), reason: "certificate_expired", srv: goPeer(9450, expired, faultNone)},
		tcase{label: "not-yet-valid", url: u(9451), reason: "certificate_not_yet_valid", srv: goPeer(9451, notYet, faultNone)},
		tcase{label: "bad-signature", url: u(9452), reason: "bad_signature", srv: goPeer(9452, badSig, faultNone)},
		tcase{label: "missing-intermediate", url: u(9453), reason: "unknown_ca", srv: goPeer(9453, noInter, faultNone)},
		tcase{label: "bad-mac-handshake", url: u(9454), reason: "bad_record_mac", srv: goPeer(9454, good, faultFlipHS)},
		tcase{label: "bad-mac-data", url: u(9455), reason: "bad_record_mac", srv: goPeer(9455, good, faultFlipApp), inFlight: true},
		tcase{label: "truncated-record", url: u(9456), reason: "truncated_record", srv: goPeer(9456, good, faultTruncApp), inFlight: true},
		// a CertificateRequest (§4.3.2): answered with an empty Certificate
		tcase{label: "certificate-request", url: u(9457), sig: "ecdsa_secp256r1_sha256", srv: startPeerServer(t, ns.Name, fmt.Sprintf("%s.1:%d", subnet, 9457), &peerServer{
			cfg: &tls.Config{Certificates: []tls.Certificate{good}, MinVersion: tls.VersionTLS13, SessionTicketsDisabled: true,
				ClientAuth: tls.RequestClientCert},
			body: body, host: name})},
	)

	// gnutls-serv, TLS 1.3 only: one suite and one group per server
	if _, err := exec.LookPath("gnutls-serv"); err == nil {
		ecChain, ecKey := writePEM(t, dir, "ecdsa", good)
		rsaChain, rsaKey := writePEM(t, dir, "rsa", rsaCA.leaf(t, name, now.Add(-time.Hour), now.Add(24*time.Hour)))
		// gnutls-serv's default: a CertificateRequest, which the kernel
		// answers with an empty Certificate
		gnutls := func(port int, chain, key, suite, group string) {
			prio := "NORMAL:-VERS-ALL:+VERS-TLS1.3:-CIPHER-ALL:+" + suite + ":-GROUP-ALL:+" + group
			startInNetns(t, ctx, ns, "", fmt.Sprintf("%s.1:%d", subnet, port), "gnutls-serv", "--http", "--port", strconv.Itoa(port),
				"--x509certfile", chain, "--x509keyfile", key, "--priority", prio)
		}
		gnutls(9460, ecChain, ecKey, "CHACHA20-POLY1305", "GROUP-X25519")
		gnutls(9461, ecChain, ecKey, "AES-128-GCM", "GROUP-X25519")
		gnutls(9462, rsaChain, rsaKey, "CHACHA20-POLY1305", "GROUP-X25519")
		gnutls(9463, ecChain, ecKey, "CHACHA20-POLY1305", "GROUP-SECP256R1")
		gu := func(port int) string { return fmt.Sprintf("https://%s.1:%d/,%s", subnet, port, name) }
		cases = append(cases,
			tcase{label: "gnutls-chacha-x25519-ecdsa", url: gu(9460), suite: "TLS_CHACHA20_POLY1305_SHA256", sig: "ecdsa_secp256r1_sha256"},
			tcase{label: "gnutls-aes-x25519-ecdsa", url: gu(9461), suite: "TLS_AES_128_GCM_SHA256", sig: "ecdsa_secp256r1_sha256"},
			tcase{label: "gnutls-chacha-x25519-rsa2048", url: gu(9462), suite: "TLS_CHACHA20_POLY1305_SHA256", sig: "rsa_pss_rsae_sha256"},
			// secp256r1 only: the server asks for a P-256 share (HelloRetryRequest), answered
			tcase{label: "gnutls-secp256r1", url: gu(9463), suite: "TLS_CHACHA20_POLY1305_SHA256", sig: "ecdsa_secp256r1_sha256", group: "secp256r1"},
		)
	} else {
		t.Log("no gnutls-serv (tools/scripts/deps.sh installs gnutls-bin): its cases are skipped")
	}

	var bootTime time.Duration
	boots := 0
	for i, c := range cases {
		t.Run(c.label, func(t *testing.T) {
			cfg := appliance.BootConfig{NodeID: "tlspeers", TLSGet: c.url}
			if !c.dhcp {
				cfg.StaticIP = subnet + ".50/24," + subnet + ".1"
			}
			res, err := qemu.Run(ctx, qemu.Options{
				Firmware: qemu.SeaBIOS,
				Kernel:   filepath.Join(dir, image.KernelFile),
				Append:   cfg.String(),
				Net: []string{"-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no",
					"-device", fmt.Sprintf("virtio-net-pci,netdev=n0,mac=52:54:00:94:%02x:50", i)},
				Wrapper: ns.Wrapper(),
				Timeout: 45 * time.Second,
			})
			if err != nil {
				t.Fatal(err)
			}
			bootTime += res.Elapsed
			boots++
			t.Logf("%s: %v", c.label, res.Elapsed.Round(time.Millisecond))
			defer func() {
				if t.Failed() {
					t.Logf("serial console:\n%s", res.Serial)
					if c.dhcp {
						t.Logf("dnsmasq:\n%s", dlog.String())
					}
					if c.srv != nil {
						c.srv.mu.Lock()
						t.Logf("server: conns=%d handshakes=%d plaintext=%d faulted=%d errors=%q", c.srv.conns.Load(),
							c.srv.shakes.Load(), c.srv.plain.Load(), c.srv.faulted.Load(), c.srv.errs)
						c.srv.mu.Unlock()
					}
				}
			}()
			all := tlsgetLine.FindAllStringSubmatch(res.Serial, -1)
			if len(all) != 1 {
				t.Fatalf("%d verdict lines, want 1", len(all))
			}
			m := all[0]
			if c.dhcp {
				re := regexp.MustCompile(`tlsget: resolving ` + regexp.QuoteMeta(strings.Split(strings.TrimPrefix(c.url, "https://"), ":")[0]) +
					` \(dns server ` + regexp.QuoteMeta(subnet) + `\.1\)`)
				if !re.MatchString(res.Serial) {
					t.Errorf("no line %q", re)
				}
			}
			if c.reason != "" {
				if m[9] != c.reason {
					t.Errorf("verdict %q, want refused reason=%s", m[1], c.reason)
				}
				if res.ExitCode != qemu.ExitFail {
					t.Errorf("QEMU exit %d, want the fail verdict %d", res.ExitCode, qemu.ExitFail)
				}
			} else {
				if m[9] != "" || m[2] != "200" {
					t.Fatalf("verdict %q, want ok status=200", m[1])
				}
				if !res.Passed() {
					t.Errorf("QEMU exit %d, want the pass verdict", res.ExitCode)
				}
				group := cmp.Or(c.group, "x25519")
				if m[6] != group || m[8] != "2" || (c.sig != "" && m[7] != c.sig) || (c.suite != "" && m[5] != c.suite) {
					t.Errorf("group=%s sig=%s chain=%s suite=%s, want %s %s 2 %s", m[6], m[7], m[8], m[5], group, c.sig, c.suite)
				}
			}
			switch {
			case c.dnsWhy != "":
				if !regexp.MustCompile(`(?m)^tlsget: ` + regexp.QuoteMeta(c.dnsWhy) + `\r?$`).MatchString(res.Serial) {
					t.Errorf("no line naming the resolver's reason %q", c.dnsWhy)
				}
				if strings.Contains(res.Serial, "tlsget: connecting to") || dnsSrv.conns.Load() != 1 {
					t.Errorf("a connection after a failed lookup (server saw %d connections, want only dns-name's 1)", dnsSrv.conns.Load())
				}
			case c.srv != nil && c.reason == "":
				if m[3] != strconv.Itoa(len(body)) || m[4] != hex.EncodeToString(sum[:]) {
					t.Errorf("body bytes=%s sha256=%s, want %d %x", m[3], m[4], len(body), sum)
				}
				c.srv.mu.Lock()
				if len(c.srv.sni) != 1 || c.srv.sni[0] != name {
					t.Errorf("SNI %q, want [%s]", c.srv.sni, name)
				}
				if len(c.srv.certs) != 1 || c.srv.certs[0] != 0 {
					t.Errorf("client certificates per handshake %v, want [0]", c.srv.certs)
				}
				c.srv.mu.Unlock()
			case c.srv != nil:
				if c.srv.conns.Load() != 1 {
					t.Errorf("server saw %d connections, want 1", c.srv.conns.Load())
				}
				if c.srv.fault != faultNone && c.srv.faulted.Load() != 1 {
					t.Errorf("the proxy changed %d records, want 1", c.srv.faulted.Load())
				}
				if !c.inFlight && (c.srv.shakes.Load() != 0 || c.srv.plain.Load() != 0) {
					t.Errorf("a refused connection: the server completed %d handshakes and decrypted %d request bytes, want none",
						c.srv.shakes.Load(), c.srv.plain.Load())
				}
			}
		})
	}
	t.Logf("%d boots: %v of QEMU", boots, bootTime.Round(time.Millisecond))
}
