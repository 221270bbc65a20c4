package netboot

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/discord-pxe/dpxe/fleet/netboot/inventory"
	"github.com/discord-pxe/dpxe/fleet/netboot/tftp"
)

// trackerQueue bounds the inventory writes waiting to be stored. When the
// store falls behind, writes are dropped (and counted), never the packets.
const trackerQueue = 4096

// tracker connects the services to the inventory: it writes sightings and
// timeline events asynchronously, so a slow database never delays a DHCP
// reply, and it remembers which MAC uses which address, so TFTP and HTTP
// requests (which carry only an address) land on the right timeline.
type tracker struct {
	inv     inventory.Inventory
	log     *slog.Logger
	q       chan func(context.Context) error
	dropped atomic.Int64

	mu   sync.RWMutex
	byIP map[netip.Addr]net.HardwareAddr
}

func newTracker(inv inventory.Inventory, log *slog.Logger) *tracker {
	return &tracker{inv: inv, log: log, q: make(chan func(context.Context) error, trackerQueue),
		byIP: map[netip.Addr]net.HardwareAddr{}}
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
		if err := f(wctx); err != nil {
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

// Sighting implements dhcp.Observer and httpboot.Recorder.
func (t *tracker) Sighting(s inventory.Sighting) {
	if s.IP.IsValid() {
		t.Address(s.MAC, s.IP)
	}
	t.enqueue(func(ctx context.Context) error { return t.inv.Seen(ctx, s) })
}

// Event implements dhcp.Observer and httpboot.Recorder.
func (t *tracker) Event(e inventory.Event) {
	t.enqueue(func(ctx context.Context) error { return t.inv.Record(ctx, e) })
}

// Address implements dhcp.Observer.
func (t *tracker) Address(mac net.HardwareAddr, ip netip.Addr) {
	t.mu.Lock()
	t.byIP[ip] = mac
	t.mu.Unlock()
}

// MACForIP implements httpboot.Recorder.
func (t *tracker) MACForIP(ip netip.Addr) (net.HardwareAddr, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	m, ok := t.byIP[ip]
	return m, ok
}

// transfer records a finished TFTP transfer on its client's timeline.
func (t *tracker) transfer(tr tftp.Transfer) {
	mac, ok := t.MACForIP(tr.Client.Addr())
	if !ok {
		t.log.Info("netboot: TFTP transfer from an address DHCP did not see", "client", tr.Client, "file", tr.File)
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
