package embedded

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
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
