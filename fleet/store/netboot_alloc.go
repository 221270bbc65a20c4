package store

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"time"

	"github.com/discord-pxe/dpxe/fleet/netboot/inventory"
)

// Shared DHCP leases (issue 20): several `dpxe serve` replicas answer DHCP
// on one boot network from one database. Each offer and each binding is
// one transaction that reads the lease table, picks an address and writes
// it with an upsert that holds only if the address is still free for the
// MAC on the database's clock; the table's primary key on the address and
// a unique index on the MAC (migration 6) do the rest. Two servers can
// therefore never hand out one address, and a client may renew at any of
// them.

// schemaLeases is migration 6. A MAC holds at most one row (the unique
// index; rows of declined addresses have mac ”), so duplicates an older
// dpxe could leave (a MAC bound again elsewhere after a reservation was
// added) are dropped first, keeping the row that lasts longest. offered
// marks an offer not yet bound, approved whether the inventory approved
// the MAC (the unapproved cap counts the others), server the address of
// the server that wrote the row.
const schemaLeases = `
DELETE FROM netboot_leases WHERE mac <> '' AND EXISTS (
	SELECT 1 FROM netboot_leases o WHERE o.mac = netboot_leases.mac AND
		(o.expiry > netboot_leases.expiry OR (o.expiry = netboot_leases.expiry AND o.ip > netboot_leases.ip)));
ALTER TABLE netboot_leases ADD COLUMN offered INTEGER NOT NULL DEFAULT 0;
ALTER TABLE netboot_leases ADD COLUMN approved INTEGER NOT NULL DEFAULT 1;
ALTER TABLE netboot_leases ADD COLUMN server TEXT NOT NULL DEFAULT '';
CREATE UNIQUE INDEX netboot_leases_mac ON netboot_leases (mac) WHERE mac <> '';
`

// pgLeaseCapLock is the advisory-lock key that serializes allocations to
// unapproved MACs on PostgreSQL ("dpxl" in ASCII), so that their count
// and their insert cannot interleave across replicas. Approved MACs do not
// take it: the address's own row decides for them.
const pgLeaseCapLock = 0x6470786c

// allocAttempts bounds the retries of an allocation that lost a race to
// another server (its conditional write matched nothing, or a unique
// index refused it).
const allocAttempts = 16

// errLostRace is an allocation attempt that another transaction beat.
var errLostRace = errors.New("store: lease allocation lost a race")

var _ inventory.LeaseAllocator = (*NetbootInventory)(nil)

// leaseRow is one row of netboot_leases as an allocation reads it.
type leaseRow struct {
	mac      string
	expiry   int64 // Unix ms
	declined bool
	offered  bool
	approved bool
}

func checkAllocation(a inventory.Allocation) error {
	switch {
	case len(a.MAC) != 6:
		return fmt.Errorf("store: allocation: MAC %q is not 6 bytes", a.MAC)
	case !a.Start.Is4() || !a.End.Is4() || a.End.Less(a.Start):
		return fmt.Errorf("store: allocation: pool %s-%s is not an IPv4 range", a.Start, a.End)
	case !a.Prefix.IsValid() || !a.Prefix.Contains(a.Start) || !a.Prefix.Contains(a.End):
		return fmt.Errorf("store: allocation: prefix %s does not hold the pool %s-%s", a.Prefix, a.Start, a.End)
	case a.For < time.Second:
		return fmt.Errorf("store: allocation: duration %v under 1s", a.For)
	case !a.Approved && a.MaxUnapproved < 1:
		return fmt.Errorf("store: allocation: MaxUnapproved %d for an unapproved MAC", a.MaxUnapproved)
	}
	return nil
}

// Offer implements inventory.LeaseAllocator.
func (n *NetbootInventory) Offer(ctx context.Context, a inventory.Allocation) (netip.Addr, error) {
	if err := checkAllocation(a); err != nil {
		return netip.Addr{}, err
	}
	for i := 0; ; i++ {
		ip, _, err := n.allocate(ctx, a, netip.Addr{}, i)
		if errors.Is(err, errLostRace) && i < allocAttempts {
			continue
		}
		if err != nil && !errors.Is(err, inventory.ErrPoolExhausted) && !errors.Is(err, inventory.ErrUnapprovedCap) {
			err = fmt.Errorf("inventory offer to %s: %w", a.MAC, err)
		}
		return ip, err
	}
}

// Bind implements inventory.LeaseAllocator.
func (n *NetbootInventory) Bind(ctx context.Context, a inventory.Allocation, ip netip.Addr) (bool, error) {
	if err := checkAllocation(a); err != nil {
		return false, err
	}
	if !ip.Is4() {
		return false, nil
	}
	for i := 0; ; i++ {
		_, ok, err := n.allocate(ctx, a, ip, i)
		if errors.Is(err, errLostRace) && i < allocAttempts {
			continue
		}
		if err != nil && !errors.Is(err, inventory.ErrUnapprovedCap) {
			err = fmt.Errorf("inventory bind %s to %s: %w", ip, a.MAC, err)
		}
		return ok, err
	}
}

// allocate is attempt number attempt of Offer (bind invalid) or Bind (bind
// is the address asked for), in one transaction. It returns errLostRace
// when a concurrent transaction took the address or the MAC first.
func (n *NetbootInventory) allocate(ctx context.Context, a inventory.Allocation, bind netip.Addr, attempt int) (netip.Addr, bool, error) {
	s := n.s
	t, err := s.begin(ctx)
	if err != nil {
		return netip.Addr{}, false, err
	}
	defer t.Rollback()
	key := inventory.MACKey(a.MAC)
	_, reserved := reservationOf(a, key)
	if s.dialect == dialectPostgres && !a.Approved && !reserved {
		if _, err := t.exec(ctx, `SELECT pg_advisory_xact_lock(?)`, int64(pgLeaseCapLock)); err != nil {
			return netip.Addr{}, false, err
		}
	}
	var now int64
	if err := t.QueryRowContext(ctx, `SELECT `+s.dbNowMS()).Scan(&now); err != nil {
		return netip.Addr{}, false, err
	}
	rows, err := t.QueryContext(ctx, `SELECT ip, mac, expiry, declined, offered, approved FROM netboot_leases`)
	if err != nil {
		return netip.Addr{}, false, err
	}
	byIP := map[netip.Addr]leaseRow{}
	mine := netip.Addr{}
	for rows.Next() {
		var ipText string
		var r leaseRow
		var declined, offered, approved int64
		if err := rows.Scan(&ipText, &r.mac, &r.expiry, &declined, &offered, &approved); err != nil {
			rows.Close()
			return netip.Addr{}, false, err
		}
		ip, err := netip.ParseAddr(ipText)
		if err != nil {
			continue // not ours to judge; never handed out by this code
		}
		r.declined, r.offered, r.approved = declined != 0, offered != 0, approved != 0
		byIP[ip] = r
		if r.mac == key {
			mine = ip
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return netip.Addr{}, false, err
	}
	live := func(r leaseRow) bool { return r.expiry > now }
	if !a.Approved && !reserved {
		holds := mine.IsValid() && !byIP[mine].declined && live(byIP[mine])
		if !holds {
			count := 0
			for _, r := range byIP {
				if !r.approved && r.mac != "" && !r.declined && live(r) {
					count++
				}
			}
			if count >= a.MaxUnapproved {
				return netip.Addr{}, false, inventory.ErrUnapprovedCap
			}
		}
	}
	usable := func(ip netip.Addr) bool {
		if ip == a.Server || !a.Prefix.Contains(ip) {
			return false
		}
		if owner, ok := a.Reserved[ip]; ok {
			return owner == key
		}
		if ip.Less(a.Start) || a.End.Less(ip) {
			return false
		}
		r, ok := byIP[ip]
		return !ok || r.mac == key && !r.declined || !live(r)
	}
	ip, offered := bind, false
	if !ip.IsValid() {
		offered = true
		ip = pickAddress(a, key, mine, byIP, usable, attempt)
		if !ip.IsValid() {
			return netip.Addr{}, false, inventory.ErrPoolExhausted
		}
		if r, ok := byIP[ip]; ok && r.mac == key && !r.declined && !r.offered && live(r) {
			return ip, true, nil // already bound to this MAC: keep the binding
		}
	} else if !usable(ip) {
		return netip.Addr{}, false, nil
	}
	// A MAC holds one address: drop any other row it has.
	if _, err := t.exec(ctx, `DELETE FROM netboot_leases WHERE mac = ? AND ip <> ?`, key, ip.String()); err != nil {
		if isPostgresRetryable(err) {
			return netip.Addr{}, false, errLostRace
		}
		return netip.Addr{}, false, err
	}
	// The write holds only if the address is still free for this MAC when
	// it runs: no row, the MAC's own live row, or a row expired on the
	// database's clock. On PostgreSQL a conflicting insert waits for the
	// other transaction and then judges its committed row.
	res, err := t.exec(ctx, `INSERT INTO netboot_leases (ip, mac, expiry, declined, offered, approved, server)
		VALUES (?, ?, `+s.dbNowMS()+` + CAST(? AS BIGINT), 0, ?, ?, ?)
		ON CONFLICT (ip) DO UPDATE SET mac = excluded.mac, expiry = excluded.expiry, declined = 0,
			offered = excluded.offered, approved = excluded.approved, server = excluded.server
		WHERE (netboot_leases.mac = excluded.mac AND netboot_leases.declined = 0)
			OR netboot_leases.expiry <= `+s.dbNowMS(),
		ip.String(), key, a.For.Milliseconds(), b2i(offered), b2i(a.Approved || reserved), a.Server.String())
	if isConstraint(err, unique) || isPostgresRetryable(err) {
		return netip.Addr{}, false, errLostRace
	}
	if err != nil {
		return netip.Addr{}, false, err
	}
	if c, _ := res.RowsAffected(); c != 1 {
		return netip.Addr{}, false, errLostRace
	}
	if err := t.Commit(); err != nil {
		if isConstraint(err, unique) || isPostgresRetryable(err) {
			return netip.Addr{}, false, errLostRace
		}
		return netip.Addr{}, false, err
	}
	return ip, true, nil
}

// reservationOf returns the address reserved for the MAC key, if any.
func reservationOf(a inventory.Allocation, key string) (netip.Addr, bool) {
	for ip, mac := range a.Reserved {
		if mac == key {
			return ip, true
		}
	}
	return netip.Addr{}, false
}

// pickAddress chooses the address to offer: the MAC's reservation, its
// current address, the requested one, a never-used address, else an
// expired one. The search for a free address starts at a point of the
// pool given by the MAC and the attempt, not at its start: servers
// allocating to several MACs at once then rarely pick the same address,
// and one that lost a race tries elsewhere.
func pickAddress(a inventory.Allocation, key string, mine netip.Addr, byIP map[netip.Addr]leaseRow, usable func(netip.Addr) bool, attempt int) netip.Addr {
	if ip, ok := reservationOf(a, key); ok {
		return ip
	}
	if mine.IsValid() && usable(mine) {
		return mine
	}
	if a.Requested.IsValid() && usable(a.Requested) {
		return a.Requested
	}
	var expired netip.Addr
	size := be32(a.End) - be32(a.Start) + 1
	h := fnv.New32a()
	h.Write([]byte(key))
	first := (h.Sum32() + uint32(attempt)*7919) % size
	for k := uint32(0); k < size; k++ {
		ip := addrFrom32(be32(a.Start) + (first+k)%size)
		if !usable(ip) {
			continue
		}
		if _, used := byIP[ip]; !used {
			return ip
		}
		if !expired.IsValid() {
			expired = ip
		}
	}
	return expired
}

func be32(ip netip.Addr) uint32 {
	b := ip.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func addrFrom32(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// Decline implements inventory.LeaseAllocator.
func (n *NetbootInventory) Decline(ctx context.Context, mac net.HardwareAddr, ip netip.Addr, hold time.Duration) error {
	_, err := n.s.exec(ctx, `UPDATE netboot_leases SET mac = '', declined = 1, offered = 0,
		expiry = `+n.s.dbNowMS()+` + CAST(? AS BIGINT) WHERE ip = ? AND mac = ?`,
		hold.Milliseconds(), ip.String(), inventory.MACKey(mac))
	if err != nil {
		return fmt.Errorf("inventory decline %s by %s: %w", ip, mac, err)
	}
	return nil
}

// Release implements inventory.LeaseAllocator.
func (n *NetbootInventory) Release(ctx context.Context, mac net.HardwareAddr, ip netip.Addr) error {
	if _, err := n.s.exec(ctx, `DELETE FROM netboot_leases WHERE ip = ? AND mac = ?`, ip.String(), inventory.MACKey(mac)); err != nil {
		return fmt.Errorf("inventory release %s by %s: %w", ip, mac, err)
	}
	return nil
}

// ForgetOffer implements inventory.LeaseAllocator.
func (n *NetbootInventory) ForgetOffer(ctx context.Context, mac net.HardwareAddr, server netip.Addr) error {
	if _, err := n.s.exec(ctx, `DELETE FROM netboot_leases WHERE mac = ? AND offered = 1 AND server = ?`,
		inventory.MACKey(mac), server.String()); err != nil {
		return fmt.Errorf("inventory forget offer to %s: %w", mac, err)
	}
	return nil
}
