package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// Renewals without a leader (issue 20, docs/ha.md). A follower that cannot
// reach a leader (none leads yet, the leader does not answer, or it
// answers 503) answers a node's check-in itself when the check-in asks for
// nothing but its lease: the node reports the stored plan's generation
// (it applied it) and the store shows it live. The
// renewal is one short transaction (store.FollowerRenewLease) that extends
// the stored deadline only while it still runs on the database's clock,
// and the answer is read in it: the stored plan, with the node's range
// startable only where the store shows the node holding the shards. A
// follower grants nothing, records nothing else, and answers no Identify
// claim: plan changes, grants and hand-offs wait for a leader, but no node
// loses its lease while none answers.
//
// A leader, for its part, no longer expires a node only because its
// memory's deadline passed: it first reads the node's stored deadline
// (store.LeaseRemainingOf). A stored deadline that still runs was renewed
// by a follower, and the leader adopts it; one that has lapsed can no
// longer be renewed by any follower, so the node may be expired. Either
// way the leader never takes shards from a node whose lease a follower
// extended (TestLeaderExpiresOnlyLapsedLeases).

type followerKey struct{}

// AnswerAsFollower returns ctx marking a node's check-in that this replica
// answers itself if it does not lead (dpxe serve, when no leader answers).
func AnswerAsFollower(ctx context.Context) context.Context {
	return context.WithValue(ctx, followerKey{}, true)
}

func answersAsFollower(ctx context.Context) bool {
	v, _ := ctx.Value(followerKey{}).(bool)
	return v
}

// lapseRecheck is how soon a sweep looks again at a node whose lapse it
// asked the store about.
const lapseRecheck = 250 * time.Millisecond

// ExpireWithoutStoreCheck is a deliberate mutation for the replica tests:
// a leader expires a node when its memory's deadline passes, as before,
// without reading the stored one a follower may have renewed. Never in
// production.
func (c *Controller) ExpireWithoutStoreCheck() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ha.expireUnchecked = true
}

// lapseUnconfirmedLocked reports whether n, whose deadline has passed,
// must stay live until the store confirms its lease lapsed; it asks the
// store if nobody has yet. Only a leader asks: a single controller has no
// followers, and a follower's memory is display only.
func (c *Controller) lapseUnconfirmedLocked(n *node) bool {
	if !c.ha.enabled || !c.ha.leading || c.ha.fence == nil || c.ha.unfenced || c.ha.expireUnchecked || n.lapseChecked {
		return false
	}
	if c.ha.lapseAsk == nil {
		c.ha.lapseAsk = map[string]struct{}{}
	}
	c.ha.lapseAsk[n.id] = struct{}{}
	if !c.ha.confirming {
		c.ha.confirming = true
		go c.confirmLapses()
	}
	return true
}

// confirmLapses reads the stored deadlines of the nodes the sweeps asked
// about until none is left: a lapsed one is marked for the next sweep to
// expire, a running one (renewed by a follower) is adopted, counted from
// after the read, as a new leader does (load).
func (c *Controller) confirmLapses() {
	for {
		c.mu.Lock()
		ids := slices.Sorted(maps.Keys(c.ha.lapseAsk))
		clear(c.ha.lapseAsk)
		if len(ids) == 0 || !c.ha.leading {
			c.ha.confirming = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		left, err := c.st.LeaseRemainingOf(ctx, ids)
		cancel()
		t := c.now()
		c.mu.Lock()
		if err != nil {
			// The sweeps ask again (lapseRecheck); until then the nodes
			// stay live, as they would with the leader cut off.
			c.ha.confirming = false
			c.mu.Unlock()
			c.log.Warn("reading stored node leases before expiring them failed", "nodes", len(ids), "err", err)
			return
		}
		for _, id := range ids {
			n := c.nodes[id]
			if n == nil || !n.live || !t.After(n.deadline) {
				continue // gone, or renewed here meanwhile
			}
			if d, ok := left[id]; ok && d > 0 {
				n.deadline = t.Add(d)
				c.log.Info("node lease renewed by another replica; kept", "node", id, "left", d.Round(time.Millisecond))
				continue
			}
			n.lapseChecked = true
		}
		c.nextSweep = time.Time{}
		c.mu.Unlock()
	}
}

// followerCheckin answers req on a replica that does not lead (see the
// comment at the top of this file), or fails with an error wrapping
// ErrNotLeader that names why the check-in needs a leader.
func (c *Controller) followerCheckin(ctx context.Context, req *appliance.CheckinRequest) (appliance.CheckinResponse, error) {
	t := c.now()
	c.mu.Lock()
	enabled, lease, total := c.ha.enabled, c.cfg.Lease, c.cfg.TotalShards
	c.mu.Unlock()
	if !enabled {
		return appliance.CheckinResponse{}, fmt.Errorf("%w: not a replica", ErrNotLeader)
	}
	for i := range req.Shards {
		if req.Shards[i].ID >= total {
			return appliance.CheckinResponse{}, &appliance.FieldError{Field: fmt.Sprintf("shards[%d].id", i),
				Reason: fmt.Sprintf("%d out of range 0..%d: %v", req.Shards[i].ID, total-1, ErrShardRange)}
		}
	}
	if req.Generation == 0 {
		return appliance.CheckinResponse{}, fmt.Errorf("%w: node %s has no plan yet: %w", ErrNotLeader, req.NodeID, store.ErrNotSteady)
	}
	f, err := c.st.FollowerRenewLease(ctx, req.NodeID, req.Generation, uint32(req.Capacity), lease)
	if errors.Is(err, store.ErrLeaseLapsed) || errors.Is(err, store.ErrNotSteady) {
		return appliance.CheckinResponse{}, fmt.Errorf("%w: %w", ErrNotLeader, err)
	}
	if err != nil {
		return appliance.CheckinResponse{}, err
	}
	held, err := decodeHeld(f.Held, total)
	if err != nil {
		return appliance.CheckinResponse{}, fmt.Errorf("node %s: stored held set: %w", req.NodeID, err)
	}
	r := f.Range
	resp := appliance.CheckinResponse{
		Generation:    f.Generation,
		TotalShards:   total,
		Assigned:      make([]uint32, 0, r.Count),
		Pending:       []uint32{},
		RangeStart:    r.Start,
		RangeCount:    r.Count,
		LeaseSeconds:  uint32(lease / time.Second),
		TimeMS:        uint64(max(t.UnixMilli(), 0)),
		NextCheckinMS: uint32(lease / 3 / time.Millisecond),
	}
	for s := r.Start; s < r.Start+r.Count; s++ {
		resp.Assigned = append(resp.Assigned, s)
		if _, ok := slices.BinarySearch(held, s); !ok {
			resp.Pending = append(resp.Pending, s)
		}
	}
	c.mu.Lock()
	resp.MaxConcurrency = c.cfg.MaxConcurrency
	c.gatewayFieldsLocked(&resp)
	c.haFieldsLocked(&resp, routeFrom(ctx))
	resp.Term = max(resp.Term, f.Term)
	c.ha.followerAnswers++
	c.mu.Unlock()
	c.natsFields(req.NodeID, &resp)
	return resp, nil
}

// FollowerAnswers is how many check-ins this replica answered while it
// did not lead (the renewals without a leader above).
func (c *Controller) FollowerAnswers() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ha.followerAnswers
}
