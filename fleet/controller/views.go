package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// NodeView is a read-only summary of one node for the API and dashboard.
type NodeView struct {
	ID              string    `json:"id"`
	Live            bool      `json:"live"`
	Draining        bool      `json:"draining"`
	Capacity        uint32    `json:"capacity"`
	Address         string    `json:"address,omitempty"`
	CreatedAt       time.Time `json:"created_at"`
	FirstSeen       time.Time `json:"first_seen,omitzero"`
	LastSeen        time.Time `json:"last_seen,omitzero"`
	LeaseDeadline   time.Time `json:"lease_deadline,omitzero"`
	AckedGeneration uint64    `json:"acked_generation"`
	RangeStart      uint32    `json:"range_start"`
	RangeCount      uint32    `json:"range_count"`
	Held            string    `json:"held"`    // shards it may run, as ranges
	Pending         int       `json:"pending"` // assigned shards still held by another node
	ReadyShards     int       `json:"ready_shards"`
	StartingShards  int       `json:"starting_shards"`
	BackoffShards   int       `json:"backoff_shards"`
	FatalShards     int       `json:"fatal_shards"`
	// Delivery is the node's event delivery from its latest check-in;
	// nil when that check-in carried none (delivery off, or nothing
	// published yet) or the node is not live.
	Delivery *NodeDelivery `json:"delivery,omitempty"`
	// NATS is the node's connection to the event broker as its latest
	// check-in reported it; nil when that check-in had none (no broker
	// access) or the node is not live.
	NATS *appliance.BrokerStatus `json:"nats,omitempty"`
}

// NodeDetail is a node with its latest per-shard status.
type NodeDetail struct {
	NodeView
	StatusAt time.Time               `json:"status_at,omitzero"`
	Shards   []appliance.ShardStatus `json:"shards"`
	// RestartShards are the node's pending requests to start a FATAL
	// shard again (POST /v1/nodes/{id}/restart-fatal), ascending.
	RestartShards []uint32 `json:"restart_shards,omitempty"`
}

func (c *Controller) viewLocked(n *node) NodeView {
	v := NodeView{ID: n.id, Live: n.live, Draining: n.draining, Capacity: n.capacity, Address: n.address,
		CreatedAt: n.createdAt, FirstSeen: n.firstSeen, LastSeen: n.lastSeen, AckedGeneration: n.ackedGen,
		RangeStart: n.plan.Start, RangeCount: n.plan.Count, Held: encodeHeld(n.held),
		ReadyShards: n.counts[0], StartingShards: n.counts[1], BackoffShards: n.counts[2], FatalShards: n.counts[3]}
	if n.live {
		v.LeaseDeadline = n.deadline
		if n.deliveryOK {
			d := n.delivery
			v.Delivery = &d
		}
		if n.broker != nil {
			b := *n.broker
			v.NATS = &b
		}
	}
	for s := n.plan.Start; s < n.plan.Start+n.plan.Count; s++ {
		if h := c.holder[s]; h != nil && h != n {
			v.Pending++
		}
	}
	return v
}

// Nodes lists every inventory node, ordered by ID.
func (c *Controller) Nodes() []NodeView {
	t := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sweepLocked(t)
	out := make([]NodeView, 0, len(c.nodes))
	for _, n := range c.nodes {
		out = append(out, c.viewLocked(n))
	}
	slices.SortFunc(out, func(a, b NodeView) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Node returns one node with its shard status. Status not reported since
// the controller started is read from the store.
func (c *Controller) Node(ctx context.Context, id string) (NodeDetail, error) {
	t := c.now()
	c.mu.Lock()
	c.sweepLocked(t)
	n := c.nodes[id]
	if n == nil {
		c.mu.Unlock()
		return NodeDetail{}, fmt.Errorf("node %s: %w", id, ErrUnknownNode)
	}
	d := NodeDetail{NodeView: c.viewLocked(n), StatusAt: n.statusAt, Shards: slices.Clone(n.status),
		RestartShards: slices.Clone(n.restart)}
	c.mu.Unlock()
	if d.Shards == nil {
		rows, err := c.st.ShardStatuses(ctx, id)
		if err != nil {
			return NodeDetail{}, err
		}
		d.Shards = []appliance.ShardStatus{}
		for _, r := range rows {
			d.Shards = append(d.Shards, appliance.ShardStatus{ID: r.ShardID, State: appliance.ShardState(r.State),
				SeqValid: r.SeqValid, HeartbeatAcks: r.HeartbeatAcks, HeartbeatMisses: r.HeartbeatMisses,
				Reconnects: r.Reconnects, LastError: r.LastError, CloseCode: r.CloseCode})
			d.StatusAt = r.UpdatedAt
		}
	}
	return d, nil
}

// PlanEntry is one node's part of the plan.
type PlanEntry struct {
	NodeID   string `json:"node_id"`
	Start    uint32 `json:"range_start"`
	Count    uint32 `json:"range_count"`
	Pending  int    `json:"pending"`
	Draining bool   `json:"draining"`
}

// PlanView is the current plan.
type PlanView struct {
	Generation     uint64      `json:"generation"`
	TotalShards    uint32      `json:"total_shards"`
	MaxConcurrency uint32      `json:"max_concurrency"`
	LeaseSeconds   uint32      `json:"lease_seconds"`
	ChangedAt      time.Time   `json:"changed_at,omitzero"`
	LiveNodes      int         `json:"live_nodes"`
	Assigned       uint32      `json:"assigned"`    // shards in some node's range
	Owned          uint32      `json:"owned"`       // shards a live node may run now
	Rebalancing    bool        `json:"rebalancing"` // a membership change awaits the next rebalance
	GraceUntil     time.Time   `json:"restart_grace_until,omitzero"`
	Ranges         []PlanEntry `json:"ranges"`
}

// Plan returns the current plan.
func (c *Controller) Plan() PlanView {
	t := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sweepLocked(t)
	v := PlanView{Generation: c.gen, TotalShards: c.cfg.TotalShards, MaxConcurrency: c.cfg.MaxConcurrency,
		LeaseSeconds: uint32(c.cfg.Lease / time.Second), ChangedAt: c.planChangedAt, LiveNodes: len(c.live),
		Rebalancing: c.dirty, Ranges: []PlanEntry{}}
	if t.Before(c.graceUntil) {
		v.GraceUntil = c.graceUntil
	}
	for _, n := range c.live {
		if n.plan.Count == 0 {
			continue
		}
		e := PlanEntry{NodeID: n.id, Start: n.plan.Start, Count: n.plan.Count, Draining: n.draining}
		for s := n.plan.Start; s < n.plan.Start+n.plan.Count; s++ {
			switch c.holder[s] {
			case n:
				v.Owned++
			case nil:
			default:
				e.Pending++
			}
		}
		v.Assigned += n.plan.Count
		v.Ranges = append(v.Ranges, e)
	}
	return v
}

// RouteView answers where a guild's events go.
type RouteView struct {
	GuildID     string `json:"guild_id"`
	ShardID     uint32 `json:"shard_id"`
	TotalShards uint32 `json:"total_shards"`
	NodeID      string `json:"node_id"`
	Address     string `json:"address"`
	Generation  uint64 `json:"generation"`
}

// Route maps a guild to its shard (appliance.ShardForGuild) and to the live
// node that may run that shard now. It returns ErrNoOwner, with the shard
// filled in, when no live node holds the shard.
func (c *Controller) Route(guildID uint64) (RouteView, error) {
	t := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sweepLocked(t)
	v := RouteView{GuildID: fmt.Sprint(guildID), TotalShards: c.cfg.TotalShards, Generation: c.gen}
	v.ShardID = appliance.ShardForGuild(guildID, c.cfg.TotalShards)
	n := c.holder[v.ShardID]
	if n == nil || !n.live {
		return v, ErrNoOwner
	}
	v.NodeID, v.Address = n.id, n.address
	return v, nil
}

// Events flushes pending writes and returns up to limit audit-log entries
// after the given ID, optionally of one kind.
func (c *Controller) Events(ctx context.Context, after int64, kind string, limit int) ([]store.Event, error) {
	if err := c.Flush(ctx); err != nil {
		return nil, err
	}
	return c.st.Events(ctx, after, kind, limit)
}

// Owners returns, for every shard, the live node allowed to run it ("" for
// none). Tests use it to check the hand-off invariant.
func (c *Controller) Owners() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, len(c.holder))
	for s, n := range c.holder {
		if n != nil && n.live {
			out[s] = n.id
		}
	}
	return out
}

// CheckInvariants verifies the controller's internal consistency: every
// holder is live and lists the shard in its held set, held sets are sorted
// and disjoint, and live nodes are sorted. It is for tests and costs
// O(shards + nodes).
func (c *Controller) CheckInvariants() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := make(map[uint32]string)
	for _, n := range c.nodes {
		if !n.live && len(n.held) > 0 {
			return fmt.Errorf("node %s is not live but holds %s", n.id, encodeHeld(n.held))
		}
		for i, s := range n.held {
			if i > 0 && n.held[i-1] >= s {
				return fmt.Errorf("node %s held set not sorted: %v", n.id, n.held)
			}
			if other, dup := seen[s]; dup {
				return fmt.Errorf("shard %d held by %s and %s", s, other, n.id)
			}
			seen[s] = n.id
			if h := c.holder[s]; h != n {
				other := "nobody"
				if h != nil {
					other = h.id
				}
				return fmt.Errorf("shard %d in %s's held set but its holder is %s", s, n.id, other)
			}
		}
	}
	for s, n := range c.holder {
		if n != nil && seen[uint32(s)] != n.id {
			return fmt.Errorf("shard %d holder %s does not list it", s, n.id)
		}
	}
	for i := 1; i < len(c.live); i++ {
		if c.live[i-1].id >= c.live[i].id {
			return fmt.Errorf("live list not sorted at %d", i)
		}
	}
	return nil
}
