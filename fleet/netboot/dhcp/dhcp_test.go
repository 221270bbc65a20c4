package dhcp

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"

	"github.com/discord-pxe/dpxe/fleet/netboot/inventory"
	"github.com/discord-pxe/dpxe/fleet/store"
	"github.com/discord-pxe/dpxe/fleet/store/pgtest"
)

var serverIP = netip.MustParseAddr("10.9.0.1")

// recorder is an Observer that keeps everything.
type recorder struct {
	mu       sync.Mutex
	events   []inventory.Event
	seen     []inventory.Sighting
	addrs    map[string]netip.Addr // from Leased only
	answered map[string]bool       // BootAnswered: MAC → approved
}

func (r *recorder) Sighting(s inventory.Sighting) {
	r.mu.Lock()
	r.seen = append(r.seen, s)
	r.mu.Unlock()
}
func (r *recorder) Event(e inventory.Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}
func (r *recorder) Leased(mac net.HardwareAddr, ip netip.Addr, until time.Time, approved bool) {
	r.mu.Lock()
	if r.addrs == nil {
		r.addrs = map[string]netip.Addr{}
	}
	r.addrs[mac.String()] = ip
	r.mu.Unlock()
}
func (r *recorder) BootAnswered(mac net.HardwareAddr, approved bool) {
	r.mu.Lock()
	if r.answered == nil {
		r.answered = map[string]bool{}
	}
	r.answered[mac.String()] = approved
	r.mu.Unlock()
}

func openStore(t testing.TB, path string) *store.NetbootInventory {
	t.Helper()
	st, err := store.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st.Netboot()
}

func authConfig(pool string) Config {
	p, err := ParsePool(pool)
	if err != nil {
		panic(err)
	}
	return Config{
		Mode: Authoritative, ServerIP: serverIP, Pool: p,
		Router: []netip.Addr{serverIP}, DNS: []netip.Addr{serverIP},
		LeaseTime: time.Hour,
		Boot:      Boot{HTTPBase: "http://10.9.0.1:8080"},
	}
}

func newHandler(t testing.TB, cfg Config, store inventory.LeaseStore) (*Handler, *recorder) {
	t.Helper()
	rec := &recorder{}
	h, err := New(context.Background(), cfg, store, rec, nil)
	if err != nil {
		t.Fatal(err)
	}
	return h, rec
}

func mac(i byte) net.HardwareAddr { return net.HardwareAddr{0x52, 0x54, 0x00, 0, 0, i} }

// kind describes a client's firmware for building requests.
type kind struct {
	class string // option 60
	arch  int    // option 93, -1 for none
	uc    string // option 77
}

var (
	plain    = kind{arch: -1}
	biosPXE  = kind{class: "PXEClient:Arch:00000:UNDI:002001", arch: 0}
	biosIPXE = kind{class: "PXEClient:Arch:00000:UNDI:002001", arch: 0, uc: "iPXE"}
	uefi7    = kind{class: "PXEClient:Arch:00007:UNDI:003016", arch: 7}
	uefi9    = kind{class: "PXEClient:Arch:00009:UNDI:003016", arch: 9}
	uefiHTTP = kind{class: "HTTPClient:Arch:00016:UNDI:003001", arch: 16}
	script   = kind{class: "PXEClient:Arch:00007:UNDI:003016", arch: 7, uc: UserClassScript}
)

func msg(t testing.TB, hw net.HardwareAddr, typ dhcpv4.MessageType, k kind, mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
	t.Helper()
	all := []dhcpv4.Modifier{dhcpv4.WithHwAddr(hw), dhcpv4.WithMessageType(typ)}
	if k.class != "" {
		all = append(all, dhcpv4.WithOption(dhcpv4.OptClassIdentifier(k.class)))
	}
	if k.arch >= 0 {
		all = append(all, dhcpv4.WithOption(dhcpv4.OptClientArch(iana.Arch(k.arch))))
	}
	if k.uc != "" {
		all = append(all, dhcpv4.WithUserClass(k.uc, false))
	}
	m, err := dhcpv4.New(append(all, mods...)...)
	if err != nil {
		t.Fatal(err)
	}
	// Through the wire format, as the server sees it.
	m, err = dhcpv4.FromBytes(m.ToBytes())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func requested(ip netip.Addr) dhcpv4.Modifier {
	return dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(stdIP(ip)))
}
func serverID(ip netip.Addr) dhcpv4.Modifier {
	return dhcpv4.WithOption(dhcpv4.OptServerIdentifier(stdIP(ip)))
}

// lease runs DISCOVER and REQUEST and returns the bound address.
func lease(t *testing.T, h *Handler, hw net.HardwareAddr, k kind) (netip.Addr, *dhcpv4.DHCPv4) {
	t.Helper()
	ctx := context.Background()
	off := h.Reply(ctx, msg(t, hw, dhcpv4.MessageTypeDiscover, k), ServerPort)
	if off == nil || off.MessageType() != dhcpv4.MessageTypeOffer {
		t.Fatalf("%s: no OFFER (%v)", hw, off)
	}
	ip := addr4(off.YourIPAddr)
	ack := h.Reply(ctx, msg(t, hw, dhcpv4.MessageTypeRequest, k, requested(ip), serverID(serverIP)), ServerPort)
	if ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck || addr4(ack.YourIPAddr) != ip {
		t.Fatalf("%s: no ACK for %s (%v)", hw, ip, ack)
	}
	return ip, ack
}

func TestFirmwareSelection(t *testing.T) {
	h, _ := newHandler(t, authConfig("10.9.0.100-10.9.0.200/24"), nil)
	cases := []struct {
		name      string
		k         kind
		file      string
		class     string
		vendorOpt bool
	}{
		{"plain client gets no boot info", plain, "", "", false},
		{"BIOS PXE ROM", biosPXE, "undionly.kpxe", ClassPXE, true},
		{"iPXE", biosIPXE, "http://10.9.0.1:8080/boot/52-54-00-00-00-03.ipxe", ClassPXE, false},
		{"UEFI arch 7", uefi7, "ipxe.efi", ClassPXE, false},
		{"UEFI arch 9", uefi9, "ipxe.efi", ClassPXE, false},
		{"UEFI HTTP boot", uefiHTTP, "http://10.9.0.1:8080/boot/ipxe.efi", ClassHTTP, false},
		{"our script's user class", script, "http://10.9.0.1:8080/boot/52-54-00-00-00-07.ipxe", ClassPXE, false},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, ack := lease(t, h, mac(byte(i+1)), c.k)
			if ack.BootFileName != c.file {
				t.Errorf("file %q, want %q", ack.BootFileName, c.file)
			}
			if got := ack.ClassIdentifier(); got != c.class {
				t.Errorf("option 60 %q, want %q", got, c.class)
			}
			if got := ack.Options.Has(dhcpv4.OptionVendorSpecificInformation); got != c.vendorOpt {
				t.Errorf("option 43 present = %v, want %v", got, c.vendorOpt)
			}
			if c.file != "" && !ack.ServerIPAddr.Equal(stdIP(serverIP)) {
				t.Errorf("siaddr %s", ack.ServerIPAddr)
			}
			if ack.SubnetMask().String() != "ffffff00" || len(ack.Router()) != 1 || ack.IPAddressLeaseTime(0) != time.Hour {
				t.Errorf("options: mask %s router %v lease %v", ack.SubnetMask(), ack.Router(), ack.IPAddressLeaseTime(0))
			}
		})
	}
	// UEFI with the user-class iPXE never gets the iPXE binary again.
	_, ack := lease(t, h, mac(50), kind{class: uefi7.class, arch: 7, uc: "iPXE"})
	if ack.BootFileName == "ipxe.efi" {
		t.Fatal("chainload loop: iPXE was sent the iPXE binary")
	}
}

func TestUniqueAddressesAndExhaustion(t *testing.T) {
	h, _ := newHandler(t, authConfig("10.9.0.10-10.9.0.13/24"), nil)
	seen := map[netip.Addr]string{}
	for i := byte(1); i <= 4; i++ {
		ip, _ := lease(t, h, mac(i), plain)
		if other, dup := seen[ip]; dup {
			t.Fatalf("%s given to %s and %s", ip, other, mac(i))
		}
		seen[ip] = mac(i).String()
	}
	if r := h.Reply(context.Background(), msg(t, mac(9), dhcpv4.MessageTypeDiscover, plain), ServerPort); r != nil {
		t.Fatalf("offer from an exhausted pool: %v", r)
	}
	// The same client asking again keeps its address.
	ip1, _ := lease(t, h, mac(1), plain)
	if seen[ip1] != mac(1).String() {
		t.Fatalf("client 1 moved to %s", ip1)
	}
}

func TestConcurrentClientsNeverShare(t *testing.T) {
	h, _ := newHandler(t, authConfig("10.9.0.10-10.9.0.59/24"), openStore(t, filepath.Join(t.TempDir(), "l.db")))
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[netip.Addr]int{}
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			ctx := context.Background()
			hw := mac(byte(i + 1))
			off := h.Reply(ctx, msg(t, hw, dhcpv4.MessageTypeDiscover, plain), ServerPort)
			if off == nil {
				t.Errorf("no offer for %s", hw)
				return
			}
			ip := addr4(off.YourIPAddr)
			ack := h.Reply(ctx, msg(t, hw, dhcpv4.MessageTypeRequest, plain, requested(ip), serverID(serverIP)), ServerPort)
			if ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck {
				t.Errorf("no ack for %s", hw)
				return
			}
			mu.Lock()
			got[ip]++
			mu.Unlock()
		}(i)
	}
	wg.Wait()
	if len(got) != 50 {
		t.Fatalf("50 clients got %d distinct addresses: %v", len(got), got)
	}
}

// TestReservationsNakDeclineRelease runs on the table in memory and, with
// SharedLeases, on the allocator of a database (SQLite and PostgreSQL).
func TestReservationsNakDeclineRelease(t *testing.T) {
	t.Run("memory", func(t *testing.T) { testReservationsNakDeclineRelease(t, false, nil) })
	pgtest.Each(t, func(t *testing.T, dsn string) { testReservationsNakDeclineRelease(t, true, openStore(t, dsn)) })
}

func testReservationsNakDeclineRelease(t *testing.T, shared bool, st inventory.LeaseStore) {
	ctx := context.Background()
	cfg := authConfig("10.9.0.10-10.9.0.12/24")
	cfg.Reservations = map[string]netip.Addr{"52-54-00-00-00-07": netip.MustParseAddr("10.9.0.11")}
	cfg.SharedLeases = shared
	h, _ := newHandler(t, cfg, st)

	// Nobody else gets the reserved address, even when asking for it.
	for i := byte(1); i <= 2; i++ {
		ip, _ := lease(t, h, mac(i), plain)
		if ip == netip.MustParseAddr("10.9.0.11") {
			t.Fatalf("reserved address given to %s", mac(i))
		}
	}
	if ip, _ := lease(t, h, mac(7), plain); ip != netip.MustParseAddr("10.9.0.11") {
		t.Fatalf("reserved client got %s", ip)
	}

	// Requesting another client's address: NAK.
	r := h.Reply(ctx, msg(t, mac(3), dhcpv4.MessageTypeRequest, plain, requested(netip.MustParseAddr("10.9.0.11"))), ServerPort)
	if r == nil || r.MessageType() != dhcpv4.MessageTypeNak {
		t.Fatalf("want NAK, got %v", r)
	}
	// Choosing another server's offer: silence.
	if r := h.Reply(ctx, msg(t, mac(3), dhcpv4.MessageTypeRequest, plain,
		requested(netip.MustParseAddr("10.9.0.12")), serverID(netip.MustParseAddr("10.9.0.254"))), ServerPort); r != nil {
		t.Fatalf("answered a request for another server: %v", r)
	}

	// Client 1 declines its address: it is not offered again.
	ip1, _ := lease(t, h, mac(1), plain)
	h.Reply(ctx, msg(t, mac(1), dhcpv4.MessageTypeDecline, plain, requested(ip1), serverID(serverIP)), ServerPort)
	off := h.Reply(ctx, msg(t, mac(1), dhcpv4.MessageTypeDiscover, plain), ServerPort)
	if off != nil && addr4(off.YourIPAddr) == ip1 {
		t.Fatalf("declined address %s offered again", ip1)
	}

	// Client 2 releases: its address is free for a newcomer.
	ip2, _ := lease(t, h, mac(2), plain)
	h.Reply(ctx, msg(t, mac(2), dhcpv4.MessageTypeRelease, plain, dhcpv4.WithClientIP(stdIP(ip2)), serverID(serverIP)), ServerPort)
	if ip, _ := lease(t, h, mac(4), plain); ip != ip2 {
		t.Fatalf("after release, newcomer got %s, want %s", ip, ip2)
	}
}

func TestLeasesPersistAndRenew(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "leases.db")
	cfg := authConfig("10.9.0.10-10.9.0.11/24")
	now := time.Unix(1_800_000_000, 0)

	h1, _ := newHandler(t, cfg, openStore(t, path))
	h1.now = func() time.Time { return now }
	ip1, _ := lease(t, h1, mac(1), plain)

	// A restarted server keeps the binding: mac 1 gets the same address,
	// mac 2 gets the other one, mac 3 nothing.
	h2, _ := newHandler(t, cfg, openStore(t, path))
	h2.now = func() time.Time { return now.Add(10 * time.Minute) }
	if ip, _ := lease(t, h2, mac(1), plain); ip != ip1 {
		t.Fatalf("after restart mac 1 got %s, want %s", ip, ip1)
	}
	ip2, _ := lease(t, h2, mac(2), plain)
	if ip2 == ip1 {
		t.Fatal("address given twice after restart")
	}
	if r := h2.Reply(ctx, msg(t, mac(3), dhcpv4.MessageTypeDiscover, plain), ServerPort); r != nil {
		t.Fatalf("pool of two gave a third address %s", r.YourIPAddr)
	}

	// Renewal (RENEWING: ciaddr set, no option 50) extends the lease.
	h2.now = func() time.Time { return now.Add(50 * time.Minute) }
	r := h2.Reply(ctx, msg(t, mac(1), dhcpv4.MessageTypeRequest, plain, dhcpv4.WithClientIP(stdIP(ip1))), ServerPort)
	if r == nil || r.MessageType() != dhcpv4.MessageTypeAck {
		t.Fatalf("renewal: %v", r)
	}
	ls, _ := openStore(t, path).Leases(ctx)
	var exp time.Time
	for _, l := range ls {
		if l.IP == ip1 {
			exp = l.Expiry
		}
	}
	if !exp.Equal(now.Add(50*time.Minute + time.Hour)) {
		t.Fatalf("renewed expiry %v, want %v", exp, now.Add(110*time.Minute))
	}

	// After expiry the address can go to someone else.
	h2.now = func() time.Time { return now.Add(5 * time.Hour) }
	if ip, _ := lease(t, h2, mac(3), plain); ip != ip1 && ip != ip2 {
		t.Fatalf("expired lease not reused: %s", ip)
	}
}

func TestProxyMode(t *testing.T) {
	ctx := context.Background()
	h, rec := newHandler(t, Config{Mode: Proxy, ServerIP: serverIP, Boot: Boot{HTTPBase: "http://10.9.0.1:8080"}}, nil)
	guid := dhcpv4.WithGeneric(dhcpv4.OptionClientMachineIdentifier, bytes.Repeat([]byte{7}, 17))

	if r := h.Reply(ctx, msg(t, mac(1), dhcpv4.MessageTypeDiscover, plain), ServerPort); r != nil {
		t.Fatal("proxy answered a non-PXE client")
	}
	if r := h.Reply(ctx, msg(t, mac(1), dhcpv4.MessageTypeRequest, biosPXE), ServerPort); r != nil {
		t.Fatal("proxy answered a REQUEST on port 67")
	}
	off := h.Reply(ctx, msg(t, mac(1), dhcpv4.MessageTypeDiscover, biosPXE, guid), ServerPort)
	if off == nil || off.MessageType() != dhcpv4.MessageTypeOffer {
		t.Fatalf("no proxy offer: %v", off)
	}
	if !off.YourIPAddr.IsUnspecified() || off.BootFileName != "undionly.kpxe" || off.ClassIdentifier() != ClassPXE ||
		!bytes.Equal(off.GetOneOption(dhcpv4.OptionClientMachineIdentifier), bytes.Repeat([]byte{7}, 17)) ||
		!off.ServerIdentifier().Equal(stdIP(serverIP)) {
		t.Fatalf("bad proxy offer: %s", off.Summary())
	}
	// UEFI: the offer names no file; the port-4011 request gets it.
	off = h.Reply(ctx, msg(t, mac(2), dhcpv4.MessageTypeDiscover, uefi7), ServerPort)
	if off == nil || off.BootFileName != "" {
		t.Fatalf("UEFI proxy offer: %v", off)
	}
	clientIP := netip.MustParseAddr("10.9.0.77")
	ack := h.Reply(ctx, msg(t, mac(2), dhcpv4.MessageTypeRequest, uefi7, dhcpv4.WithClientIP(stdIP(clientIP))), PXEServerPort)
	if ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck || ack.BootFileName != "ipxe.efi" || !ack.YourIPAddr.IsUnspecified() {
		t.Fatalf("4011 ACK: %v", ack)
	}
	if _, bound := rec.addrs[mac(2).String()]; bound || !rec.answered[mac(2).String()] {
		t.Fatalf("a 4011 request's claimed ciaddr bound an address (%v), or it was not reported as answered (%v)", rec.addrs, rec.answered)
	}
	// iPXE gets its script in the proxy offer.
	off = h.Reply(ctx, msg(t, mac(3), dhcpv4.MessageTypeDiscover, biosIPXE), ServerPort)
	if off == nil || off.BootFileName != "http://10.9.0.1:8080/boot/52-54-00-00-00-03.ipxe" {
		t.Fatalf("iPXE proxy offer: %v", off)
	}
	if len(rec.events) == 0 || rec.events[0].Stage != inventory.StageDHCPOffer {
		t.Fatalf("events %v", rec.events)
	}
	// Unsupported firmware (32-bit UEFI): silence.
	if r := h.Reply(ctx, msg(t, mac(4), dhcpv4.MessageTypeDiscover, kind{class: "PXEClient", arch: 6}), ServerPort); r != nil {
		t.Fatal("answered a 32-bit UEFI client")
	}
}

func TestRelayedRequests(t *testing.T) {
	h, _ := newHandler(t, authConfig("10.9.0.10-10.9.0.20/24"), nil)
	ctx := context.Background()
	other := dhcpv4.WithGatewayIP(net.IPv4(10, 8, 0, 1))
	if r := h.Reply(ctx, msg(t, mac(1), dhcpv4.MessageTypeDiscover, plain, other), ServerPort); r != nil {
		t.Fatalf("offered %s to a client behind a relay on another subnet", r.YourIPAddr)
	}
	same := dhcpv4.WithGatewayIP(net.IPv4(10, 9, 0, 254))
	r := h.Reply(ctx, msg(t, mac(1), dhcpv4.MessageTypeDiscover, plain, same), ServerPort)
	if r == nil || !r.GatewayIPAddr.Equal(net.IPv4(10, 9, 0, 254)) {
		t.Fatalf("relayed offer in our subnet: %v", r)
	}
	if d := destination(msg(t, mac(1), dhcpv4.MessageTypeDiscover, plain, same), r, &net.UDPAddr{IP: net.IPv4(10, 9, 0, 254), Port: 67}, ServerPort); d.String() != "10.9.0.254:67" {
		t.Fatalf("relayed reply goes to %s, want the relay on port 67", d)
	}
}

func TestParsePool(t *testing.T) {
	for _, c := range []struct {
		in   string
		size int
	}{
		{"10.0.0.100-10.0.0.200/24", 101},
		{"192.168.1.2-192.168.1.2/30", 1},
		{"10.0.0.100/24", 0},
		{"10.0.0.200-10.0.0.100/24", 0},
		{"10.0.0.100-10.0.1.1/24", 0},
		{"10.0.0.0-10.0.0.5/24", 0},
		{"10.0.0.250-10.0.0.255/24", 0},
		{"fe80::1-fe80::2/64", 0},
		{"10.0.0.1-10.0.0.2/31", 0},
	} {
		p, err := ParsePool(c.in)
		if (err == nil) != (c.size > 0) || err == nil && p.Size() != c.size {
			t.Errorf("ParsePool(%q) = %v (size %d), %v", c.in, p, p.Size(), err)
		}
	}
}
