package netboot

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/discord-pxe/dpxe/fleet/netboot/httpboot"
	"github.com/discord-pxe/dpxe/fleet/netboot/inventory"
	"github.com/discord-pxe/dpxe/fleet/netboot/tftp"
	"github.com/discord-pxe/dpxe/fleet/security"
)

// trackerQueue bounds the inventory writes waiting to be stored. When the
// store falls behind, writes are dropped (and counted), never the packets.
const trackerQueue = 4096

// maxTickets bounds the outstanding boot tickets. Tickets are issued to
// approved MACs only, so this is far above any fleet's reboot burst.
const maxTickets = 4096

// enrollBinding is how long the address that claimed a ticket in proxy
// mode stays bound to its MAC (for the kernel download and TFTP steps of
// the timeline): until the machine's next DHCP exchange at the latest.
const enrollBinding = 30 * time.Minute

// trust is how far the services trust what they know of a client's
// address (docs/security.md).
type trust int

const (
	// trustLeases: authoritative DHCP. An address is bound to a MAC only
	// by this server's ACK; an approved MAC's script goes only to the
	// address just leased to it, once, within the window after the ACK.
	trustLeases trust = iota + 1
	// trustEnroll: proxy DHCP with the operator's opt-in. Addresses come
	// from the site's server and cannot be verified: within the window
	// after this server's proxy answer, the first fetch of an approved
	// MAC's script gets it, and its address is bound to the MAC.
	trustEnroll
	// trustNone: proxy DHCP without the opt-in, or no DHCP: no approved
	// machine's script carries a credential.
	trustNone
)

// binding is an address this server stands behind: leased by its DHCP,
// or (proxy mode, opted in) the one that claimed a MAC's boot ticket.
type binding struct {
	mac   net.HardwareAddr
	until time.Time
	how   string // "lease" or "enrollment"
}

// ticket is the right to fetch an approved MAC's enrollment script once,
// given by this server's DHCP answer to that MAC.
type ticket struct {
	ip netip.Addr // the leased address; invalid in proxy mode (any)
	at time.Time
}

// tracker connects the services to the inventory: it writes sightings and
// timeline events asynchronously, so a slow database never delays a DHCP
// reply; it keeps the address bindings the services trust, so TFTP and
// HTTP requests (which carry only an address) land on the right timeline;
// and it hands out boot tickets. It implements dhcp.Observer and
// httpboot.Recorder and is safe for concurrent use.
type tracker struct {
	inv      inventory.Inventory
	log      *slog.Logger
	q        chan func(context.Context) error
	dropped  atomic.Int64
	trust    trust
	window   time.Duration
	now      func() time.Time
	refusals *security.Log // counts new MACs not recorded (discovered cap)

	mu      sync.Mutex
	byIP    map[netip.Addr]binding
	byMAC   map[string]netip.Addr
	tickets map[string]ticket
}

func newTracker(inv inventory.Inventory, log *slog.Logger, tr trust, window time.Duration) *tracker {
	return &tracker{inv: inv, log: log, q: make(chan func(context.Context) error, trackerQueue),
		trust: tr, window: window, now: time.Now,
		byIP: map[netip.Addr]binding{}, byMAC: map[string]netip.Addr{}, tickets: map[string]ticket{}}
}

func (t *tracker) enqueue(f func(context.Context) error) {
	select {
	case t.q <- f:
	default:
		if t.dropped.Add(1)%1000 == 1 {
			t.log.Warn("netboot: inventory is slow; dropping timeline writes", "dropped", t.dropped.Load())
		}
	}
}

// run stores queued writes until ctx ends, then drains what is queued.
func (t *tracker) run(ctx context.Context) {
	do := func(f func(context.Context) error) {
		wctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := f(wctx)
		switch {
		case errors.Is(err, inventory.ErrDiscoveredFull):
			t.refusals.Refused(security.DiscoveredCap, "inventory",
				"netboot: not recording a new machine: the inventory holds its maximum of discovered ones; approve or ignore some")
		case err != nil:
			t.log.Error("netboot: inventory write failed", "err", err)
		}
	}
	for {
		select {
		case f := <-t.q:
			do(f)
		case <-ctx.Done():
			for {
				select {
				case f := <-t.q:
					do(f)
				default:
					return
				}
			}
		}
	}
}

// Sighting implements dhcp.Observer and httpboot.Recorder. It binds no
// address.
func (t *tracker) Sighting(s inventory.Sighting) {
	t.enqueue(func(ctx context.Context) error { return t.inv.Seen(ctx, s) })
}

// Event implements dhcp.Observer and httpboot.Recorder.
func (t *tracker) Event(e inventory.Event) {
	t.enqueue(func(ctx context.Context) error { return t.inv.Record(ctx, e) })
}

// bindLocked binds ip to mac, dropping mac's other binding and ip's
// binding to another MAC. Caller holds mu.
func (t *tracker) bindLocked(mac net.HardwareAddr, ip netip.Addr, until time.Time, how string) {
	key := inventory.MACKey(mac)
	if old, ok := t.byMAC[key]; ok && old != ip {
		delete(t.byIP, old)
	}
	if b, ok := t.byIP[ip]; ok {
		if other := inventory.MACKey(b.mac); other != key {
			delete(t.byMAC, other)
		}
	}
	t.byIP[ip] = binding{mac: mac, until: until, how: how}
	t.byMAC[key] = ip
}

// issueLocked gives mac a ticket for ip. Caller holds mu.
func (t *tracker) issueLocked(mac net.HardwareAddr, ip netip.Addr, now time.Time) {
	key := inventory.MACKey(mac)
	if _, ok := t.tickets[key]; !ok && len(t.tickets) >= maxTickets {
		for k, tk := range t.tickets {
			if now.Sub(tk.at) > t.window {
				delete(t.tickets, k)
			}
		}
		if len(t.tickets) >= maxTickets {
			t.log.Warn("netboot: too many boot tickets outstanding; this boot must try again", "mac", mac.String())
			return
		}
	}
	t.tickets[key] = ticket{ip: ip, at: now}
}

// Leased implements dhcp.Observer: the one source of trusted bindings in
// authoritative mode. An approved MAC also gets a ticket for ip.
func (t *tracker) Leased(mac net.HardwareAddr, ip netip.Addr, until time.Time, approved bool) {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.bindLocked(mac, ip, until, "lease")
	if approved && t.trust == trustLeases {
		t.issueLocked(mac, ip, now)
	}
}

// BootAnswered implements dhcp.Observer: in proxy mode with the opt-in,
// an approved MAC gets a ticket for whichever address fetches first.
func (t *tracker) BootAnswered(mac net.HardwareAddr, approved bool) {
	if !approved || t.trust != trustEnroll {
		return
	}
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.issueLocked(mac, netip.Addr{}, now)
}

// MACForIP implements httpboot.Recorder: the MAC bound to ip by a lease
// of this server or a claimed ticket, never by what a client claimed.
func (t *tracker) MACForIP(ip netip.Addr) (net.HardwareAddr, bool) {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	b, ok := t.byIP[ip]
	if !ok || !now.Before(b.until) {
		return nil, false
	}
	return b.mac, true
}

// VerifiesAddresses implements httpboot.Recorder: in authoritative mode
// every boot client's address is one this server leased.
func (t *tracker) VerifiesAddresses() bool { return t.trust == trustLeases }

// ClaimScript implements httpboot.Recorder (see trust).
func (t *tracker) ClaimScript(mac net.HardwareAddr, ip netip.Addr) error {
	now := t.now()
	key := inventory.MACKey(mac)
	t.mu.Lock()
	defer t.mu.Unlock()
	switch t.trust {
	case trustLeases:
		if b, ok := t.byIP[ip]; !ok || !now.Before(b.until) || inventory.MACKey(b.mac) != key {
			return fmt.Errorf("%w: %s is not leased to %s", httpboot.ErrNotLeased, ip, mac)
		}
	case trustEnroll:
	default:
		return httpboot.ErrEnrollOff
	}
	tk, ok := t.tickets[key]
	if !ok || now.Sub(tk.at) > t.window || tk.ip.IsValid() && tk.ip != ip {
		return fmt.Errorf("%w: no DHCP exchange with %s in the last %s, or its script was fetched already", httpboot.ErrNoTicket, mac, t.window)
	}
	delete(t.tickets, key)
	if t.trust == trustEnroll {
		t.bindLocked(mac, ip, now.Add(enrollBinding), "enrollment")
	}
	return nil
}

// transfer records a finished TFTP transfer on its client's timeline,
// when the client's address is bound.
func (t *tracker) transfer(tr tftp.Transfer) {
	mac, ok := t.MACForIP(tr.Client.Addr())
	if !ok {
		t.log.Info("netboot: TFTP transfer from an address this server did not lease", "client", tr.Client, "file", tr.File)
		return
	}
	detail := fmt.Sprintf("%s: %d bytes in %s", tr.File, tr.Bytes, tr.Duration.Round(time.Millisecond))
	if tr.Probe {
		detail = fmt.Sprintf("%s: size probe (client ended it after the option negotiation)", tr.File)
	} else if tr.Err != nil {
		detail = fmt.Sprintf("%s: failed after %d bytes: %v", tr.File, tr.Bytes, tr.Err)
	}
	t.Event(inventory.Event{MAC: mac, Stage: inventory.StageTFTPFile, Detail: detail, At: time.Now()})
}
