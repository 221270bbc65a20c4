package controller

import (
	"context"
	"fmt"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// This file holds read-only views for the web dashboard: the whole shard
// map in one pass, recent Identify activity, and a filtered audit log.
// The last two read the store's audit log newest first (Store.ScanEventLog,
// Store.EventLog).
// They are tested in web/controllerviews_test.go.

// ShardCell is the dashboard's state of one global shard.
type ShardCell uint8

// Shard map states, ordered from least to most in need of attention
// (CellUnowned aside): an aggregated cell shows the highest it contains.
const (
	CellReady    ShardCell = iota // its owner reports READY
	CellAssigned                  // held by its owner, no per-shard status (or ASSIGNED)
	CellStarting                  // its owner reports STARTING
	CellPending                   // in a node's range, not yet held by it (hand-off)
	CellBackoff                   // its owner reports BACKOFF
	CellFatal                     // its owner reports FATAL
	CellUnowned                   // in no live node's range
	NumCells
)

// ShardGroup is one node's contiguous range in the shard map.
type ShardGroup struct {
	NodeID   string
	Start    uint32
	Count    uint32
	Draining bool
}

// ShardMapView is every shard's state at one instant, with the plan's
// ranges. Cells has one entry per shard.
type ShardMapView struct {
	Generation uint64
	Total      uint32
	Groups     []ShardGroup // in shard order; shards outside them are unowned
	Cells      []ShardCell
}

// cellOf maps a reported shard state to its cell.
func cellOf(s appliance.ShardState) ShardCell {
	switch s {
	case appliance.ShardReady:
		return CellReady
	case appliance.ShardStarting:
		return CellStarting
	case appliance.ShardBackoff:
		return CellBackoff
	case appliance.ShardFatal:
		return CellFatal
	}
	return CellAssigned
}

// ShardMap returns the state of every shard. It costs O(shards + nodes)
// under the controller's lock.
func (c *Controller) ShardMap() ShardMapView {
	t := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sweepLocked(t)
	v := ShardMapView{Generation: c.gen, Total: c.cfg.TotalShards, Cells: make([]ShardCell, c.cfg.TotalShards)}
	for i := range v.Cells {
		v.Cells[i] = CellUnowned
	}
	for _, n := range c.live {
		if n.plan.Count == 0 {
			continue
		}
		v.Groups = append(v.Groups, ShardGroup{NodeID: n.id, Start: n.plan.Start, Count: n.plan.Count, Draining: n.draining})
		for s := n.plan.Start; s < n.plan.Start+n.plan.Count; s++ {
			if c.holder[s] == n {
				v.Cells[s] = CellAssigned
			} else {
				v.Cells[s] = CellPending
			}
		}
		for _, st := range n.status {
			if st.ID < c.cfg.TotalShards && n.plan.Contains(st.ID) && c.holder[st.ID] == n {
				v.Cells[st.ID] = cellOf(st.State)
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
	// The stored grants, not the in-memory ones: at start every bucket
	// counts as just granted, which is a safety measure, not a grant.
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
	EventIdentifyUnused, EventNodeEnrolled, EventEnrollmentRefused, EventNodeDeleted}

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
