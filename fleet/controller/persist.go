package controller

import (
	"context"
	"fmt"
	"time"

	"github.com/discord-pxe/dpxe/fleet/store"
)

// stage collects changes not yet written to the store. Everything in it is
// guarded by Controller.mu. seq counts changes that must be durable before
// the answer depending on them is sent; Controller.flushedSeq says how far
// they are committed.
type stage struct {
	nodes  map[*node]struct{}
	status map[*node]struct{}
	plan   bool
	budget bool
	events []store.Event
	// sessions: per shard, the session record to write or drop
	// (crashresume.go).
	sessions map[uint32]store.ShardSession
	seq      uint64
}

func (c *Controller) stageNodeLocked(n *node) {
	if c.stage.nodes == nil {
		c.stage.nodes = map[*node]struct{}{}
	}
	c.stage.nodes[n] = struct{}{}
}

// eventLocked appends an audit-log entry to the next flush.
func (c *Controller) eventLocked(t time.Time, kind, nodeID string, shard *uint32, detail string) {
	e := store.Event{At: t, Kind: kind, NodeID: nodeID, Detail: detail}
	if shard != nil {
		v := *shard
		e.ShardID = &v
	}
	c.stage.events = append(c.stage.events, e)
}

// nodeStateLocked is n as the store keeps it.
func nodeStateLocked(n *node) store.NodeState {
	return store.NodeState{ID: n.id, Draining: n.draining, Capacity: int(n.capacity), FirstSeen: n.firstSeen,
		LastSeen: n.lastSeen, LeaseDeadline: n.deadline, Live: n.live, AckedGeneration: n.ackedGen,
		Held: encodeHeld(n.held), Address: n.address,
		Ready: n.counts[0], Starting: n.counts[1], Backoff: n.counts[2], Fatal: n.counts[3]}
}

// snapshotLocked moves the stage into a batch: a consistent copy of the
// staged state at one instant.
func (c *Controller) snapshotLocked() (*store.Batch, uint64) {
	b := &store.Batch{Events: c.stage.events}
	for n := range c.stage.nodes {
		b.Nodes = append(b.Nodes, nodeStateLocked(n))
	}
	for n := range c.stage.status {
		for _, s := range n.status {
			b.ShardStatus = append(b.ShardStatus, store.ShardStatus{ShardID: s.ID, NodeID: n.id, State: string(s.State),
				SeqValid: s.SeqValid, HeartbeatAcks: s.HeartbeatAcks, HeartbeatMisses: s.HeartbeatMisses,
				Reconnects: s.Reconnects, LastError: s.LastError, CloseCode: s.CloseCode, UpdatedAt: n.statusAt})
		}
	}
	if c.stage.plan {
		p := &store.Plan{Generation: c.gen, TotalShards: c.cfg.TotalShards, ChangedAt: c.planChangedAt}
		for _, n := range c.live {
			if n.plan.Count > 0 {
				p.Ranges = append(p.Ranges, store.PlanRange{NodeID: n.id, Start: n.plan.Start, Count: n.plan.Count})
			}
		}
		b.Plan = p
	}
	if c.stage.budget {
		bu := c.budget
		b.Budget = &bu
	}
	for _, x := range c.stage.sessions {
		b.Sessions = append(b.Sessions, x)
	}
	c.haBatchLocked(b)
	seq := c.stage.seq
	b.Durable = seq > c.flushedSeq
	c.stage = stage{seq: seq}
	return b, seq
}

// restageLocked puts a failed batch's state back so the next flush
// retries it. Node rows and the plan are re-read from memory then.
func (c *Controller) restageLocked(b *store.Batch) {
	for _, ns := range b.Nodes {
		if n := c.nodes[ns.ID]; n != nil {
			c.stageNodeLocked(n)
		}
	}
	c.stage.plan = c.stage.plan || b.Plan != nil
	c.stage.budget = c.stage.budget || b.Budget != nil
	c.stage.events = append(b.Events, c.stage.events...)
	for _, x := range b.Sessions {
		if _, newer := c.stage.sessions[x.ShardID]; !newer {
			c.stageSessionLocked(x)
		}
	}
}

// Flush writes every staged change to the store in one transaction.
func (c *Controller) Flush(ctx context.Context) error {
	c.flushMu.Lock()
	defer c.flushMu.Unlock()
	return c.flushHeld(ctx)
}

// flushHeld is Flush with flushMu held.
func (c *Controller) flushHeld(ctx context.Context) error {
	c.mu.Lock()
	if err := c.haFlushRefusedLocked(); err != nil {
		c.mu.Unlock()
		return err
	}
	b, seq := c.snapshotLocked()
	onCommit := c.onCommit
	c.mu.Unlock()
	if b.Empty() {
		return nil
	}
	start := time.Now()
	err := c.st.Apply(ctx, b)
	if onCommit != nil {
		onCommit(time.Since(start), err)
	}
	if err != nil {
		c.mu.Lock()
		if c.ha.enabled && (!c.ha.leading || b.Fence != c.ha.fence) {
			// The leadership the batch was staged under has ended: the
			// batch is lost, not retried under another term.
			c.ha.lost = append(c.ha.lost, seqRange{c.flushedSeq + 1, seq})
		} else {
			c.restageLocked(b)
		}
		c.mu.Unlock()
		c.haFlushFailed(err)
		c.log.Error("store write failed; will retry", "err", err)
		return fmt.Errorf("store: %w", err)
	}
	c.mu.Lock()
	c.flushedSeq = max(c.flushedSeq, seq)
	c.haCommittedLocked(b)
	late := len(c.ha.lateLeases) > 0
	c.mu.Unlock()
	if late {
		c.commitLateLeases(ctx)
	}
	return nil
}

// waitDurable returns once every change staged up to seq is committed.
// Callers that arrive while a flush runs are usually covered by the next
// one: one commit serves all of them (group commit).
func (c *Controller) waitDurable(ctx context.Context, seq uint64) error {
	c.mu.Lock()
	done, lost := c.flushedSeq >= seq, c.lostLocked(seq)
	c.mu.Unlock()
	if lost {
		return ErrNotLeader
	}
	if done {
		return nil
	}
	c.flushMu.Lock()
	defer c.flushMu.Unlock()
	c.mu.Lock()
	done, lost = c.flushedSeq >= seq, c.lostLocked(seq)
	c.mu.Unlock()
	if lost {
		return ErrNotLeader
	}
	if done {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := c.flushHeld(ctx); err != nil {
		return err
	}
	c.mu.Lock()
	lost = c.lostLocked(seq)
	c.mu.Unlock()
	if lost {
		return ErrNotLeader
	}
	return nil
}

// Run ticks the controller (lease expiry, due rebalances) and flushes
// batched writes every flushEvery until ctx is cancelled, then flushes a
// last time.
func (c *Controller) Run(ctx context.Context, flushEvery time.Duration) error {
	tick := time.NewTicker(min(flushEvery, max(c.cfg.RebalanceEvery, 50*time.Millisecond)))
	defer tick.Stop()
	lastFlush := time.Now()
	for {
		select {
		case <-ctx.Done():
			return c.Flush(context.WithoutCancel(ctx))
		case <-tick.C:
			c.Tick()
			if time.Since(lastFlush) >= flushEvery {
				lastFlush = time.Now()
				_ = c.Flush(ctx) // logged; retried next time
			}
		}
	}
}
