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
// follower records nothing else: plan changes and hand-offs wait for a
// leader, but no node loses its lease while none answers.
//
// A follower also answers an Identify claim no leader answers
// (followerIdentify): a grant is one transaction (store.GrantIdentify)
// that commits only if the store shows the node's lease running, the node
// live and holding the shard in its range with no other live node holding
// it, the bucket's last grant a window old on the database's clock, and
// the stored budget above its reserve, and it spends from that budget. So
// a shard whose session Discord invalidated starts again while the
// leader is cut off from the nodes.
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

type receivedKey struct{}

// ReceivedAt returns ctx noting when the request reached this replica: a
// follower does not grant a claim that has waited so long (forwarded to
// a leader that did not answer) that its answer would come past the
// grant's use_within_ms.
func ReceivedAt(ctx context.Context, t time.Time) context.Context {
	return context.WithValue(ctx, receivedKey{}, t)
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

// FollowerAnswers is how many check-ins this replica answered, and how
// many Identify claims it granted, while it did not lead (the renewals
// and grants without a leader above).
func (c *Controller) FollowerAnswers() (checkins, grants uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ha.followerAnswers, c.ha.followerGrants
}

// followerIdentify answers req on a replica that does not lead (see the
// comment at the top of this file). A shard that never started waits for
// every shard of the earlier start groups to have started, as the stored
// audit log and statuses show: a follower does not judge which of them
// cannot start now, as a leader does.
func (c *Controller) followerIdentify(ctx context.Context, req appliance.IdentifyRequest) (appliance.IdentifyResponse, error) {
	t := c.now()
	c.mu.Lock()
	enabled, total, mc, window, reserve := c.ha.enabled, c.cfg.TotalShards, max(c.cfg.MaxConcurrency, 1), c.cfg.IdentifyWindow, c.cfg.SessionReserve
	base := c.startGroupBase(req.ShardID)
	c.mu.Unlock()
	if !enabled {
		return appliance.IdentifyResponse{}, fmt.Errorf("%w: not a replica", ErrNotLeader)
	}
	bucket := appliance.IdentifyBucket(req.ShardID, mc)
	resp := appliance.IdentifyResponse{ShardID: req.ShardID, Bucket: bucket}
	refuse := func(reason appliance.IdentifyReason, after time.Duration) (appliance.IdentifyResponse, error) {
		resp.Reason = reason
		resp.RetryAfterMS = retryAfterMS(after)
		return resp, nil
	}
	if req.ShardID >= total {
		return refuse(appliance.ReasonNotOwner, settleCheckin)
	}
	if blocker, ok, err := c.storedOrderBlocker(ctx, req.ShardID, base); err != nil {
		return appliance.IdentifyResponse{}, err
	} else if ok {
		c.log.Debug("follower refuses an Identify claim: an earlier start group has not started", "shard", req.ShardID, "blocker", blocker)
		return refuse(appliance.ReasonOrder, orderRetry)
	}
	if at, ok := ctx.Value(receivedKey{}).(time.Time); ok && time.Since(at) > appliance.GrantUseWithin(window)/2 {
		// The node would likely discard the grant (its answer comes past
		// use_within_ms) and the budget would be spent for nothing: it
		// claims again, and this replica then answers at once.
		return refuse(appliance.ReasonBucketBusy, time.Millisecond)
	}
	shard := req.ShardID
	_, err := c.st.GrantIdentify(ctx, store.Grant{NodeID: req.NodeID, ShardID: shard, Bucket: bucket, MaxConcurrency: mc,
		Spacing: window, Reserve: reserve, Owner: func(v store.OwnerView) error { return storedOwner(v, shard, total) },
		Event: store.Event{At: t, Kind: EventIdentifyGranted, NodeID: req.NodeID, ShardID: &shard, Detail: grantDetail(total)}})
	var r *store.GrantRefused
	switch {
	case errors.As(err, &r) && errors.Is(err, store.ErrGrantSpacing):
		return refuse(appliance.ReasonBucketBusy, r.Wait)
	case errors.As(err, &r) && errors.Is(err, store.ErrBudgetSpent):
		return refuse(appliance.ReasonBudget, window)
	case errors.As(err, &r):
		return refuse(appliance.ReasonNotOwner, settleCheckin)
	case err != nil:
		return appliance.IdentifyResponse{}, err
	}
	c.mu.Lock()
	c.ha.followerGrants++
	c.mu.Unlock()
	resp.Granted = true
	resp.UseWithinMS = uint32(appliance.GrantUseWithin(window) / time.Millisecond)
	return resp, nil
}

// storedOwner is a follower's owner check of a grant: the store shows the
// node's lease running, the node live and holding shard in its range, and
// no other live node holding it.
func storedOwner(v store.OwnerView, shard, total uint32) error {
	if v.LeaseLeft <= 0 {
		return store.ErrLeaseLapsed
	}
	if !v.Live {
		return errors.New("the node is not live")
	}
	if shard < v.Range.Start || shard-v.Range.Start >= v.Range.Count {
		return fmt.Errorf("shard %d is outside the node's range %d+%d", shard, v.Range.Start, v.Range.Count)
	}
	if held, err := decodeHeld(v.Held, total); err != nil || !slices.Contains(held, shard) {
		return fmt.Errorf("the node does not hold shard %d (%q, %v)", shard, v.Held, err)
	}
	for id, h := range v.OthersHeld {
		if held, err := decodeHeld(h, total); err != nil || slices.Contains(held, shard) {
			return fmt.Errorf("node %s holds shard %d too (%q, %v)", id, shard, h, err)
		}
	}
	return nil
}

// storedOrderBlocker returns a shard below base (the claimed shard's start
// group) that the store does not show started, unless the claimed shard
// itself started before: the stored audit log's last identify_granted of
// this shard count after its last identify_unused, or a READY status.
func (c *Controller) storedOrderBlocker(ctx context.Context, shard, base uint32) (uint32, bool, error) {
	c.mu.Lock()
	total := c.cfg.TotalShards
	c.mu.Unlock()
	last, err := c.st.LastShardEvents(ctx, EventIdentifyGranted, EventIdentifyUnused, grantDetail(total))
	if err != nil {
		return 0, false, err
	}
	started := make([]bool, total)
	for _, x := range last {
		if x.LastA > x.LastB && x.ShardID < total {
			started[x.ShardID] = true
		}
	}
	if started[shard] {
		return 0, false, nil
	}
	if base > 0 {
		st, err := c.st.ShardStatuses(ctx, "")
		if err != nil {
			return 0, false, err
		}
		for _, x := range st {
			if x.State == string(appliance.ShardReady) && x.ShardID < total {
				started[x.ShardID] = true
			}
		}
	}
	for s := range base {
		if !started[s] {
			return s, true, nil
		}
	}
	return 0, false, nil
}
