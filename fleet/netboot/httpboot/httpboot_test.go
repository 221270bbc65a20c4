package httpboot

import (
	"context"
	"crypto/rand"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/u-root/u-root/pkg/boot/netboot/ipxe"
	"github.com/u-root/u-root/pkg/curl"
	"github.com/u-root/u-root/pkg/ulog"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/netboot/bootfiles"
	"github.com/discord-pxe/dpxe/fleet/netboot/inventory"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// rec is a Recorder with the tracker's rules in miniature: owners are the
// bound addresses, tickets the scripts a MAC may fetch once (an invalid
// address: from anywhere).
type rec struct {
	mu      sync.Mutex
	events  []inventory.Event
	inv     *store.NetbootInventory
	owners  map[netip.Addr]net.HardwareAddr
	verify  bool
	off     bool
	tickets map[string]netip.Addr
}

func (r *rec) VerifiesAddresses() bool { return r.verify }
func (r *rec) ClaimScript(mac net.HardwareAddr, ip netip.Addr) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.off {
		return ErrEnrollOff
	}
	if o, ok := r.owners[ip]; r.verify && (!ok || o.String() != mac.String()) {
		return ErrNotLeased
	}
	t, ok := r.tickets[mac.String()]
	if !ok || t.IsValid() && t != ip {
		return ErrNoTicket
	}
	delete(r.tickets, mac.String())
	return nil
}
func (r *rec) ticket(mac net.HardwareAddr) {
	r.mu.Lock()
	r.tickets[mac.String()] = netip.Addr{}
	r.mu.Unlock()
}

func (r *rec) Sighting(s inventory.Sighting) { r.inv.Seen(context.Background(), s) }
func (r *rec) Event(e inventory.Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}
func (r *rec) MACForIP(ip netip.Addr) (net.HardwareAddr, bool) {
	m, ok := r.owners[ip]
	return m, ok
}
func (r *rec) stages() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var s []string
	for _, e := range r.events {
		s = append(s, string(e.Stage))
	}
	return s
}

func setup(t *testing.T) (*httptest.Server, *store.NetbootInventory, *rec, []byte) {
	t.Helper()
	return setupConfig(t, nil)
}

// setupConfig is setup with the handler's Config changed by edit.
func setupConfig(t *testing.T, edit func(*Config)) (*httptest.Server, *store.NetbootInventory, *rec, []byte) {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(context.Background(), filepath.Join(dir, "inv.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	inv := st.Netboot()
	root := filepath.Join(dir, "out")
	os.Mkdir(root, 0o755)
	kernel := make([]byte, 200_000)
	rand.Read(kernel)
	os.WriteFile(filepath.Join(root, "kernel.bin"), kernel, 0o644)
	os.WriteFile(filepath.Join(dir, "secret"), []byte("secret"), 0o644)
	os.Symlink("../secret", filepath.Join(root, "escape"))
	roots, err := bootfiles.OpenRoots(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { roots.Close() })
	r := &rec{inv: inv, owners: map[netip.Addr]net.HardwareAddr{}, tickets: map[string]netip.Addr{}}
	mux := http.NewServeMux()
	srv := httptest.NewUnstartedServer(mux)
	srv.Start()
	t.Cleanup(srv.Close)
	cfg := Config{BaseURL: srv.URL, Controller: "http://10.0.0.1:8080", Roots: roots, Retry: 5 * time.Second}
	if edit != nil {
		edit(&cfg)
	}
	h, err := New(cfg, inv, r, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.Register(mux)
	return srv, inv, r, kernel
}

func get(t *testing.T, u string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// TestScriptCarriesPin: with an https:// controller and its pin, the
// approved machine's kernel line carries controller_pin=, and the kernel's
// parser (appliance) reads it back.
func TestScriptCarriesPin(t *testing.T) {
	pin := strings.Repeat("5a", 32)
	srv, inv, r, _ := setupConfig(t, func(c *Config) { c.Controller, c.ControllerPin = "https://10.0.0.1:8443", pin })
	mac, _ := inventory.ParseMAC("52:54:00:12:34:57")
	const cred = "c0ffee-c0ffee-c0ffee"
	if err := inv.Approve(context.Background(), mac, "edge-02", cred, time.Now()); err != nil {
		t.Fatal(err)
	}
	r.owners[netip.MustParseAddr("127.0.0.1")] = mac
	r.ticket(mac)
	resp, body := get(t, srv.URL+"/boot/52-54-00-12-34-57.ipxe")
	if resp.StatusCode != 200 {
		t.Fatalf("boot script: %d\n%s", resp.StatusCode, body)
	}
	line := strings.SplitAfter(body, "\nkernel ")[1]
	line = line[:strings.IndexByte(line, '\n')]
	bc, err := appliance.ParseBootConfig([]byte(line))
	if err != nil || bc.ControllerPin != pin || bc.Controller != "https://10.0.0.1:8443" {
		t.Fatalf("kernel line %q reads as %+v, %v", line, bc, err)
	}
}

func TestDiscoveredThenApproved(t *testing.T) {
	srv, inv, r, kernel := setup(t)
	ctx := context.Background()
	mac, _ := inventory.ParseMAC("52:54:00:12:34:56")
	scriptURL := srv.URL + "/boot/52-54-00-12-34-56.ipxe"

	// Unknown MAC: a discovered node and a script that says how to approve it.
	resp, body := get(t, scriptURL)
	if resp.StatusCode != 200 || !strings.HasPrefix(body, "#!ipxe\n") ||
		!strings.Contains(body, "dpxe nodes approve 52-54-00-12-34-56 --id NAME") ||
		!strings.Contains(body, "sleep 5") || !strings.Contains(body, "chain --replace "+scriptURL) ||
		!strings.Contains(body, "\ndhcp || goto retry\n") ||
		!strings.Contains(body, "set user-class dpxe") || strings.Contains(body, "kernel ") {
		t.Fatalf("wait script (%d):\n%s", resp.StatusCode, body)
	}
	if n, err := inv.Lookup(ctx, mac); err != nil || n.State != inventory.Discovered {
		t.Fatalf("after first script fetch: %+v %v", n, err)
	}

	// Approved: the script boots the kernel with the node's command line.
	const cred = "c0ffee-c0ffee-c0ffee"
	if err := inv.Approve(ctx, mac, "edge-01", cred, time.Now()); err != nil {
		t.Fatal(err)
	}
	// Each fetch of an approved script uses a ticket (a DHCP exchange);
	// the kernel's timeline step needs the address bound to the MAC.
	r.owners[netip.MustParseAddr("127.0.0.1")] = mac
	r.ticket(mac)
	resp, body = get(t, scriptURL)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Length") == "" {
		t.Fatalf("boot script: %d %v", resp.StatusCode, resp.Header)
	}
	u, _ := url.Parse(scriptURL)
	r.ticket(mac)
	img, err := ipxe.ParseConfig(ctx, ulog.Null, u, curl.DefaultSchemes)
	if err != nil {
		t.Fatalf("u-root rejects the script: %v\n%s", err, body)
	}
	want := "node=edge-01 controller=http://10.0.0.1:8080 cred=" + cred
	if img.Cmdline != want {
		t.Fatalf("cmdline %q, want %q\n%s", img.Cmdline, want, body)
	}
	bc, err := appliance.ParseBootConfig([]byte("kernel.bin " + img.Cmdline))
	if err != nil || bc.NodeID != "edge-01" || bc.Credential != cred {
		t.Fatalf("kernel would read %+v, %v", bc, err)
	}
	got, err := io.ReadAll(io.NewSectionReader(img.Kernel, 0, int64(len(kernel))+1))
	if err != nil && err != io.EOF || string(got) != string(kernel) {
		t.Fatalf("kernel via the script: %d bytes, %v", len(got), err)
	}
	// Fetches: ours (wait script), ours and the parser's (boot script); the
	// parser's kernel fetch went through /boot/node/<mac>/kernel.bin, so
	// the timeline names the node. No '=' may precede the command line:
	// iPXE passes the URL as the first token.
	if strings.Contains(strings.Fields(strings.SplitAfter(body, "\nkernel ")[1])[0], "=") {
		t.Fatalf("kernel URL contains '=':\n%s", body)
	}
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) && !strings.Contains(strings.Join(r.stages(), ","), "kernel_fetched") {
		time.Sleep(10 * time.Millisecond)
	}
	if s := strings.Join(r.stages(), ","); s != "script_fetched,script_fetched,script_fetched,kernel_fetched" {
		t.Fatalf("stages %s", s)
	}
	if r.events[3].MAC.String() != mac.String() {
		t.Fatalf("kernel event for %s", r.events[3].MAC)
	}

	// Retired: no kernel.
	inv.Retire(ctx, mac)
	if _, body = get(t, scriptURL); strings.Contains(body, "kernel ") || !strings.Contains(body, "exit 1") {
		t.Fatalf("retired script:\n%s", body)
	}
}

func TestFilesAndRefusals(t *testing.T) {
	srv, _, r, kernel := setup(t)
	resp, body := get(t, srv.URL+"/boot/kernel.bin")
	if resp.StatusCode != 200 || resp.ContentLength != int64(len(kernel)) || body != string(kernel) {
		t.Fatalf("kernel: %d length %d", resp.StatusCode, resp.ContentLength)
	}
	for path, code := range map[string]int{
		"/boot/escape":                        403,
		"/boot/..%2fsecret":                   403,
		"/boot/nothere":                       404,
		"/boot/not-a-mac.ipxe":                400,
		"/boot/52-54-00-12-34-56-78.ipxe":     400,
		"/boot/..%2F..%2Fetc%2Fpasswd":        403,
		"/boot/%2Fetc%2Fpasswd":               403,
		"/boot/52-54-00-12-34-56.ipxe/extra":  404,
		"/boot/node/zz/kernel.bin":            400,
		"/boot/node/52-54-00-12-34-56/escape": 403,
	} {
		if resp, _ := get(t, srv.URL+path); resp.StatusCode != code {
			t.Errorf("GET %s = %d, want %d", path, resp.StatusCode, code)
		}
	}
	// Another MAC's script from an address DHCP gave to someone else.
	other, _ := inventory.ParseMAC("52-54-00-00-00-99")
	r.owners[netip.MustParseAddr("127.0.0.1")] = other
	r.verify = true
	if resp, _ := get(t, srv.URL+"/boot/52-54-00-12-34-56.ipxe"); resp.StatusCode != 403 {
		t.Fatalf("script served to another node's address: %d", resp.StatusCode)
	}
}
