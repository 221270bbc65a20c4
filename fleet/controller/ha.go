package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// Replicas (issue 20, docs/ha.md). With EnableHA, the controller is one of
// several `dpxe serve` replicas on one PostgreSQL database. Only the
// replica that holds the store's leader lease (store.Campaign) acts: it
// loads the fleet's state from the store when it takes the lead (Lead),
// answers check-ins and Identify claims, rebalances, applies drains and
// writes plans, and every batch it writes carries its term as a fence
// (store.Batch.Fence), so a deposed leader's writes fail in the database
// and it steps down. A leader also stops answering on its own once its
// trust deadline passes (the last renewal's start plus the lease minus a
// margin, on the monotonic clock): a paused leader that wakes after
// another took over answers nothing from stale memory. The other replicas
// follow: they refuse node requests with ErrNotLeader (`dpxe serve`
// forwards those to the leader) and reload the stored state now and then
// for their dashboard (Observe).

// ErrNotLeader is returned, with EnableHA, by the calls only the leader
// answers when this replica does not lead or no longer trusts its lease.
var ErrNotLeader = errors.New("this controller replica does not lead")

// haState is the replica state; guarded by Controller.mu.
type haState struct {
	enabled     bool
	leading     bool
	term        uint64
	fence       *store.Fence
	trustUntil  time.Time // monotonic: leading answers stop after it
	leaderURL   string
	controllers map[Route][]string
	onFenced    func(error)
	// lost are ranges of stage sequences staged under a leadership that
	// ended before they were committed: their waiters must fail.
	lost []seqRange
	// unfenced is a deliberate mutation for tests (DisableFencing).
	unfenced bool
	// leaseLate is a deliberate mutation for tests
	// (AnswerBeforeLeaseCommit): renewals are committed after the answer,
	// at the next flush (lateLeases), as before issue 20's lease commit.
	leaseLate  bool
	lateLeases []string
	// leaseOnce is a harsher mutation (CommitFirstLeaseOnly): only a
	// node's first renewal of this term is committed, as if every later
	// one were lost with its leader.
	leaseOnce map[string]bool
	// stateLate is a deliberate mutation for tests
	// (AnswerBeforeHandoffCommit): resume hand-offs and restart requests
	// are answered before they are committed, as before.
	stateLate bool
	// The resume hand-offs and restart requests as last committed, so a
	// batch carries them only when they changed.
	wroteHandoffs map[uint32]store.Handoff
	wroteRestarts map[string]string
	// Renewals without a leader (followrenew.go): the nodes whose stored
	// lease a leader's sweep asked about, whether a read of them runs,
	// the check-ins answered and claims granted while following, and the
	// mutation (ExpireWithoutStoreCheck).
	lapseAsk        map[string]struct{}
	confirming      bool
	followerAnswers uint64
	followerGrants  uint64
	expireUnchecked bool
}

type seqRange struct{ from, to uint64 }

// maxLost bounds haState.lost; older ranges are long answered.
const maxLost = 16

// EnableHA makes the controller a replica that acts only while it leads
// (Lead). onFenced, if set, is called (in its own goroutine) when a write
// fails because another replica took the lease. Call it before serving.
func (c *Controller) EnableHA(onFenced func(error)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ha.enabled = true
	c.ha.onFenced = onFenced
}

// DisableFencing is a deliberate mutation for the replica tests: batches
// are written without their term's fence and Identify grants without the
// database's spacing check, so a deposed leader's writes land. Never in
// production.
func (c *Controller) DisableFencing() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ha.unfenced = true
}

// AnswerBeforeLeaseCommit is a deliberate mutation for the replica tests:
// a check-in's lease renewal is committed after its answer, with the next
// batch, so a leader that dies in between leaves an older deadline in the
// database than the node holds. Never in production.
func (c *Controller) AnswerBeforeLeaseCommit() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ha.leaseLate = true
}

// CommitFirstLeaseOnly is a deliberate mutation for the replica tests:
// a check-in's lease renewal is committed only for the node's first
// check-in of each term, so the stored deadlines fall behind the nodes'
// own by up to a lease. Never in production.
func (c *Controller) CommitFirstLeaseOnly() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ha.leaseOnce = map[string]bool{}
}

// AnswerBeforeHandoffCommit is a deliberate mutation for the replica
// tests: a release that records a resume hand-off and a FATAL-restart
// request are answered before they are committed, with the next batch, so
// a leader that dies in between loses them. Never in production.
func (c *Controller) AnswerBeforeHandoffCommit() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ha.stateLate = true
}

// haDurableSeqLocked marks a change of the replicas' shared state (a
// resume hand-off or a FATAL-restart request, which haBatchLocked
// carries) as one whose answer waits for its commit: it returns the stage
// sequence to wait for (waitDurable), or 0 when the answer need not wait
// (a single controller, or the AnswerBeforeHandoffCommit mutation).
func (c *Controller) haDurableSeqLocked() uint64 {
	if !c.ha.enabled || c.ha.stateLate {
		return 0
	}
	c.stage.seq++
	return c.stage.seq
}

// leaseFenceLocked is the fence a check-in's lease renewal is committed
// under before its answer, or nil when none is (no replicas, or a
// mutation).
func (c *Controller) leaseFenceLocked(nodeID string) *store.Fence {
	if !c.ha.enabled || c.ha.fence == nil || c.ha.unfenced {
		return nil
	}
	if c.ha.leaseLate {
		c.ha.lateLeases = append(c.ha.lateLeases, nodeID)
		return nil
	}
	if c.ha.leaseOnce != nil {
		key := fmt.Sprintf("%d/%s", c.ha.fence.Term, nodeID)
		if c.ha.leaseOnce[key] {
			return nil
		}
		c.ha.leaseOnce[key] = true
	}
	f := *c.ha.fence
	return &f
}

// leaseGroup is the renewals waiting for one group commit.
type leaseGroup struct {
	fence store.Fence
	ids   []string
	taken bool // a check-in of the group is committing it (leaseQueue.mu)
	done  chan struct{}
	err   error
}

// leaseCommitsInFlight is how many renewal statements may run at once:
// while one commits, the next group may start its own rather than wait.
const leaseCommitsInFlight = 2

// leaseQueue gathers concurrent check-ins' renewals: the renewals that
// arrive while every statement slot is busy wait in the next group, which
// the first of them commits in one statement once a slot frees.
type leaseQueue struct {
	once  sync.Once
	slots chan struct{} // one per statement in flight
	mu    sync.Mutex
	next  *leaseGroup
}

// commitLease commits a check-in's lease renewal (lease from now on the
// database's clock) under f before the check-in is answered, grouped with
// the renewals of concurrent check-ins. A fenced renewal ends the
// leadership like a fenced batch.
func (c *Controller) commitLease(ctx context.Context, f store.Fence, nodeID string, lease time.Duration) error {
	q := &c.leases
	q.once.Do(func() { q.slots = make(chan struct{}, leaseCommitsInFlight) })
	q.mu.Lock()
	g := q.next
	if g == nil || g.fence != f {
		g = &leaseGroup{fence: f, done: make(chan struct{})}
		q.next = g
	}
	if !slices.Contains(g.ids, nodeID) {
		g.ids = append(g.ids, nodeID)
	}
	q.mu.Unlock()
	select {
	case <-g.done: // committed by another check-in of the group
	case q.slots <- struct{}{}:
		q.mu.Lock()
		mine := !g.taken // not yet committing (a group of an older fence may no longer be next)
		g.taken = true
		if q.next == g {
			q.next = nil
		}
		ids := slices.Clone(g.ids)
		q.mu.Unlock()
		if mine {
			// One order for every statement, so two in flight that
			// share a node lock its row in the same order.
			slices.Sort(ids)
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			g.err = c.st.RenewLeases(cctx, g.fence, ids, lease)
			cancel()
			close(g.done)
		}
		<-q.slots
		<-g.done
	}
	err := g.err
	if err == nil {
		return nil
	}
	c.haFlushFailed(err)
	if errors.Is(err, store.ErrFenced) {
		return fmt.Errorf("%w: %w", ErrNotLeader, err)
	}
	return err
}

// commitLateLeases is the AnswerBeforeLeaseCommit mutation's flush of the
// renewals answered since the last one.
func (c *Controller) commitLateLeases(ctx context.Context) {
	c.mu.Lock()
	ids, fence, lease := c.ha.lateLeases, c.ha.fence, c.cfg.Lease
	c.ha.lateLeases = nil
	c.mu.Unlock()
	if fence == nil {
		return
	}
	for _, id := range ids {
		_ = c.st.RenewLease(ctx, *fence, id, lease)
	}
}

// Role is the replica's view of leadership.
type Role struct {
	HA        bool   `json:"ha"`      // several replicas may run (EnableHA)
	Leading   bool   `json:"leading"` // this replica acts
	Term      uint64 `json:"term"`    // the latest term this replica saw
	LeaderURL string `json:"leader_url,omitempty"`
}

// Name is "leader" or "follower" with EnableHA, "single" without.
func (r Role) Name() string {
	switch {
	case !r.HA:
		return "single"
	case r.Leading:
		return "leader"
	}
	return "follower"
}

// Role returns the replica's role now.
func (c *Controller) Role() Role {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Role{HA: c.ha.enabled, Leading: c.ha.enabled && c.ha.leading && time.Now().Before(c.ha.trustUntil),
		Term: c.ha.term, LeaderURL: c.ha.leaderURL}
}

// Route is the way a node's request reached a replica: the network
// (management, by the advertised URL, or the boot network, by the URL its
// boot scripts carry) and the scheme. A check-in answer lists the live
// replicas' URLs of the route the check-in came by, so a node is handed
// only URLs it can reach, and a node on https (which pins the
// controller's key) never an http one (docs/ha.md).
type Route string

// The routes a node's request comes by.
const (
	RouteHTTP      Route = "http"       // --listen, or the advertised URL
	RouteHTTPS     Route = "https"      // --tls-listen
	RouteBootHTTP  Route = "boot-http"  // the boot network's listener
	RouteBootHTTPS Route = "boot-https" // the boot network's HTTPS listener
)

// Routes lists every Route.
var Routes = []Route{RouteHTTP, RouteHTTPS, RouteBootHTTP, RouteBootHTTPS}

// RouteOf is the route of a request that came by the boot network's
// listener or not, over TLS or not.
func RouteOf(boot, tls bool) Route {
	switch {
	case boot && tls:
		return RouteBootHTTPS
	case boot:
		return RouteBootHTTP
	case tls:
		return RouteHTTPS
	}
	return RouteHTTP
}

// ParseRoute returns the Route named s.
func ParseRoute(s string) (Route, error) {
	if r := Route(s); slices.Contains(Routes, r) {
		return r, nil
	}
	return "", fmt.Errorf("route %q: want one of http, https, boot-http, boot-https", s)
}

type routeKey struct{}

// WithRoute returns ctx carrying the route a node's request came by, for
// the check-in answer's controllers (Checkin).
func WithRoute(ctx context.Context, r Route) context.Context {
	return context.WithValue(ctx, routeKey{}, r)
}

// routeFrom is the route ctx carries, RouteHTTP when none.
func routeFrom(ctx context.Context) Route {
	if r, ok := ctx.Value(routeKey{}).(Route); ok {
		return r
	}
	return RouteHTTP
}

// SetControllers sets, per route, the URLs of the live replicas that
// check-in answers carry (appliance.CheckinResponse.Controllers).
func (c *Controller) SetControllers(byRoute map[Route][]string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !maps.EqualFunc(c.ha.controllers, byRoute, slices.Equal) {
		c.ha.controllers = maps.Clone(byRoute)
	}
}

// haCheckLocked returns ErrNotLeader when the replica may not act now.
func (c *Controller) haCheckLocked() error {
	if !c.ha.enabled {
		return nil
	}
	if !c.ha.leading || !time.Now().Before(c.ha.trustUntil) {
		return fmt.Errorf("%w (term %d, leader %s)", ErrNotLeader, c.ha.term, c.ha.leaderURL)
	}
	return nil
}

// haFieldsLocked adds the replica fields to a check-in answer that came
// by route.
func (c *Controller) haFieldsLocked(resp *appliance.CheckinResponse, route Route) {
	if !c.ha.enabled {
		return
	}
	resp.Term = c.ha.term
	resp.Controllers = slices.Clone(c.ha.controllers[route])
}

// Lead makes this replica the acting controller for fence.Term: it reloads
// the fleet's state from the store (as a restart does, with its grace),
// records a controller_start event under the fence, and answers until
// trustUntil (monotonic; Renewed extends it). A failed load or first write
// leaves it following.
func (c *Controller) Lead(ctx context.Context, fence store.Fence, leaderURL string, trustUntil time.Time) error {
	fresh, restored, err := load(ctx, c.st, c.Config(), c.now, c.log, true)
	if err != nil {
		return err
	}
	hs, err := c.st.Handoffs(ctx)
	if err != nil {
		return fmt.Errorf("controller: load hand-offs: %w", err)
	}
	rs, err := c.st.RestartRequests(ctx)
	if err != nil {
		return fmt.Errorf("controller: load restart requests: %w", err)
	}
	c.flushMu.Lock()
	c.mu.Lock()
	c.adoptLocked(fresh)
	c.loadHandoffsLocked(hs, rs)
	c.ha.leading, c.ha.term, c.ha.fence = true, fence.Term, &store.Fence{Holder: fence.Holder, Term: fence.Term}
	c.ha.trustUntil, c.ha.leaderURL = trustUntil, leaderURL
	t := c.now()
	c.eventLocked(t, EventControllerStart, "", nil, fmt.Sprintf("leader of term %d: %s", fence.Term, c.loadDetail(restored)))
	c.recordUnrecordedBudgetLocked(t)
	c.mu.Unlock()
	err = c.flushHeld(ctx)
	c.flushMu.Unlock()
	if err != nil {
		c.Follow(fence.Term, "")
		return err
	}
	c.log.Info("leading", "term", fence.Term, "restored_live", restored, "generation", c.Generation())
	return nil
}

// recordUnrecordedBudgetLocked, as a replica takes the lead, stages
// Discord's session budget that it fetched while following
// (gatewayState.unrecorded) when the store has no budget row (load staged
// the configured default): a new database gets Discord's figures, as a
// single controller's first GET /gateway/bot gives it, not the default.
// A stored budget stays: the previous leader kept it up to date.
func (c *Controller) recordUnrecordedBudgetLocked(t time.Time) {
	u := c.gw.unrecorded
	c.gw.unrecorded = nil
	if u == nil || !c.stage.budget {
		return
	}
	c.budget = *u
	c.gw.budgetTotalSet = u.Total
	c.eventLocked(t, EventBudgetConfigured, "", nil, fmt.Sprintf("total %d remaining %d reset_at %s (GET /gateway/bot before this replica led)",
		u.Total, u.Remaining, u.ResetAt.UTC().Format(time.RFC3339)))
}

// Renewed extends the trust deadline of term after a renewal of the lease.
func (c *Controller) Renewed(term uint64, trustUntil time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ha.leading && c.ha.term == term {
		c.ha.trustUntil = trustUntil
	}
}

// Follow stops acting: changes staged and not yet committed are dropped
// and their waiters fail with ErrNotLeader. term and leaderURL are the
// current leadership as far as the replica knows ("" if unknown).
func (c *Controller) Follow(term uint64, leaderURL string) {
	c.mu.Lock()
	was := c.ha.leading
	c.stepDownLocked()
	c.ha.term = max(c.ha.term, term)
	c.ha.leaderURL = leaderURL
	c.mu.Unlock()
	if was {
		c.log.Warn("stopped leading", "term", term, "leader", leaderURL)
	}
}

// stepDownLocked ends the leadership in memory.
func (c *Controller) stepDownLocked() {
	c.ha.leading = false
	c.ha.trustUntil = time.Time{}
	if c.stage.seq > c.flushedSeq {
		c.ha.lost = append(c.ha.lost, seqRange{c.flushedSeq + 1, c.stage.seq})
		if len(c.ha.lost) > maxLost {
			c.ha.lost = c.ha.lost[len(c.ha.lost)-maxLost:]
		}
	}
	c.stage = stage{seq: c.stage.seq}
}

// lostLocked reports whether the change staged at seq was dropped.
func (c *Controller) lostLocked(seq uint64) bool {
	for _, r := range c.ha.lost {
		if seq >= r.from && seq <= r.to {
			return true
		}
	}
	return false
}

// Observe reloads the stored state while following, so a follower's
// dashboard and health show the fleet as the leader last wrote it. It
// writes nothing.
func (c *Controller) Observe(ctx context.Context) error {
	if c.Role().Leading {
		return nil
	}
	fresh, _, err := load(ctx, c.st, c.Config(), c.now, c.log, true)
	if err != nil {
		return err
	}
	c.flushMu.Lock()
	defer c.flushMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ha.leading {
		return nil
	}
	c.adoptLocked(fresh)
	return nil
}

// adoptLocked replaces the fleet state by fresh's, keeping the replica,
// Gateway and callback state. In-flight grants of the old state stop
// counting (grantEpoch): an answer still to come closes every bucket for a
// window (grantAnswered); otherwise the windows are the stored grants'
// (loadGrants).
func (c *Controller) adoptLocked(fresh *Controller) {
	c.nodes, c.live, c.holder = fresh.nodes, fresh.live, fresh.holder
	c.sessions, c.grantGen = fresh.sessions, fresh.grantGen
	c.gen, c.planChangedAt = fresh.gen, fresh.planChangedAt
	c.dirty, c.lastRebalance, c.graceUntil, c.nextSweep = fresh.dirty, fresh.lastRebalance, fresh.graceUntil, fresh.nextSweep
	c.gatherUntil = fresh.gatherUntil
	c.lastGrant, c.answering = fresh.lastGrant, fresh.answering
	c.grantEpoch++
	c.order, c.budget = fresh.order, fresh.budget
	c.handoffs = fresh.handoffs // crash hand-offs from stored sessions; Lead adds the stored ones
	c.genSeq = 0
	c.stepDownLocked()
	c.stage.budget = fresh.stage.budget
}

// haBatchLocked fences a batch of the leader's and adds the hand-offs and
// restart requests when they changed since the last commit.
func (c *Controller) haBatchLocked(b *store.Batch) {
	if !c.ha.enabled || !c.ha.leading {
		return
	}
	if !c.ha.unfenced {
		b.Fence = c.ha.fence
	}
	hs := make([]store.Handoff, 0, len(c.handoffs))
	same := len(c.handoffs) == len(c.ha.wroteHandoffs)
	for s, h := range c.handoffs {
		x := store.Handoff{ShardID: s, From: h.from.id, SessionID: h.state.SessionID, Seq: h.state.Seq,
			ResumeURL: h.state.ResumeURL, OfferedAt: h.at}
		if w, ok := c.ha.wroteHandoffs[s]; !ok || !w.OfferedAt.Equal(x.OfferedAt) || w.From != x.From || w.SessionID != x.SessionID ||
			w.Seq != x.Seq || w.ResumeURL != x.ResumeURL {
			same = false
		}
		hs = append(hs, x)
	}
	if !same {
		b.Handoffs = &hs
	}
	rs := map[string]string{}
	for _, n := range c.live {
		if len(n.restart) > 0 {
			rs[n.id] = encodeHeld(n.restart)
		}
	}
	if !maps.Equal(rs, c.ha.wroteRestarts) {
		b.Restarts = rs
	}
}

// haCommittedLocked notes what a committed batch wrote.
func (c *Controller) haCommittedLocked(b *store.Batch) {
	if b.Handoffs != nil {
		c.ha.wroteHandoffs = map[uint32]store.Handoff{}
		for _, h := range *b.Handoffs {
			c.ha.wroteHandoffs[h.ShardID] = h
		}
	}
	if b.Restarts != nil {
		c.ha.wroteRestarts = b.Restarts
	}
}

// loadHandoffsLocked restores the stored hand-offs and restart requests
// of live nodes after a load (Lead).
func (c *Controller) loadHandoffsLocked(hs []store.Handoff, rs map[string]string) {
	c.ha.wroteHandoffs, c.ha.wroteRestarts = map[uint32]store.Handoff{}, rs
	for _, h := range hs {
		c.ha.wroteHandoffs[h.ShardID] = h
		n := c.nodes[h.From]
		if n == nil || h.ShardID >= c.cfg.TotalShards {
			continue
		}
		if c.handoffs == nil {
			c.handoffs = map[uint32]*handoff{}
		}
		c.handoffs[h.ShardID] = &handoff{from: n, at: h.OfferedAt,
			state: appliance.ResumeState{ShardID: h.ShardID, SessionID: h.SessionID, Seq: h.Seq, ResumeURL: h.ResumeURL}}
	}
	for id, text := range rs {
		n := c.nodes[id]
		if n == nil || !n.live {
			continue
		}
		shards, err := decodeHeld(text, c.cfg.TotalShards)
		if err != nil {
			c.log.Warn("stored restart requests unreadable; dropped", "node", id, "err", err)
			continue
		}
		for _, s := range shards {
			if n.plan.Contains(s) {
				n.restart = append(n.restart, s)
			}
		}
	}
}

// haFlushRefusedLocked drops a follower's stage, so it writes nothing;
// the waiters of what was staged fail with ErrNotLeader (lost).
func (c *Controller) haFlushRefusedLocked() error {
	if c.ha.enabled && !c.ha.leading {
		c.stepDownLocked()
	}
	return nil
}

// HoldsTerm reports whether the replica acts for term, trusted or not.
func (c *Controller) HoldsTerm(term uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ha.leading && c.ha.term == term
}

// haFlushFailed handles a failed leader write: a fenced one ends the
// leadership.
func (c *Controller) haFlushFailed(err error) {
	if !errors.Is(err, store.ErrFenced) {
		return
	}
	c.mu.Lock()
	term := c.ha.term
	was := c.ha.leading
	c.stepDownLocked()
	onFenced := c.ha.onFenced
	c.mu.Unlock()
	if was {
		c.log.Warn("write fenced off: another replica leads", "term", term, "err", err)
	}
	if onFenced != nil {
		go onFenced(err)
	}
}

// Generation returns the current plan generation.
func (c *Controller) Generation() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen
}
