package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/discord-pxe/dpxe/appliance"
)

// natsTLSLogRE finds the embedded server's address in serve's events line
// when it requires TLS.
var natsTLSLogRE = regexp.MustCompile(`msg=events part=events nats=(tls://127\.0\.0\.1:\d+)`)

// writeBrokerCA makes a throw-away CA and a leaf it signs for hosts (DNS
// names or IP addresses), and writes ca.pem, broker.crt and broker.key
// (0600) into dir; it returns their paths.
func writeBrokerCA(t *testing.T, dir string, hosts ...string) (caFile, certFile, keyFile string) {
	t.Helper()
	now := time.Now()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "dpxe test broker CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: hosts[0]},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			leaf.IPAddresses = append(leaf.IPAddresses, ip)
		} else {
			leaf.DNSNames = append(leaf.DNSNames, h)
		}
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalPKCS8PrivateKey(key)
	caFile, certFile, keyFile = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "broker.crt"), filepath.Join(dir, "broker.key")
	for _, f := range []struct {
		path, typ string
		der       []byte
		mode      os.FileMode
	}{{caFile, "CERTIFICATE", caDER, 0o644}, {certFile, "CERTIFICATE", leafDER, 0o644}, {keyFile, "PRIVATE KEY", keyDER, 0o600}} {
		if err := os.WriteFile(f.path, pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der}), f.mode); err != nil {
			t.Fatal(err)
		}
	}
	return caFile, certFile, keyFile
}

// freePort returns a loopback TCP port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestServeNATSTLS runs `dpxe serve --nats-auth --nats-tls-cert/-key
// --nats-node-url tls://broker.test:PORT`: a node's check-in answer
// carries exactly that URL; a client trusting the test CA reaches the
// broker by that name (the test resolves it to loopback) over TLS with the
// node's credentials from the answer and stores an event in the stream; a
// client that speaks plaintext is cut, one without the CA refuses the
// certificate; a worker reads the stream's stats with --nats-ca and fails
// without it.
func TestServeNATSTLS(t *testing.T) {
	dir := t.TempDir()
	bin := sharedDpxe(t)
	caFile, certFile, keyFile := writeBrokerCA(t, dir, "broker.test", "127.0.0.1")
	if out, err := exec.Command(bin, "workers", "add", "w1", "--auth-file", filepath.Join(dir, "nats-auth.json")).CombinedOutput(); err != nil {
		t.Fatalf("workers add: %v\n%s", err, out)
	}
	port := freePort(t)
	listen := fmt.Sprintf("127.0.0.1:%d", port)
	nodeURL := fmt.Sprintf("tls://broker.test:%d", port)
	p := startServe(t, bin, "--db", filepath.Join(dir, "dpxe.db"), "--no-dashboard", "--total-shards", "1",
		"--nats-listen", listen, "--nats-auth", "--nats-tls-cert", certFile, "--nats-tls-key", keyFile, "--nats-node-url", nodeURL)
	if m := natsTLSLogRE.FindStringSubmatch(p.logs()); m == nil || m[1] != "tls://"+listen {
		t.Fatalf("no events line with tls://%s:\n%s", listen, p.logs())
	}

	out, err := exec.Command(bin, "nodes", "--server", p.url, "--token-file", filepath.Join(dir, "admin.token"), "add", "n1").CombinedOutput()
	if err != nil {
		t.Fatalf("dpxe nodes add: %v\n%s", err, out)
	}
	cred := strings.TrimSpace(strings.Split(string(out), "\n")[1])
	r := nodeCheckin(t, p.url, "n1", cred, appliance.CheckinRequest{Capacity: 1})
	if r.NATS == nil || len(r.NATS.URLs) != 1 || r.NATS.URLs[0] != nodeURL || r.NATS.User != "node-n1" {
		t.Fatalf("check-in answer's nats: %+v, want the one URL %s", r.NATS, nodeURL)
	}
	if len(r.Assigned) != 1 {
		t.Fatalf("node n1 assigned %v, want one shard", r.Assigned)
	}

	// broker.test is resolved by the test's dialer; TLS checks the
	// certificate against the URL's name, as a node does.
	toLoopback := &nameDialer{name: "broker.test", addr: listen}
	nc, err := nats.Connect(r.NATS.URLs[0], nats.UserInfo(r.NATS.User, r.NATS.Password), nats.RootCAs(caFile),
		nats.SetCustomDialer(toLoopback), nats.MaxReconnects(0))
	if err != nil {
		t.Fatalf("node n1 over TLS with its answer's credentials: %v", err)
	}
	defer nc.Close()
	if st, err := nc.TLSConnectionState(); err != nil || !st.HandshakeComplete || st.ServerName != "broker.test" {
		t.Fatalf("node connection's TLS state: %+v %v", st, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	subject := fmt.Sprintf("dpxe.bot.events.%d.MESSAGE_CREATE", r.Assigned[0])
	ack, err := js.Publish(ctx, subject, []byte(`{"content":"over tls"}`), jetstream.WithMsgID("s1:1"))
	if err != nil || ack.Stream != "DPXE_EVENTS_bot" || ack.Sequence != 1 {
		t.Fatalf("publish %s over TLS: %+v %v", subject, ack, err)
	}

	// Plaintext: INFO says tls_required, and a CONNECT in clear is cut
	// before any answer.
	raw, err := net.DialTimeout("tcp", listen, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(raw)
	line, err := br.ReadString('\n')
	var info struct {
		TLSRequired bool `json:"tls_required"`
	}
	if err != nil || !strings.HasPrefix(line, "INFO ") || json.Unmarshal([]byte(strings.TrimPrefix(line, "INFO ")), &info) != nil || !info.TLSRequired {
		t.Fatalf("INFO in clear: %q %v, want tls_required", line, err)
	}
	connect, _ := json.Marshal(map[string]any{"user": r.NATS.User, "pass": r.NATS.Password, "verbose": false})
	fmt.Fprintf(raw, "CONNECT %s\r\nPING\r\n", connect)
	if rest, err := br.ReadString('\n'); err == nil && strings.HasPrefix(rest, "PONG") {
		t.Errorf("a plaintext client was answered: %q", rest)
	}

	// Without the CA the certificate is refused.
	if c, err := nats.Connect(r.NATS.URLs[0], nats.UserInfo(r.NATS.User, r.NATS.Password),
		nats.SetCustomDialer(toLoopback), nats.MaxReconnects(0)); err == nil {
		c.Close()
		t.Error("a client without the test CA accepted the broker's certificate")
	}

	// A worker on the listener's address: with --nats-ca it reads the
	// stream (the event above); without, the certificate is refused.
	worker := []string{"events", "stats", "--nats-url", "nats://" + listen, "--nats-user", "worker-w1",
		"--nats-password-file", filepath.Join(dir, "worker-w1.token")}
	out, err = exec.Command(bin, append(worker, "--nats-ca", caFile)...).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "stream DPXE_EVENTS_bot: 1 events") {
		t.Errorf("events stats with --nats-ca: %v\n%s", err, out)
	}
	ctxNoCA, cancelNoCA := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancelNoCA()
	if out, err := exec.CommandContext(ctxNoCA, bin, worker...).CombinedOutput(); err == nil || ctxNoCA.Err() != nil {
		t.Errorf("events stats without --nats-ca: %v (timed out: %v)\n%s", err, ctxNoCA.Err() != nil, out)
	}
	if strings.Contains(p.logs(), r.NATS.Password) {
		t.Error("the node's NATS password is in serve's log")
	}
}

// nameDialer dials addr for name:port and anything else as asked: the
// test's stand-in for a DNS record.
type nameDialer struct{ name, addr string }

func (d *nameDialer) Dial(network, address string) (net.Conn, error) {
	if host, _, err := net.SplitHostPort(address); err == nil && host == d.name {
		address = d.addr
	}
	return net.DialTimeout(network, address, 5*time.Second)
}

// TestServeNATSTLSFlags: --nats-node-url and --nats-tls-cert/-key are
// refused at start, naming the flag (and the URL at fault), when they
// cannot work: a URL the kernel's parser refuses, too many URLs, node URLs
// without --nats-auth, a certificate without its key or with --nats-url,
// and a certificate file that does not load.
func TestServeNATSTLSFlags(t *testing.T) {
	many := strings.TrimSuffix(strings.Repeat("tls://b.test:4222,", appliance.MaxNATSURLs+1), ",")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--nats-auth", "--nats-node-url", "tls://broker.test:4222,http://broker.test:80"}, `nats-node-url: "http://broker.test:80"`},
		{[]string{"--nats-auth", "--nats-node-url", "tls://user:pw@broker.test:4222"}, `nats-node-url: "tls://…@broker.test:4222"`},
		{[]string{"--nats-auth", "--nats-node-url", "nats://127.0.0.1:4222"}, `nats-node-url: "nats://127.0.0.1:4222"`},
		{[]string{"--nats-auth", "--nats-node-url", many}, "nats-node-url: 9 URLs, want at most 8"},
		{[]string{"--nats-node-url", "tls://broker.test:4222"}, "nats-node-url needs --nats-auth"},
		{[]string{"--nats-tls-cert", "c.pem"}, "nats-tls-cert and nats-tls-key go together"},
		{[]string{"--nats-tls-key", "k.pem"}, "nats-tls-cert and nats-tls-key go together"},
		{[]string{"--nats-url", "nats://a:4222", "--nats-tls-cert", "c.pem", "--nats-tls-key", "k.pem"}, "nats-tls-cert is for the embedded server"},
	} {
		_, err := parseServeFlags(c.args)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want a usage error with %q", c.args, err, c.want)
		}
	}
	if cfg, err := parseServeFlags([]string{"--nats-auth", "--nats-node-url", "tls://broker.test:4222,nats://10.0.0.1"}); err != nil ||
		len(cfg.NATSNodeURLs) != 2 || cfg.NATSNodeURLs[1] != "nats://10.0.0.1" {
		t.Errorf("two good URLs: %q %v", cfg.NATSNodeURLs, err)
	}
	// A certificate that does not load stops serve at start, naming the flag.
	dir := t.TempDir()
	bin := sharedDpxe(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "serve", "--db", filepath.Join(dir, "dpxe.db"), "--listen", "127.0.0.1:0", "--no-dashboard",
		"--nats-listen", "127.0.0.1:0", "--nats-tls-cert", filepath.Join(dir, "missing.crt"), "--nats-tls-key", filepath.Join(dir, "missing.key")).CombinedOutput()
	if err == nil || ctx.Err() != nil || !strings.Contains(string(out), "nats-tls-cert: certificate "+filepath.Join(dir, "missing.crt")) {
		t.Errorf("serve with a missing --nats-tls-cert: %v\n%s", err, out)
	}
}
