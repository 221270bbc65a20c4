package controller

import (
	"context"
	"errors"
	"fmt"

	"github.com/discord-pxe/dpxe/fleet/store"
)

// EventNodeDeleted is the audit-log kind of DeleteNode.
const EventNodeDeleted = "node_deleted"

// ErrLive is returned by DeleteNode for a node that holds a lease: its
// shards would have two owners if its ID came back.
var ErrLive = errors.New("node is live")

// DeleteNode removes a node that is not live from the inventory: its
// credential (and any pending enrollment) stops working at once, and its
// record, shard status and staged changes go. A live node is refused with
// ErrLive; an unknown one with ErrUnknownNode.
//
// It holds flushMu, so no batch in flight still carries the node, and
// writes the store with Controller.mu held (one small transaction, as
// redeem does), so no authentication can take the stored credential back
// into memory between the two.
func (c *Controller) DeleteNode(ctx context.Context, id string) error {
	c.flushMu.Lock()
	defer c.flushMu.Unlock()
	t := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sweepLocked(t)
	n := c.nodes[id]
	if n == nil {
		if _, err := c.st.Node(ctx, id); err != nil {
			return fmt.Errorf("node %s: %w", id, ErrUnknownNode)
		}
	} else if n.live {
		return fmt.Errorf("node %s: %w until %s (its lease); drain it, stop the machine and wait for the lease to lapse",
			id, ErrLive, n.deadline.UTC().Format("15:04:05 MST"))
	}
	if err := c.st.DeleteNode(ctx, id); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("node %s: %w", id, ErrUnknownNode)
		}
		return err
	}
	if n != nil {
		delete(c.stage.nodes, n)
		delete(c.stage.status, n)
		delete(c.nodes, id)
		c.forgetSessionsLocked(n)
	}
	c.eventLocked(t, EventNodeDeleted, id, nil, "")
	c.log.Info("node deleted", "node", id)
	return nil
}
