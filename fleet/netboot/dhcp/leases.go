package dhcp

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/discord-pxe/dpxe/fleet/netboot/inventory"
)

// OfferHold is how long an offered address stays set aside for the client
// it was offered to while it decides (RFC 2131 §4.3.1 leaves this local).
const OfferHold = 60 * time.Second

// DeclineHold is how long an address declined by a client (it found the
// address in use, RFC 2131 §4.3.3) is kept out of the pool.
const DeclineHold = 10 * time.Minute

type leaseState int

const (
	stateOffered leaseState = iota
	stateBound
	stateDeclined
)

type leaseEntry struct {
	mac      string // inventory.MACKey form; "" for declined
	state    leaseState
	expiry   time.Time
	approved bool // the inventory approved mac when it was offered or bound
}

// Errors of the lease table.
var (
	// ErrPoolExhausted: no address of the pool is free.
	ErrPoolExhausted = inventory.ErrPoolExhausted
	// ErrUnapprovedCap: the MAC is not approved and unapproved MACs
	// already hold Config.MaxUnapproved addresses.
	ErrUnapprovedCap = inventory.ErrUnapprovedCap
)

// leaseTable is the authoritative server's address book. Every method takes
// the lock, so an address can never be given to two clients: a decision and
// its bookkeeping happen under one lock.
//
// With shared set (Config.SharedLeases) the table keeps no lease in
// memory: every decision is a transaction of the shared database
// (inventory.LeaseAllocator), which several servers may use at once.
type leaseTable struct {
	shared     inventory.LeaseAllocator
	mu         sync.Mutex
	pool       Pool
	server     netip.Addr
	reserved   map[string]netip.Addr // MAC key → address
	reservedBy map[netip.Addr]string // address → MAC key
	byIP       map[netip.Addr]*leaseEntry
	byMAC      map[string]netip.Addr
	store      inventory.LeaseStore
	// maxUnapproved bounds the live entries (offered or bound) of MACs
	// that are not approved.
	maxUnapproved int
	// refusals counts requests refused for an exhausted pool.
	refusals atomic.Int64
}

func newLeaseTable(pool Pool, server netip.Addr, reservations map[string]netip.Addr, store inventory.LeaseStore, maxUnapproved int) *leaseTable {
	t := &leaseTable{
		pool: pool, server: server, store: store, maxUnapproved: maxUnapproved,
		reserved:   map[string]netip.Addr{},
		reservedBy: map[netip.Addr]string{},
		byIP:       map[netip.Addr]*leaseEntry{},
		byMAC:      map[string]netip.Addr{},
	}
	for mac, ip := range reservations {
		t.reserved[mac] = ip
		t.reservedBy[ip] = mac
	}
	return t
}

// load fills the table from the store (not with shared leases: the
// database holds them).
func (t *leaseTable) load(ctx context.Context) error {
	if t.store == nil || t.shared != nil {
		return nil
	}
	ls, err := t.store.Leases(ctx)
	if err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, l := range ls {
		// Whether a stored lease's MAC was approved is not stored; it
		// counts as approved until the client renews (unapproved leases
		// are short, so this lasts minutes).
		e := &leaseEntry{state: stateBound, expiry: l.Expiry, approved: true}
		if l.Declined || l.MAC == nil {
			e.state = stateDeclined
		} else {
			e.mac = inventory.MACKey(l.MAC)
			t.byMAC[e.mac] = l.IP
		}
		t.byIP[l.IP] = e
	}
	return nil
}

// usableBy reports whether ip may go to mac now. Caller holds mu.
func (t *leaseTable) usableBy(ip netip.Addr, mac string, now time.Time) bool {
	if ip == t.server || !t.pool.Prefix.Contains(ip) {
		return false
	}
	if owner, ok := t.reservedBy[ip]; ok {
		return owner == mac
	}
	if !t.pool.Contains(ip) {
		return false
	}
	e := t.byIP[ip]
	return e == nil || e.mac == mac && e.state != stateDeclined || now.After(e.expiry)
}

// holdsLocked reports whether mac has a live entry (offered or bound)
// now. Caller holds mu.
func (t *leaseTable) holdsLocked(mac string, now time.Time) bool {
	ip, ok := t.byMAC[mac]
	if !ok {
		return false
	}
	e := t.byIP[ip]
	return e != nil && e.mac == mac && e.state != stateDeclined && now.Before(e.expiry)
}

// capFullLocked reports whether a MAC that is not approved and holds no
// address may not get one: unapproved MACs hold maxUnapproved live
// entries. Caller holds mu.
func (t *leaseTable) capFullLocked(now time.Time) bool {
	n := 0
	for _, e := range t.byIP {
		if !e.approved && e.mac != "" && e.state != stateDeclined && now.Before(e.expiry) {
			n++
		}
	}
	return n >= t.maxUnapproved
}

// offer picks an address for mac and sets it aside for OfferHold. It
// returns ErrPoolExhausted, or ErrUnapprovedCap for an unapproved MAC
// beyond the cap.
func (t *leaseTable) offer(ctx context.Context, mac string, hw net.HardwareAddr, requested netip.Addr, now time.Time, approved bool) (netip.Addr, error) {
	if t.shared != nil {
		return t.shared.Offer(ctx, t.allocation(hw, requested, OfferHold, approved))
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, reserved := t.reserved[mac]; !approved && !reserved && !t.holdsLocked(mac, now) && t.capFullLocked(now) {
		return netip.Addr{}, ErrUnapprovedCap
	}
	ip, ok := t.pick(mac, requested, now)
	if !ok {
		return netip.Addr{}, ErrPoolExhausted
	}
	if e := t.byIP[ip]; e != nil && e.mac == mac && e.state == stateBound && now.Before(e.expiry) {
		return ip, nil // already bound to this client: keep the binding
	}
	t.setEntry(ip, &leaseEntry{mac: mac, state: stateOffered, expiry: now.Add(OfferHold), approved: approved})
	return ip, nil
}

// pick chooses an address for mac. Caller holds mu.
func (t *leaseTable) pick(mac string, requested netip.Addr, now time.Time) (netip.Addr, bool) {
	if ip, ok := t.reserved[mac]; ok {
		return ip, true
	}
	if ip, ok := t.byMAC[mac]; ok && t.usableBy(ip, mac, now) {
		return ip, true
	}
	if requested.IsValid() && t.usableBy(requested, mac, now) {
		return requested, true
	}
	// Never-used addresses first, so a client coming back after its lease
	// expired still finds its old address most of the time.
	var expired netip.Addr
	for ip := t.pool.Start; t.pool.Contains(ip); ip = ip.Next() {
		if !t.usableBy(ip, mac, now) {
			continue
		}
		if t.byIP[ip] == nil {
			return ip, true
		}
		if !expired.IsValid() {
			expired = ip
		}
	}
	return expired, expired.IsValid()
}

func (t *leaseTable) setEntry(ip netip.Addr, e *leaseEntry) {
	if old := t.byIP[ip]; old != nil && old.mac != "" && t.byMAC[old.mac] == ip {
		delete(t.byMAC, old.mac)
	}
	t.byIP[ip] = e
	if e.mac != "" {
		t.byMAC[e.mac] = ip
	}
}

// bind makes ip mac's lease until now+d and persists it. It returns false
// when ip may not go to mac (the server answers DHCPNAK), and
// ErrUnapprovedCap for an unapproved MAC holding nothing beyond the cap.
func (t *leaseTable) bind(ctx context.Context, mac string, hw net.HardwareAddr, ip netip.Addr, d time.Duration, now time.Time, approved bool) (bool, error) {
	if t.shared != nil {
		return t.shared.Bind(ctx, t.allocation(hw, netip.Addr{}, d, approved), ip)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.usableBy(ip, mac, now) {
		return false, nil
	}
	if _, reserved := t.reserved[mac]; !approved && !reserved && !t.holdsLocked(mac, now) && t.capFullLocked(now) {
		return false, ErrUnapprovedCap
	}
	// A client holds one address: drop any other binding it had.
	if old, ok := t.byMAC[mac]; ok && old != ip {
		delete(t.byIP, old)
		delete(t.byMAC, mac)
		if t.store != nil {
			if err := t.store.DeleteLease(ctx, old); err != nil {
				return false, err
			}
		}
	}
	e := &leaseEntry{mac: mac, state: stateBound, expiry: now.Add(d), approved: approved}
	if t.store != nil {
		if err := t.store.PutLease(ctx, inventory.Lease{IP: ip, MAC: hw, Expiry: e.expiry}); err != nil {
			return false, err
		}
	}
	t.setEntry(ip, e)
	return true, nil
}

// decline takes ip out of service for DeclineHold if mac held it.
func (t *leaseTable) decline(ctx context.Context, mac string, hw net.HardwareAddr, ip netip.Addr, now time.Time) error {
	if t.shared != nil {
		return t.shared.Decline(ctx, hw, ip, DeclineHold)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.byIP[ip]
	if e == nil || e.mac != mac {
		return nil
	}
	d := &leaseEntry{state: stateDeclined, expiry: now.Add(DeclineHold)}
	t.setEntry(ip, d)
	if t.store != nil {
		return t.store.PutLease(ctx, inventory.Lease{IP: ip, Declined: true, Expiry: d.expiry})
	}
	return nil
}

// release frees ip if mac held it.
func (t *leaseTable) release(ctx context.Context, mac string, hw net.HardwareAddr, ip netip.Addr) error {
	if t.shared != nil {
		return t.shared.Release(ctx, hw, ip)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.byIP[ip]
	if e == nil || e.mac != mac {
		return nil
	}
	delete(t.byIP, ip)
	delete(t.byMAC, mac)
	if t.store != nil {
		return t.store.DeleteLease(ctx, ip)
	}
	return nil
}

// forgetOffer drops an outstanding offer to mac (it chose another server).
func (t *leaseTable) forgetOffer(ctx context.Context, mac string, hw net.HardwareAddr) error {
	if t.shared != nil {
		return t.shared.ForgetOffer(ctx, hw, t.server)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if ip, ok := t.byMAC[mac]; ok {
		if e := t.byIP[ip]; e != nil && e.state == stateOffered {
			delete(t.byIP, ip)
			delete(t.byMAC, mac)
		}
	}
	return nil
}

// allocation describes a request to the shared allocator.
func (t *leaseTable) allocation(hw net.HardwareAddr, requested netip.Addr, d time.Duration, approved bool) inventory.Allocation {
	return inventory.Allocation{
		MAC: hw, Requested: requested,
		Start: t.pool.Start, End: t.pool.End, Prefix: t.pool.Prefix, Server: t.server,
		Reserved: t.reservedBy, Approved: approved, MaxUnapproved: t.maxUnapproved, For: d,
	}
}
