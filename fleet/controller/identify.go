package controller

import (
	"context"
	"fmt"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// Identify answers a node's claim to send Identify for a shard (DESIGN §5).
// It grants only to the shard's live, non-pending owner, at most once per
// bucket (shard % max_concurrency) per IdentifyWindow fleet-wide, and only
// while the daily session-start budget stays above its reserve. A grant is
// durable before Identify returns it.
func (c *Controller) Identify(ctx context.Context, req appliance.IdentifyRequest) (appliance.IdentifyResponse, error) {
	t := c.now()
	c.mu.Lock()
	c.sweepLocked(t)
	n := c.nodes[req.NodeID]
	if n == nil {
		c.mu.Unlock()
		return appliance.IdentifyResponse{}, fmt.Errorf("node %s: %w", req.NodeID, ErrUnknownNode)
	}
	bucket := appliance.IdentifyBucket(req.ShardID, c.cfg.MaxConcurrency)
	resp := appliance.IdentifyResponse{ShardID: req.ShardID, Bucket: bucket}
	refuse := func(reason appliance.IdentifyReason, after time.Duration) (appliance.IdentifyResponse, error) {
		resp.Reason = reason
		resp.RetryAfterMS = max(1, int64((after+time.Millisecond-1)/time.Millisecond))
		if t.Sub(n.lastRefusalEv) >= c.cfg.IdentifyWindow {
			// One refusal event per node per window keeps the log small.
			n.lastRefusalEv = t
			c.eventLocked(t, EventIdentifyRefused, n.id, &req.ShardID, string(reason))
		}
		c.mu.Unlock()
		return resp, nil
	}
	if req.ShardID >= c.cfg.TotalShards || !n.live || c.holder[req.ShardID] != n || !n.plan.Contains(req.ShardID) {
		return refuse(appliance.ReasonNotOwner, settleCheckin)
	}
	c.refillBudgetLocked(t)
	if last := c.lastGrant[bucket]; !last.IsZero() && t.Sub(last) < c.cfg.IdentifyWindow {
		return refuse(appliance.ReasonBucketBusy, last.Add(c.cfg.IdentifyWindow).Sub(t))
	}
	if c.budget.Remaining <= c.cfg.SessionReserve {
		return refuse(appliance.ReasonBudget, c.budget.ResetAt.Sub(t))
	}
	c.lastGrant[bucket] = t
	c.budget.Remaining--
	c.stage.buckets = append(c.stage.buckets, store.BucketGrant{Bucket: bucket, GrantedAt: t, ShardID: req.ShardID, NodeID: n.id})
	c.stage.budget = true
	c.eventLocked(t, EventIdentifyGranted, n.id, &req.ShardID, "")
	c.stage.seq++
	seq := c.stage.seq
	c.mu.Unlock()
	if err := c.waitDurable(ctx, seq); err != nil {
		return appliance.IdentifyResponse{}, err
	}
	resp.Granted = true
	return resp, nil
}

// refillBudgetLocked restores the budget when its reset time has passed.
func (c *Controller) refillBudgetLocked(t time.Time) {
	if t.Before(c.budget.ResetAt) {
		return
	}
	for !t.Before(c.budget.ResetAt) {
		c.budget.ResetAt = c.budget.ResetAt.Add(budgetPeriod)
	}
	c.budget.Remaining = c.budget.Total
	c.stage.budget = true
}

// Budget is the session-start budget as the controller tracks it.
type Budget struct {
	Total     int       `json:"total"`
	Remaining int       `json:"remaining"`
	Reserve   int       `json:"reserve"`
	ResetAt   time.Time `json:"reset_at"`
}

// Budget returns the current session-start budget.
func (c *Controller) Budget() Budget {
	t := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refillBudgetLocked(t)
	return Budget{Total: c.budget.Total, Remaining: c.budget.Remaining, Reserve: c.cfg.SessionReserve, ResetAt: c.budget.ResetAt}
}

// SetBudget replaces the tracked budget with Discord's own figures from
// GET /gateway/bot session_start_limit: total, remaining and reset_after.
func (c *Controller) SetBudget(ctx context.Context, total, remaining int, resetAfter time.Duration) error {
	if total < 1 || remaining < 0 || remaining > total || resetAfter < 0 || resetAfter > budgetPeriod {
		return fmt.Errorf("%w: budget total %d remaining %d reset_after %v: need total >= 1, 0 <= remaining <= total, 0 <= reset_after <= 24h",
			ErrConfig, total, remaining, resetAfter)
	}
	t := c.now()
	c.mu.Lock()
	c.gw.budgetTotalSet = total
	seq := c.setBudgetLocked(t, total, remaining, resetAfter, true)
	c.mu.Unlock()
	return c.waitDurable(ctx, seq)
}
