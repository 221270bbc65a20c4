// Package inventory is the boundary between the netboot services (DHCP,
// TFTP, HTTP boot) and the fleet's policy: which MAC is which node, what a
// node may boot, and what happened while it booted.
//
// The services depend only on the Inventory and LeaseStore interfaces, so
// they can be tested alone and the controller can decide policy without
// knowing about packets. fleet/store implements both over the fleet's
// database (store.NetbootInventory) and owns their schema.
package inventory

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"
)

// State is where a MAC stands with the operator.
type State string

const (
	// Discovered: the MAC asked to boot and nobody has approved it yet.
	Discovered State = "discovered"
	// Approved: the MAC has a node ID and a credential and boots the kernel.
	Approved State = "approved"
	// Retired: the operator retired the node; it gets no boot script.
	Retired State = "retired"
)

// Firmware is the boot firmware class a client announced (DHCP option 93,
// user class), as recorded in the inventory.
type Firmware string

const (
	FirmwareBIOS     Firmware = "bios"      // option 93 = 0, a PXE ROM
	FirmwareUEFI     Firmware = "uefi"      // option 93 = 7 or 9
	FirmwareUEFIHTTP Firmware = "uefi-http" // option 93 = 16, UEFI HTTP boot
	FirmwareIPXE     Firmware = "ipxe"      // iPXE (user class iPXE or option 175)
	FirmwareUnknown  Firmware = "unknown"
)

// Stage names one step of a node's boot timeline.
type Stage string

const (
	StageDHCPOffer     Stage = "dhcp_offer"     // we offered an address or boot info
	StageDHCPAck       Stage = "dhcp_ack"       // we acknowledged a request
	StageTFTPFile      Stage = "tftp_file"      // a TFTP transfer ended (detail says how)
	StageScriptFetched Stage = "script_fetched" // the node fetched its iPXE script
	StageKernelFetched Stage = "kernel_fetched" // the node fetched kernel.bin in full
	StageKernelPartial Stage = "kernel_partial" // a kernel download ended early
	StageCheckin       Stage = "checkin"        // the kernel's first check-in (written by the controller)
)

// Node is what the services need to know about one MAC.
type Node struct {
	MAC        net.HardwareAddr
	State      State
	ID         string // node ID, set once approved
	Credential string // the node's secret, set once approved
}

// Sighting is one observation of a MAC by a service.
type Sighting struct {
	MAC      net.HardwareAddr
	Firmware Firmware   // FirmwareUnknown leaves the stored value alone
	IP       netip.Addr // zero leaves the stored value alone
	At       time.Time
}

// Event is one step of a boot timeline.
type Event struct {
	MAC    net.HardwareAddr
	Stage  Stage
	Detail string // free text: file name, address, error
	At     time.Time
}

// Lease is one DHCP address binding owned by the authoritative server.
type Lease struct {
	IP     netip.Addr
	MAC    net.HardwareAddr // nil for a declined address
	Expiry time.Time
	// Declined marks an address a client reported in use (DHCPDECLINE);
	// it is not handed out again before Expiry.
	Declined bool
}

// ErrUnknownMAC is returned by Inventory.Lookup for a MAC never seen.
var ErrUnknownMAC = errors.New("inventory: unknown MAC")

// ErrDiscoveredFull is returned by Inventory.Seen for a MAC not yet known
// when the inventory already holds its maximum of discovered machines:
// the sighting is not recorded (a flood of made-up MACs cannot fill it).
var ErrDiscoveredFull = errors.New("inventory: too many discovered machines; approve or ignore some")

// LiveError is returned by Inventory.Enroll for a node that is live: a
// boot script must not take a running node's place. RetryAfter is how
// long until its lease lapses, when a machine that really rebooted can
// enroll.
type LiveError struct {
	NodeID     string
	RetryAfter time.Duration
}

func (e *LiveError) Error() string {
	return fmt.Sprintf("inventory: node %s is live (its lease runs %s more); enrollment refused", e.NodeID, e.RetryAfter.Round(time.Second))
}

// Inventory is what the netboot services ask of the fleet. Implementations
// must be safe for concurrent use and fast: they sit in the DHCP and HTTP
// request paths.
type Inventory interface {
	// Lookup returns the node for mac, or ErrUnknownMAC. It never mints
	// a credential.
	Lookup(ctx context.Context, mac net.HardwareAddr) (Node, error)
	// Enroll returns the credential the boot script of the approved node
	// n carries, when that script goes to address to. The fleet's
	// implementation issues an enrollment credential good only for the
	// node's first check-in from to, and refuses a node that is live with
	// a *LiveError; it never revokes a running node's credential.
	Enroll(ctx context.Context, n Node, to netip.Addr) (string, error)
	// Seen records that mac was seen; an unknown MAC becomes a Discovered
	// node with first and last seen set to s.At, unless the inventory
	// holds its maximum of those (ErrDiscoveredFull).
	Seen(ctx context.Context, s Sighting) error
	// Record appends e to the boot timeline of e.MAC, a MAC the inventory
	// knows (events of other MACs are dropped).
	Record(ctx context.Context, e Event) error
}

// LeaseStore persists the authoritative DHCP server's leases.
type LeaseStore interface {
	// Leases returns every stored lease, expired ones included.
	Leases(ctx context.Context) ([]Lease, error)
	// PutLease inserts or replaces the lease for l.IP.
	PutLease(ctx context.Context, l Lease) error
	// DeleteLease removes the lease for ip, if any.
	DeleteLease(ctx context.Context, ip netip.Addr) error
}

// ParseMAC parses a 6-byte Ethernet MAC written with ':' or '-'
// separators (52:54:00:12:34:56, 52-54-00-12-34-56).
func ParseMAC(s string) (net.HardwareAddr, error) {
	if len(s) != 17 {
		return nil, ErrBadMAC
	}
	hw, err := net.ParseMAC(strings.ReplaceAll(s, "-", ":"))
	if err != nil || len(hw) != 6 {
		return nil, ErrBadMAC
	}
	return hw, nil
}

// ErrBadMAC is returned by ParseMAC for anything but a 6-byte MAC.
var ErrBadMAC = errors.New("inventory: not a 6-byte MAC address")

// MACKey is the canonical text form of a MAC used as a database key and in
// URLs: lower-case hex joined by '-'.
func MACKey(mac net.HardwareAddr) string {
	return strings.ReplaceAll(mac.String(), ":", "-")
}

// MaxEventsPerMAC bounds the stored timeline of one MAC; older events are
// pruned so a node stuck in a boot loop cannot fill the disk.
const MaxEventsPerMAC = 500

// DefaultMaxDiscovered bounds the discovered (not approved, not retired)
// machines an Inventory keeps unless told otherwise (store.NetbootInventory
// uses it when its MaxDiscovered is zero).
const DefaultMaxDiscovered = 512

// NodeRecord is one row of the inventory, for listings.
type NodeRecord struct {
	Node
	Firmware            Firmware
	IP                  string
	FirstSeen, LastSeen time.Time
}

// Errors of address allocation (the DHCP server's lease table and
// LeaseAllocator).
var (
	// ErrPoolExhausted: no address of the pool is free.
	ErrPoolExhausted = errors.New("dhcp: pool exhausted")
	// ErrUnapprovedCap: the MAC is not approved and unapproved MACs
	// already hold their share of the pool (Allocation.MaxUnapproved).
	ErrUnapprovedCap = errors.New("dhcp: unapproved MACs hold their share of the pool")
)

// Allocation describes one request for an address of a pool that several
// DHCP servers share through one database (LeaseAllocator).
type Allocation struct {
	MAC net.HardwareAddr
	// Requested is the address the client asked for (option 50), if any;
	// an offer gives it when it is free.
	Requested netip.Addr
	// Start and End bound the pool (inclusive), Prefix is its subnet and
	// Server this server's own address, never handed out.
	Start, End netip.Addr
	Prefix     netip.Prefix
	Server     netip.Addr
	// Reserved maps every reserved address to its MAC (MACKey form); a
	// reserved address goes to its MAC only, and a MAC with a
	// reservation gets it. Read only.
	Reserved map[netip.Addr]string
	// Approved says the inventory approves MAC. Unapproved MACs hold at
	// most MaxUnapproved live addresses (offered or bound) between them.
	Approved      bool
	MaxUnapproved int
	// For is how long an offer holds its address, or a binding lasts,
	// from the database's clock at the decision.
	For time.Duration
}

// LeaseAllocator allocates addresses in a store shared by several DHCP
// servers: each decision, with its bookkeeping, is one transaction of the
// shared database, timed by the database's clock, and the database's
// constraints keep an address from going to two MACs whichever server
// decides. store.NetbootInventory implements it on SQLite and PostgreSQL.
type LeaseAllocator interface {
	// Offer sets an address aside for a.MAC for a.For and returns it: the
	// MAC's reservation, its current address, the requested one, an
	// address never used, or an expired one, in that order. An address
	// bound to a.MAC stays bound. It returns ErrPoolExhausted or
	// ErrUnapprovedCap.
	Offer(ctx context.Context, a Allocation) (netip.Addr, error)
	// Bind makes ip a.MAC's lease for a.For, dropping any other address
	// the MAC held. It reports false when ip may not go to a.MAC (held by
	// another MAC and unexpired, declined, outside the pool, reserved for
	// another), and returns ErrUnapprovedCap like Offer.
	Bind(ctx context.Context, a Allocation, ip netip.Addr) (bool, error)
	// Decline takes ip out of service for hold if mac held it.
	Decline(ctx context.Context, mac net.HardwareAddr, ip netip.Addr, hold time.Duration) error
	// Release frees ip if mac held it.
	Release(ctx context.Context, mac net.HardwareAddr, ip netip.Addr) error
	// ForgetOffer drops mac's outstanding offer (not a binding) if server
	// made it: the client took another server's offer.
	ForgetOffer(ctx context.Context, mac net.HardwareAddr, server netip.Addr) error
}
