package store

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/netboot/inventory"
	"github.com/discord-pxe/dpxe/fleet/store/pgtest"
)

// openInventory opens a fresh store and returns its netboot tables.
func openInventory(t *testing.T, dsn string) *NetbootInventory {
	t.Helper()
	s := openDSN(t, dsn)
	t.Cleanup(func() { s.Close() })
	return s.Netboot()
}

func TestDiscoverApproveLookup(t *testing.T) { pgtest.Each(t, discoverApproveLookup) }

func discoverApproveLookup(t *testing.T, dsn string) {
	ctx := context.Background()
	s := openInventory(t, dsn)
	mac, _ := net.ParseMAC("52:54:00:aa:bb:01")
	t0 := time.UnixMilli(1_700_000_000_000)

	if _, err := s.Lookup(ctx, mac); !errors.Is(err, inventory.ErrUnknownMAC) {
		t.Fatalf("lookup of unseen MAC: err = %v, want inventory.ErrUnknownMAC", err)
	}
	if err := s.Seen(ctx, inventory.Sighting{MAC: mac, Firmware: inventory.FirmwareBIOS, IP: netip.MustParseAddr("10.0.0.5"), At: t0}); err != nil {
		t.Fatal(err)
	}
	// A later sighting with unknown firmware and no IP keeps the old values.
	if err := s.Seen(ctx, inventory.Sighting{MAC: mac, Firmware: inventory.FirmwareUnknown, At: t0.Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	n, err := s.Lookup(ctx, mac)
	if err != nil || n.State != inventory.Discovered || n.ID != "" {
		t.Fatalf("after sighting: %+v, %v", n, err)
	}
	recs, err := s.Nodes(ctx)
	if err != nil || len(recs) != 1 {
		t.Fatalf("nodes: %v %v", recs, err)
	}
	r := recs[0]
	if r.Firmware != inventory.FirmwareBIOS || r.IP != "10.0.0.5" || !r.FirstSeen.Equal(t0) || !r.LastSeen.Equal(t0.Add(time.Minute)) {
		t.Fatalf("record = %+v", r)
	}

	for _, bad := range []struct{ id, cred string }{
		{"", "0123456789abcdef"},
		{"bad id", "0123456789abcdef"},
		{"node-1", "short"},
	} {
		if err := s.Approve(ctx, mac, bad.id, bad.cred, t0); err == nil {
			t.Errorf("Approve(%q, %q) accepted", bad.id, bad.cred)
		}
	}
	if err := s.Approve(ctx, mac, "node-1", "0123456789abcdefXYZ", t0); err != nil {
		t.Fatal(err)
	}
	n, err = s.Lookup(ctx, mac)
	if err != nil || n.State != inventory.Approved || n.ID != "node-1" || n.Credential != "0123456789abcdefXYZ" {
		t.Fatalf("after approve: %+v, %v", n, err)
	}
	// Node IDs are unique.
	other, _ := net.ParseMAC("52:54:00:aa:bb:02")
	if err := s.Approve(ctx, other, "node-1", "0123456789abcdefXYZ", t0); err == nil {
		t.Fatal("two MACs approved with the same node ID")
	}
	if err := s.Retire(ctx, mac); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.Lookup(ctx, mac); n.State != inventory.Retired {
		t.Fatalf("after retire: %+v", n)
	}
	if err := s.Retire(ctx, other); !errors.Is(err, inventory.ErrUnknownMAC) {
		t.Fatalf("retire unknown: %v", err)
	}
}

func TestTimelineOrderAndPruning(t *testing.T) { pgtest.Each(t, timelineOrderAndPruning) }

func timelineOrderAndPruning(t *testing.T, dsn string) {
	ctx := context.Background()
	s := openInventory(t, dsn)
	mac, _ := net.ParseMAC("52:54:00:aa:bb:03")
	if err := s.Seen(ctx, inventory.Sighting{MAC: mac, At: time.UnixMilli(0)}); err != nil {
		t.Fatal(err)
	}
	stages := []inventory.Stage{inventory.StageDHCPOffer, inventory.StageDHCPAck, inventory.StageScriptFetched, inventory.StageKernelFetched}
	for i, st := range stages {
		if err := s.Record(ctx, inventory.Event{MAC: mac, Stage: st, Detail: "d", At: time.UnixMilli(int64(i))}); err != nil {
			t.Fatal(err)
		}
	}
	ev, err := s.Timeline(ctx, mac)
	if err != nil || len(ev) != len(stages) {
		t.Fatalf("timeline: %v %v", ev, err)
	}
	for i := range stages {
		if ev[i].Stage != stages[i] {
			t.Fatalf("event %d = %s, want %s", i, ev[i].Stage, stages[i])
		}
	}
	for i := 0; i < inventory.MaxEventsPerMAC+20; i++ {
		if err := s.Record(ctx, inventory.Event{MAC: mac, Stage: inventory.StageDHCPOffer, At: time.UnixMilli(int64(100 + i))}); err != nil {
			t.Fatal(err)
		}
	}
	ev, _ = s.Timeline(ctx, mac)
	if len(ev) != inventory.MaxEventsPerMAC {
		t.Fatalf("after %d events the timeline holds %d, want %d", inventory.MaxEventsPerMAC+24, len(ev), inventory.MaxEventsPerMAC)
	}
	if last := ev[len(ev)-1].At.UnixMilli(); last != int64(100+inventory.MaxEventsPerMAC+19) {
		t.Fatalf("newest event at %d: pruning dropped the wrong end", last)
	}
	// The dashboard's summary: each MAC's newest step.
	other, _ := net.ParseMAC("52:54:00:aa:bb:13")
	s.Seen(ctx, inventory.Sighting{MAC: other, At: time.UnixMilli(0)})
	s.Record(ctx, inventory.Event{MAC: other, Stage: inventory.StageKernelFetched, Detail: "k", At: time.UnixMilli(1)})
	s.Record(ctx, inventory.Event{MAC: mac, Stage: inventory.StageScriptFetched, Detail: "last", At: time.UnixMilli(2)})
	ls, err := s.LastStages(ctx)
	if err != nil || len(ls) != 2 || ls[inventory.MACKey(mac)].Stage != inventory.StageScriptFetched ||
		ls[inventory.MACKey(mac)].Detail != "last" || ls[inventory.MACKey(other)].Stage != inventory.StageKernelFetched {
		t.Fatalf("LastStages = %+v, %v", ls, err)
	}
}

func TestLeasesRoundTrip(t *testing.T) { pgtest.Each(t, leasesRoundTrip) }

func leasesRoundTrip(t *testing.T, dsn string) {
	ctx := context.Background()
	s := openInventory(t, dsn)
	mac, _ := net.ParseMAC("52:54:00:aa:bb:04")
	exp := time.UnixMilli(1_800_000_000_000)
	a, b := netip.MustParseAddr("10.0.0.100"), netip.MustParseAddr("10.0.0.101")
	if err := s.PutLease(ctx, inventory.Lease{IP: a, MAC: mac, Expiry: exp}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutLease(ctx, inventory.Lease{IP: b, Declined: true, Expiry: exp}); err != nil {
		t.Fatal(err)
	}
	// Renewal replaces.
	if err := s.PutLease(ctx, inventory.Lease{IP: a, MAC: mac, Expiry: exp.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	ls, err := s.Leases(ctx)
	if err != nil || len(ls) != 2 {
		t.Fatalf("leases %v %v", ls, err)
	}
	if ls[0].IP != a || ls[0].MAC.String() != mac.String() || !ls[0].Expiry.Equal(exp.Add(time.Hour)) || ls[0].Declined {
		t.Fatalf("lease 0 = %+v", ls[0])
	}
	if ls[1].IP != b || ls[1].MAC != nil || !ls[1].Declined {
		t.Fatalf("lease 1 = %+v", ls[1])
	}
	if err := s.DeleteLease(ctx, a); err != nil {
		t.Fatal(err)
	}
	if ls, _ := s.Leases(ctx); len(ls) != 1 {
		t.Fatalf("after delete: %v", ls)
	}
}

// TestDiscoveredCap performs the pool-starvation flood of issue 24 on the
// inventory: many made-up MACs. The discovered machines stop at the cap
// (inventory.ErrDiscoveredFull), known MACs are still updated, approving one makes
// room, and timelines of MACs the inventory does not hold are dropped.
func TestDiscoveredCap(t *testing.T) { pgtest.Each(t, discoveredCap) }

func discoveredCap(t *testing.T, dsn string) {
	ctx := context.Background()
	s := openInventory(t, dsn)
	s.MaxDiscovered = 8
	t0 := time.UnixMilli(1_700_000_000_000)
	mac := func(i int) net.HardwareAddr { return net.HardwareAddr{0x02, 0, 0, 0, byte(i >> 8), byte(i)} }
	for i := 0; i < 100; i++ {
		err := s.Seen(ctx, inventory.Sighting{MAC: mac(i), At: t0})
		if i < 8 && err != nil || i >= 8 && !errors.Is(err, inventory.ErrDiscoveredFull) {
			t.Fatalf("sighting %d: %v", i, err)
		}
		s.Record(ctx, inventory.Event{MAC: mac(i), Stage: inventory.StageDHCPOffer, At: t0})
	}
	recs, _ := s.Nodes(ctx)
	if len(recs) != 8 {
		t.Fatalf("%d machines recorded, cap 8", len(recs))
	}
	var events int
	s.s.queryRow(ctx, `SELECT count(*) FROM netboot_events`).Scan(&events)
	if events != 8 {
		t.Fatalf("%d timeline events stored for 100 MACs of which 8 are known", events)
	}
	if err := s.Seen(ctx, inventory.Sighting{MAC: mac(3), IP: netip.MustParseAddr("10.0.0.3"), At: t0.Add(time.Second)}); err != nil {
		t.Fatalf("a known MAC at the cap: %v", err)
	}
	if err := s.Approve(ctx, mac(3), "node-3", "", t0); err != nil {
		t.Fatal(err)
	}
	if err := s.Seen(ctx, inventory.Sighting{MAC: mac(50), At: t0}); err != nil {
		t.Fatalf("after an approval made room: %v", err)
	}
	// An approved MAC is not discovered: it never counts toward the cap.
	if err := s.Approve(ctx, mac(200), "node-200", "", t0); err != nil {
		t.Fatal(err)
	}
	if err := s.Seen(ctx, inventory.Sighting{MAC: mac(200), At: t0}); err != nil {
		t.Fatalf("an approved MAC at the cap: %v", err)
	}
}

// TestDiscoveredCapConcurrent: sightings of new MACs racing for the last
// places of the cap never exceed it, on either backend (on PostgreSQL the
// count and the insert would race under READ COMMITTED without the lock).
func TestDiscoveredCapConcurrent(t *testing.T) { pgtest.Each(t, testDiscoveredCapConcurrent) }

func testDiscoveredCapConcurrent(t *testing.T, dsn string) {
	ctx := context.Background()
	s := openInventory(t, dsn)
	s.MaxDiscovered = 8
	const writers, each = 16, 6
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				mac := net.HardwareAddr{0x02, 0, 0, 1, byte(w), byte(i)}
				err := s.Seen(ctx, inventory.Sighting{MAC: mac, At: time.UnixMilli(1_700_000_000_000)})
				if err != nil && !errors.Is(err, inventory.ErrDiscoveredFull) {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	recs, err := s.Nodes(ctx)
	if err != nil || len(recs) != 8 {
		t.Fatalf("%d machines recorded by %d racing writers, cap 8 (%v)", len(recs), writers, err)
	}
}
