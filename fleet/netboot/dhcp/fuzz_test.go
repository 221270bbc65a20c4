package dhcp

import (
	"context"
	"net/netip"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// FuzzReply feeds arbitrary datagrams to both modes on both ports. The
// handler must not panic, must stay silent unless the datagram is a
// well-formed BOOTREQUEST with a message type, and must never give one
// address to two MACs.
func FuzzReply(f *testing.F) {
	for i, k := range []kind{plain, biosPXE, biosIPXE, uefi7, uefi9, uefiHTTP, script} {
		for _, typ := range []dhcpv4.MessageType{dhcpv4.MessageTypeDiscover, dhcpv4.MessageTypeRequest,
			dhcpv4.MessageTypeDecline, dhcpv4.MessageTypeRelease, dhcpv4.MessageTypeInform} {
			f.Add(msg(f, mac(byte(i+1)), typ, k, requested(netip.MustParseAddr("10.9.0.10"))).ToBytes(), uint8(i))
		}
	}
	f.Add([]byte{}, uint8(0))
	f.Add([]byte("\x01\x01\x06\x00garbage"), uint8(1))

	auth := authConfig("10.9.0.10-10.9.0.13/24")
	proxy := Config{Mode: Proxy, ServerIP: serverIP}
	f.Fuzz(func(t *testing.T, p []byte, sel uint8) {
		cfg := auth
		if sel&1 == 1 {
			cfg = proxy
		}
		port := ServerPort
		if sel&2 == 2 {
			port = PXEServerPort
		}
		h, _ := newHandler(t, cfg, nil)
		m, err := dhcpv4.FromBytes(p)
		if err != nil {
			return // server4 drops what does not parse
		}
		owner := map[netip.Addr]string{}
		// Twice, with a second MAC the second time, to exercise the table.
		for round := 0; round < 2; round++ {
			r := h.Reply(context.Background(), m, port)
			if r == nil {
				if round == 0 {
					continue
				}
				return
			}
			if !valid(m) {
				t.Fatalf("replied to an invalid request: %s", m.Summary())
			}
			if r.OpCode != dhcpv4.OpcodeBootReply || r.TransactionID != m.TransactionID {
				t.Fatalf("reply is not a BOOTREPLY to the request: %s", r.Summary())
			}
			if _, err := dhcpv4.FromBytes(r.ToBytes()); err != nil {
				t.Fatalf("reply does not parse: %v", err)
			}
			if ip := addr4(r.YourIPAddr); ip.IsValid() {
				if cfg.Mode == Proxy {
					t.Fatalf("proxy mode handed out %s", ip)
				}
				if !cfg.Pool.Contains(ip) {
					t.Fatalf("address %s outside the pool", ip)
				}
				if o, ok := owner[ip]; ok && o != m.ClientHWAddr.String() {
					t.Fatalf("%s given to %s and %s", ip, o, m.ClientHWAddr)
				}
				owner[ip] = m.ClientHWAddr.String()
			}
			if len(m.ClientHWAddr) == 6 {
				m.ClientHWAddr = append(m.ClientHWAddr[:5:5], m.ClientHWAddr[5]^0x55)
			}
		}
	})
}
