// Package fleetinv is the netboot inventory as `dpxe serve` runs it: the
// store's netboot tables (store.NetbootInventory) joined to the controller.
// One Inventory serves the three users of those tables: the netboot
// services (inventory.Inventory and inventory.LeaseStore, with enrollment
// through the controller), the operator API (fleet/api's
// /v1/netboot/machines endpoints) and the dashboard's netboot sections
// (web.Netboot). Node secrets are never stored in clear.
package fleetinv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/netboot/inventory"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// EnrollTTL is how long an enrollment credential waits for the node's
// first check-in: the kernel download, the boot and the kernel's own DHCP
// take seconds (a minute under QEMU's TCG).
const EnrollTTL = 5 * time.Minute

// maxTimelineSteps bounds the boot timeline of one boot record.
const maxTimelineSteps = 50

// ErrNoBootRecord is returned by Boot for a node with no boot record.
var ErrNoBootRecord = errors.New("no netboot record for this node")

// DiscoveredNode is a MAC that asked to boot.
type DiscoveredNode struct {
	MAC       string // 52-54-00-12-34-56
	Firmware  string // bios, uefi, uefi-http, ipxe, unknown
	IP        string
	FirstSeen time.Time
	LastSeen  time.Time
}

// BootSummary is a node's netboot facts for the nodes table.
type BootSummary struct {
	MAC, IP, Firmware string
	LastStage         string // the latest timeline stage, e.g. "kernel_fetched"
	LastStageFailed   bool
}

// BootRecord is a node's DHCP lease and boot timeline.
type BootRecord struct {
	BootSummary
	LeaseIP  string    // "" without a DHCP lease from us (proxy mode, or expired)
	LeaseEnd time.Time // when that lease ends
	Steps    []BootStep
}

// BootStep is one step of a boot timeline.
type BootStep struct {
	At     time.Time
	Stage  string
	Detail string
	Failed bool // the boot stopped here
}

// Inventory is the store's netboot tables with enrollment and approval
// through the controller. It is safe for concurrent use.
type Inventory struct {
	*store.NetbootInventory
	ctrl *controller.Controller
}

// New returns the inventory over inv and c.
func New(inv *store.NetbootInventory, c *controller.Controller) *Inventory {
	return &Inventory{NetbootInventory: inv, ctrl: c}
}

var (
	_ inventory.Inventory  = (*Inventory)(nil)
	_ inventory.LeaseStore = (*Inventory)(nil)
)

// Enroll implements inventory.Inventory: a script fetch never revokes a
// running node's credential. It asks the controller for an enrollment
// credential good only for the node's first check-in from the script's
// address (controller.Enroll), and a node that is live gets none.
func (n *Inventory) Enroll(ctx context.Context, node inventory.Node, to netip.Addr) (string, error) {
	cred, err := n.ctrl.Enroll(ctx, node.ID, to.String(), EnrollTTL)
	var live *controller.LiveError
	if errors.As(err, &live) {
		return "", &inventory.LiveError{NodeID: node.ID, RetryAfter: time.Until(live.Until)}
	}
	if err != nil {
		return "", fmt.Errorf("enrolling %s: %w", node.ID, err)
	}
	return cred, nil
}

// failedStep reports whether a timeline event ended a boot attempt.
func failedStep(stage inventory.Stage, detail string) bool {
	return stage == inventory.StageKernelPartial || (stage == inventory.StageTFTPFile && strings.Contains(detail, "failed"))
}

// Discovered lists the MACs in state discovered, newest sighting first.
func (n *Inventory) Discovered(ctx context.Context) ([]DiscoveredNode, error) {
	recs, err := n.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	var out []DiscoveredNode
	for _, r := range recs {
		if r.State != inventory.Discovered {
			continue
		}
		out = append(out, DiscoveredNode{MAC: inventory.MACKey(r.MAC), Firmware: string(r.Firmware), IP: r.IP,
			FirstSeen: r.FirstSeen, LastSeen: r.LastSeen})
	}
	slices.SortStableFunc(out, func(a, b DiscoveredNode) int { return b.LastSeen.Compare(a.LastSeen) })
	return out, nil
}

// Summaries returns the boot summary of every approved MAC, by node ID.
func (n *Inventory) Summaries(ctx context.Context) (map[string]BootSummary, error) {
	recs, err := n.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	last, err := n.LastStages(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]BootSummary{}
	for _, r := range recs {
		if r.ID == "" || r.State != inventory.Approved {
			continue
		}
		key := inventory.MACKey(r.MAC)
		st := last[key]
		out[r.ID] = BootSummary{MAC: key, IP: r.IP, Firmware: string(r.Firmware), LastStage: string(st.Stage),
			LastStageFailed: failedStep(st.Stage, st.Detail)}
	}
	return out, nil
}

// Boot returns the node's MAC record, its DHCP lease if the authoritative
// server holds one, and the timeline of its latest boot attempt (from its
// last DHCP offer); ErrNoBootRecord when no approved MAC is the node.
func (n *Inventory) Boot(ctx context.Context, nodeID string) (BootRecord, error) {
	recs, err := n.Nodes(ctx)
	if err != nil {
		return BootRecord{}, err
	}
	var rec *inventory.NodeRecord
	for i := range recs {
		if recs[i].ID == nodeID && recs[i].State == inventory.Approved {
			rec = &recs[i]
		}
	}
	if rec == nil {
		return BootRecord{}, ErrNoBootRecord
	}
	out := BootRecord{BootSummary: BootSummary{MAC: inventory.MACKey(rec.MAC), IP: rec.IP, Firmware: string(rec.Firmware)}}
	leases, err := n.Leases(ctx)
	if err != nil {
		return BootRecord{}, err
	}
	for _, l := range leases {
		if !l.Declined && l.MAC.String() == rec.MAC.String() && (out.LeaseIP == "" || l.Expiry.After(out.LeaseEnd)) {
			out.LeaseIP, out.LeaseEnd = l.IP.String(), l.Expiry
		}
	}
	tl, err := n.Timeline(ctx, rec.MAC)
	if err != nil {
		return BootRecord{}, err
	}
	start := 0
	for i, e := range tl {
		if e.Stage == inventory.StageDHCPOffer && (i == 0 || tl[i-1].Stage != inventory.StageDHCPOffer) {
			start = i
		}
	}
	tl = tl[start:]
	if len(tl) > maxTimelineSteps {
		tl = tl[len(tl)-maxTimelineSteps:]
	}
	for _, e := range tl {
		out.Steps = append(out.Steps, BootStep{At: e.At, Stage: string(e.Stage), Detail: e.Detail, Failed: failedStep(e.Stage, e.Detail)})
	}
	if len(out.Steps) > 0 {
		last := out.Steps[len(out.Steps)-1]
		out.LastStage, out.LastStageFailed = last.Stage, last.Failed
	}
	return out, nil
}

// Approve makes mac the node nodeID: the node is created in the
// controller's inventory and the MAC is approved as that node. No secret
// is stored with the MAC: the machine is enrolled when it fetches its iPXE
// script (Enroll). An existing node ID is refused rather than taken over.
func (n *Inventory) Approve(ctx context.Context, mac, nodeID string) error {
	hw, err := inventory.ParseMAC(mac)
	if err != nil {
		return fmt.Errorf("MAC %q: %w", mac, err)
	}
	_, err = n.ctrl.AddNode(ctx, nodeID)
	if errors.Is(err, store.ErrExists) {
		return fmt.Errorf("a node named %s already exists; choose another name", nodeID)
	}
	if err != nil {
		return err
	}
	return n.NetbootInventory.Approve(ctx, hw, nodeID, "", time.Now())
}

// Ignore retires mac: it keeps its record but gets no boot script and
// leaves the discovered list.
func (n *Inventory) Ignore(ctx context.Context, mac string) error {
	hw, err := inventory.ParseMAC(mac)
	if err != nil {
		return fmt.Errorf("MAC %q: %w", mac, err)
	}
	if err := n.Retire(ctx, hw); errors.Is(err, inventory.ErrUnknownMAC) {
		return fmt.Errorf("MAC %s was never seen", mac)
	} else if err != nil {
		return err
	}
	return nil
}

// RecordCheckin adds the "first check-in" step to the boot timeline of the
// approved MAC that is node nodeID, if any (controller.OnNodeLive).
func (n *Inventory) RecordCheckin(nodeID, addr string, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	recs, err := n.Nodes(ctx)
	if err != nil {
		log.Warn("boot timeline: listing the inventory", "err", err)
		return
	}
	for _, r := range recs {
		if r.ID == nodeID && r.State == inventory.Approved {
			if err := n.Record(ctx, inventory.Event{MAC: r.MAC, Stage: inventory.StageCheckin, Detail: "from " + addr, At: time.Now()}); err != nil {
				log.Warn("boot timeline: recording the check-in", "node", nodeID, "err", err)
			}
		}
	}
}
