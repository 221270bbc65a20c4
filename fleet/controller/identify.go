package controller

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// Identify answers a node's claim to send Identify for a shard (DESIGN §5).
// It grants only to the shard's live, non-pending owner, at most once per
// bucket (shard % max_concurrency) per IdentifyWindow fleet-wide, only
// while the daily session-start budget stays above its reserve, and only
// in start-group order (see orderBlockerLocked). A grant is durable before
// Identify returns it.
//
// The window runs from the moment a grant is answered, not from the
// moment it was decided: making a grant durable is a synchronous commit
// that can take hundreds of milliseconds on a busy disk, and a grant
// decided early but answered late would send its Identify late, so the
// next grant's Identify, answered quickly, could reach Discord less than
// 5 s after it. While a grant awaits its commit its bucket stays closed.
//
// A grant's answer can also be late in the network. It carries
// use_within_ms (appliance.GrantUseWithin): the node uses it only if it
// arrived that soon after the claim was sent, so Identifies of one bucket
// leave their nodes at least window - use_within apart (appliance.GrantUsable).
func (c *Controller) Identify(ctx context.Context, req appliance.IdentifyRequest) (appliance.IdentifyResponse, error) {
	t := c.now()
	c.mu.Lock()
	if err := c.haCheckLocked(); err != nil {
		c.mu.Unlock()
		if answersAsFollower(ctx) {
			return c.followerIdentify(ctx, req)
		}
		return appliance.IdentifyResponse{}, err
	}
	c.sweepLocked(t)
	n := c.nodes[req.NodeID]
	if n == nil {
		c.mu.Unlock()
		return appliance.IdentifyResponse{}, fmt.Errorf("node %s: %w", req.NodeID, ErrUnknownNode)
	}
	bucket := appliance.IdentifyBucket(req.ShardID, c.cfg.MaxConcurrency)
	resp := appliance.IdentifyResponse{ShardID: req.ShardID, Bucket: bucket}
	refuse := func(reason appliance.IdentifyReason, after time.Duration, detail ...string) (appliance.IdentifyResponse, error) {
		resp.Reason = reason
		resp.RetryAfterMS = retryAfterMS(after)
		if t.Sub(n.lastRefusalEv) >= c.cfg.IdentifyWindow {
			// One refusal event per node per window keeps the log small.
			n.lastRefusalEv = t
			c.eventLocked(t, EventIdentifyRefused, n.id, &req.ShardID, strings.Join(append([]string{string(reason)}, detail...), ": "))
		}
		c.mu.Unlock()
		return resp, nil
	}
	if req.ShardID >= c.cfg.TotalShards || !n.live || c.holder[req.ShardID] != n || !n.plan.Contains(req.ShardID) {
		return refuse(appliance.ReasonNotOwner, settleCheckin)
	}
	if len(n.restart) > 0 {
		// A FATAL shard never claims: the node took the restart up.
		c.restartDoneLocked(t, n, req.ShardID, "claimed an Identify")
	}
	if r := c.sessions[req.ShardID]; c.ownRecordLocked(n, req.ShardID, r) {
		// n reported a session for the shard under this grant and now
		// Identifies: that session ended without a Resume. (A shard the
		// operator restarts from FATAL has no record: the FATAL report
		// dropped it, so its new session is not a gap.)
		c.noteOwnGapLocked(t, n, req.ShardID, r, "it claimed an Identify", lastCloseCode(n, req.ShardID))
	}
	c.refillBudgetLocked(t)
	if req.UnusedGrant && c.order.at[req.ShardID] != 0 {
		// The node discarded its last grant for this shard (the answer
		// arrived past use_within_ms): count the shard as not started, so
		// later start groups wait for it again (if it did start before,
		// that only delays them). The daily budget is not refunded: the
		// safe side, should the Identify have gone out after all.
		c.order.at[req.ShardID] = 0
		c.order.low = min(c.order.low, req.ShardID)
		c.eventLocked(t, EventIdentifyUnused, n.id, &req.ShardID, grantDetail(c.cfg.TotalShards))
	}
	if c.answering[bucket] > 0 {
		return refuse(appliance.ReasonBucketBusy, c.cfg.IdentifyWindow, "a grant is being answered")
	}
	if last := c.lastGrant[bucket]; !last.IsZero() && t.Sub(last) < c.cfg.IdentifyWindow {
		return refuse(appliance.ReasonBucketBusy, last.Add(c.cfg.IdentifyWindow).Sub(t))
	}
	if c.budget.Remaining <= c.cfg.SessionReserve {
		return refuse(appliance.ReasonBudget, c.budget.ResetAt.Sub(t))
	}
	if wait, gathering := c.gatheringLocked(t); gathering && c.order.at[req.ShardID] == 0 {
		return refuse(appliance.ReasonOrder, wait, "gathering the nodes' check-ins after the controller's start")
	}
	if blocker, wait, blocked := c.orderBlockerLocked(t, req.ShardID); blocked {
		return refuse(appliance.ReasonOrder, wait, fmt.Sprintf("shard %d of an earlier start group has not started", blocker))
	}
	prevLast := c.lastGrant[bucket]
	c.lastGrant[bucket] = t
	c.answering[bucket]++
	epoch := c.grantEpoch
	c.budget.Remaining--
	first := c.order.at[req.ShardID] == 0
	if first {
		c.order.at[req.ShardID] = t.UnixNano()
	}
	shard := req.ShardID
	b := c.budget
	g := store.Grant{NodeID: n.id, ShardID: shard, Bucket: bucket, MaxConcurrency: c.cfg.MaxConcurrency,
		Reserve: c.cfg.SessionReserve, Budget: &b,
		// The detail names the shard count: the event is the durable
		// record that this shard of this count has started
		// (loadStartOrder).
		Event: store.Event{At: t, Kind: EventIdentifyGranted, NodeID: n.id, ShardID: &shard, Detail: grantDetail(c.cfg.TotalShards)}}
	if c.ha.enabled && c.ha.leading && !c.ha.unfenced {
		// Replicas: the store checks the spacing against every other
		// replica's grants (a follower's, a former leader's).
		g.Fence, g.Spacing = c.ha.fence, c.cfg.IdentifyWindow
	}
	// What is staged before the grant (the acknowledgement that made the
	// node the shard's holder, this claim's events) commits first; the
	// grant then commits in a transaction of its own (store.GrantIdentify).
	c.stage.seq++
	seq := c.stage.seq
	c.mu.Unlock()
	err := c.waitDurable(ctx, seq)
	var stored store.Budget
	if err == nil {
		stored, err = c.st.GrantIdentify(ctx, g)
	}
	if refused := (*store.GrantRefused)(nil); errors.As(err, &refused) {
		return c.grantRefused(t, n, req, resp, refused, prevLast, epoch, first)
	}
	if errors.Is(err, store.ErrFenced) {
		c.haFlushFailed(err)
		err = fmt.Errorf("%w: %w", ErrNotLeader, err)
	}
	c.grantAnswered(bucket, epoch)
	if err != nil {
		return appliance.IdentifyResponse{}, err
	}
	c.mu.Lock()
	if stored.ResetAt.Equal(c.budget.ResetAt) {
		// Another replica's grants spent from the stored budget.
		c.budget.Remaining = min(c.budget.Remaining, stored.Remaining)
	}
	c.mu.Unlock()
	resp.Granted = true
	resp.UseWithinMS = uint32(appliance.GrantUseWithin(c.cfg.IdentifyWindow) / time.Millisecond)
	return resp, nil
}

// grantRefused answers a claim whose grant the store refused (another
// replica granted in its bucket within the window, or spent the budget):
// what the grant took in memory is given back, and the bucket opens when
// the store says.
func (c *Controller) grantRefused(t time.Time, n *node, req appliance.IdentifyRequest, resp appliance.IdentifyResponse,
	r *store.GrantRefused, prevLast time.Time, epoch uint64, first bool) (appliance.IdentifyResponse, error) {
	now := c.now()
	c.mu.Lock()
	if epoch == c.grantEpoch {
		c.answering[resp.Bucket]--
		c.lastGrant[resp.Bucket] = prevLast
		if errors.Is(r, store.ErrGrantSpacing) {
			c.lastGrant[resp.Bucket] = latest(prevLast, now.Add(r.Wait-c.cfg.IdentifyWindow))
		}
	}
	if first && c.order.at[req.ShardID] == t.UnixNano() {
		c.order.at[req.ShardID] = 0
	}
	resp.Reason = appliance.ReasonBucketBusy
	after := r.Wait
	if errors.Is(r, store.ErrBudgetSpent) {
		c.budget.Remaining = min(c.budget.Remaining+1, c.cfg.SessionReserve)
		resp.Reason, after = appliance.ReasonBudget, c.budget.ResetAt.Sub(now)
	}
	resp.RetryAfterMS = retryAfterMS(after)
	if now.Sub(n.lastRefusalEv) >= c.cfg.IdentifyWindow {
		n.lastRefusalEv = now
		c.eventLocked(now, EventIdentifyRefused, n.id, &req.ShardID, string(resp.Reason)+": "+r.Error())
	}
	c.mu.Unlock()
	return resp, nil
}

// retryAfterMS is a refusal's retry_after_ms for a wait of d: whole
// milliseconds, rounded up, at least 1.
func retryAfterMS(d time.Duration) int64 {
	return max(1, int64((d+time.Millisecond-1)/time.Millisecond))
}

// lastCloseCode is the close code n last reported for shard s, 0 if none.
func lastCloseCode(n *node, s uint32) uint16 {
	for i := range n.status {
		if n.status[i].ID == s {
			return n.status[i].CloseCode
		}
	}
	return 0
}

// grantAnswered restarts the window of a grant's bucket at the moment the
// grant is answered (or fails to be) and opens the bucket to later claims.
// If max_concurrency changed meanwhile, the bucket numbers mean other
// shards now, so every bucket's window restarts.
func (c *Controller) grantAnswered(bucket uint32, epoch uint64) {
	t := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if epoch != c.grantEpoch {
		for i, last := range c.lastGrant {
			c.lastGrant[i] = latest(last, t)
		}
		return
	}
	c.answering[bucket]--
	c.lastGrant[bucket] = latest(c.lastGrant[bucket], t)
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
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

// Start-group order. Discord requires shards to start "by bucket in
// order": shard s may Identify only once every shard t of an earlier start
// group (t / max_concurrency < s / max_concurrency) of the same shard
// count has identified at least once (research
// gateway-protocol-and-sharding.md §1.11; the emulator's
// bucket_out_of_order). The controller keeps, for its shard count, which
// shards have ever been granted an Identify or reported READY, and refuses
// a claim with reason "order" while a shard of an earlier group has not,
// unless that shard cannot start now (canStartLocked), so one broken shard
// does not hold back the fleet.
const (
	// orderRetry is retry_after for an "order" refusal whose blocking
	// shard's bucket is open: that shard may be granted any moment.
	orderRetry = 250 * time.Millisecond
	// orderSettle is how long a first grant counts as in flight: the node
	// sends Identify right after the grant, so a later group's Identify
	// must not overtake it. Capped at the Identify window.
	orderSettle = time.Second
	// startedKnown marks a shard known to have started long ago: from the
	// stored history or a READY report.
	startedKnown int64 = 1
	// startGather bounds the start gather: after a controller starts or
	// takes the lead, no shard's first Identify is granted until every
	// enrolled, non-draining node is live and no rebalance is due, or
	// startGather (at most a window) has passed. A plan made before the
	// fleet's nodes are in would start sessions on nodes that the next
	// rebalance takes them from, and spend Identifies of the daily budget
	// on shards whose place is about to change. Nodes that boot with the
	// controller check in within about a second; one that is not in by
	// then only moves its shards later, by a Resume hand-off. Bounding
	// the gather keeps it a small part of a window: the last of k start
	// groups goes out at most startGather + (k-1) windows after the start
	// (docs/handoff.md), where a blind wait of a window cost a whole one.
	startGather = time.Second
)

// startOrder is the start-group state of the controller's shard count;
// guarded by Controller.mu.
type startOrder struct {
	// at is per shard: 0 if it never started, startedKnown, or the Unix
	// time in nanoseconds of its first grant.
	at []int64
	// low is a shard below which every shard has started and settled.
	low uint32
}

// grantDetail is the detail of an identify_granted event.
func grantDetail(total uint32) string { return "num_shards " + strconv.FormatUint(uint64(total), 10) }

// loadStartOrder rebuilds the start-group state from the audit log: every
// identify_granted event of this shard count is a grant that was durable
// before it was answered, so no started shard is missed unless the log
// pruned it (store.MaxEvents) or it was written before the detail named
// the count. Either way the shard counts as never started, which only
// delays: shards that run report READY at their node's next check-in.
// The loaded grants count as settled, except those recent enough to still
// hold their bucket's row, which loadGrants dates. A grant its node
// reported unused afterwards (identify_unused) does not count.
func (c *Controller) loadStartOrder(ctx context.Context) error {
	c.order = startOrder{at: make([]int64, c.cfg.TotalShards)}
	// A shard started if its last grant came after its last re-claim.
	last, err := c.st.LastShardEvents(ctx, EventIdentifyGranted, EventIdentifyUnused, grantDetail(c.cfg.TotalShards))
	if err != nil {
		return err
	}
	for _, x := range last {
		if x.LastA > x.LastB && x.ShardID < uint32(len(c.order.at)) {
			c.order.at[x.ShardID] = startedKnown
		}
	}
	return nil
}

// loadGrants dates each bucket's last grant from the store (issue 20:
// nothing about grants lives only in one controller's memory), so a
// controller that starts or takes the lead waits, per bucket, only for
// what is left of the window of that bucket's last grant, instead of a
// blind window from the load. It runs in load, after loadStartOrder.
//
// The stored time is the database's clock when the grant's batch was
// written (store.GrantAges): after the grant was decided, so after its
// claim was sent, and before it was answered. Its node sends Identify
// within use_within_ms (appliance.GrantUseWithin) of sending the claim or
// not at all, so at most G after the stored time; a grant this controller
// answers a window W after the stored time leaves its node at least W - G
// (Discord's 5 s) after it, as within one controller. The age is measured
// on the database's clock and subtracted from this controller's now taken
// after the read, so the clocks of the two processes never meet, and the
// read's own latency only makes the bucket wait longer. A grant of
// unknown age (written before migration 5) or dated in the future (the
// database's clock stepped back) counts as granted now, as every bucket
// did before.
//
// Bucket numbers are only meaningful under the max_concurrency they were
// written with: a recent grant whose shard is in another bucket now
// (max_concurrency changed) counts for every bucket, as a change of
// max_concurrency at run time does (setMaxConcurrencyLocked).
//
// A recent grant also dates its shard's start (startOrder.at), so the
// next start group waits orderSettle after it, as without the restart.
func (c *Controller) loadGrants(ctx context.Context) error {
	gs, err := c.st.GrantAges(ctx)
	if err != nil {
		return err
	}
	t := c.now()
	var newest time.Time
	renumbered := false
	for _, g := range gs {
		at := t
		if g.Known && g.Age > 0 {
			at = t.Add(-g.Age)
		}
		if t.Sub(at) >= c.cfg.IdentifyWindow {
			continue // its window is over
		}
		b := appliance.IdentifyBucket(g.ShardID, c.cfg.MaxConcurrency)
		if b != g.Bucket {
			renumbered = true
		}
		c.lastGrant[b] = latest(c.lastGrant[b], at)
		newest = latest(newest, at)
		if g.ShardID < uint32(len(c.order.at)) && c.order.at[g.ShardID] != 0 {
			c.order.at[g.ShardID] = at.UnixNano()
		}
	}
	if renumbered {
		for i := range c.lastGrant {
			c.lastGrant[i] = newest
		}
	}
	return nil
}

// noteReadyLocked records shards a node reports READY as started: a READY
// (or RESUMED) session began with an Identify of this shard count.
func (c *Controller) noteReadyLocked(shards []appliance.ShardStatus) {
	for i := range shards {
		if shards[i].State == appliance.ShardReady && shards[i].ID < uint32(len(c.order.at)) {
			c.order.at[shards[i].ID] = startedKnown
		}
	}
}

// startGroupBase returns the lowest shard of s's start group. When the
// operator caps max_concurrency below Discord's, the groups of both
// numberings must have started, so the higher base counts.
func (c *Controller) startGroupBase(s uint32) uint32 {
	mc := max(c.cfg.MaxConcurrency, 1)
	base := s / mc * mc
	if d := c.gw.discordMC; d > 0 {
		base = max(base, s/d*d)
	}
	return base
}

// orderBlockerLocked returns the lowest shard that holds back shard s's
// first Identify, and how long to wait before asking again. A shard that
// started before (it re-identifies after op 9 or close 4007/4009) is
// never held back. Otherwise every shard t below s's start group must
// have started at least orderSettle ago, or be unable to start now.
func (c *Controller) orderBlockerLocked(t time.Time, s uint32) (uint32, time.Duration, bool) {
	o := &c.order
	if o.at[s] != 0 {
		return 0, 0, false
	}
	now := t.UnixNano()
	settle := min(orderSettle, c.cfg.IdentifyWindow).Nanoseconds()
	settled := func(x uint32) bool { a := o.at[x]; return a != 0 && now-a >= settle }
	for o.low < uint32(len(o.at)) && settled(o.low) {
		o.low++
	}
	end := c.startGroupBase(s)
	for x := o.low; x < end; x++ {
		if a := o.at[x]; a != 0 {
			if now-a >= settle {
				continue
			}
			return x, time.Duration(settle - (now - a)), true
		}
		if !c.canStartLocked(t, x) {
			continue
		}
		wait := orderRetry
		if last := c.lastGrant[appliance.IdentifyBucket(x, c.cfg.MaxConcurrency)]; !last.IsZero() {
			wait = max(wait, last.Add(c.cfg.IdentifyWindow).Sub(t))
		}
		return x, wait, true
	}
	return 0, 0, false
}

// gatheringLocked reports whether the start gather (startGather) still
// holds first Identifies back, and when to ask again.
func (c *Controller) gatheringLocked(t time.Time) (time.Duration, bool) {
	if c.gatherUntil.IsZero() {
		return 0, false
	}
	due := c.dirty && !t.Before(c.graceUntil) // a rebalance is due: the plan is about to change
	left := c.gatherUntil.Sub(t)
	if left <= 0 {
		// The gather's time is over, but a rebalance due then (outside
		// the restart grace it runs within RebalanceEvery) still ends it
		// first: nodes that boot with the controller may check in just as
		// the bound passes, and a grant then would start a session on a
		// node the rebalance a moment later takes the shard from.
		if due {
			return orderRetry, true
		}
		c.gatherUntil = time.Time{}
		return 0, false
	}
	wait := min(orderRetry, left)
	if due {
		return wait, true
	}
	for _, n := range c.nodes {
		if !n.live && !n.draining {
			return wait, true
		}
	}
	c.gatherUntil = time.Time{}
	return 0, false
}

// canStartLocked reports whether shard x, which never started, may start
// soon, so that later start groups must wait for it. It may not when:
//   - no live node's range contains it (unassigned, or its owner's lease
//     ran out);
//   - its holder reported it FATAL (a close code that is never retried);
//   - it has been pending hand-off (held by a node whose range no longer
//     contains it, or not yet taken by its new owner) for more than a
//     lease since the plan last changed.
func (c *Controller) canStartLocked(t time.Time, x uint32) bool {
	if h := c.holder[x]; h != nil && h.live && h.plan.Contains(x) {
		for i := range h.status {
			if h.status[i].ID == x {
				return h.status[i].State != appliance.ShardFatal
			}
		}
		return true
	}
	owner := false
	for _, n := range c.live {
		if n.plan.Contains(x) {
			owner = true
			break
		}
	}
	return owner && t.Sub(c.planChangedAt) <= c.cfg.Lease
}
