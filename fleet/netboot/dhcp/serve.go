package dhcp

import (
	"context"
	"log/slog"
	"net"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"

	"github.com/discord-pxe/dpxe/fleet/netboot/stats"
)

// Listen opens a UDP socket for the DHCP server on port (ServerPort or
// PXEServerPort), bound to the interface ifname so broadcasts leave and
// arrive there only. It sets SO_REUSEADDR, so a site DHCP server on the same
// host (which usually sets it too) can share port 67 in proxy mode.
func Listen(ifname string, port int) (*net.UDPConn, error) {
	return server4.NewIPv4UDPConn(ifname, &net.UDPAddr{Port: port})
}

// MaxInFlight bounds the requests handled at once per socket; server4
// starts a goroutine per datagram, and a flood beyond this is dropped
// rather than queued (DHCP clients retransmit).
const MaxInFlight = 1024

// Serve answers the requests arriving on conn, which listens on port
// (ServerPort or PXEServerPort), until ctx ends or conn fails. Each request
// is handled in its own goroutine by server4, at most MaxInFlight at once.
// With Config.Stats set it counts each request server4 could parse (what
// does not parse is dropped before the handler sees it), each reply sent
// and its bytes, and each request left unanswered, by reason.
func (h *Handler) Serve(ctx context.Context, conn net.PacketConn, port int) error {
	sem := make(chan struct{}, MaxInFlight)
	st := h.cfg.Stats
	srv, err := server4.NewServer("", nil, func(c net.PacketConn, peer net.Addr, m *dhcpv4.DHCPv4) {
		st.Request(stats.DHCP)
		select {
		case sem <- struct{}{}:
			defer func() { <-sem }()
		default:
			st.Refuse(stats.DHCP, stats.Overload)
			return
		}
		r, why := h.reply(ctx, m, port)
		debug := h.log.Enabled(ctx, slog.LevelDebug)
		if r == nil {
			st.Refuse(stats.DHCP, why)
			if !debug {
				return
			}
			h.log.Debug("dhcp: no reply", "port", port, "from", peer, "type", m.MessageType(), "mac", m.ClientHWAddr.String())
			return
		}
		dst := destination(m, r, peer, port)
		if debug {
			h.log.Debug("dhcp: reply", "port", port, "from", peer, "type", m.MessageType(), "mac", m.ClientHWAddr.String(),
				"reply", r.MessageType(), "to", dst, "yiaddr", r.YourIPAddr, "file", r.BootFileName)
		}
		if n, err := c.WriteTo(r.ToBytes(), dst); err != nil {
			st.Error(stats.DHCP, 0)
			h.log.Warn("dhcp: sending reply failed", "to", dst, "type", r.MessageType(), "err", err)
		} else {
			st.Answer(stats.DHCP, int64(n))
		}
	}, server4.WithConn(conn))
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { srv.Close() })
	defer stop()
	err = srv.Serve()
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// destination picks where a reply goes (RFC 2131 §4.1): to the relay if
// there is one; on port 4011 back to the sender; to the client's address
// when it has one; otherwise broadcast, which every PXE ROM accepts.
func destination(req, reply *dhcpv4.DHCPv4, peer net.Addr, port int) net.Addr {
	switch {
	case port == PXEServerPort:
		return peer
	case !req.GatewayIPAddr.IsUnspecified() && req.GatewayIPAddr != nil:
		return &net.UDPAddr{IP: req.GatewayIPAddr, Port: ServerPort}
	case reply.MessageType() == dhcpv4.MessageTypeNak:
		return &net.UDPAddr{IP: net.IPv4bcast, Port: ClientPort}
	case !req.ClientIPAddr.IsUnspecified() && req.ClientIPAddr != nil:
		return &net.UDPAddr{IP: req.ClientIPAddr, Port: ClientPort}
	}
	return &net.UDPAddr{IP: net.IPv4bcast, Port: ClientPort}
}
