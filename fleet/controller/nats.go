package controller

import (
	"github.com/discord-pxe/dpxe/appliance"
)

// NATSAccessFunc returns a node's event-broker access for its check-in
// answer, or nil for none. It must be safe for concurrent use.
type NATSAccessFunc func(nodeID string) *appliance.NATSAccess

// SetNATSAccess makes every check-in answer carry what fn returns for the
// node as "nats" (dpxe serve --nats-auth: the node's broker URLs and
// credentials). nil stops it. The answer goes only to a node whose
// check-in was authenticated; the controller never logs it.
func (c *Controller) SetNATSAccess(fn NATSAccessFunc) {
	if fn == nil {
		c.natsAccess.Store(nil)
		return
	}
	c.natsAccess.Store(&fn)
}

// natsFields adds the node's broker access to an answer.
func (c *Controller) natsFields(id string, resp *appliance.CheckinResponse) {
	if fn := c.natsAccess.Load(); fn != nil {
		resp.NATS = (*fn)(id)
	}
}

// PlanChanges is signalled when a rebalance changed the plan (one signal
// stands for every change since the last receive): dpxe serve's NATS
// authorizer then disconnects at once the nodes whose publish permissions
// (PublishShards) changed, rather than at its next periodic sweep, so a
// node that connected to the broker before its first plan is not refused
// its first dispatches for seconds.
func (c *Controller) PlanChanges() <-chan struct{} { return c.planChanged }

// PublishShards returns the shards node id may publish events for, and
// false for a node that may not connect to the broker (unknown, or its
// lease lapsed): its current range, where it will run shards, and the
// shards it still holds outside it, which it runs until it acknowledges
// the generation that moved them (safe hand-off). So a node keeps its
// permission for a shard that is moving away until it stops it: its
// last dispatches are stored rather than refused, and the next owner's
// Resume has less to replay. Only the holder runs a shard, so the two
// nodes permitted during a move never both publish it (a replay's copies
// of one dispatch share their Nats-Msg-Id). Ascending, without repeats.
func (c *Controller) PublishShards(id string) ([]uint32, bool) {
	t := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[id]
	if n == nil || !n.live || t.After(n.deadline) {
		return nil, false // no sweep here: it changes state, and replicas that follow must not
	}
	out := make([]uint32, 0, int(n.plan.Count)+len(n.held))
	i := 0
	for s := n.plan.Start; s < n.plan.Start+n.plan.Count; s++ {
		for i < len(n.held) && n.held[i] < s {
			out = append(out, n.held[i])
			i++
		}
		if i < len(n.held) && n.held[i] == s {
			i++
		}
		out = append(out, s)
	}
	return append(out, n.held[i:]...), true
}
