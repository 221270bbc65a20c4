package dhcp

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"

	"github.com/discord-pxe/dpxe/fleet/netboot/inventory"
	"github.com/discord-pxe/dpxe/fleet/security"
)

// TestForged4011BindsNothing performs the rebinding attack of issue 24
// without sockets: the victim leases an address; the attacker sends a PXE
// REQUEST to port 4011 with its own chaddr and the victim's address as
// ciaddr. It gets its PXE answer (a PXE client may ask), but no binding
// is reported for it, and the victim's stays the only one.
func TestForged4011BindsNothing(t *testing.T) {
	ctx := context.Background()
	h, rec := newHandler(t, authConfig("10.9.0.100-10.9.0.200/24"), nil)
	victim, attacker := mac(1), mac(0x66)
	ip, _ := lease(t, h, victim, biosIPXE)
	if rec.addrs[victim.String()] != ip {
		t.Fatalf("the victim's lease was not reported: %v", rec.addrs)
	}
	forged := msg(t, attacker, dhcpv4.MessageTypeRequest, uefi7, dhcpv4.WithClientIP(stdIP(ip)))
	if r := h.Reply(ctx, forged, PXEServerPort); r == nil || r.BootFileName != "ipxe.efi" {
		t.Fatalf("4011 answer: %v", r)
	}
	if got, bound := rec.addrs[attacker.String()]; bound || len(rec.addrs) != 1 {
		t.Fatalf("the forged 4011 request bound %s to the attacker: %v", got, rec.addrs)
	}
	// Nor does a sighting carry the claimed address into the inventory.
	for _, s := range rec.seen {
		if s.MAC.String() == attacker.String() && s.IP.IsValid() {
			t.Fatalf("the attacker's sighting carries %s", s.IP)
		}
	}
}

// TestUnapprovedCapAndShortLeases performs the pool starvation of issue
// 24: many made-up MACs ask for addresses. Unapproved MACs get short
// leases and at most MaxUnapproved addresses between them; an approved
// machine still gets an address and the long lease; a reserved MAC
// counts as approved.
func TestUnapprovedCapAndShortLeases(t *testing.T) {
	ctx := context.Background()
	cfg := authConfig("10.9.0.100-10.9.0.119/24") // 20 addresses
	approvedMAC := mac(0xaa)
	cfg.Approved = func(_ context.Context, hw net.HardwareAddr) bool { return hw.String() == approvedMAC.String() }
	cfg.Reservations = map[string]netip.Addr{"52:54:00:00:00:bb": netip.MustParseAddr("10.9.0.50")}
	h, _ := newHandler(t, cfg, nil)
	if h.cfg.MaxUnapproved != 10 {
		t.Fatalf("default cap %d, want half of 20", h.cfg.MaxUnapproved)
	}
	fake := func(i int) net.HardwareAddr { return net.HardwareAddr{0x02, 0xfa, 0xce, 0, byte(i >> 8), byte(i)} }
	got := 0
	for i := 0; i < 500; i++ {
		off := h.Reply(ctx, msg(t, fake(i), dhcpv4.MessageTypeDiscover, biosPXE), ServerPort)
		if off == nil {
			continue
		}
		got++
		ack := h.Reply(ctx, msg(t, fake(i), dhcpv4.MessageTypeRequest, biosPXE, requested(addr4(off.YourIPAddr)), serverID(serverIP)), ServerPort)
		if ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck || ack.IPAddressLeaseTime(0) != DefaultUnapprovedLeaseTime {
			t.Fatalf("unapproved ACK: %v", ack)
		}
	}
	if got != 10 {
		t.Fatalf("%d made-up MACs got addresses, cap 10", got)
	}
	if n := h.cfg.Refusals.Count(security.DHCPUnapproved); n != 490 {
		t.Fatalf("%d refusals counted for 490 MACs beyond the cap", n)
	}
	// A made-up MAC asking straight for a free address is NAKed too.
	if r := h.Reply(ctx, msg(t, fake(999), dhcpv4.MessageTypeRequest, biosPXE, requested(netip.MustParseAddr("10.9.0.118")), serverID(serverIP)), ServerPort); r == nil || r.MessageType() != dhcpv4.MessageTypeNak {
		t.Fatalf("REQUEST beyond the cap: %v", r)
	}
	ip, ack := lease(t, h, approvedMAC, biosIPXE)
	if !cfg.Pool.Contains(ip) || ack.IPAddressLeaseTime(0) != time.Hour {
		t.Fatalf("approved machine: %s lease %v", ip, ack.IPAddressLeaseTime(0))
	}
	if ip, ack := lease(t, h, mac(0xbb), plain); ip != netip.MustParseAddr("10.9.0.50") || ack.IPAddressLeaseTime(0) != time.Hour {
		t.Fatalf("reserved MAC: %s lease %v", ip, ack.IPAddressLeaseTime(0))
	}
	// An unapproved machine that holds an address renews it at the cap.
	first := fake(0)
	held := h.leases.byMAC[inventory.MACKey(first)]
	if r := h.Reply(ctx, msg(t, first, dhcpv4.MessageTypeRequest, biosPXE, dhcpv4.WithClientIP(stdIP(held))), ServerPort); r == nil || r.MessageType() != dhcpv4.MessageTypeAck {
		t.Fatalf("renewal at the cap: %v", r)
	}
	// Once the short leases lapse, the addresses come back.
	now := time.Now()
	h.now = func() time.Time { return now.Add(DefaultUnapprovedLeaseTime + time.Second) }
	if off := h.Reply(ctx, msg(t, fake(600), dhcpv4.MessageTypeDiscover, biosPXE), ServerPort); off == nil {
		t.Fatal("no address for a new MAC after the unapproved leases lapsed")
	}
}
