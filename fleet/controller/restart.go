package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
)

// Restarting FATAL shards. A shard the Gateway closed with a non-retryable
// code (4004 authentication failed, 4010-4014) goes FATAL on its node and
// the node never retries it: the same Identify would fail the same way.
// Once the operator has fixed the cause (a new bot token file, other
// --intents, then a restart of dpxe serve), RestartFatal records a request
// for each FATAL shard of a node, and every check-in answer to that node
// lists them (appliance.CheckinResponse.RestartShards) until
//
//   - a check-in of that node reports the shard in a state other than
//     FATAL (the node took the request up), or the node claims an Identify
//     for it (a FATAL shard never claims, so the node took it up; the
//     claim may come before the node's next check-in, and the shard may be
//     FATAL again by then if the cause is not fixed: without this rule the
//     controller would restart it over and over);
//   - the shard leaves the node's assignment (a rebalance, a drain);
//   - the node's lease lapses.
//
// Requests live in memory only: a restarted controller forgets them, and
// the operator asks again.

// Errors of RestartFatal.
var (
	// ErrNotLive is returned when the node has no valid lease: it runs no
	// shard, so there is nothing to restart.
	ErrNotLive = errors.New("node is not live (no valid lease)")
	// ErrNotFatal is wrapped by *NotFatalError.
	ErrNotFatal = errors.New("shard is not FATAL on the node")
)

// NotFatalError says why a shard the operator named cannot be restarted.
type NotFatalError struct {
	Index  int // position in the requested list
	NodeID string
	Shard  uint32
	Why    string // e.g. "it is READY"
}

func (e *NotFatalError) Error() string {
	return fmt.Sprintf("shard %d is not FATAL on node %s: %s", e.Shard, e.NodeID, e.Why)
}

// Unwrap makes errors.Is(err, ErrNotFatal) hold.
func (e *NotFatalError) Unwrap() error { return ErrNotFatal }

// RestartFatal asks node id to start its FATAL shards again. It takes the
// shards the node reported FATAL in its latest per-shard status that are
// still in its assignment and held by it (only those listed in only, when
// only is not nil), records a restart request for each, and returns them
// ascending. Requests are idempotent: asking again for a shard whose
// request is pending keeps the one request. Nothing FATAL gives an empty
// list, not an error.
//
// Errors: ErrUnknownNode; ErrNotLive; a *NotFatalError for a listed shard
// that is not FATAL on the node; an *appliance.FieldError for a malformed
// list (empty, duplicates, IDs out of range).
func (c *Controller) RestartFatal(ctx context.Context, id string, only []uint32) ([]uint32, error) {
	if only != nil && len(only) == 0 {
		return nil, &appliance.FieldError{Field: "shards", Reason: "empty list: leave shards out to restart every FATAL shard of the node"}
	}
	for i, s := range only {
		if j := slices.Index(only[:i], s); j >= 0 {
			return nil, &appliance.FieldError{Field: fmt.Sprintf("shards[%d]", i), Reason: fmt.Sprintf("shard %d already listed in shards[%d]", s, j)}
		}
	}
	c.mu.Lock()
	if err := c.haCheckLocked(); err != nil {
		c.mu.Unlock()
		return nil, err
	}
	n, err := c.liveNodeLocked(id)
	if err != nil {
		c.mu.Unlock()
		return nil, err
	}
	var stored []appliance.ShardStatus
	if n.status == nil {
		// No status since this controller started (or the node sends
		// counts only): the dashboard shows the stored one, so use it.
		c.mu.Unlock()
		rows, err := c.st.ShardStatuses(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("node %s: stored shard status: %w", id, err)
		}
		stored = []appliance.ShardStatus{}
		for _, r := range rows {
			stored = append(stored, appliance.ShardStatus{ID: r.ShardID, State: appliance.ShardState(r.State),
				LastError: r.LastError, CloseCode: r.CloseCode})
		}
		c.mu.Lock()
		if n, err = c.liveNodeLocked(id); err != nil {
			c.mu.Unlock()
			return nil, err
		}
	}
	out, seq, err := c.restartFatalLocked(n, only, stored)
	c.mu.Unlock()
	if err != nil || seq == 0 {
		return out, err
	}
	// With replicas the request is committed before it is answered, so a
	// leader that dies right after leaves it to the next.
	if err := c.waitDurable(ctx, seq); err != nil {
		return nil, fmt.Errorf("node %s: restart request not committed: %w", id, err)
	}
	return out, nil
}

// restartFatalLocked is RestartFatal's work under c.mu: it records the
// requests and returns the shards and, with replicas, the stage sequence
// the answer waits for (0: none).
func (c *Controller) restartFatalLocked(n *node, only []uint32, stored []appliance.ShardStatus) ([]uint32, uint64, error) {
	id := n.id
	status := n.status
	if status == nil {
		status = stored
	}
	for i, s := range only {
		if s >= c.cfg.TotalShards {
			return nil, 0, &appliance.FieldError{Field: fmt.Sprintf("shards[%d]", i),
				Reason: fmt.Sprintf("%d out of range 0..%d: %v", s, c.cfg.TotalShards-1, ErrShardRange)}
		}
	}
	statusOf := func(s uint32) *appliance.ShardStatus {
		for i := range status {
			if status[i].ID == s {
				return &status[i]
			}
		}
		return nil
	}
	var picked []uint32
	if only == nil {
		for i := range status {
			if s := status[i].ID; status[i].State == appliance.ShardFatal && c.runsLocked(n, s) {
				picked = append(picked, s)
			}
		}
	} else {
		for i, s := range only {
			why := ""
			st := statusOf(s)
			switch {
			case !n.plan.Contains(s):
				why = "it is not in the node's assignment (" + n.plan.String() + ")"
			case !c.runsLocked(n, s):
				why = "its previous holder has not released it yet (hand-off pending)"
			case st == nil:
				why = "the node has reported no status for it"
			case st.State != appliance.ShardFatal:
				why = "it is " + string(st.State)
			}
			if why != "" {
				return nil, 0, &NotFatalError{Index: i, NodeID: id, Shard: s, Why: why}
			}
			picked = append(picked, s)
		}
	}
	slices.Sort(picked)
	out := []uint32{}
	added := false
	t := c.now()
	for _, s := range picked {
		out = append(out, s)
		i, dup := slices.BinarySearch(n.restart, s)
		if dup {
			continue
		}
		n.restart = slices.Insert(n.restart, i, s)
		added = true
		detail := "restart of a FATAL shard requested"
		if st := statusOf(s); st != nil && st.CloseCode != 0 {
			detail += fmt.Sprintf(" (close code %d)", st.CloseCode)
		}
		shard := s
		c.eventLocked(t, EventRestartRequested, n.id, &shard, detail)
	}
	var seq uint64
	if added {
		seq = c.haDurableSeqLocked()
	}
	if len(out) > 0 {
		c.log.Info("restart of FATAL shards requested", "node", n.id, "shards", encodeHeld(out))
	}
	return out, seq, nil
}

// liveNodeLocked returns node id if its lease is valid.
func (c *Controller) liveNodeLocked(id string) (*node, error) {
	c.sweepLocked(c.now())
	n := c.nodes[id]
	switch {
	case n == nil:
		return nil, fmt.Errorf("node %s: %w", id, ErrUnknownNode)
	case !n.live:
		return nil, fmt.Errorf("node %s: %w: it runs no shard to restart", id, ErrNotLive)
	}
	return n, nil
}

// runsLocked reports whether s is in n's assignment and held by n, so n
// may be running it.
func (c *Controller) runsLocked(n *node, s uint32) bool {
	return n.plan.Contains(s) && s < uint32(len(c.holder)) && c.holder[s] == n
}

// restartsLocked is the restart_shards of n's next answer: its pending
// requests, all within its assignment.
func (c *Controller) restartsLocked(n *node) []uint32 {
	var out []uint32
	for _, s := range n.restart {
		if n.plan.Contains(s) {
			out = append(out, s)
		}
	}
	return out
}

// settleRestartsLocked drops the requests of n that its reported statuses
// show taken up: the shard is in a state other than FATAL.
func (c *Controller) settleRestartsLocked(t time.Time, n *node, reported []appliance.ShardStatus) {
	for i := range reported {
		st := &reported[i]
		if st.State != appliance.ShardFatal {
			c.restartDoneLocked(t, n, st.ID, "reported "+string(st.State))
		}
	}
}

// restartDoneLocked drops n's request for s, if any: the shard came back
// from FATAL.
func (c *Controller) restartDoneLocked(t time.Time, n *node, s uint32, how string) {
	i, ok := slices.BinarySearch(n.restart, s)
	if !ok {
		return
	}
	if n.restart = slices.Delete(n.restart, i, i+1); len(n.restart) == 0 {
		n.restart = nil
	}
	shard := s
	c.eventLocked(t, EventShardRestarted, n.id, &shard, "back from FATAL after the restart request: "+how)
	c.log.Info("FATAL shard restarted", "node", n.id, "shard", s, "how", how)
}

// pruneRestartsLocked drops n's requests for shards outside its
// assignment (after a rebalance, or when its lease lapsed).
func (c *Controller) pruneRestartsLocked(n *node, why string) {
	kept := n.restart[:0]
	var dropped []uint32
	for _, s := range n.restart {
		if n.plan.Contains(s) {
			kept = append(kept, s)
		} else {
			dropped = append(dropped, s)
		}
	}
	n.restart = kept
	if len(n.restart) == 0 {
		n.restart = nil
	}
	if len(dropped) > 0 {
		c.log.Info("restart requests dropped", "node", n.id, "shards", encodeHeld(dropped), "why", why)
	}
}
