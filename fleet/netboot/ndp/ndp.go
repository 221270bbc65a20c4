// Package ndp answers IPv6 Router Solicitations on the boot network with a
// Router Advertisement that says "no IPv6 router here" (router lifetime 0,
// no prefixes, no DHCPv6 flags).
//
// Why: iPXE configures IPv4 and IPv6 in parallel and, on a network without
// an IPv6 router, waits about 15 s for a Router Advertisement before it
// fetches its script. That wait is most of a netboot on a fast network.
// With a lifetime of 0 the advertisement makes no host use us as a router
// (RFC 4861 §6.3.4), and it goes only to the host that asked, unicast.
package ndp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv6"
)

// RFC 4861 constants.
const (
	// hopLimitND is the hop limit every Neighbor Discovery message carries;
	// anything else was forwarded and must be ignored (§6.1.1, §6.1.2).
	hopLimitND = 255
	// raBodyLen is the Router Advertisement body after type, code and
	// checksum: hop limit, flags, router lifetime, reachable time,
	// retransmission timer (§4.2).
	raBodyLen = 12
	// rsMinLen is the smallest valid Router Solicitation (§6.1.1).
	rsMinLen = 8
)

// allRouters is the group Router Solicitations are sent to (RFC 4291).
var allRouters = net.ParseIP("ff02::2")

// ErrNoInterface is returned when the interface does not exist.
var ErrNoInterface = errors.New("ndp: no such interface")

// Responder answers Router Solicitations on one interface.
type Responder struct {
	Interface string
	Log       *slog.Logger
}

// IsSolicitation reports whether b (an ICMPv6 message) is a valid Router
// Solicitation as far as a responder cares: type 133, code 0, long enough.
func IsSolicitation(b []byte) bool {
	return len(b) >= rsMinLen && b[0] == byte(ipv6.ICMPTypeRouterSolicitation) && b[1] == 0
}

// Advertisement is the message sent in reply: router lifetime 0, no
// options. The kernel fills in the checksum on ICMPv6 sockets.
func Advertisement() []byte {
	m := icmp.Message{Type: ipv6.ICMPTypeRouterAdvertisement, Code: 0, Body: &icmp.RawBody{Data: make([]byte, raBodyLen)}}
	b, _ := m.Marshal(nil)
	return b
}

// Serve answers solicitations until ctx ends or the socket fails.
func (r *Responder) Serve(ctx context.Context) error {
	log := r.Log
	if log == nil {
		log = slog.Default()
	}
	ifi, err := net.InterfaceByName(r.Interface)
	if err != nil {
		return fmt.Errorf("%w: %s", ErrNoInterface, r.Interface)
	}
	c, err := icmp.ListenPacket("ip6:ipv6-icmp", "::")
	if err != nil {
		return fmt.Errorf("ndp: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	defer c.Close()
	p := c.IPv6PacketConn()
	if err := p.JoinGroup(ifi, &net.IPAddr{IP: allRouters}); err != nil {
		return fmt.Errorf("ndp: join all-routers on %s: %w", r.Interface, err)
	}
	if err := p.SetControlMessage(ipv6.FlagInterface|ipv6.FlagHopLimit, true); err != nil {
		return fmt.Errorf("ndp: %w", err)
	}
	var f ipv6.ICMPFilter
	f.SetAll(true)
	f.Accept(ipv6.ICMPTypeRouterSolicitation)
	if err := p.SetICMPFilter(&f); err != nil {
		return fmt.Errorf("ndp: %w", err)
	}
	ra := Advertisement()
	buf := make([]byte, 1500)
	for {
		n, cm, src, err := p.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("ndp: read: %w", err)
		}
		if cm == nil || cm.IfIndex != ifi.Index || cm.HopLimit != hopLimitND || !IsSolicitation(buf[:n]) {
			continue
		}
		ua, ok := src.(*net.IPAddr)
		if !ok || ua.IP.IsUnspecified() {
			// A solicitation from :: gets the multicast answer in RFC
			// 4861; we stay quiet rather than advertise to everyone.
			continue
		}
		wcm := &ipv6.ControlMessage{HopLimit: hopLimitND, IfIndex: ifi.Index}
		if _, err := p.WriteTo(ra, wcm, &net.IPAddr{IP: ua.IP, Zone: r.Interface}); err != nil {
			log.Debug("ndp: advertisement not sent", "to", ua.IP, "err", err)
			continue
		}
		log.Debug("ndp: answered router solicitation", "from", ua.IP)
	}
}
