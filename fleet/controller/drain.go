package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// ErrDrainStrands is returned by Drain without force when draining the node
// would leave shards with no owner: the other live nodes' spare capacity
// cannot hold them.
var ErrDrainStrands = errors.New("the other nodes cannot hold every shard")

// ShardMove is a run of shards [Start, Start+Count) that changes owner in a
// plan change: from node From to node To ("" is no owner).
type ShardMove struct {
	From  string `json:"from"`
	To    string `json:"to"`
	Start uint32 `json:"start"`
	Count uint32 `json:"count"`
}

// DrainPreview is what draining a node does to the plan, computed with the
// controller's own policy (Rebalance over the live set, the node draining),
// as the next rebalance will compute it if membership stays as it is.
type DrainPreview struct {
	NodeID     string `json:"node_id"`
	Live       bool   `json:"live"`
	Draining   bool   `json:"draining"` // already draining: nothing changes
	RangeStart uint32 `json:"range_start"`
	RangeCount uint32 `json:"range_count"`
	// Moves lists every run of shards that changes owner, the node's own
	// and the other nodes' (ranges stay contiguous, so others shift too),
	// in shard order; To "" runs become unowned.
	Moves []ShardMove `json:"moves"`
	// Moved counts the shards that change owner, Leaving those of the
	// drained node.
	Moved   uint32 `json:"moved"`
	Leaving uint32 `json:"leaving"`
	// UnownedBefore and UnownedAfter count the shards with no owner now
	// and after the drain; Strands is how many more the drain leaves
	// without one (Drain refuses it without force).
	UnownedBefore uint32 `json:"unowned_before"`
	UnownedAfter  uint32 `json:"unowned_after"`
	Strands       uint32 `json:"strands"`
}

// PreviewDrain says what draining node id would move where and what it
// would leave unowned. It changes nothing.
func (c *Controller) PreviewDrain(id string) (DrainPreview, error) {
	t := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sweepLocked(t)
	return c.previewDrainLocked(id)
}

// Drain marks node id draining, as SetDraining does, unless the preview
// says it would leave shards unowned and force is false: then nothing
// changes and the error wraps ErrDrainStrands. It returns the preview
// computed for the decision.
func (c *Controller) Drain(ctx context.Context, id string, force bool) (DrainPreview, error) {
	t := c.now()
	c.mu.Lock()
	c.sweepLocked(t)
	p, err := c.previewDrainLocked(id)
	if err != nil {
		c.mu.Unlock()
		return p, err
	}
	if p.Strands > 0 && !force {
		c.mu.Unlock()
		return p, fmt.Errorf("drain %s: %d shards would have no owner: %w (add capacity, or force the drain)", id, p.Strands, ErrDrainStrands)
	}
	seq := c.setDrainingLocked(t, c.nodes[id], true)
	c.mu.Unlock()
	return p, c.waitDurable(ctx, seq)
}

func (c *Controller) previewDrainLocked(id string) (DrainPreview, error) {
	n := c.nodes[id]
	if n == nil {
		return DrainPreview{}, fmt.Errorf("node %s: %w", id, ErrUnknownNode)
	}
	p := DrainPreview{NodeID: id, Live: n.live, Draining: n.draining, RangeStart: n.plan.Start, RangeCount: n.plan.Count, Moves: []ShardMove{}}
	members := make([]Member, len(c.live))
	for i, m := range c.live {
		members[i] = Member{ID: m.id, Capacity: m.capacity, Draining: m.draining || m == n}
	}
	next := Rebalance(members, c.cfg.TotalShards)
	before := make([]owned, 0, len(c.live))
	after := make([]owned, 0, len(c.live))
	for i, m := range c.live {
		if m.plan.Count > 0 {
			before = append(before, owned{m.id, m.plan})
		}
		if next[i].Count > 0 {
			after = append(after, owned{m.id, next[i]})
		}
	}
	p.Moves = planMoves(before, after, c.cfg.TotalShards)
	for _, mv := range p.Moves {
		p.Moved += mv.Count
		if mv.From == id {
			p.Leaving += mv.Count
		}
	}
	total := c.cfg.TotalShards
	p.UnownedBefore = total - sumOwned(before)
	p.UnownedAfter = total - sumOwned(after)
	if p.UnownedAfter > p.UnownedBefore {
		p.Strands = p.UnownedAfter - p.UnownedBefore
	}
	return p, nil
}

// owned is a node's range in a plan.
type owned struct {
	id string
	r  Range
}

func sumOwned(os []owned) uint32 {
	var s uint32
	for _, o := range os {
		s += o.r.Count
	}
	return s
}

// planMoves lists the runs of shards whose owner differs between two
// plans, each given as disjoint ranges. It runs in O(ranges), whatever the
// shard count.
func planMoves(before, after []owned, total uint32) []ShardMove {
	cuts := []uint32{0, total}
	for _, set := range [][]owned{before, after} {
		for _, o := range set {
			cuts = append(cuts, o.r.Start, o.r.Start+o.r.Count)
		}
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	// Each plan's ranges ascend (contiguous in sorted node order), so the
	// owner of a shard is the last range starting at or before it.
	ownerAt := func(set []owned, s uint32) string {
		i, _ := slices.BinarySearchFunc(set, s+1, func(o owned, x uint32) int {
			if o.r.Start < x {
				return -1
			}
			return 1
		})
		if i > 0 && set[i-1].r.Contains(s) {
			return set[i-1].id
		}
		return ""
	}
	moves := []ShardMove{}
	for i := 0; i+1 < len(cuts) && cuts[i] < total; i++ {
		lo, hi := cuts[i], min(cuts[i+1], total)
		from, to := ownerAt(before, lo), ownerAt(after, lo)
		if from == to {
			continue
		}
		if k := len(moves) - 1; k >= 0 && moves[k].From == from && moves[k].To == to && moves[k].Start+moves[k].Count == lo {
			moves[k].Count += hi - lo
			continue
		}
		moves = append(moves, ShardMove{From: from, To: to, Start: lo, Count: hi - lo})
	}
	return moves
}

// setDrainingLocked sets n's draining flag, records the event, stages the
// node and rebalances if the rate limit allows; it returns the sequence to
// wait for.
func (c *Controller) setDrainingLocked(t time.Time, n *node, draining bool) uint64 {
	if n.draining != draining {
		n.draining = draining
		if n.live {
			c.dirty = true
		}
		kind := EventUndrain
		if draining {
			kind = EventDrain
		}
		c.eventLocked(t, kind, n.id, nil, "")
		c.log.Info(kind, "node", n.id)
	}
	c.stageNodeLocked(n)
	c.stage.seq++
	seq := c.stage.seq
	c.maybeRebalanceLocked(t)
	return seq
}
