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
