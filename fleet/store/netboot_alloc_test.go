package store

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/netboot/inventory"
	"github.com/discord-pxe/dpxe/fleet/store/pgtest"
)

func allocMAC(i int) net.HardwareAddr {
	return net.HardwareAddr{0x52, 0x54, 0x01, 0, byte(i >> 8), byte(i)}
}

func allocFor(mac net.HardwareAddr, server string, d time.Duration) inventory.Allocation {
	return inventory.Allocation{
		MAC:   mac,
		Start: netip.MustParseAddr("10.7.0.10"), End: netip.MustParseAddr("10.7.0.209"),
		Prefix: netip.MustParsePrefix("10.7.0.0/24"), Server: netip.MustParseAddr(server),
		Approved: true, For: d,
	}
}

// TestSharedLeasesTwoReplicas: two stores on one database (two replicas'
// connection pools) allocate a 200-address pool to 200 MACs at once,
// split between them, each MAC an offer then a binding at its replica.
// Every binding succeeds (no offered address was taken by another MAC),
// no address goes to two MACs, the 201st MAC finds the pool exhausted,
// every MAC renews at the other replica and keeps its address, and an
// address held by one MAC is refused to another until it expires on the
// database's clock. Mutation: without the upsert's condition (the row
// must be free for the MAC when written) PostgreSQL hands addresses to
// two MACs.
func TestSharedLeasesTwoReplicas(t *testing.T) { pgtest.Each(t, testSharedLeasesTwoReplicas) }

func testSharedLeasesTwoReplicas(t *testing.T, dsn string) {
	ctx := context.Background()
	reps := []*NetbootInventory{openDSN(t, dsn).Netboot(), openDSN(t, dsn).Netboot()}
	servers := []string{"10.7.0.1", "10.7.0.2"}
	const n = 200
	got := make([]netip.Addr, n)
	var mu sync.Mutex
	var errs []error
	sem := make(chan struct{}, 24)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			r := i % 2
			a := allocFor(allocMAC(i), servers[r], time.Minute)
			ip, err := reps[r].Offer(ctx, a)
			if err == nil {
				a.For = time.Hour
				var ok bool
				ok, err = reps[r].Bind(ctx, a, ip)
				if err == nil && !ok {
					err = fmt.Errorf("bind of offered %s refused", ip)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("mac %d: %w", i, err))
				return
			}
			got[i] = ip
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d allocations failed, first: %v", len(errs), errs[0])
	}
	owner := map[netip.Addr]int{}
	for i, ip := range got {
		if j, dup := owner[ip]; dup {
			t.Fatalf("%s went to MAC %d and MAC %d", ip, j, i)
		}
		owner[ip] = i
	}
	if _, err := reps[0].Offer(ctx, allocFor(allocMAC(n), servers[0], time.Minute)); !errors.Is(err, inventory.ErrPoolExhausted) {
		t.Fatalf("201st MAC: %v, want ErrPoolExhausted", err)
	}
	// Renewal at the other replica keeps the address; an offer there too.
	for i := 0; i < n; i += 7 {
		r := 1 - i%2
		a := allocFor(allocMAC(i), servers[r], time.Hour)
		if ok, err := reps[r].Bind(ctx, a, got[i]); !ok || err != nil {
			t.Fatalf("MAC %d renewing %s at the other replica: %v %v", i, got[i], ok, err)
		}
		if ip, err := reps[r].Offer(ctx, a); ip != got[i] || err != nil {
			t.Fatalf("MAC %d offered %s, %v at the other replica; holds %s", i, ip, err, got[i])
		}
	}
	ls, err := reps[1].Leases(ctx)
	if err != nil || len(ls) != n {
		t.Fatalf("stored leases: %d, %v", len(ls), err)
	}
	for _, l := range ls {
		if i, ok := owner[l.IP]; !ok || l.MAC.String() != allocMAC(i).String() {
			t.Fatalf("stored lease %s → %s, allocated to MAC %d", l.IP, l.MAC, i)
		}
	}

	// Another MAC may not take a live address, and may once it has
	// expired on the database's clock (rows aged in the database).
	other := allocFor(allocMAC(n+1), servers[1], time.Hour)
	if ok, err := reps[1].Bind(ctx, other, got[0]); ok || err != nil {
		t.Fatalf("binding MAC 0's live %s to another MAC: %v %v", got[0], ok, err)
	}
	db := reps[0].s
	if _, err := db.exec(ctx, `UPDATE netboot_leases SET expiry = `+db.dbNowMS()+` + 3600000 WHERE ip = ?`, got[0].String()); err != nil {
		t.Fatal(err)
	}
	if ok, _ := reps[1].Bind(ctx, other, got[0]); ok {
		t.Fatal("took an address that expires in an hour on the database's clock")
	}
	if _, err := db.exec(ctx, `UPDATE netboot_leases SET expiry = `+db.dbNowMS()+` - 1 WHERE ip = ?`, got[0].String()); err != nil {
		t.Fatal(err)
	}
	if ok, err := reps[1].Bind(ctx, other, got[0]); !ok || err != nil {
		t.Fatalf("expired %s not re-taken: %v %v", got[0], ok, err)
	}
	// The old holder's renewal is now refused.
	if ok, _ := reps[0].Bind(ctx, allocFor(allocMAC(0), servers[0], time.Hour), got[0]); ok {
		t.Fatalf("MAC 0 renewed %s after another MAC took it", got[0])
	}
}

// TestSharedLeasesPolicy: reservations, declines, releases, forgotten
// offers and the unapproved cap through the shared allocator, and bad
// requests refused with the field named.
func TestSharedLeasesPolicy(t *testing.T) { pgtest.Each(t, testSharedLeasesPolicy) }

func testSharedLeasesPolicy(t *testing.T, dsn string) {
	ctx := context.Background()
	s := openDSN(t, dsn).Netboot()
	resv := netip.MustParseAddr("10.7.0.10")
	withResv := func(a inventory.Allocation) inventory.Allocation {
		a.Reserved = map[netip.Addr]string{resv: inventory.MACKey(allocMAC(1))}
		return a
	}
	// The reserved address goes to its MAC only.
	ip, err := s.Offer(ctx, withResv(allocFor(allocMAC(2), "10.7.0.1", time.Minute)))
	if err != nil || ip == resv {
		t.Fatalf("MAC 2 offered %s, %v", ip, err)
	}
	if ok, _ := s.Bind(ctx, withResv(allocFor(allocMAC(2), "10.7.0.1", time.Hour)), resv); ok {
		t.Fatal("bound a reserved address to another MAC")
	}
	if ip, err := s.Offer(ctx, withResv(allocFor(allocMAC(1), "10.7.0.1", time.Minute))); ip != resv || err != nil {
		t.Fatalf("reserved MAC offered %s, %v", ip, err)
	}
	// The requested address when free; the server's own never.
	a9 := allocFor(allocMAC(9), "10.7.0.50", time.Minute)
	a9.Requested = netip.MustParseAddr("10.7.0.50")
	if ip, _ := s.Offer(ctx, a9); ip == a9.Requested {
		t.Fatal("offered the server's own address")
	}
	a3 := allocFor(allocMAC(3), "10.7.0.1", time.Minute)
	a3.Requested = a9.Requested
	if ip, _ := s.Offer(ctx, a3); ip != a3.Requested {
		t.Fatalf("requested %s, offered %s", a3.Requested, ip)
	}
	// A forgotten offer frees its address only for the server that made it.
	if err := s.ForgetOffer(ctx, allocMAC(3), netip.MustParseAddr("10.7.0.2")); err != nil {
		t.Fatal(err)
	}
	if ok, _ := s.Bind(ctx, allocFor(allocMAC(4), "10.7.0.1", time.Hour), a3.Requested); ok {
		t.Fatal("another server's forget dropped the offer")
	}
	s.ForgetOffer(ctx, allocMAC(3), a3.Server)
	if ok, err := s.Bind(ctx, allocFor(allocMAC(4), "10.7.0.1", time.Hour), a3.Requested); !ok || err != nil {
		t.Fatalf("forgotten offer's address not free: %v %v", ok, err)
	}
	// Decline: out of service, also for the MAC that declined it.
	if err := s.Decline(ctx, allocMAC(4), a3.Requested, time.Hour); err != nil {
		t.Fatal(err)
	}
	if ok, _ := s.Bind(ctx, allocFor(allocMAC(4), "10.7.0.1", time.Hour), a3.Requested); ok {
		t.Fatal("bound a declined address")
	}
	// Release frees, only by its holder.
	ip5, _ := s.Offer(ctx, allocFor(allocMAC(5), "10.7.0.1", time.Minute))
	s.Bind(ctx, allocFor(allocMAC(5), "10.7.0.1", time.Hour), ip5)
	s.Release(ctx, allocMAC(6), ip5)
	if ok, _ := s.Bind(ctx, allocFor(allocMAC(6), "10.7.0.1", time.Hour), ip5); ok {
		t.Fatal("a release by another MAC freed the address")
	}
	s.Release(ctx, allocMAC(5), ip5)
	if ok, _ := s.Bind(ctx, allocFor(allocMAC(6), "10.7.0.1", time.Hour), ip5); !ok {
		t.Fatal("released address not free")
	}
	// Unapproved MACs hold at most MaxUnapproved addresses between them.
	for i := 10; i < 13; i++ {
		a := allocFor(allocMAC(i), "10.7.0.1", time.Minute)
		a.Approved, a.MaxUnapproved = false, 2
		_, err := s.Offer(ctx, a)
		if want := i < 12; (err == nil) != want {
			t.Fatalf("unapproved MAC %d: %v", i, err)
		}
		if i == 12 && !errors.Is(err, inventory.ErrUnapprovedCap) {
			t.Fatalf("unapproved MAC 12: %v, want ErrUnapprovedCap", err)
		}
	}
	// Bad requests name the field.
	bad := allocFor(allocMAC(7), "10.7.0.1", time.Minute)
	bad.For = 0
	if _, err := s.Offer(ctx, bad); err == nil || !strings.Contains(err.Error(), "duration") {
		t.Fatalf("zero duration: %v", err)
	}
	bad = allocFor(nil, "10.7.0.1", time.Minute)
	if _, err := s.Bind(ctx, bad, resv); err == nil || !strings.Contains(err.Error(), "MAC") {
		t.Fatalf("no MAC: %v", err)
	}
}

// TestMigrationDropsDuplicateLeases: migration 6 keeps one row per MAC,
// the one that lasts longest (the greater address on a tie), before its
// unique index; declined rows (no MAC) all stay. The database is taken
// back to version 5 by hand (index and columns dropped, the later
// migrations' tables too) and reopened.
func TestMigrationDropsDuplicateLeases(t *testing.T) {
	pgtest.Each(t, testMigrationDropsDuplicateLeases)
}

func testMigrationDropsDuplicateLeases(t *testing.T, dsn string) {
	ctx := context.Background()
	s, err := Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`DROP INDEX netboot_leases_mac`,
		`ALTER TABLE netboot_leases DROP COLUMN offered`,
		`ALTER TABLE netboot_leases DROP COLUMN approved`,
		`ALTER TABLE netboot_leases DROP COLUMN server`,
		// The later migrations go too, so that reopening applies 6 again.
		`DROP TABLE shard_sessions`,
		`DROP TABLE node_leases`,
		`ALTER TABLE replicas DROP COLUMN node_urls`,
		`ALTER TABLE replicas DROP COLUMN tls_pin`,
		`DELETE FROM schema_migrations WHERE version >= 6`,
		`INSERT INTO netboot_leases (ip, mac, expiry, declined) VALUES
			('10.0.0.1', 'aa', 100, 0), ('10.0.0.2', 'aa', 200, 0),
			('10.0.0.3', 'bb', 300, 0), ('10.0.0.4', 'bb', 300, 0),
			('10.0.0.5', '', 50, 1), ('10.0.0.6', '', 50, 1), ('10.0.0.7', 'cc', 10, 0)`,
	} {
		if _, err := s.DB().ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	s.Close()
	s = openDSN(t, dsn)
	rows, err := s.DB().QueryContext(ctx, `SELECT ip, mac FROM netboot_leases ORDER BY ip`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var ip, mac string
		rows.Scan(&ip, &mac)
		got = append(got, ip+"="+mac)
	}
	want := "10.0.0.2=aa 10.0.0.4=bb 10.0.0.5= 10.0.0.6= 10.0.0.7=cc"
	if strings.Join(got, " ") != want {
		t.Fatalf("after migration 6: %v, want %s", got, want)
	}
}
