package web

import (
	"context"

	"github.com/discord-pxe/dpxe/fleet/netboot/fleetinv"
)

// Netboot is what the dashboard asks of the netboot part of `dpxe serve`:
// the MACs that asked to boot, each approved node's boot record (MAC,
// firmware, DHCP lease, boot timeline), and the operator's approve and
// ignore actions. The dashboard works without it (Config.Netboot nil) and
// then shows "netboot not enabled" where this data would be.
//
// Implementations must be safe for concurrent use; the dashboard calls
// Summaries on every live update of the nodes table, so it should be a
// single query.
type Netboot interface {
	// Discovered lists MACs that asked to boot and are not approved,
	// newest sighting first.
	Discovered(ctx context.Context) ([]DiscoveredNode, error)
	// Summaries returns the boot summary of every approved node, by node ID.
	Summaries(ctx context.Context) (map[string]BootSummary, error)
	// Boot returns one node's boot record; ErrNoBootRecord when the node
	// never booted over the network.
	Boot(ctx context.Context, nodeID string) (BootRecord, error)
	// Approve makes mac the node nodeID (creating it in the controller's
	// inventory with a credential) so that it boots the shard kernel.
	Approve(ctx context.Context, mac, nodeID string) error
	// Ignore stops offering mac a boot and hides it from Discovered.
	Ignore(ctx context.Context, mac string) error
}

// ErrNoBootRecord is returned by Netboot.Boot for a node with no boot
// record.
var ErrNoBootRecord = fleetinv.ErrNoBootRecord

// The netboot facts the dashboard shows are fleetinv's, the one adapter
// over the netboot tables that `dpxe serve` passes to web.New
// (Config.Netboot), the API and the netboot services.
type (
	// DiscoveredNode is a MAC that asked to boot.
	DiscoveredNode = fleetinv.DiscoveredNode
	// BootSummary is a node's netboot facts for the nodes table.
	BootSummary = fleetinv.BootSummary
	// BootRecord is a node's DHCP lease and boot timeline.
	BootRecord = fleetinv.BootRecord
	// BootStep is one step of a boot timeline.
	BootStep = fleetinv.BootStep
)

var _ Netboot = (*fleetinv.Inventory)(nil)
