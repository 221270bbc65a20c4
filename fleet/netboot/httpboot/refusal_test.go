package httpboot

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/netboot/bootfiles"
	"github.com/discord-pxe/dpxe/fleet/netboot/inventory"
	"github.com/discord-pxe/dpxe/fleet/security"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// liveInv is the SQL inventory whose Enroll refuses nodes named in live,
// as the fleet's does for a node whose lease runs.
type liveInv struct {
	*store.NetbootInventory
	live map[string]bool
}

func (l *liveInv) Enroll(ctx context.Context, n inventory.Node, to netip.Addr) (string, error) {
	if l.live[n.ID] {
		return "", &inventory.LiveError{NodeID: n.ID, RetryAfter: 27 * time.Second}
	}
	return l.NetbootInventory.Enroll(ctx, n, to)
}

// TestScriptRefusals performs each refusal of issue 24 at the handler:
// a foreign Host (DNS rebinding), an approved script to an address not
// leased to its MAC, without a fresh DHCP exchange, with network
// enrollment off, for a live node, a discovered script to another
// machine's address, and a kernel download naming another MAC. None
// carries a credential, the refusals are counted, and none writes a step
// onto the victim's timeline.
func TestScriptRefusals(t *testing.T) {
	srv, inv, r, _ := setup(t)
	ctx := context.Background()
	victim, _ := inventory.ParseMAC("52-54-00-aa-bb-01")
	attacker, _ := inventory.ParseMAC("52-54-00-00-00-66")
	const cred = "victim-credential-0123456789"
	if err := inv.Approve(ctx, victim, "victim", cred, time.Now()); err != nil {
		t.Fatal(err)
	}
	li := &liveInv{NetbootInventory: inv, live: map[string]bool{}}
	refusals := security.New(nil)
	h, err := New(Config{BaseURL: srv.URL, Controller: "http://10.0.0.1:8080", Roots: mustRoots(t), Retry: 5 * time.Second,
		Refusals: refusals, EnrollOff: "enrollment is off for this test"}, li, r, nil)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	h.Register(mux)
	script := "/boot/52-54-00-aa-bb-01.ipxe"
	lo := netip.MustParseAddr("127.0.0.1")
	do := func(path, host string) (int, string) {
		t.Helper()
		req := httptest.NewRequest("GET", "http://"+host+path, nil)
		req.RemoteAddr = "127.0.0.1:5555"
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		return w.Code, w.Body.String()
	}
	base := strings.TrimPrefix(srv.URL, "http://")
	r.verify = true
	r.owners[lo] = attacker // the attacker's own lease
	r.tickets[victim.String()] = netip.MustParseAddr("10.0.0.5")

	type want struct {
		code   int
		has    string
		reason security.Reason
	}
	for _, c := range []struct {
		name  string
		setup func()
		host  string
		want  want
	}{
		{"foreign Host (DNS rebinding)", func() {}, "rebind.evil.example:8080", want{421, "serves boot files only as", security.BootHost}},
		{"from another machine's address", func() {}, base, want{403, "not leased", security.BootAddress}},
		{"no fresh DHCP exchange", func() { r.owners[lo] = victim; delete(r.tickets, victim.String()) }, base,
			want{200, "running DHCP again", security.BootTicket}},
		{"network enrollment off", func() { r.off = true }, base, want{200, "enrollment is off for this test", security.BootEnrollOff}},
		{"node is live", func() { r.off = false; r.ticket(victim); li.live["victim"] = true }, base,
			want{200, "sleep 28\n", security.EnrollLive}},
	} {
		c.setup()
		code, body := do(script, c.host)
		if code != c.want.code || !strings.Contains(body, c.want.has) || strings.Contains(body, "cred=") {
			t.Errorf("%s: %d\n%s", c.name, code, body)
		}
		if refusals.Count(c.want.reason) != 1 {
			t.Errorf("%s: %s counted %d times, want 1", c.name, c.want.reason, refusals.Count(c.want.reason))
		}
	}
	// The live node keeps its credential; once it is not live, a fresh
	// DHCP exchange enrolls the machine.
	li.live["victim"] = false
	if _, body := do(script, base); strings.Contains(body, "cred=") {
		t.Fatalf("a script without a ticket carried a credential:\n%s", body)
	}
	r.ticket(victim)
	if code, body := do(script, base); code != 200 || !strings.Contains(body, "cred="+cred) {
		t.Fatalf("genuine boot: %d\n%s", code, body)
	}

	// Discovered MAC, authoritative mode: only to its own address.
	stranger, _ := inventory.ParseMAC("52-54-00-00-00-77")
	if code, _ := do("/boot/52-54-00-00-00-77.ipxe", base); code != 403 {
		t.Fatalf("discovered script to another machine's address: %d", code)
	}
	if _, err := inv.Lookup(ctx, stranger); !errors.Is(err, inventory.ErrUnknownMAC) {
		t.Fatalf("a refused fetch recorded the MAC: %v", err)
	}

	// The kernel named for the victim, fetched by the attacker's address:
	// served (it is no secret), not put on the victim's timeline.
	r.owners[lo] = attacker
	before := len(r.stages())
	if code, _ := do("/boot/node/52-54-00-aa-bb-01/kernel.bin", base); code != 200 {
		t.Fatalf("kernel: %d", code)
	}
	for _, e := range r.events[before:] {
		if e.MAC.String() == victim.String() {
			t.Fatalf("the attacker wrote %s onto the victim's timeline", e.Stage)
		}
	}
	// And the foreign Host never reaches a file either.
	if code, _ := do("/boot/kernel.bin", "127.0.0.1"); code != 421 {
		t.Fatalf("file with a foreign Host: %d", code)
	}
}

func mustRoots(t *testing.T) *bootfiles.Roots {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "kernel.bin"), []byte("KERNEL"), 0o644); err != nil {
		t.Fatal(err)
	}
	roots, err := bootfiles.OpenRoots(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { roots.Close() })
	return roots
}
