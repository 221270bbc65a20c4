package controller

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
)

// Checkin renews a node's lease, records its health and shard status,
// applies its acknowledgement of the current plan, and answers with the
// node's assignment and which of its shards are still pending hand-off.
//
// The request must already be validated (appliance.ParseCheckinRequest)
// and authenticated. addr is the node's address as the server saw it.
// When the answer lets the node start a shard it could not start before,
// or carries a new generation, Checkin returns only after that state is
// committed durably.
func (c *Controller) Checkin(ctx context.Context, req *appliance.CheckinRequest, addr string) (appliance.CheckinResponse, error) {
	t := c.now()
	c.mu.Lock()
	if err := c.haCheckLocked(); err != nil {
		c.mu.Unlock()
		if answersAsFollower(ctx) {
			return c.followerCheckin(ctx, req)
		}
		return appliance.CheckinResponse{}, err
	}
	c.sweepLocked(t)
	n := c.nodes[req.NodeID]
	if n == nil {
		c.mu.Unlock()
		return appliance.CheckinResponse{}, fmt.Errorf("node %s: %w", req.NodeID, ErrUnknownNode)
	}
	for i := range req.Shards {
		if req.Shards[i].ID >= c.cfg.TotalShards {
			c.mu.Unlock()
			return appliance.CheckinResponse{}, &appliance.FieldError{Field: fmt.Sprintf("shards[%d].id", i),
				Reason: fmt.Sprintf("%d out of range 0..%d: %v", req.Shards[i].ID, c.cfg.TotalShards-1, ErrShardRange)}
		}
	}
	var becameLive func(string, string)
	if !n.live {
		becameLive = c.onLive
		n.live = true
		i, _ := slices.BinarySearchFunc(c.live, n.id, func(a *node, id string) int {
			switch {
			case a.id < id:
				return -1
			case a.id > id:
				return 1
			}
			return 0
		})
		c.live = slices.Insert(c.live, i, n)
		c.dirty = true
		if n.firstSeen.IsZero() {
			n.firstSeen = t
			c.eventLocked(t, EventNodeFirstSeen, n.id, nil, fmt.Sprintf("capacity %d from %s", req.Capacity, addr))
			c.log.Info("node first seen", "node", n.id, "capacity", req.Capacity, "addr", addr)
		} else {
			c.log.Info("node rejoined", "node", n.id, "capacity", req.Capacity, "addr", addr)
		}
	}
	if uint32(req.Capacity) != n.capacity {
		n.capacity = uint32(req.Capacity)
		c.dirty = true
	}
	n.lastSeen = t
	n.deadline = t.Add(c.cfg.Lease)
	n.lapseChecked = false
	if n.deadline.Before(c.nextSweep) {
		c.nextSweep = n.deadline.Add(time.Nanosecond)
	}
	n.address = addr
	n.counts = [4]int{req.ReadyShards, req.StartingShards, req.BackoffShards, req.FatalShards}
	n.broker = nil
	if req.NATS != nil {
		b := *req.NATS
		n.broker = &b
	}
	if req.Shards != nil {
		// Before n.status is overwritten: the rate needs the last report.
		n.delivery, n.deliveryOK = nextDelivery(n.status, n.statusAt, req.Shards, t)
		n.status = append(n.status[:0], req.Shards...)
		n.statusAt = t
		if c.stage.status == nil {
			c.stage.status = map[*node]struct{}{}
		}
		c.stage.status[n] = struct{}{}
	}

	if len(n.restart) > 0 && len(req.Shards) > 0 {
		c.settleRestartsLocked(t, n, req.Shards)
	}
	c.noteReadyLocked(req.Shards)
	if len(c.handoffs) > 0 && len(req.Shards) > 0 {
		c.settleHandoffsLocked(t, n, req.Shards)
	}
	if len(req.Shards) > 0 {
		c.noteSessionsLocked(t, n, req.Shards)
	}
	// Acknowledgement: the node runs nothing outside this generation's
	// range, so it no longer holds the rest. The statuses it reports for
	// those shards are its last word on them: a resumable session among
	// them goes to the shard's next holder (resume hand-off).
	ack := req.Generation == c.gen && req.Generation != 0
	var handoffSeq uint64
	if (ack || len(req.Shards) > 0) && c.recordHandoffsLocked(t, n, req.Shards, ack) {
		// With replicas the hand-off is committed before the release is
		// acknowledged, so a leader that dies after answering leaves it to
		// the next (haBatchLocked carries it).
		handoffSeq = c.haDurableSeqLocked()
	}
	if ack {
		n.ackedGen = req.Generation
		c.releaseOutsideLocked(n)
	}
	c.maybeRebalanceLocked(t)
	if n.plan.Count > n.capacity {
		// The node came back with less capacity while no rebalance may run
		// (its rate limit, or the restart grace): an answer never assigns
		// more startable shards than the capacity just reported.
		c.shrinkLocked(t, n)
	}

	// Grant every assigned shard nobody else holds.
	resp := appliance.CheckinResponse{
		Generation:     c.gen,
		TotalShards:    c.cfg.TotalShards,
		Assigned:       make([]uint32, 0, n.plan.Count),
		Pending:        []uint32{},
		RangeStart:     n.plan.Start,
		RangeCount:     n.plan.Count,
		LeaseSeconds:   uint32(c.cfg.Lease / time.Second),
		MaxConcurrency: c.cfg.MaxConcurrency,
		TimeMS:         uint64(max(t.UnixMilli(), 0)),
	}
	c.gatewayFieldsLocked(&resp)
	c.haFieldsLocked(&resp, routeFrom(ctx))
	if len(n.restart) > 0 {
		resp.RestartShards = c.restartsLocked(n)
	}
	grew := false
	for s := n.plan.Start; s < n.plan.Start+n.plan.Count; s++ {
		resp.Assigned = append(resp.Assigned, s)
		switch c.holder[s] {
		case n:
		case nil:
			c.holder[s] = n
			c.grantGen[s] = c.gen
			n.held = insertSorted(n.held, s)
			grew = true
		default:
			resp.Pending = append(resp.Pending, s)
			continue
		}
		// Startable here: a session its previous holder released
		// resumably is this node's, and only this node's, to Resume.
		if len(c.handoffs) > 0 {
			if rs, ok := c.resumeForLocked(t, s); ok {
				resp.Resume = append(resp.Resume, rs)
			}
		}
	}
	next := c.cfg.Lease / 3
	if len(resp.Pending) > 0 || c.dirty || n.ackedGen != c.gen {
		next = min(next, settleCheckin)
	}
	resp.NextCheckinMS = uint32(next / time.Millisecond)
	c.stageNodeLocked(n)
	// The answer may go out once its generation and its grants are durable.
	if grew {
		c.stage.seq++
		n.grantSeq = c.stage.seq
	}
	need := max(c.genSeq, n.grantSeq, handoffSeq)
	durable := need <= c.flushedSeq
	fence, lease := c.leaseFenceLocked(n.id), c.cfg.Lease
	c.mu.Unlock()
	if becameLive != nil {
		becameLive(n.id, addr)
	}
	// With replicas the renewal itself is committed, on the database's
	// clock, before the answer: a new leader trusts the stored deadline
	// (load), which is then never earlier than the node's own.
	if fence != nil {
		if err := c.commitLease(ctx, *fence, n.id, lease); err != nil {
			return appliance.CheckinResponse{}, err
		}
	}
	if !durable {
		if err := c.waitDurable(ctx, need); err != nil {
			return appliance.CheckinResponse{}, err
		}
	}
	c.natsFields(n.id, &resp)
	return resp, nil
}

// shrinkLocked cuts n's range down to its capacity at once, keeping its
// lowest shards, and bumps the generation. It only takes shards away, so it
// is safe while no rebalance may run: the shards cut off stay held by n
// until it acknowledges the new generation (safe hand-off), are unowned
// meanwhile, and go to other nodes at the next rebalance (dirty).
func (c *Controller) shrinkLocked(t time.Time, n *node) {
	was := n.plan
	n.plan.Count = n.capacity
	c.dirty = true
	if len(n.restart) > 0 {
		c.pruneRestartsLocked(n, "the shards left the node's assignment")
	}
	c.gen++
	c.planChangedAt = t
	c.stage.plan = true
	c.stage.seq++ // a new generation must be durable before anyone sees it
	c.genSeq = c.stage.seq
	detail := fmt.Sprintf("generation %d: %s reported capacity %d, range %d+%d cut to %d+%d until the next rebalance",
		c.gen, n.id, n.capacity, was.Start, was.Count, n.plan.Start, n.plan.Count)
	c.eventLocked(t, EventPlanChanged, n.id, nil, detail)
	c.log.Info("plan changed: range cut to capacity", "generation", c.gen, "node", n.id, "capacity", n.capacity,
		"range_start", was.Start, "was", was.Count)
}

// releaseOutsideLocked drops from n's held set every shard outside its
// current range.
func (c *Controller) releaseOutsideLocked(n *node) {
	kept := n.held[:0]
	for _, s := range n.held {
		if n.plan.Contains(s) {
			kept = append(kept, s)
			continue
		}
		if c.holder[s] == n {
			c.holder[s] = nil
		}
	}
	if len(kept) != len(n.held) {
		c.stageNodeLocked(n)
	}
	n.held = kept
}

// insertSorted inserts s into the sorted slice ids, which does not hold it.
func insertSorted(ids []uint32, s uint32) []uint32 {
	if len(ids) == 0 || ids[len(ids)-1] < s {
		return append(ids, s)
	}
	i, _ := slices.BinarySearch(ids, s)
	return slices.Insert(ids, i, s)
}
