package gatewayemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/coder/websocket"
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

// loopbackClient is an HTTP client that dials every *.discord.gg name at
// 127.0.0.1 (the port kept) and any other name not at all: a stand-in for
// the test namespace's DNS, so the names in the emulator's URLs are dialled
// as they are written. It records the names it was asked for.
func loopbackClient(t *testing.T, emu *Emulator, asked *[]string) *http.Client {
	t.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = emu.ClientTLSConfig()
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		*asked = append(*asked, host)
		if !strings.HasSuffix(host, ".discord.gg") {
			return nil, fmt.Errorf("no such host %q in the test resolver", host)
		}
		var d net.Dialer
		return d.DialContext(ctx, network, net.JoinHostPort("127.0.0.1", port))
	}
	return &http.Client{Transport: tr, Timeout: testTimeout}
}

// TestHostNameURLs runs a shard against URLs with Discord's host names, in
// plain and TLS mode: /gateway/bot and READY name gateway.discord.gg and a
// resume host without a path; the client dials those names (through a
// resolver that maps them to loopback; with TLS the certificate is checked
// against the name); the resume host answers the first handshake with 503
// and the next one resumes, recognised by its Host header (no
// resume_wrong_url); a handshake whose Host names neither is wrong_host.
func TestHostNameURLs(t *testing.T) {
	t.Parallel()
	for _, useTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", useTLS), func(t *testing.T) {
			t.Parallel()
			o := fastOptions()
			o.TLS = useTLS
			o.PublicHost = "gateway.discord.gg"
			o.ResumeHost = "gateway-us-east1-b.discord.gg"
			o.ResumeUnavailable = 1
			emu := startEmu(t, o)
			ws, web := "ws", "http"
			if useTLS {
				ws, web = "wss", "https"
			}
			_, port, _ := net.SplitHostPort(strings.TrimPrefix(emu.URL(), ws+"://"))
			if emu.URL() != ws+"://gateway.discord.gg:"+port || emu.ResumeURL() != ws+"://gateway-us-east1-b.discord.gg:"+port {
				t.Fatalf("URLs %s and %s", emu.URL(), emu.ResumeURL())
			}
			var asked []string
			hc := loopbackClient(t, emu, &asked)
			req, _ := http.NewRequest("GET", web+"://gateway.discord.gg:"+port+"/api/v10/gateway/bot", nil)
			req.Header.Set("Authorization", "Bot "+emu.Token())
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var gb struct{ URL string }
			json.NewDecoder(resp.Body).Decode(&gb)
			resp.Body.Close()
			if gb.URL != emu.URL() {
				t.Fatalf("/gateway/bot url %q, want %q", gb.URL, emu.URL())
			}
			dialURL := func(u string) (*wsClient, *http.Response, error) {
				ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
				defer cancel()
				conn, resp, err := websocket.Dial(ctx, u+"/?v=10&encoding=json", &websocket.DialOptions{HTTPClient: hc})
				if err != nil {
					return nil, resp, err
				}
				t.Cleanup(func() { conn.CloseNow() })
				conn.SetReadLimit(1 << 20)
				return &wsClient{t: t, emu: emu, ws: conn}, resp, nil
			}
			c, _, err := dialURL(gb.URL)
			if err != nil {
				t.Fatal(err)
			}
			c.expectOp(OpHello)
			r := c.identify(emu, 0, 1)
			if r.ResumeGatewayURL != emu.ResumeURL() {
				t.Fatalf("READY resume_gateway_url %q, want %q", r.ResumeGatewayURL, emu.ResumeURL())
			}
			c.ws.Close(4000, "going to resume")
			awaitState(t, emu, "detached", func(s State) bool {
				return len(s.Shards) == 1 && s.Shards[0].Sessions[0].State == SessionDetached
			})
			if _, resp, err := dialURL(r.ResumeGatewayURL); err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
				t.Fatalf("first resume handshake: %v %v, want 503", resp, err)
			}
			c2, _, err := dialURL(r.ResumeGatewayURL)
			if err != nil {
				t.Fatal(err)
			}
			c2.expectOp(OpHello)
			c2.send(OpResume, map[string]any{"token": emu.Token(), "session_id": r.SessionID, "seq": c.lastS})
			c2.expectDispatch("RESUMED")
			noViolations(t, emu)
			// (HTTP keep-alive may carry several requests on one dial.)
			names := map[string]bool{}
			for _, n := range asked {
				names[n] = true
			}
			if len(names) != 2 || !names["gateway.discord.gg"] || !names["gateway-us-east1-b.discord.gg"] {
				t.Fatalf("names dialled %q, want the gateway's and the resume host's", asked)
			}

			// The loopback address in Host is not the gateway's name.
			if !useTLS {
				addr := "127.0.0.1:" + port
				raw, _ := rawDial(t, nil, addr, addr, "/?v=10&encoding=json")
				raw.expect()
				if k := violationKinds(emu); len(k) != 1 || k[0] != KindWrongHost {
					t.Fatalf("violations %v, want wrong_host", k)
				}
			}
		})
	}
}

// TestResumeHostOptions checks the validation of the host options.
func TestResumeHostOptions(t *testing.T) {
	t.Parallel()
	for _, o := range []Options{
		{PublicHost: "gateway.discord.gg", ResumeHost: "GATEWAY.discord.gg:443"},
		{ResumeUnavailable: -1},
	} {
		if _, err := New(o); !errors.Is(err, ErrBadOptions) {
			t.Errorf("New(%+v): %v", o, err)
		}
	}
}
