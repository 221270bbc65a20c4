package embedded

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/discord-pxe/dpxe/fleet/ctlcert"
)

func TestStartListensAndConnects(t *testing.T) {
	s, err := Start(ServerConfig{Listen: "127.0.0.1:0", StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	addr, ok := s.Addr().(*net.TCPAddr)
	if !ok || addr.Port == 0 || addr.Port == 4222 || !addr.IP.IsLoopback() {
		t.Fatalf("listener %v: want a loopback port picked for port 0", s.Addr())
	}
	nc, err := nats.Connect(s.ClientURL(), nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if got := nc.MaxPayload(); got != 8<<20 {
		t.Errorf("max_payload %d, want 8 MiB", got)
	}
	// JetStream answers over TCP.
	if _, err := nc.Request("$JS.API.INFO", nil, 5*time.Second); err != nil {
		t.Errorf("JetStream API over TCP: %v", err)
	}
}

func TestStartInProcessOnly(t *testing.T) {
	s, err := Start(ServerConfig{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	if s.ClientURL() != "" || s.Addr() != nil {
		t.Errorf("no listener asked for, got %q %v", s.ClientURL(), s.Addr())
	}
	nc, err := s.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.Request("$JS.API.INFO", nil, 5*time.Second); err != nil {
		t.Errorf("JetStream API in process: %v", err)
	}
}

func TestStartRefusals(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []ServerConfig{
		{Listen: "127.0.0.1:0"},
		{Listen: "127.0.0.1", StoreDir: dir},
		{Listen: ":4222", StoreDir: dir},
		{Listen: "127.0.0.1:99999", StoreDir: dir},
		{StoreDir: dir, MaxPayload: 100},
		{StoreDir: dir, MaxPayload: 65 << 20},
		{StoreDir: dir, TLS: &tls.Config{Certificates: make([]tls.Certificate, 1)}}, // TLS without a listener
		{Listen: "127.0.0.1:0", StoreDir: dir, TLS: &tls.Config{}},                  // TLS without a certificate
	} {
		if s, err := Start(c); !errors.Is(err, ErrServerConfig) {
			if s != nil {
				s.Shutdown()
			}
			t.Errorf("%+v: %v, want ErrServerConfig", c, err)
		}
	}
	// A port in use is an error, not a silent fallback.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if s, err := Start(ServerConfig{Listen: ln.Addr().String(), StoreDir: dir}); err == nil {
		s.Shutdown()
		t.Error("started on a port in use")
	}
}

// TestStartRelay: a client connected to a relay address talks to the same
// server as one on the listener (a message crosses from one to the other,
// JetStream answers through the relay); Shutdown closes the relay's
// listener and cuts its connections; a relay without a listener, or on a
// port in use, is refused.
func TestStartRelay(t *testing.T) {
	s, err := Start(ServerConfig{Listen: "127.0.0.1:0", Relay: []string{"127.0.0.1:0"}, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	ra := s.RelayAddrs()
	if len(ra) != 1 || ra[0].String() == s.Addr().String() {
		t.Fatalf("relay addresses %v beside listener %v", ra, s.Addr())
	}
	direct, err := nats.Connect(s.ClientURL(), nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	cut := make(chan struct{})
	relayed, err := nats.Connect("nats://"+ra[0].String(), nats.Timeout(5*time.Second), nats.NoReconnect(),
		nats.ClosedHandler(func(*nats.Conn) { close(cut) }))
	if err != nil {
		t.Fatalf("through the relay: %v", err)
	}
	defer relayed.Close()
	sub, err := direct.SubscribeSync("relay.test")
	if err != nil {
		t.Fatal(err)
	}
	direct.Flush()
	if err := relayed.Publish("relay.test", []byte("across")); err != nil {
		t.Fatal(err)
	}
	if m, err := sub.NextMsg(5 * time.Second); err != nil || string(m.Data) != "across" {
		t.Fatalf("message published through the relay: %v %v", m, err)
	}
	if _, err := relayed.Request("$JS.API.INFO", nil, 5*time.Second); err != nil {
		t.Errorf("JetStream API through the relay: %v", err)
	}
	if _, err := Start(ServerConfig{Listen: "127.0.0.1:0", Relay: []string{ra[0].String()}, StoreDir: t.TempDir()}); err == nil {
		t.Error("a relay on a port in use was accepted")
	}
	if _, err := Start(ServerConfig{Relay: []string{"127.0.0.1:0"}, StoreDir: t.TempDir()}); !errors.Is(err, ErrServerConfig) {
		t.Errorf("a relay without a listener: %v, want ErrServerConfig", err)
	}
	s.Shutdown()
	select {
	case <-cut:
	case <-time.After(5 * time.Second):
		t.Error("the relayed connection outlived Shutdown")
	}
	if c, err := net.DialTimeout("tcp", ra[0].String(), time.Second); err == nil {
		c.Close()
		t.Error("the relay still accepts after Shutdown")
	}
}

// TestStartTLS: with ServerConfig.TLS every TCP client speaks TLS, on the
// listener and through a relay (joined byte for byte, the certificate
// checked against the relay's address); INFO in clear says tls_required,
// and a CONNECT in clear is cut unanswered; in-process connections need
// no TLS.
func TestStartTLS(t *testing.T) {
	id, err := ctlcert.LoadOrCreate(t.TempDir(), []string{"127.0.0.1"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	s, err := Start(ServerConfig{Listen: "127.0.0.1:0", Relay: []string{"127.0.0.1:0"}, StoreDir: t.TempDir(),
		TLS: &tls.Config{Certificates: []tls.Certificate{id.Cert}, MinVersion: tls.VersionTLS12}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	if !strings.HasPrefix(s.ClientURL(), "tls://") {
		t.Errorf("ClientURL %q, want tls://", s.ClientURL())
	}
	roots := x509.NewCertPool()
	roots.AddCert(id.Leaf)
	for _, addr := range []string{s.Addr().String(), s.RelayAddrs()[0].String()} {
		nc, err := nats.Connect("nats://"+addr, nats.Secure(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}),
			nats.Timeout(5*time.Second), nats.MaxReconnects(0))
		if err != nil {
			t.Fatalf("TLS client on %s: %v", addr, err)
		}
		if _, err := nc.Request("$JS.API.INFO", nil, 5*time.Second); err != nil {
			t.Errorf("JetStream over TLS on %s: %v", addr, err)
		}
		nc.Close()

		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(c)
		if info, err := br.ReadString('\n'); err != nil || !strings.Contains(info, `"tls_required":true`) {
			t.Errorf("INFO on %s: %q %v, want tls_required", addr, info, err)
		}
		c.Write([]byte("CONNECT {\"verbose\":false}\r\nPING\r\n"))
		if rest, err := br.ReadString('\n'); err == nil && strings.HasPrefix(rest, "PONG") {
			t.Errorf("a plaintext client on %s was answered", addr)
		}
		c.Close()
	}
	nc, err := s.Connect()
	if err != nil {
		t.Fatalf("in process under TLS: %v", err)
	}
	defer nc.Close()
	if _, err := nc.Request("$JS.API.INFO", nil, 5*time.Second); err != nil {
		t.Errorf("JetStream in process: %v", err)
	}
}
