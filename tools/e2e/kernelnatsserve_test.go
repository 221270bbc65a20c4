package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/discord-pxe/dpxe/fleet/events"
	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/kernel"
	"github.com/discord-pxe/dpxe/tools/gatewayemu"
)

// natsServeMutationEnv names a deliberate mutation of
// TestKernelNATSServeTLS, to see it fail: "other-ca" gives dpxe serve's
// broker a certificate for broker.test from a CA the image does not trust.
const natsServeMutationEnv = "DPXE_NATSTLS_MUTATION"

// TestKernelNATSServeTLS: a QEMU node publishes to the broker embedded in
// `dpxe serve` itself, over TLS, end to end with nothing in between:
// serve runs with --nats-auth, --nats-tls-cert/--nats-tls-key (a leaf for
// broker.test from a test CA whose root is the image's only trust anchor)
// and --nats-node-url tls://broker.test:4222, so the node's check-in
// answer names the broker by a host name it resolves through a DNS server
// in the namespace (its address and DNS server come by DHCP). The node
// speaks TLS 1.3 to the broker (the chain and the name checked), CONNECTs
// with the credentials of its answer and publishes both sessions of its 2
// shards: dispatches 1..100 of each are in the stream exactly once, equal
// to the emulator's record. Neither the node's nor a worker's password is
// on the node's console. One boot. With DPXE_NATSTLS_MUTATION=other-ca it
// fails: the node refuses the certificate (unknown_ca, said on the
// console) and the stream holds nothing.
func TestKernelNATSServeTLS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const (
		subnet = "10.164.0"
		app    = "bot"
		node   = "ns-node"
		want   = 100
	)
	start := time.Now()
	ca := newPeerCA(t, "dpxe serve nats test root", false)
	dir := t.TempDir()
	if _, err := image.Build(ctx, image.Options{Sources: kernel.Sources, OutDir: dir,
		Trust: []image.TrustSource{{Name: "nats-test-root", PEM: ca.rootPEM}}}); err != nil {
		t.Fatal(err)
	}
	t.Logf("image with the test anchor: %v", time.Since(start).Round(time.Millisecond))
	issuer := ca
	mutation := os.Getenv(natsServeMutationEnv)
	switch mutation {
	case "":
	case "other-ca":
		issuer = newPeerCA(t, "dpxe serve nats other root", false)
		t.Logf("deliberate mutation %s=%s: the broker's certificate is from a CA the image does not trust", natsServeMutationEnv, mutation)
	default:
		t.Fatalf("%s=%q: want other-ca or nothing", natsServeMutationEnv, mutation)
	}
	certFile, keyFile := writePEM(t, t.TempDir(), "broker", issuer.leaf(t, "broker.test", time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)))

	l := newGWLab(t, ctx, subnet, gatewayemu.Options{HeartbeatInterval: 2 * time.Second, Shards: 2, MaxConcurrency: 2,
		MessagesPerSecond: 20, ReplayLimit: 100000}, "--total-shards", "2", "--lease", "30s",
		"--nats-auth", "--nats-listen", subnet+".1:4222",
		"--nats-tls-cert", certFile, "--nats-tls-key", keyFile, "--nats-node-url", "tls://broker.test:4222")
	l.kernel = filepath.Join(dir, image.KernelFile)
	dns := startLabDNS(t, l.ns.Name, subnet+".1", 30, map[string][4]byte{"broker.test": {10, 164, 0, 1}})
	startDHCPOnly(t, ctx, l)

	// The worker trusts the broker's issuer (under the mutation too, so
	// it sees what the stream holds) and checks the name broker.test, as
	// the node does; it reaches the broker by the bridge's address.
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(issuer.rootPEM)
	secure := nats.Secure(&tls.Config{RootCAs: roots, ServerName: "broker.test", MinVersion: tls.VersionTLS12})
	nc, f, workerPass := l.connectWorkerTo("tls://"+subnet+".1:4222", nats.NoReconnect(), secure)
	if st, err := nc.TLSConnectionState(); err != nil || !st.HandshakeComplete {
		t.Fatalf("the worker's connection is not TLS: %+v %v", st, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}

	booted := time.Now()
	n := l.boot(node, "virtio-net-pci", 2)
	// The connection, or the refusal that ends the test at once (a
	// refused broker is tried again and again).
	connected := `nats: connected to tls://broker\.test:4222 \(10\.164\.0\.1\) as node-` + node
	refused := `nats: tls://broker\.test:4222: TLS refused: \S+`
	m := n.serial.waitFor(regexp.MustCompile(connected+`|`+refused), 120*time.Second)
	if m == nil || !regexp.MustCompile(connected).MatchString(m[0]) {
		stored := "unknown"
		if name, err := events.StreamName(app); err == nil {
			if s, err := js.Stream(ctx, name); err == nil {
				if info, err := s.Info(ctx); err == nil {
					stored = strconv.FormatUint(info.State.Msgs, 10)
				}
			}
		}
		seen := lastLine(n.serial.String(), "nats: ")
		if m != nil {
			seen = m[0]
		}
		t.Fatalf("the node did not connect to dpxe serve's broker over TLS (console: %q; messages in the stream: %s)", seen, stored)
	}
	t.Logf("connected to serve's broker over TLS %v after the boot", time.Since(booted).Round(time.Millisecond))
	for _, re := range []string{
		`dns: broker\.test -> 10\.164\.0\.1 ttl 30s in \d+ ms`,
		`nats: tls://broker\.test:4222: TLS 1\.3 chain=2 name=broker\.test in \d+ ms`,
	} {
		if n.serial.waitFor(regexp.MustCompile(re), 5*time.Second) == nil {
			t.Errorf("no console line %q", re)
		}
	}
	if c, _ := dns.lookups("broker.test"); c < 1 {
		t.Error("broker.test was never asked for")
	}
	l.allSessionsAt(want, 90*time.Second)
	checkStreamHolds(t, ctx, l, js, app, want)
	if v := l.emu.Violations(); len(v) != 0 {
		t.Errorf("emulator violations: %s", violationReport(v))
	}
	con := n.serial.String()
	if strings.Contains(con, "TLS refused") {
		t.Errorf("a TLS refusal on the console: %s", lastLine(con, "TLS refused"))
	}
	if strings.Contains(con, f.NodePassword(node)) || strings.Contains(con, workerPass) {
		t.Error("a NATS password is on the node's console")
	}
	t.Logf("nats lines:\n%s", grepLines(con, "nats: tls://"))
	t.Logf("test time %v", time.Since(start).Round(time.Second))
}
