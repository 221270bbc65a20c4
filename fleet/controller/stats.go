package controller

import (
	"context"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
)

// This file gives fleet/metrics the controller's state at one instant, in
// one pass under the lock: the metrics collector reads it at scrape time
// and the health verdict is computed from it, so neither keeps its own
// copy of the fleet in step with the controller.

// NodeStats is one inventory node in a FleetStats.
type NodeStats struct {
	ID            string
	Live          bool
	Draining      bool
	Capacity      uint32
	Range         Range     // the node's range in the current plan (empty when not live)
	Held          int       // shards it may run now
	LastSeen      time.Time // last check-in, zero if never
	LeaseDeadline time.Time // zero when not live
	// HeartbeatMisses and Reconnects are the sums of the counters the
	// node's shards last reported (each counts since the shard started on
	// the node, so a sum falls when a shard leaves it).
	HeartbeatMisses uint64
	Reconnects      uint64
	// Delivery is the live node's event delivery from its latest
	// check-in (NodeDelivery), when DeliveryOK: false when that check-in
	// carried none, or the node is not live.
	Delivery   NodeDelivery
	DeliveryOK bool
	// Broker is the live node's broker connection state as its latest
	// check-in reported it (appliance.BrokerUp or BrokerDown); "" when it
	// reported none, or the node is not live.
	Broker string
}

// ShardStats is one global shard in a FleetStats.
type ShardStats struct {
	// Node is the index in FleetStats.Nodes of the live node whose plan
	// range has the shard, or -1 when no live node's range has it.
	Node int32
	// Held says that node holds the shard (may run it); false with Node
	// set means the hand-off from its previous owner is pending.
	Held bool
	// Reported says the node reported a status for the shard; State,
	// PingMS, AckSlow and CloseCode are that status.
	Reported  bool
	State     appliance.ShardState
	PingMS    float64 // last heartbeat-to-ACK latency, 0 before the first ACK
	AckSlow   bool
	CloseCode uint16
}

// FleetStats is the controller's state at one instant (FleetStats).
type FleetStats struct {
	At             time.Time
	Generation     uint64
	TotalShards    uint32
	MaxConcurrency uint32
	Lease          time.Duration
	Rebalancing    bool      // a membership change awaits the next rebalance
	GraceUntil     time.Time // no rebalance before this (restart safety); zero when over
	Budget         Budget
	Nodes          []NodeStats  // every inventory node, in no particular order
	Shards         []ShardStats // one per global shard
}

// FleetStats returns the state of every node and shard. It costs
// O(shards + nodes + reported statuses) under the controller's lock and
// allocates the two slices; nothing else is shared with the controller.
func (c *Controller) FleetStats() FleetStats {
	t := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sweepLocked(t)
	c.refillBudgetLocked(t)
	fs := FleetStats{At: t, Generation: c.gen, TotalShards: c.cfg.TotalShards, MaxConcurrency: c.cfg.MaxConcurrency,
		Lease: c.cfg.Lease, Rebalancing: c.dirty,
		Budget: Budget{Total: c.budget.Total, Remaining: c.budget.Remaining, Reserve: c.cfg.SessionReserve, ResetAt: c.budget.ResetAt},
		Nodes:  make([]NodeStats, 0, len(c.nodes)), Shards: make([]ShardStats, c.cfg.TotalShards)}
	if t.Before(c.graceUntil) {
		fs.GraceUntil = c.graceUntil
	}
	for i := range fs.Shards {
		fs.Shards[i].Node = -1
	}
	for _, n := range c.nodes {
		ns := NodeStats{ID: n.id, Live: n.live, Draining: n.draining, Capacity: n.capacity,
			Held: len(n.held), LastSeen: n.lastSeen}
		if n.live {
			ns.Range = n.plan
			ns.LeaseDeadline = n.deadline
			ns.Delivery, ns.DeliveryOK = n.delivery, n.deliveryOK
			if n.broker != nil {
				ns.Broker = n.broker.State
			}
		}
		for i := range n.status {
			ns.HeartbeatMisses += uint64(n.status[i].HeartbeatMisses)
			ns.Reconnects += uint64(n.status[i].Reconnects)
		}
		idx := int32(len(fs.Nodes))
		fs.Nodes = append(fs.Nodes, ns)
		if !n.live {
			continue
		}
		for s := n.plan.Start; s < n.plan.Start+n.plan.Count && s < c.cfg.TotalShards; s++ {
			fs.Shards[s] = ShardStats{Node: idx, Held: c.holder[s] == n}
		}
		for i := range n.status {
			st := &n.status[i]
			if st.ID >= c.cfg.TotalShards || !n.plan.Contains(st.ID) {
				continue
			}
			sh := &fs.Shards[st.ID]
			sh.Reported, sh.State, sh.PingMS, sh.AckSlow, sh.CloseCode = true, st.State, st.PingMS, st.AckSlow, st.CloseCode
		}
	}
	return fs
}

// CheckStore reports whether the controller's store accepts a write now
// (store.CheckWritable), for GET /healthz.
func (c *Controller) CheckStore(ctx context.Context) error { return c.st.CheckWritable(ctx) }

// OnCommit makes the controller call f after every store commit of its
// batched and durable writes, with the commit's duration and error. Call
// it before Run; f must be safe for concurrent use and quick (it runs on
// the commit path). fleet/metrics uses it for the commit latency.
func (c *Controller) OnCommit(f func(d time.Duration, err error)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.onCommit = f
}
