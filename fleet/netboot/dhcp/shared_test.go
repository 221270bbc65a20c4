package dhcp

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"

	"github.com/discord-pxe/dpxe/fleet/store/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

// sharedMutation turns SharedLeases off in TestSharedLeasesTwoServers
// (DPXE_DHCP_MUTATION=unshared): each server then keeps its own table in
// memory, persisted to the same database, and the test fails.
var sharedMutation = os.Getenv("DPXE_DHCP_MUTATION") == "unshared"

// TestSharedLeasesTwoServers runs two authoritative servers, as two
// controller replicas do, on one database (each its own store.Open of
// it, SQLite and PostgreSQL), serving one 200-address pool to 200
// clients at once. Each client broadcasts its DISCOVER and its REQUEST to
// both servers, takes the offer of its home server (half the clients each)
// and starts again on a NAK, at most 10 times. It asserts that every
// client gets an address, that no address goes to two clients, that the
// server not chosen never ACKs, that each client renewing at the other
// server (ciaddr, no option 50: REBINDING) keeps its address, and that
// the database holds exactly these bindings.
func TestSharedLeasesTwoServers(t *testing.T) { pgtest.Each(t, testSharedLeasesTwoServers) }

func testSharedLeasesTwoServers(t *testing.T, dsn string) {
	ctx := context.Background()
	ips := []netip.Addr{netip.MustParseAddr("10.9.0.1"), netip.MustParseAddr("10.9.0.2")}
	var servers []*Handler
	for _, ip := range ips {
		cfg := authConfig("10.9.0.10-10.9.0.209/24")
		cfg.ServerIP = ip
		cfg.SharedLeases = !sharedMutation
		h, _ := newHandler(t, cfg, openStore(t, dsn))
		servers = append(servers, h)
	}
	const n = 200
	hw := func(i int) net.HardwareAddr { return net.HardwareAddr{0x52, 0x54, 0x02, 0, byte(i >> 8), byte(i)} }
	got := make([]netip.Addr, n)
	errs := make([]error, n)
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			got[i], errs[i] = sharedClient(t, servers, i%2, hw(i))
		}()
	}
	wg.Wait()
	owner := map[netip.Addr]int{}
	for i := range got {
		if errs[i] != nil {
			t.Fatalf("client %d: %v", i, errs[i])
		}
		if j, dup := owner[got[i]]; dup {
			t.Fatalf("%s went to client %d and client %d", got[i], j, i)
		}
		owner[got[i]] = i
	}
	// Each client renews at the server it did not choose.
	for i := range got {
		other := servers[1-i%2]
		r := other.Reply(ctx, msg(t, hw(i), dhcpv4.MessageTypeRequest, plain, dhcpv4.WithClientIP(stdIP(got[i]))), ServerPort)
		if r == nil || r.MessageType() != dhcpv4.MessageTypeAck || addr4(r.YourIPAddr) != got[i] {
			t.Fatalf("client %d renewing %s at the other server: %v", i, got[i], r)
		}
	}
	ls, err := openStore(t, dsn).Leases(ctx)
	if err != nil || len(ls) != n {
		t.Fatalf("stored leases: %d, %v", len(ls), err)
	}
	for _, l := range ls {
		if i, ok := owner[l.IP]; !ok || l.MAC.String() != hw(i).String() {
			t.Fatalf("stored lease %s → %s; the clients hold %v", l.IP, l.MAC, owner)
		}
	}
}

// sharedClient leases an address for hw as a client on a LAN with both
// servers: its DISCOVER and REQUEST reach both at once, it takes the offer
// of servers[home], and it starts again on a NAK or silence.
func sharedClient(t *testing.T, servers []*Handler, home int, hw net.HardwareAddr) (netip.Addr, error) {
	ctx := context.Background()
	both := func(m *dhcpv4.DHCPv4) [2]*dhcpv4.DHCPv4 {
		var out [2]*dhcpv4.DHCPv4
		var wg sync.WaitGroup
		for s := range servers {
			wg.Add(1)
			go func() { defer wg.Done(); out[s] = servers[s].Reply(ctx, m, ServerPort) }()
		}
		wg.Wait()
		return out
	}
	var last string
	for attempt := 0; attempt < 10; attempt++ {
		offers := both(msg(t, hw, dhcpv4.MessageTypeDiscover, plain))
		off := offers[home]
		if off == nil || off.MessageType() != dhcpv4.MessageTypeOffer {
			last = fmt.Sprintf("no offer from server %d", home)
			continue
		}
		ip := addr4(off.YourIPAddr)
		answers := both(msg(t, hw, dhcpv4.MessageTypeRequest, plain, requested(ip), serverID(servers[home].cfg.ServerIP)))
		if r := answers[1-home]; r != nil {
			return netip.Addr{}, fmt.Errorf("the server not chosen answered the REQUEST: %v", r)
		}
		ack := answers[home]
		if ack != nil && ack.MessageType() == dhcpv4.MessageTypeAck && addr4(ack.YourIPAddr) == ip {
			return ip, nil
		}
		last = fmt.Sprintf("REQUEST for %s answered %v", ip, ack)
	}
	return netip.Addr{}, fmt.Errorf("no lease after 10 attempts: %s", last)
}

// TestSharedLeasesNeedAnAllocator: SharedLeases without a store that
// allocates is refused with an error that says so.
func TestSharedLeasesNeedAnAllocator(t *testing.T) {
	cfg := authConfig("10.9.0.10-10.9.0.12/24")
	cfg.SharedLeases = true
	if _, err := New(context.Background(), cfg, nil, nil, nil); err == nil || !strings.Contains(err.Error(), "shared leases") {
		t.Fatalf("shared leases without a store: %v", err)
	}
}
