package gatewayemu

import (
	"net"
	"strings"
	"testing"
)

// TestPublicHost checks the host:port the gateway URLs carry: the
// listener's address by default, PublicHost verbatim when it has a port,
// and PublicHost with the listener's port when it has none (a guest behind
// QEMU's user-mode network reaches a port-0 listener as 10.0.2.2:PORT).
func TestPublicHost(t *testing.T) {
	for _, tc := range []struct {
		public string
		want   func(port string) string
	}{
		{"", func(p string) string { return "127.0.0.1:" + p }},
		{"10.0.2.2:7000", func(string) string { return "10.0.2.2:7000" }},
		{"10.0.2.2", func(p string) string { return "10.0.2.2:" + p }},
		{"gw.example", func(p string) string { return "gw.example:" + p }},
		{"::1", func(p string) string { return "[::1]:" + p }},
	} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		o := fastOptions()
		o.PublicHost = tc.public
		emu, err := New(o)
		if err != nil {
			t.Fatal(err)
		}
		emu.mu.Lock()
		emu.setHostLocked(ln) // what Start and Serve do first
		emu.mu.Unlock()
		ln.Close()
		emu.Close()
		want := tc.want(port)
		if got := emu.URL(); got != "ws://"+want {
			t.Errorf("PublicHost %q: URL %q, want ws://%s", tc.public, got, want)
		}
		if got := emu.ResumeURL(); !strings.HasPrefix(got, "ws://"+want+"/") {
			t.Errorf("PublicHost %q: resume URL %q, want ws://%s/...", tc.public, got, want)
		}
		if got := emu.APIBase(10); got != "http://"+want+"/api/v10/" {
			t.Errorf("PublicHost %q: API base %q", tc.public, got)
		}
	}
}
