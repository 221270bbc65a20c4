package netboot

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	packtftp "pack.ag/tftp"

	"github.com/discord-pxe/dpxe/fleet/netboot/inventory"
	"github.com/discord-pxe/dpxe/fleet/store"
	"github.com/discord-pxe/dpxe/internal/freeport"
)

func TestServeTFTPAndHTTP(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "kernel.bin"), []byte("KERNEL"), 0o644)
	st, err := store.Open(context.Background(), filepath.Join(dir, "inv.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	inv := st.Netboot()
	tport, hport := freeport.Port(t), freeport.Port(t)
	cfg := Config{
		ServerIP: netip.MustParseAddr("127.0.0.1"),
		TFTPAddr: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(tport)).String(),
		HTTPAddr: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(hport)).String(),
		BootDir:  dir, IPXEDir: t.TempDir(), Controller: "http://127.0.0.1:9999",
	}
	if os.Geteuid() != 0 {
		t.Log("not root: TFTP runs without its front-end")
	}
	s, err := New(context.Background(), cfg, inv, inv)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()

	base := "http://" + cfg.HTTPAddr
	var body string
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := http.Get(base + "/boot/52-54-00-00-00-01.ipxe")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(b)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("HTTP never came up: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(body, "dpxe nodes approve 52-54-00-00-00-01") || !strings.Contains(body, base+"/boot/52-54-00-00-00-01.ipxe") {
		t.Fatalf("script:\n%s", body)
	}
	c, _ := packtftp.NewClient()
	resp, err := c.Get("tftp://" + cfg.TFTPAddr + "/kernel.bin")
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(resp); string(b) != "KERNEL" {
		t.Fatalf("tftp got %q", b)
	}
	// The discovered node reaches the inventory through the async tracker.
	mac, _ := inventory.ParseMAC("52-54-00-00-00-01")
	for deadline := time.Now().Add(5 * time.Second); ; {
		if n, err := inv.Lookup(context.Background(), mac); err == nil && n.State == inventory.Discovered {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("discovered node never stored")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve after cancel: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not stop")
	}
}

func TestServeReportsListenerFailure(t *testing.T) {
	dir := t.TempDir()
	busy, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	s, err := New(context.Background(), Config{
		ServerIP: netip.MustParseAddr("127.0.0.1"), TFTPAddr: busy.LocalAddr().String(),
		BootDir: dir, IPXEDir: dir,
	}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Serve(ctx); err == nil || !strings.Contains(err.Error(), "TFTP") {
		t.Fatalf("Serve with a busy TFTP port: %v", err)
	}
	if _, err := New(context.Background(), Config{ServerIP: netip.MustParseAddr("127.0.0.1"), BootDir: filepath.Join(dir, "none")}, nil, nil); err == nil {
		t.Fatal("New accepted a missing boot directory")
	}
}
