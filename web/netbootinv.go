package web

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/netboot/inventory"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// InventoryNetboot implements Netboot over the netboot services' tables in
// the store (store.NetbootInventory) and the controller: the netboot part
// of `dpxe serve` can hand it to the dashboard once its tables exist.
type InventoryNetboot struct {
	Inv  *store.NetbootInventory
	Ctrl *controller.Controller
}

// maxTimelineSteps bounds the boot timeline shown on a node page.
const maxTimelineSteps = 50

// failedStep reports whether a timeline event ended a boot attempt.
func failedStep(stage inventory.Stage, detail string) bool {
	return stage == inventory.StageKernelPartial || (stage == inventory.StageTFTPFile && strings.Contains(detail, "failed"))
}

// Discovered implements Netboot: MACs in state discovered, newest first.
func (n *InventoryNetboot) Discovered(ctx context.Context) ([]DiscoveredNode, error) {
	recs, err := n.Inv.Nodes(ctx)
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

// Summaries implements Netboot for approved MACs, by node ID.
func (n *InventoryNetboot) Summaries(ctx context.Context) (map[string]BootSummary, error) {
	recs, err := n.Inv.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	last, err := n.Inv.LastStages(ctx)
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

// Boot implements Netboot: the node's MAC record, its DHCP lease if the
// authoritative server holds one, and the timeline of its latest boot
// attempt (from its last DHCP offer).
func (n *InventoryNetboot) Boot(ctx context.Context, nodeID string) (BootRecord, error) {
	recs, err := n.Inv.Nodes(ctx)
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
	leases, err := n.Inv.Leases(ctx)
	if err != nil {
		return BootRecord{}, err
	}
	for _, l := range leases {
		if !l.Declined && l.MAC.String() == rec.MAC.String() && (out.LeaseIP == "" || l.Expiry.After(out.LeaseEnd)) {
			out.LeaseIP, out.LeaseEnd = l.IP.String(), l.Expiry
		}
	}
	tl, err := n.Inv.Timeline(ctx, rec.MAC)
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

// Approve implements Netboot: the node is created in the controller's
// inventory (its credential goes only to the netboot record, which puts it
// on the kernel command line) and the MAC is approved as that node. An
// existing node ID is refused rather than taken over.
func (n *InventoryNetboot) Approve(ctx context.Context, mac, nodeID string) error {
	hw, err := inventory.ParseMAC(mac)
	if err != nil {
		return fmt.Errorf("MAC %q: %w", mac, err)
	}
	_, err = n.Ctrl.AddNode(ctx, nodeID)
	if errors.Is(err, store.ErrExists) {
		return fmt.Errorf("a node named %s already exists; choose another name", nodeID)
	}
	if err != nil {
		return err
	}
	// No secret is stored with the MAC: `dpxe serve` enrolls the machine
	// when it fetches its iPXE script (Controller.Enroll keeps only the
	// hash, and never replaces a live node's credential).
	return n.Inv.Approve(ctx, hw, nodeID, "", time.Now())
}

// Ignore implements Netboot by retiring the MAC: it keeps its record but
// gets no boot script and leaves the discovered list.
func (n *InventoryNetboot) Ignore(ctx context.Context, mac string) error {
	hw, err := inventory.ParseMAC(mac)
	if err != nil {
		return fmt.Errorf("MAC %q: %w", mac, err)
	}
	if err := n.Inv.Retire(ctx, hw); errors.Is(err, inventory.ErrUnknownMAC) {
		return fmt.Errorf("MAC %s was never seen", mac)
	} else if err != nil {
		return err
	}
	return nil
}
