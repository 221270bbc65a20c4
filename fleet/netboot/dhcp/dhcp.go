// Package dhcp is the DHCPv4 service of the netboot server, in two modes:
// Proxy answers only PXE clients, with boot information and no address,
// next to a site's own DHCP server (including the PXE port-4011 exchange);
// Authoritative runs its own pool with reservations and persisted leases.
//
// Handler.Reply is the whole decision, a function of the request and the
// lease table, so it is tested and fuzzed without sockets; Serve puts it on
// the wire with insomniacslk/dhcp's server4.
package dhcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"

	"github.com/discord-pxe/dpxe/fleet/netboot/inventory"
	"github.com/discord-pxe/dpxe/fleet/netboot/stats"
	"github.com/discord-pxe/dpxe/fleet/security"
)

// Mode selects how the server takes part in DHCP.
type Mode int

const (
	// Proxy: ProxyDHCP (PXE spec 2.1 §2.2.5): boot information only.
	Proxy Mode = iota + 1
	// Authoritative: the server owns the pool and hands out addresses.
	Authoritative
)

// ParseMode parses "proxy" or "authoritative".
func ParseMode(s string) (Mode, error) {
	switch s {
	case "proxy":
		return Proxy, nil
	case "authoritative":
		return Authoritative, nil
	}
	return 0, fmt.Errorf("dhcp: mode %q: want proxy or authoritative", s)
}

func (m Mode) String() string {
	switch m {
	case Proxy:
		return "proxy"
	case Authoritative:
		return "authoritative"
	case 0:
		return "off"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Ports (RFC 2131 §4.1; PXE spec 2.1 §2.2.6 for the boot server port).
const (
	ServerPort    = 67
	ClientPort    = 68
	PXEServerPort = 4011
)

// Vendor classes (option 60) of boot clients (PXE spec 2.1 §2.2.1; UEFI
// 2.x §24.7 HTTP boot).
const (
	ClassPXE  = "PXEClient"
	ClassHTTP = "HTTPClient"
)

// UserClassScript is the user class (option 77) our iPXE script sets, so
// a chained iPXE that runs DHCP again is recognised even if it does not
// send "iPXE" (the chainload loop cannot start).
const UserClassScript = "dpxe"

// userClassIPXE is what stock iPXE sends in option 77.
const userClassIPXE = "iPXE"

// pxeDiscoveryControl is PXE vendor sub-option 6 (PXE spec 2.1 table
// 2-1); the value 8 means "boot the file named in this reply, skip boot
// server discovery".
var pxeDiscoveryControl = []byte{6, 1, 8, 255}

// DefaultLeaseTime is the lease length when Config.LeaseTime is zero.
const DefaultLeaseTime = time.Hour

// DefaultUnapprovedLeaseTime is the lease length of a MAC the inventory
// does not approve, when Config.UnapprovedLeaseTime is zero: long enough
// for a machine waiting for approval (its iPXE script asks again every
// 15 s and runs DHCP again each time), short enough that made-up MACs
// give their addresses back soon.
const DefaultUnapprovedLeaseTime = 2 * time.Minute

// Boot names the files each firmware class is sent to.
type Boot struct {
	BIOSFile string // TFTP file for option 93 = 0; default undionly.kpxe
	UEFIFile string // TFTP file for option 93 = 7 or 9; default ipxe.efi (or snponly.efi)
	// HTTPBase is the HTTP boot server, e.g. http://10.0.0.1:8080. iPXE
	// gets HTTPBase/boot/<mac>.ipxe; UEFI HTTP boot (93 = 16) gets
	// HTTPBase/boot/<UEFIFile>.
	HTTPBase string
}

// ScriptURL is the iPXE script URL of mac.
func (b Boot) ScriptURL(mac net.HardwareAddr) string {
	return strings.TrimRight(b.HTTPBase, "/") + "/boot/" + inventory.MACKey(mac) + ".ipxe"
}

// Config configures a Handler.
type Config struct {
	Mode     Mode
	ServerIP netip.Addr // our address on the boot network: option 54, siaddr
	// Authoritative mode only:
	Pool         Pool
	Router       []netip.Addr
	DNS          []netip.Addr
	LeaseTime    time.Duration         // 0 means DefaultLeaseTime
	Reservations map[string]netip.Addr // static addresses by MAC (any form ParseMAC accepts)
	// Approved reports whether the inventory approves mac. In
	// authoritative mode a MAC it does not approve (a discovered machine,
	// a plain DHCP client, a made-up MAC) is leased for
	// UnapprovedLeaseTime only, and such MACs hold at most MaxUnapproved
	// addresses (offered or bound) between them, so a flood of made-up
	// MACs cannot take the addresses approved machines need. Reserved
	// MACs count as approved. Nil approves every MAC (no cap). It must
	// be fast: it is asked once per request.
	Approved            func(ctx context.Context, mac net.HardwareAddr) bool
	UnapprovedLeaseTime time.Duration // 0 means DefaultUnapprovedLeaseTime
	// SharedLeases allocates every address in the lease store's database,
	// which must implement inventory.LeaseAllocator: each offer and each
	// binding is one transaction timed by the database's clock, and the
	// database keeps an address from going to two MACs, so several
	// servers (controller replicas) may serve one pool from one database
	// and a client may renew at any of them. The server then keeps no
	// lease in memory.
	SharedLeases  bool
	MaxUnapproved int // 0 means half the pool's addresses (at least 1)
	Boot          Boot
	// Refusals counts clients refused for the unapproved cap
	// (security.DHCPUnapproved) and logs them, rate-limited; nil makes
	// one over the handler's logger.
	Refusals *security.Log
	// Stats, when set, counts requests, replies and requests left
	// unanswered, by reason (Serve).
	Stats *stats.Counters
}

// Observer receives what the handler learns, for the boot timeline and for
// mapping a TFTP or HTTP client address back to its MAC. Its methods must
// not block.
//
// Only Leased carries an address binding the netboot services may trust:
// an address this server leased. Nothing a client claims (ciaddr of a
// port-4011 request, option 50) ever binds an address to a MAC.
type Observer interface {
	// Sighting reports a boot client.
	Sighting(inventory.Sighting)
	// Event reports a timeline step.
	Event(inventory.Event)
	// Leased reports that this server bound ip to mac until the given
	// time (an ACK in authoritative mode); approved is Config.Approved's
	// answer for mac.
	Leased(mac net.HardwareAddr, ip netip.Addr, until time.Time, approved bool)
	// BootAnswered reports that the boot client mac got boot information
	// without an address (a proxy offer, a port-4011 answer in proxy
	// mode): nothing about its address is known.
	BootAnswered(mac net.HardwareAddr, approved bool)
}

// Handler answers DHCP requests. It is safe for concurrent use.
type Handler struct {
	cfg    Config
	leases *leaseTable
	obs    Observer
	log    *slog.Logger
	now    func() time.Time
}

// New checks cfg and returns a Handler; in authoritative mode it loads the
// leases from store (which may be nil to keep leases in memory only).
func New(ctx context.Context, cfg Config, store inventory.LeaseStore, obs Observer, log *slog.Logger) (*Handler, error) {
	if log == nil {
		log = slog.Default()
	}
	if !cfg.ServerIP.Is4() {
		return nil, errors.New("dhcp: server IP must be an IPv4 address")
	}
	if cfg.Boot.BIOSFile == "" {
		cfg.Boot.BIOSFile = "undionly.kpxe"
	}
	if cfg.Boot.UEFIFile == "" {
		cfg.Boot.UEFIFile = "ipxe.efi"
	}
	if cfg.Boot.HTTPBase == "" {
		cfg.Boot.HTTPBase = "http://" + cfg.ServerIP.String()
	}
	if cfg.LeaseTime <= 0 {
		cfg.LeaseTime = DefaultLeaseTime
	}
	if cfg.Refusals == nil {
		cfg.Refusals = security.New(log)
	}
	if cfg.UnapprovedLeaseTime <= 0 {
		cfg.UnapprovedLeaseTime = min(DefaultUnapprovedLeaseTime, cfg.LeaseTime)
	}
	h := &Handler{cfg: cfg, obs: obs, log: log, now: time.Now}
	switch cfg.Mode {
	case Proxy:
	case Authoritative:
		if !cfg.Pool.Start.IsValid() {
			return nil, errors.New("dhcp: authoritative mode needs a pool")
		}
		if !cfg.Pool.Prefix.Contains(cfg.ServerIP) {
			return nil, fmt.Errorf("dhcp: server IP %s is outside the pool's subnet %s", cfg.ServerIP, cfg.Pool.Prefix)
		}
		res := map[string]netip.Addr{}
		taken := map[netip.Addr]string{}
		for m, ip := range cfg.Reservations {
			hw, err := inventory.ParseMAC(m)
			if err != nil {
				return nil, fmt.Errorf("dhcp: reservation %q: %w", m, err)
			}
			if !cfg.Pool.Prefix.Contains(ip) || ip == cfg.ServerIP {
				return nil, fmt.Errorf("dhcp: reservation %s → %s: not a usable address in %s", m, ip, cfg.Pool.Prefix)
			}
			if other, dup := taken[ip]; dup {
				return nil, fmt.Errorf("dhcp: %s reserved for both %s and %s", ip, other, m)
			}
			taken[ip] = m
			res[inventory.MACKey(hw)] = ip
		}
		if cfg.MaxUnapproved <= 0 {
			cfg.MaxUnapproved = max(cfg.Pool.Size()/2, 1)
		}
		h.cfg.MaxUnapproved = cfg.MaxUnapproved
		h.leases = newLeaseTable(cfg.Pool, cfg.ServerIP, res, store, cfg.MaxUnapproved)
		if cfg.SharedLeases {
			alloc, ok := store.(inventory.LeaseAllocator)
			if !ok {
				return nil, errors.New("dhcp: shared leases need a lease store that allocates addresses (inventory.LeaseAllocator)")
			}
			h.leases.shared = alloc
		}
		if err := h.leases.load(ctx); err != nil {
			return nil, fmt.Errorf("dhcp: loading leases: %w", err)
		}
	default:
		return nil, fmt.Errorf("dhcp: unknown mode %d", cfg.Mode)
	}
	return h, nil
}

// client is what the handler reads from a request.
type client struct {
	mac      net.HardwareAddr
	key      string
	boot     bool   // a PXE, HTTP boot or iPXE client
	class    string // ClassPXE or ClassHTTP, to echo in option 60
	fw       inventory.Firmware
	arch     iana.Arch
	hasArch  bool
	ipxe     bool
	file     string // boot file or URL; "" when the firmware is unsupported
	tftpFile bool   // file is served over TFTP
}

// classify reads the firmware class of m (option 60, 77, 93, 175) and
// chooses its boot file.
func (h *Handler) classify(m *dhcpv4.DHCPv4) client {
	c := client{mac: m.ClientHWAddr, key: inventory.MACKey(m.ClientHWAddr), fw: inventory.FirmwareUnknown}
	vc := m.ClassIdentifier()
	switch {
	case strings.HasPrefix(vc, ClassPXE):
		c.class = ClassPXE
	case strings.HasPrefix(vc, ClassHTTP):
		c.class = ClassHTTP
	}
	for _, uc := range m.UserClass() {
		if uc == userClassIPXE || uc == UserClassScript {
			c.ipxe = true
		}
	}
	if m.Options.Has(dhcpv4.OptionEtherboot) {
		c.ipxe = true
	}
	if archs := m.ClientArch(); len(archs) > 0 {
		c.arch, c.hasArch = archs[0], true
	}
	c.boot = c.class != "" || c.ipxe
	if !c.boot {
		return c
	}
	switch {
	case c.ipxe:
		c.fw, c.file = inventory.FirmwareIPXE, h.cfg.Boot.ScriptURL(c.mac)
	case !c.hasArch:
		// A PXE client without option 93 is a broken ROM; no boot info.
	case c.arch == iana.INTEL_X86PC:
		c.fw, c.file, c.tftpFile = inventory.FirmwareBIOS, h.cfg.Boot.BIOSFile, true
	case c.arch == iana.EFI_X86_64 || c.arch == iana.EFI_BC:
		// RFC 4578 assigned 7 to "EFI BC" and 9 to "EFI x86-64"; errata
		// 4624 swapped them. Both mean x64 UEFI in the wild.
		c.fw, c.file, c.tftpFile = inventory.FirmwareUEFI, h.cfg.Boot.UEFIFile, true
	case c.arch == iana.EFI_X86_64_HTTP:
		c.fw = inventory.FirmwareUEFIHTTP
		c.class = ClassHTTP
		c.file = strings.TrimRight(h.cfg.Boot.HTTPBase, "/") + "/boot/" + h.cfg.Boot.UEFIFile
	}
	return c
}

// valid reports whether m is a request worth answering at all: a
// BOOTREQUEST from an Ethernet client with a message type.
func valid(m *dhcpv4.DHCPv4) bool {
	return m.OpCode == dhcpv4.OpcodeBootRequest && m.HWType == iana.HWTypeEthernet &&
		len(m.ClientHWAddr) == 6 && m.Options.Has(dhcpv4.OptionDHCPMessageType) &&
		!isZeroMAC(m.ClientHWAddr) && m.ClientHWAddr[0]&1 == 0
}

func isZeroMAC(hw net.HardwareAddr) bool {
	for _, b := range hw {
		if b != 0 {
			return false
		}
	}
	return true
}

func addr4(ip net.IP) netip.Addr {
	a, ok := netip.AddrFromSlice(ip.To4())
	if !ok || a.IsUnspecified() {
		return netip.Addr{}
	}
	return a
}

func stdIP(a netip.Addr) net.IP { return net.IP(a.AsSlice()) }

func stdIPs(as []netip.Addr) []net.IP {
	out := make([]net.IP, len(as))
	for i, a := range as {
		out[i] = stdIP(a)
	}
	return out
}

// Reply decides the answer to m, received on port (ServerPort or
// PXEServerPort). It returns nil when the server must stay silent.
func (h *Handler) Reply(ctx context.Context, m *dhcpv4.DHCPv4, port int) *dhcpv4.DHCPv4 {
	r, _ := h.reply(ctx, m, port)
	return r
}

// reply is Reply with, when it stays silent, the reason (a stats reason).
func (h *Handler) reply(ctx context.Context, m *dhcpv4.DHCPv4, port int) (*dhcpv4.DHCPv4, string) {
	if !valid(m) {
		return nil, stats.Invalid
	}
	c := h.classify(m)
	var r *dhcpv4.DHCPv4
	switch {
	case port == PXEServerPort:
		r = h.replyPXE(ctx, m, c)
	case h.cfg.Mode == Proxy:
		r = h.replyProxy(ctx, m, c)
	default:
		var noAddress bool
		if r, noAddress = h.replyAuthoritative(ctx, m, c); noAddress {
			return nil, stats.NoAddress
		}
	}
	if r == nil {
		return nil, stats.Unanswered
	}
	return r, ""
}

// bootMods adds the boot information for c to a reply.
func (h *Handler) bootMods(c client, proxy bool) []dhcpv4.Modifier {
	if !c.boot || c.file == "" {
		return nil
	}
	mods := []dhcpv4.Modifier{
		dhcpv4.WithServerIP(stdIP(h.cfg.ServerIP)),
		func(d *dhcpv4.DHCPv4) { d.BootFileName = c.file },
	}
	if c.class != "" {
		mods = append(mods, dhcpv4.WithOption(dhcpv4.OptClassIdentifier(c.class)))
	}
	if c.tftpFile {
		mods = append(mods, dhcpv4.WithOption(dhcpv4.OptTFTPServerName(h.cfg.ServerIP.String())))
	}
	if c.class == ClassPXE && (c.fw == inventory.FirmwareBIOS || proxy && c.fw == inventory.FirmwareIPXE) {
		mods = append(mods, dhcpv4.WithGeneric(dhcpv4.OptionVendorSpecificInformation, pxeDiscoveryControl))
	}
	return mods
}

func (h *Handler) record(c client, stage inventory.Stage, detail string, ip netip.Addr) {
	if h.obs == nil || !c.boot {
		return
	}
	now := h.now()
	h.obs.Sighting(inventory.Sighting{MAC: c.mac, Firmware: c.fw, IP: ip, At: now})
	h.obs.Event(inventory.Event{MAC: c.mac, Stage: stage, Detail: detail, At: now})
}

// approved asks Config.Approved about c; a reserved MAC is approved.
func (h *Handler) approved(ctx context.Context, c client) bool {
	if h.cfg.Approved == nil {
		return true
	}
	if h.leases != nil {
		if _, ok := h.leases.reserved[c.key]; ok { // set once by New, read-only after
			return true
		}
	}
	return h.cfg.Approved(ctx, c.mac)
}

// leaseTime is the lease length for a MAC.
func (h *Handler) leaseTime(approved bool) time.Duration {
	if approved {
		return h.cfg.LeaseTime
	}
	return h.cfg.UnapprovedLeaseTime
}

// bootAnswered tells the observer that boot client c got boot
// information without an address.
func (h *Handler) bootAnswered(ctx context.Context, c client) {
	if h.obs != nil && c.boot {
		h.obs.BootAnswered(c.mac, h.approved(ctx, c))
	}
}

// replyProxy answers a ProxyDHCP DISCOVER on port 67: boot clients only,
// no address.
func (h *Handler) replyProxy(ctx context.Context, m *dhcpv4.DHCPv4, c client) *dhcpv4.DHCPv4 {
	if m.MessageType() != dhcpv4.MessageTypeDiscover || !c.boot || c.class == "" && !c.ipxe {
		return nil
	}
	if c.file == "" {
		h.log.Info("dhcp: boot client with unsupported firmware", "mac", c.mac.String(), "arch", c.arch)
		return nil
	}
	mods := []dhcpv4.Modifier{
		dhcpv4.WithMessageType(dhcpv4.MessageTypeOffer),
		dhcpv4.WithServerIP(stdIP(h.cfg.ServerIP)),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(stdIP(h.cfg.ServerIP))),
		dhcpv4.WithOption(dhcpv4.OptClassIdentifier(ClassPXE)),
		dhcpv4.WithOptionCopied(m, dhcpv4.OptionClientMachineIdentifier),
	}
	if c.class == ClassHTTP {
		mods = append(mods, dhcpv4.WithOption(dhcpv4.OptClassIdentifier(ClassHTTP)))
	}
	// UEFI PXE stacks boot more reliably when the proxy offer carries no
	// file and they fetch it with a port-4011 request (PXE spec "boot
	// server" exchange); BIOS ROMs and iPXE take the file right away.
	if !(c.fw == inventory.FirmwareUEFI) {
		mods = append(mods, h.bootMods(c, true)...)
	}
	r, err := dhcpv4.NewReplyFromRequest(m, mods...)
	if err != nil {
		return nil
	}
	r.YourIPAddr = net.IPv4zero
	h.record(c, inventory.StageDHCPOffer, "proxy file="+c.file, netip.Addr{})
	h.bootAnswered(ctx, c)
	return r
}

// replyPXE answers the PXE boot-server request on port 4011 (both modes).
// Its ciaddr is what the client claims; it binds nothing (issue 24: one
// forged request with the victim's ciaddr rebound the victim's address).
func (h *Handler) replyPXE(ctx context.Context, m *dhcpv4.DHCPv4, c client) *dhcpv4.DHCPv4 {
	t := m.MessageType()
	if t != dhcpv4.MessageTypeRequest && t != dhcpv4.MessageTypeInform || !c.boot || c.file == "" {
		return nil
	}
	mods := append([]dhcpv4.Modifier{
		dhcpv4.WithMessageType(dhcpv4.MessageTypeAck),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(stdIP(h.cfg.ServerIP))),
		dhcpv4.WithOption(dhcpv4.OptClassIdentifier(ClassPXE)),
		dhcpv4.WithOptionCopied(m, dhcpv4.OptionClientMachineIdentifier),
	}, h.bootMods(c, true)...)
	r, err := dhcpv4.NewReplyFromRequest(m, mods...)
	if err != nil {
		return nil
	}
	r.YourIPAddr = net.IPv4zero
	detail := "pxe-4011 file=" + c.file
	if ip := addr4(m.ClientIPAddr); ip.IsValid() {
		detail += " ciaddr=" + ip.String() + " (claimed)"
	}
	h.record(c, inventory.StageDHCPAck, detail, netip.Addr{})
	if h.cfg.Mode == Proxy {
		h.bootAnswered(ctx, c)
	}
	return r
}

// replyAuthoritative serves the pool; noAddress says it had no address
// to offer.
func (h *Handler) replyAuthoritative(ctx context.Context, m *dhcpv4.DHCPv4, c client) (r *dhcpv4.DHCPv4, noAddress bool) {
	now := h.now()
	// A relayed request from another subnet cannot use our one pool.
	if gi := addr4(m.GatewayIPAddr); gi.IsValid() && !h.cfg.Pool.Prefix.Contains(gi) {
		h.log.Debug("dhcp: relayed request from a subnet without a pool", "giaddr", gi, "mac", c.mac.String())
		return nil, false
	}
	switch m.MessageType() {
	case dhcpv4.MessageTypeDiscover:
		approved := h.approved(ctx, c)
		ip, err := h.leases.offer(ctx, c.key, c.mac, addr4(m.RequestedIPAddress()), now, approved)
		if err != nil && !errors.Is(err, ErrPoolExhausted) && !errors.Is(err, ErrUnapprovedCap) {
			// Shared leases: the database did not answer. No offer.
			h.log.Error("dhcp: allocating an address failed", "mac", c.mac.String(), "err", err)
			return nil, true
		}
		if err != nil {
			h.refused(c, err)
			return nil, true
		}
		r = h.addressReply(m, c, dhcpv4.MessageTypeOffer, ip, h.leaseTime(approved))
		if r != nil {
			h.record(c, inventory.StageDHCPOffer, "ip="+ip.String()+" file="+c.file, netip.Addr{})
		}
		return r, false

	case dhcpv4.MessageTypeRequest:
		if sid := addr4(m.ServerIdentifier()); sid.IsValid() && sid != h.cfg.ServerIP {
			// The client took another server's offer.
			if err := h.leases.forgetOffer(ctx, c.key, c.mac); err != nil {
				h.log.Warn("dhcp: forgetting an offer failed", "mac", c.mac.String(), "err", err)
			}
			return nil, false
		}
		ip := addr4(m.RequestedIPAddress())
		if !ip.IsValid() {
			ip = addr4(m.ClientIPAddr) // RENEWING / REBINDING
		}
		if !ip.IsValid() {
			return nil, false
		}
		approved := h.approved(ctx, c)
		d := h.leaseTime(approved)
		ok, err := h.leases.bind(ctx, c.key, c.mac, ip, d, now, approved)
		if errors.Is(err, ErrUnapprovedCap) {
			h.refused(c, err)
			err, ok = nil, false
		}
		if err != nil {
			// Without a stored lease there is no ACK: the client retries.
			h.log.Error("dhcp: storing lease failed", "mac", c.mac.String(), "ip", ip, "err", err)
			return nil, false
		}
		if !ok {
			h.log.Debug("dhcp: NAK", "mac", c.mac.String(), "requested", ip)
			nak, err := dhcpv4.NewReplyFromRequest(m,
				dhcpv4.WithMessageType(dhcpv4.MessageTypeNak),
				dhcpv4.WithOption(dhcpv4.OptServerIdentifier(stdIP(h.cfg.ServerIP))))
			if err != nil {
				return nil, false
			}
			return nak, false
		}
		r = h.addressReply(m, c, dhcpv4.MessageTypeAck, ip, d)
		if r != nil {
			if h.obs != nil {
				h.obs.Leased(c.mac, ip, now.Add(d), approved)
			}
			h.record(c, inventory.StageDHCPAck, "ip="+ip.String()+" file="+c.file, ip)
		}
		return r, false

	case dhcpv4.MessageTypeDecline:
		if ip := addr4(m.RequestedIPAddress()); ip.IsValid() {
			h.log.Warn("dhcp: client declined address (in use by another host?)", "mac", c.mac.String(), "ip", ip)
			if err := h.leases.decline(ctx, c.key, c.mac, ip, now); err != nil {
				h.log.Error("dhcp: storing decline failed", "ip", ip, "err", err)
			}
		}
		return nil, false

	case dhcpv4.MessageTypeRelease:
		if ip := addr4(m.ClientIPAddr); ip.IsValid() {
			if err := h.leases.release(ctx, c.key, c.mac, ip); err != nil {
				h.log.Error("dhcp: storing release failed", "ip", ip, "err", err)
			}
		}
		return nil, false

	case dhcpv4.MessageTypeInform:
		ip := addr4(m.ClientIPAddr)
		if !ip.IsValid() {
			return nil, false
		}
		r = h.addressReply(m, c, dhcpv4.MessageTypeAck, netip.Addr{}, 0)
		if r != nil {
			r.Options.Del(dhcpv4.OptionIPAddressLeaseTime)
		}
		return r, false
	}
	return nil, false
}

// refused counts and logs, rate-limited, that c got no address: the
// unapproved cap through Config.Refusals (one line a minute for all
// MACs: made-up MACs are the point of a flood), an exhausted pool once
// and then every thousandth time.
func (h *Handler) refused(c client, err error) {
	if errors.Is(err, ErrUnapprovedCap) {
		h.cfg.Refusals.Refused(security.DHCPUnapproved, "dhcp", "dhcp: no address for an unapproved MAC: unapproved MACs hold their share of the pool",
			"mac", c.mac.String(), "cap", h.cfg.MaxUnapproved)
		return
	}
	n := h.leases.refusals.Add(1)
	if n == 1 || n%1000 == 0 {
		h.log.Warn("dhcp: no address", "mac", c.mac.String(), "pool", h.cfg.Pool, "reason", err, "refused_so_far", n)
	}
}

// addressReply builds an OFFER or ACK giving ip for d (zero ip for INFORM).
func (h *Handler) addressReply(m *dhcpv4.DHCPv4, c client, t dhcpv4.MessageType, ip netip.Addr, d time.Duration) *dhcpv4.DHCPv4 {
	mods := []dhcpv4.Modifier{
		dhcpv4.WithMessageType(t),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(stdIP(h.cfg.ServerIP))),
		dhcpv4.WithNetmask(net.CIDRMask(h.cfg.Pool.Prefix.Bits(), 32)),
		dhcpv4.WithLeaseTime(uint32(d / time.Second)),
		dhcpv4.WithOptionCopied(m, dhcpv4.OptionClientMachineIdentifier),
	}
	if ip.IsValid() {
		mods = append(mods, dhcpv4.WithYourIP(stdIP(ip)))
	}
	if len(h.cfg.Router) > 0 {
		mods = append(mods, dhcpv4.WithRouter(stdIPs(h.cfg.Router)...))
	}
	if len(h.cfg.DNS) > 0 {
		mods = append(mods, dhcpv4.WithDNS(stdIPs(h.cfg.DNS)...))
	}
	mods = append(mods, h.bootMods(c, false)...)
	r, err := dhcpv4.NewReplyFromRequest(m, mods...)
	if err != nil {
		return nil
	}
	return r
}
