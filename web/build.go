package web

import (
	"cmp"
	"context"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/store"
	"github.com/discord-pxe/dpxe/web/view"
)

// This file turns controller views into view models. Builders take their
// inputs as arguments so tests and benchmarks can call them directly.

// MaxMapCells is the most cells the shard map draws (plus at most one
// partial cell per group): beyond it, each cell stands for a block of
// shards. 4,096 keeps a 2,048-shard fleet at one shard per cell and a
// 131,072-shard fleet at 32 shards per cell.
const MaxMapCells = 4096

// CompactGroups is the number of groups above which the shard map draws
// groups as tiles rather than one headed row each.
const CompactGroups = 48

// viewState maps what a node reported for a shard it holds to the
// dashboard's state; "" (no per-shard status) shows as held. ok is false
// for a state this mapping does not know (TestEveryShardStateMapped fails
// on one; the page shows it as held).
func viewState(reported appliance.ShardState) (v view.State, ok bool) {
	switch reported {
	case appliance.ShardReady:
		return view.Ready, true
	case appliance.ShardStarting:
		return view.Starting, true
	case appliance.ShardBackoff:
		return view.Backoff, true
	case appliance.ShardFatal:
		return view.Fatal, true
	case appliance.ShardAssigned, "":
		return view.Held, true
	}
	return view.Held, false
}

// stateOfFact is the view state of a shard in a node's range: pending
// until the node holds it, then what the node reported.
func stateOfFact(f controller.ShardFact) view.State {
	if !f.Held {
		return view.Pending
	}
	v, _ := viewState(f.Reported())
	return v
}

// mapBlockSize is the number of shards per cell for total shards: 1 up to
// MaxMapCells, then the smallest power of two that fits.
func mapBlockSize(total uint32) uint32 {
	b := uint32(1)
	for uint64(total) > uint64(MaxMapCells)*uint64(b) {
		b *= 2
	}
	return b
}

// BuildShardMap groups the shard map by owning node and aggregates cells
// into blocks when there are more than MaxMapCells shards. Shards outside
// every node's range form "no owner" groups in between.
func BuildShardMap(m controller.ShardMapView, now time.Time) view.ShardMap {
	out := view.ShardMap{Total: m.Total, BlockSize: mapBlockSize(m.Total)}
	groups := slices.Clone(m.Groups)
	slices.SortFunc(groups, func(a, b controller.ShardGroup) int { return cmp.Compare(a.Start, b.Start) })
	add := func(g controller.ShardGroup) {
		if g.Count == 0 {
			return
		}
		vg := view.MapGroup{NodeID: g.NodeID, Start: g.Start, End: g.Start + g.Count - 1,
			Range: controller.Range{Start: g.Start, Count: g.Count}.String(), Draining: g.Draining}
		if g.NodeID != "" {
			vg.Href = "/nodes/" + url.PathEscape(g.NodeID)
		}
		bs := out.BlockSize
		owned := g.NodeID != ""
		vg.Cells = make([]view.State, 0, (g.Count+bs-1)/bs)
		end := g.Start + g.Count
		for s := g.Start; s < end; s += bs {
			hi := min(end, s+bs)
			worst := view.Ready
			for i := s; i < hi; i++ {
				st := view.Unowned
				if owned {
					st = stateOfFact(m.Shards[i])
				}
				vg.Counts[st]++
				if st > worst {
					worst = st
				}
			}
			vg.Cells = append(vg.Cells, worst)
		}
		for i, n := range vg.Counts {
			out.Counts[i] += n
		}
		out.Groups = append(out.Groups, vg)
	}
	next := uint32(0)
	for _, g := range groups {
		if g.Start > next {
			add(controller.ShardGroup{Start: next, Count: g.Start - next})
		}
		add(g)
		next = max(next, g.Start+g.Count)
	}
	if next < m.Total {
		add(controller.ShardGroup{Start: next, Count: m.Total - next})
	}
	out.Compact = len(out.Groups) > CompactGroups
	return out
}

// nodeStatus names a node's standing.
func nodeStatus(n controller.NodeView) string {
	switch {
	case n.Live && n.Draining:
		return "draining"
	case n.Live:
		return "live"
	case !n.FirstSeen.IsZero():
		return "expired"
	}
	return "waiting"
}

// BuildNodeRow makes a table row of a node and its netboot summary.
func BuildNodeRow(n controller.NodeView, boot BootSummary, now time.Time) view.NodeRow {
	r := view.NodeRow{ID: n.ID, Href: "/nodes/" + url.PathEscape(n.ID), MAC: boot.MAC, IP: boot.IP, Firmware: boot.Firmware,
		BootStage: boot.LastStage, Address: n.Address, Capacity: n.Capacity,
		Range: controller.Range{Start: n.RangeStart, Count: n.RangeCount}.String(), RangeStart: n.RangeStart, RangeCount: n.RangeCount,
		Ready: n.ReadyShards, Starting: n.StartingShards, Backoff: n.BackoffShards, Fatal: n.FatalShards, Pending: n.Pending,
		Status: nodeStatus(n), Live: n.Live, Draining: n.Draining,
		Lease:       view.Countdown{Deadline: n.LeaseDeadline, Now: now},
		LastCheckin: view.Moment{At: n.LastSeen, Now: now}, Delivery: BuildNodeDelivery(n.Delivery),
		Broker: BuildBroker(n.NATS)}
	if boot.LastStageFailed && r.BootStage != "" {
		r.BootStage += " (failed)"
	}
	return r
}

// BuildTotals counts nodes and shards.
func BuildTotals(nodes []controller.NodeView, plan controller.PlanView, discovered int, netboot bool, now time.Time) view.Totals {
	t := view.Totals{TotalShards: plan.TotalShards, Generation: plan.Generation, Rebalancing: plan.Rebalancing,
		Discovered: discovered, DiscoveredKnown: netboot, PlanChanged: view.Moment{At: plan.ChangedAt, Now: now}}
	if !plan.GraceUntil.IsZero() {
		t.GraceUntil = view.Stamp(plan.GraceUntil)
	}
	for _, n := range nodes {
		switch nodeStatus(n) {
		case "live":
			t.NodesLive++
		case "draining":
			t.NodesLive++
			t.NodesDraining++
		case "expired":
			t.NodesExpired++
		default:
			t.NodesWaiting++
		}
		if n.Live {
			t.Ready += n.ReadyShards
			t.Starting += n.StartingShards
			t.Backoff += n.BackoffShards
			t.Fatal += n.FatalShards
			t.Pending += n.Pending
		}
	}
	t.Unowned = int(plan.TotalShards - plan.Assigned)
	return t
}

// BuildBudget formats the session-start budget.
func BuildBudget(b controller.Budget, now time.Time) view.Budget {
	v := view.Budget{Total: b.Total, Remaining: b.Remaining, Reserve: b.Reserve, ResetIn: view.Span(b.ResetAt.Sub(now)),
		Low: b.Remaining <= b.Reserve}
	if b.Total > 0 {
		v.Percent = min(100, max(0, b.Remaining*100/b.Total))
	}
	return v
}

// maxBucketRows is the most rows of the Identify panel; more buckets are
// shown as ranges of buckets.
const maxBucketRows = 16

// BuildIdentify makes the Identify activity panel.
func BuildIdentify(acts []controller.BucketActivity, window time.Duration, now time.Time) view.Identify {
	v := view.Identify{Minutes: int(window / time.Minute), MaxConcurrency: uint32(len(acts))}
	per := (len(acts) + maxBucketRows - 1) / maxBucketRows
	per = max(per, 1)
	busiest := 0
	for i := 0; i < len(acts); i += per {
		hi := min(len(acts), i+per)
		bar := view.BucketBar{Label: controller.Range{Start: uint32(i), Count: uint32(hi - i)}.String()}
		var last time.Time
		for _, a := range acts[i:hi] {
			bar.Granted += a.Granted
			bar.Refused += a.Refused
			if a.LastGrant.After(last) {
				last = a.LastGrant
			}
		}
		bar.LastGrant = view.Moment{At: last, Now: now}
		v.Granted += bar.Granted
		v.Refused += bar.Refused
		busiest = max(busiest, bar.Granted+bar.Refused)
		v.Bars = append(v.Bars, bar)
	}
	for i := range v.Bars {
		if busiest > 0 {
			v.Bars[i].Width = (v.Bars[i].Granted + v.Bars[i].Refused) * 100 / busiest
		}
	}
	return v
}

// closeText names a Gateway close code (Discord's 4000-range and the
// WebSocket codes shards commonly report).
func closeText(code uint16) string {
	switch code {
	case 0:
		return ""
	case 1000:
		return "normal closure"
	case 1001:
		return "going away"
	case 1006:
		return "abnormal closure"
	case 4000:
		return "unknown error"
	case 4001:
		return "unknown opcode"
	case 4002:
		return "decode error"
	case 4003:
		return "not authenticated"
	case 4004:
		return "authentication failed (fatal)"
	case 4005:
		return "already authenticated"
	case 4007:
		return "invalid sequence (re-Identify)"
	case 4008:
		return "rate limited"
	case 4009:
		return "session timed out (re-Identify)"
	case 4010:
		return "invalid shard (fatal)"
	case 4011:
		return "sharding required (fatal)"
	case 4012:
		return "invalid API version (fatal)"
	case 4013:
		return "invalid intents (fatal)"
	case 4014:
		return "disallowed intents (fatal)"
	}
	return ""
}

// BuildShardRows lists a node's shards: its range (state from the shard
// map) and any shard it reported on outside it (being released). Shards
// with a pending restart request are marked.
func BuildShardRows(d controller.NodeDetail, m controller.ShardMapView) ([]view.ShardRow, [view.NumStates]int) {
	byID := map[uint32]appliance.ShardStatus{}
	for _, st := range d.Shards {
		byID[st.ID] = st
	}
	var rows []view.ShardRow
	var counts [view.NumStates]int
	seen := map[uint32]bool{}
	addRow := func(id uint32, state view.State) {
		r := view.ShardRow{ID: id, State: state}
		_, r.RestartRequested = slices.BinarySearch(d.RestartShards, id)
		if st, ok := byID[id]; ok {
			r.Reported, r.SeqValid, r.Acks, r.Misses = string(st.State), st.SeqValid, st.HeartbeatAcks, st.HeartbeatMisses
			r.Reconnects, r.LastError, r.CloseCode, r.CloseText = st.Reconnects, st.LastError, st.CloseCode, closeText(st.CloseCode)
			r.Delivery = BuildShardDelivery(st, d.Delivery != nil)
		}
		seen[id] = true
		counts[state]++
		rows = append(rows, r)
	}
	if d.Live {
		for s := d.RangeStart; s < d.RangeStart+d.RangeCount && s < uint32(len(m.Shards)); s++ {
			addRow(s, stateOfFact(m.Shards[s]))
		}
		for _, st := range d.Shards {
			if !seen[st.ID] {
				v, _ := viewState(st.State)
				addRow(st.ID, v)
			}
		}
	}
	slices.SortFunc(rows, func(a, b view.ShardRow) int { return cmp.Compare(a.ID, b.ID) })
	return rows, counts
}

// FatalInRange returns the rows of the FATAL shards in a node's
// assignment: the ones "Restart FATAL shards" asks it to start again
// (controller.RestartFatal).
func FatalInRange(d controller.NodeDetail, rows []view.ShardRow) []view.ShardRow {
	var out []view.ShardRow
	for _, r := range rows {
		if r.State == view.Fatal && r.ID >= d.RangeStart && r.ID-d.RangeStart < d.RangeCount {
			out = append(out, r)
		}
	}
	return out
}

// BuildEventRows formats audit-log entries.
func BuildEventRows(evs []store.Event, now time.Time) []view.EventRow {
	out := make([]view.EventRow, 0, len(evs))
	for _, e := range evs {
		r := view.EventRow{ID: e.ID, At: view.Stamp(e.At), When: view.Moment{At: e.At, Now: now}, Kind: e.Kind, NodeID: e.NodeID, Detail: e.Detail}
		if e.ShardID != nil {
			r.Shard = strconv.FormatUint(uint64(*e.ShardID), 10)
		}
		out = append(out, r)
	}
	return out
}

// BuildDrainConfirm turns the controller's drain preview into the
// confirmation page's view: the controller computes what moves where with
// its own policy, the view only words it.
func BuildDrainConfirm(p controller.DrainPreview) (moves []view.Move, leaving, strands, allMoved uint32) {
	for _, m := range p.Moves {
		moves = append(moves, view.Move{From: m.From, To: m.To, Range: controller.Range{Start: m.Start, Count: m.Count}.String(), Count: m.Count})
	}
	return moves, p.Leaving, p.Strands, p.Moved
}

// nodeBoot fetches a node's netboot section.
func (s *Server) nodeBoot(ctx context.Context, id string, now time.Time) view.Boot {
	if s.cfg.Netboot == nil {
		return view.Boot{Reason: "Netboot is not enabled in this dpxe serve, so there is no DHCP lease or boot timeline to show."}
	}
	rec, err := s.cfg.Netboot.Boot(ctx, id)
	if err != nil {
		b := view.Boot{Enabled: true, Reason: "No netboot record: " + err.Error() + "."}
		if err == ErrNoBootRecord {
			b.Reason = "This node has not booted over the network (it may boot from USB)."
		}
		return b
	}
	b := view.Boot{Enabled: true, MAC: rec.MAC, Firmware: rec.Firmware, LeaseIP: rec.LeaseIP}
	if rec.LeaseIP != "" {
		b.LeaseEnd = view.Countdown{Deadline: rec.LeaseEnd, Now: now}.Text()
	}
	for _, st := range rec.Steps {
		b.Steps = append(b.Steps, view.BootStep{At: view.Stamp(st.At), Stage: st.Stage, Detail: st.Detail, Failed: st.Failed})
	}
	return b
}
