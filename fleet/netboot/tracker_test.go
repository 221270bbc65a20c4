package netboot

import (
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/netboot/httpboot"
	"github.com/discord-pxe/dpxe/fleet/netboot/inventory"
)

func testTracker(tr trust) (*tracker, *time.Time) {
	t := newTracker(nil, slog.New(slog.DiscardHandler), tr, time.Minute)
	now := time.Unix(1_700_000_000, 0)
	t.now = func() time.Time { return now }
	return t, &now
}

// TestTrackerTickets: in authoritative mode an approved MAC's script goes
// only to the address just leased to it, once, within the window; a
// sighting (what a client says) never binds an address; in proxy mode
// with the opt-in, the first fetch after a proxy answer wins and binds;
// without it nothing enrolls.
func TestTrackerTickets(t *testing.T) {
	victim := net.HardwareAddr{0x52, 0x54, 0, 0xaa, 0xbb, 1}
	attacker := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0x66}
	vip, aip := netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("10.0.0.66")

	tk, now := testTracker(trustLeases)
	tk.Sighting(inventory.Sighting{MAC: attacker, IP: vip}) // claims bind nothing
	if _, ok := tk.MACForIP(vip); ok {
		t.Fatal("a sighting bound an address")
	}
	if err := tk.ClaimScript(victim, vip); !errors.Is(err, httpboot.ErrNotLeased) {
		t.Fatalf("claim before any lease: %v", err)
	}
	tk.Leased(victim, vip, now.Add(time.Hour), true)
	tk.Leased(attacker, aip, now.Add(time.Hour), false)
	if err := tk.ClaimScript(victim, aip); !errors.Is(err, httpboot.ErrNotLeased) {
		t.Fatalf("claim from the attacker's address: %v", err)
	}
	if err := tk.ClaimScript(attacker, aip); !errors.Is(err, httpboot.ErrNoTicket) {
		t.Fatalf("an unapproved MAC's lease gave a ticket: %v", err)
	}
	*now = now.Add(59 * time.Second)
	if err := tk.ClaimScript(victim, vip); err != nil {
		t.Fatalf("genuine claim within the window: %v", err)
	}
	if err := tk.ClaimScript(victim, vip); !errors.Is(err, httpboot.ErrNoTicket) {
		t.Fatalf("second claim of one ticket: %v", err)
	}
	tk.Leased(victim, vip, now.Add(time.Hour), true)
	*now = now.Add(61 * time.Second)
	if err := tk.ClaimScript(victim, vip); !errors.Is(err, httpboot.ErrNoTicket) {
		t.Fatalf("claim after the window: %v", err)
	}
	if m, ok := tk.MACForIP(vip); !ok || m.String() != victim.String() {
		t.Fatalf("lease binding: %v %v", m, ok)
	}
	*now = now.Add(2 * time.Hour)
	if _, ok := tk.MACForIP(vip); ok {
		t.Fatal("an expired lease still binds")
	}

	// Proxy, opted in: first fetch after a proxy answer wins and binds.
	tk, now = testTracker(trustEnroll)
	tk.BootAnswered(victim, false)
	if err := tk.ClaimScript(victim, vip); !errors.Is(err, httpboot.ErrNoTicket) {
		t.Fatalf("unapproved MAC's proxy answer gave a ticket: %v", err)
	}
	tk.BootAnswered(victim, true)
	if err := tk.ClaimScript(victim, vip); err != nil {
		t.Fatal(err)
	}
	if m, ok := tk.MACForIP(vip); !ok || m.String() != victim.String() {
		t.Fatal("the claimed address is not bound in proxy mode")
	}
	if err := tk.ClaimScript(victim, aip); !errors.Is(err, httpboot.ErrNoTicket) {
		t.Fatalf("second fetch of one proxy ticket: %v", err)
	}
	// Proxy without the opt-in, or no DHCP: never.
	tk, _ = testTracker(trustNone)
	tk.BootAnswered(victim, true)
	if err := tk.ClaimScript(victim, vip); !errors.Is(err, httpboot.ErrEnrollOff) {
		t.Fatalf("proxy without opt-in: %v", err)
	}
}
