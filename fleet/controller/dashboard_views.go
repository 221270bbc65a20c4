package controller

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// This file holds read-only views for the web dashboard: the whole shard
// map in one pass, recent Identify activity, and a filtered audit log.
// The last two read the store's audit log newest first (Store.ScanEventLog,
// Store.EventLog).
// They are tested in web/controllerviews_test.go.

// ShardGroup is one node's contiguous range in the shard map.
type ShardGroup struct {
	NodeID   string
	Start    uint32
	Count    uint32
	Draining bool
}

// ShardFact is what the controller knows of one global shard in a node's
// range: whether that node holds it, and what it last reported of it.
// How the facts look (states, colours, attention order) is the
// dashboard's business: web maps them to its own view states.
//
// A fact is two bytes without pointers (a 131,072-shard map is 256 KiB
// the garbage collector need not scan): the reported state is kept as
// its place in appliance.ShardStates and read back with Reported.
type ShardFact struct {
	// Held says the node whose range has the shard holds it (may run
	// it); false means the hand-off from its previous owner is pending.
	Held     bool
	reported uint8 // 1 + index in appliance.ShardStates; 0: none
}

// Reported is the state the holder last reported for the shard: "" when
// it reported none (nodes that send counts only) or does not hold it.
func (f ShardFact) Reported() appliance.ShardState {
	if f.reported == 0 || int(f.reported) > len(appliance.ShardStates) {
		return ""
	}
	return appliance.ShardStates[f.reported-1]
}

// NewShardFact makes the fact of a shard whose node holds it or not and
// last reported it in state reported ("" for none; a state outside
// appliance.ShardStates counts as none).
func NewShardFact(held bool, reported appliance.ShardState) ShardFact {
	return ShardFact{Held: held, reported: uint8(slices.Index(appliance.ShardStates, reported) + 1)}
}

// ShardMapView is every shard at one instant, with the plan's ranges.
// Shards has one entry per shard; shards outside every group have no
// owner and a zero ShardFact.
type ShardMapView struct {
	Generation uint64
	Total      uint32
	Groups     []ShardGroup // in shard order; shards outside them are unowned
	Shards     []ShardFact
}

// ShardMap returns the facts of every shard. It costs O(shards + nodes)
// under the controller's lock.
func (c *Controller) ShardMap() ShardMapView {
	t := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sweepLocked(t)
	v := ShardMapView{Generation: c.gen, Total: c.cfg.TotalShards, Shards: make([]ShardFact, c.cfg.TotalShards)}
	for _, n := range c.live {
		if n.plan.Count == 0 {
			continue
		}
		v.Groups = append(v.Groups, ShardGroup{NodeID: n.id, Start: n.plan.Start, Count: n.plan.Count, Draining: n.draining})
		for s := n.plan.Start; s < n.plan.Start+n.plan.Count; s++ {
			v.Shards[s].Held = c.holder[s] == n
		}
		for _, st := range n.status {
			if st.ID < c.cfg.TotalShards && n.plan.Contains(st.ID) && c.holder[st.ID] == n {
				v.Shards[st.ID] = NewShardFact(true, st.State)
			}
		}
	}
	return v
}

// BucketActivity is the Identify activity of one concurrency bucket.
type BucketActivity struct {
	Bucket    uint32
	Granted   int       // grants since the window start
	Refused   int       // refusal events since the window start (at most one per node per window)
	LastGrant time.Time // the bucket's latest grant ever, zero if none
}

// identifyScanLimit bounds how many recent Identify events one
// IdentifyActivity call reads.
const identifyScanLimit = 20000

// IdentifyActivity counts Identify grants and refusals per bucket since
// the given time, from the stored audit log (newest first, at most
// identifyScanLimit events of each kind), with each bucket's latest grant.
// It does not flush: the store is at most one flush period behind, and a
// dashboard must not queue behind the controller's batched writes.
func (c *Controller) IdentifyActivity(ctx context.Context, since time.Time) ([]BucketActivity, error) {
	out := make([]BucketActivity, c.Config().MaxConcurrency)
	for i := range out {
		out[i].Bucket = uint32(i)
	}
	// The stored grants, not the in-memory ones: after a change of
	// max_concurrency every bucket counts as granted at the latest grant,
	// which is a safety measure, not a grant.
	grants, err := c.st.BucketGrants(ctx)
	if err != nil {
		return nil, fmt.Errorf("identify activity: %w", err)
	}
	for _, g := range grants {
		if g.Bucket < uint32(len(out)) {
			out[g.Bucket].LastGrant = g.GrantedAt
		}
	}
	for _, kind := range []string{EventIdentifyGranted, EventIdentifyRefused} {
		err := c.st.ScanEventLog(ctx, store.EventQuery{Kind: kind, Limit: identifyScanLimit}, func(e store.Event) bool {
			if e.At.UnixMilli() < since.UnixMilli() {
				return false
			}
			if e.ShardID == nil {
				return true
			}
			b := appliance.IdentifyBucket(*e.ShardID, uint32(len(out)))
			if kind == EventIdentifyGranted {
				out[b].Granted++
			} else {
				out[b].Refused++
			}
			return true
		})
		if err != nil {
			return nil, fmt.Errorf("identify activity: %w", err)
		}
	}
	return out, nil
}

// EventKinds lists every audit-log kind the controller writes.
var EventKinds = []string{EventNodeFirstSeen, EventLeaseExpired, EventDrain, EventUndrain, EventPlanChanged,
	EventIdentifyGranted, EventIdentifyRefused, EventNodeAdded, EventControllerStart, EventBudgetConfigured,
	EventResumeHandoff, EventGatewayShards, EventGatewayConcurrency, EventRestartRequested, EventShardRestarted,
	EventIdentifyUnused, EventNodeEnrolled, EventEnrollmentRefused, EventNodeDeleted, EventCrashHandoff, EventSessionGap}

// EventFilter selects audit-log entries for EventLog. Empty fields match
// everything.
type EventFilter struct {
	NodeID string
	Kind   string
	Before int64 // only entries with a smaller ID; 0 for the newest
	Limit  int   // 1..1000
}

// EventLog returns the newest stored audit-log entries that match f,
// newest first. Like IdentifyActivity it does not flush: entries of the
// last flush period (batched writes, one second in dpxe serve) may be
// missing; changes whose answer waits to be durable (drain, a new
// generation, grants) are stored before that answer.
func (c *Controller) EventLog(ctx context.Context, f EventFilter) ([]store.Event, error) {
	if f.Limit < 1 || f.Limit > 1000 {
		return nil, fmt.Errorf("%w: event limit %d out of range 1..1000", ErrConfig, f.Limit)
	}
	out, err := c.st.EventLog(ctx, store.EventQuery{NodeID: f.NodeID, Kind: f.Kind, Before: f.Before, Limit: f.Limit})
	if err != nil {
		return nil, fmt.Errorf("event log: %w", err)
	}
	return out, nil
}
