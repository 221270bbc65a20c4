// Package controller decides which node may run which Discord shard and
// when a shard may Identify. It owns the shard plan (seed 004's
// deterministic capacity-weighted contiguous rebalance), node leases, the
// safe hand-off of shards between nodes, Identify claims per concurrency
// bucket with the daily session-start budget, per-shard status, and guild
// routing.
//
// All state lives in memory behind one mutex and is persisted through
// fleet/store: changes a safety argument depends on (a node being allowed to
// start a shard, a new generation, an Identify grant) are committed durably
// before the answer that depends on them is returned; lease renewals, status
// and most events are written in batches. docs/handoff.md argues why no
// shard ever has two live owners, including across a controller restart.
//
// Time comes from an injected clock, so tests drive leases without sleeping.
package controller

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// Defaults of Config.
const (
	DefaultTotalShards    = 16
	DefaultMaxConcurrency = 1
	DefaultLease          = 30 * time.Second
	// DefaultIdentifyWindow is Discord's 5 s per bucket plus 250 ms: the
	// Identify a grant allows reaches Discord some milliseconds after the
	// grant, and a later grant's Identify may travel faster than the
	// earlier one's, so grants exactly 5 s apart can arrive under 5 s apart
	// (measured: 4.996 s between two kernel Identifies).
	DefaultIdentifyWindow = 5250 * time.Millisecond
	DefaultRebalanceEvery = 250 * time.Millisecond
	DefaultSessionBudget  = 1000 // Discord's usual daily session starts
	DefaultSessionReserve = 10
	// MaxMaxConcurrency bounds max_concurrency (Discord's largest tiers are far below).
	MaxMaxConcurrency = 4096
	// budgetPeriod is the length of Discord's session-start budget window.
	budgetPeriod = 24 * time.Hour
	// settleCheckin is how soon a node should check in again while some of
	// its shards are pending or the plan is about to change.
	settleCheckin = time.Second
	// credentialBytes is the entropy of a node credential.
	credentialBytes = 32
)

// Event kinds of the audit log.
const (
	EventNodeFirstSeen    = "node_first_seen"
	EventLeaseExpired     = "lease_expired"
	EventDrain            = "drain"
	EventUndrain          = "undrain"
	EventPlanChanged      = "plan_changed"
	EventIdentifyGranted  = "identify_granted"
	EventIdentifyRefused  = "identify_refused"
	EventNodeAdded        = "node_added"
	EventControllerStart  = "controller_start"
	EventBudgetConfigured = "budget_set"
	// EventResumeHandoff: a node released a shard with a resumable session,
	// now on offer to the shard's next holder.
	EventResumeHandoff = "resume_handoff"
	// EventCrashHandoff and EventSessionGap: crashresume.go.
	// EventGatewayShards: GET /gateway/bot recommends another shard count.
	EventGatewayShards = "gateway_shards"
	// EventGatewayConcurrency: max_concurrency changed (GET /gateway/bot).
	EventGatewayConcurrency = "max_concurrency_set"
	// EventRestartRequested: an operator asked a node to start a FATAL
	// shard again (RestartFatal); one event per shard.
	EventRestartRequested = "restart_requested"
	// EventShardRestarted: a shard with a restart request came back from
	// FATAL (its node reported another state, or claimed an Identify).
	EventShardRestarted = "shard_restarted"
	// EventIdentifyUnused: a node claimed again for a shard whose last
	// grant it discarded (the answer arrived past use_within_ms): the shard
	// counts as not started for the start-group order, also after a
	// restart (loadStartOrder).
	EventIdentifyUnused = "identify_unused"
)

// Errors.
var (
	// ErrUnknownNode is returned for a node ID that is not in the inventory.
	ErrUnknownNode = errors.New("unknown node")
	// ErrBadCredential is returned when a credential does not match.
	ErrBadCredential = errors.New("credential does not match")
	// ErrNoOwner is returned by Route when the shard has no live owner.
	ErrNoOwner = errors.New("shard has no live owner")
	// ErrTotalChanged is returned by New when the store's plan has another
	// shard total and some node may still run shards of it.
	ErrTotalChanged = errors.New("total shard count differs from the stored plan while nodes still hold shards")
	// ErrConfig is wrapped by configuration errors.
	ErrConfig = errors.New("controller config")
	// ErrShardRange is returned for a shard ID at or above the total.
	ErrShardRange = errors.New("shard ID out of range")
)

// Config is the controller's policy. The zero value of a field means its
// default.
type Config struct {
	TotalShards    uint32        // global shard count, 1..appliance.MaxTotalShards
	MaxConcurrency uint32        // Discord's max_concurrency, 1..MaxMaxConcurrency
	Lease          time.Duration // node lease; nodes renew every third of it
	IdentifyWindow time.Duration // one Identify per bucket per window
	// RebalanceEvery is the least time between two rebalances; membership
	// changes closer together are folded into one. Negative means
	// rebalance on every change.
	RebalanceEvery time.Duration
	SessionBudget  int // daily session starts when the store has none
	SessionReserve int // session starts kept back from Identify grants
	// ResumeTTL is how long a resume hand-off is offered to the shard's
	// next holder (DefaultResumeTTL; 1s..10m).
	ResumeTTL time.Duration
	// Replica makes the controller one of several replicas on one
	// database (ha.go): New writes nothing and the controller follows,
	// as after EnableHA, until it leads; Lead records its
	// controller_start event (and the budget row when there is none)
	// under its term's fence.
	Replica bool
}

// Check reports whether New would accept c, without opening anything, so
// `dpxe serve` can refuse a bad flag before it starts.
func (c Config) Check() error { return c.fill() }

func (c *Config) fill() error {
	if c.TotalShards == 0 {
		c.TotalShards = DefaultTotalShards
	}
	if c.MaxConcurrency == 0 {
		c.MaxConcurrency = DefaultMaxConcurrency
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.IdentifyWindow == 0 {
		c.IdentifyWindow = DefaultIdentifyWindow
	}
	if c.RebalanceEvery == 0 {
		c.RebalanceEvery = DefaultRebalanceEvery
	}
	if c.SessionBudget == 0 {
		c.SessionBudget = DefaultSessionBudget
	}
	if c.ResumeTTL == 0 {
		c.ResumeTTL = DefaultResumeTTL
	}
	switch {
	case c.TotalShards > appliance.MaxTotalShards:
		return fmt.Errorf("%w: total_shards %d out of range 1..%d", ErrConfig, c.TotalShards, appliance.MaxTotalShards)
	case c.MaxConcurrency > MaxMaxConcurrency:
		return fmt.Errorf("%w: max_concurrency %d out of range 1..%d", ErrConfig, c.MaxConcurrency, MaxMaxConcurrency)
	case c.Lease < time.Second || c.Lease > time.Hour:
		return fmt.Errorf("%w: lease %v out of range 1s..1h", ErrConfig, c.Lease)
	case c.IdentifyWindow < time.Millisecond || c.IdentifyWindow > time.Minute:
		return fmt.Errorf("%w: identify_window %v out of range 1ms..1m", ErrConfig, c.IdentifyWindow)
	case c.SessionBudget < 1:
		return fmt.Errorf("%w: session_budget %d must be positive", ErrConfig, c.SessionBudget)
	case c.SessionReserve < 0 || c.SessionReserve >= c.SessionBudget:
		return fmt.Errorf("%w: session_reserve %d out of range 0..%d", ErrConfig, c.SessionReserve, c.SessionBudget-1)
	case c.ResumeTTL < time.Second || c.ResumeTTL > 10*time.Minute:
		return fmt.Errorf("%w: resume_ttl %v out of range 1s..10m", ErrConfig, c.ResumeTTL)
	}
	return nil
}

// node is the controller's record of one inventory node.
type node struct {
	id        string
	credHash  [sha256.Size]byte
	createdAt time.Time

	live          bool
	draining      bool
	capacity      uint32
	firstSeen     time.Time
	lastSeen      time.Time
	deadline      time.Time // lease deadline: lastSeen + lease
	ackedGen      uint64
	address       string
	counts        [4]int // ready, starting, backoff, fatal
	plan          Range  // the node's range in the current plan
	held          []uint32
	grantSeq      uint64 // stage sequence of the node's latest grant
	status        []appliance.ShardStatus
	statusAt      time.Time
	delivery      NodeDelivery // from status (delivery.go), when deliveryOK
	deliveryOK    bool
	broker        *appliance.BrokerStatus // the latest check-in's nats, nil when absent
	lastRefusalEv time.Time
	// restart lists the shards of n's assignment an operator asked to
	// start again from FATAL, ascending (restart.go). Stored only with
	// replicas (ha.go).
	restart []uint32
	// lapseChecked: with replicas, the store showed the lease lapsed
	// after deadline passed, so no follower can renew it (followrenew.go).
	lapseChecked bool
}

// Controller is the fleet's control plane. Its methods are safe for
// concurrent use.
type Controller struct {
	cfg Config
	now func() time.Time
	st  *store.Store
	log *slog.Logger
	// natsAccess (SetNATSAccess) is read without mu: it is called after
	// a check-in answer is built, outside the lock.
	natsAccess atomic.Pointer[NATSAccessFunc]

	mu            sync.Mutex
	nodes         map[string]*node
	live          []*node // live nodes sorted by ID
	holder        []*node // per shard: the live node that may run it, or nil
	gen           uint64
	planChangedAt time.Time
	dirty         bool      // membership, capacity or drain changed since the last rebalance
	lastRebalance time.Time // when the last rebalance ran
	graceUntil    time.Time // no rebalance before this (restart safety)
	gatherUntil   time.Time // no first Identify before this unless gathered (startGather); zero once over
	nextSweep     time.Time // earliest lease deadline of a live node
	// Per Identify bucket: when the window last opened (the latest grant's
	// answer, see Identify) and how many grants are awaiting their answer.
	// grantEpoch counts bucket renumberings (max_concurrency changes).
	lastGrant  []time.Time
	answering  []int
	grantEpoch uint64
	order      startOrder // which shards ever identified (start-group order)
	budget     store.Budget
	stage      stage
	genSeq     uint64 // stage sequence of the current generation
	gw         gatewayState
	handoffs   map[uint32]*handoff // per shard: a resumable session on offer (stored only with replicas, ha.go)
	// sessions is per shard the resumable session its holder last
	// reported, and grantGen the generation its holder was granted it
	// under (crashresume.go); both stored.
	sessions      map[uint32]*shardSession
	grantGen      []uint64
	noCrashResume bool       // a deliberate mutation (DisableCrashResume)
	ha            haState    // replicas (ha.go)
	leases        leaseQueue // check-ins' lease renewals awaiting their group commit (ha.go)

	onLive func(nodeID, addr string) // see OnNodeLive; guarded by mu
	// planChanged is signalled, never blocking, when a rebalance
	// changes the plan (PlanChanges).
	planChanged chan struct{}
	onCommit    func(d time.Duration, err error) // see OnCommit; guarded by mu

	flushMu    sync.Mutex // serialises flushes; taken before mu
	flushedSeq uint64     // highest durable sequence committed; guarded by mu
}

// New loads the controller state from st and returns a controller that
// uses now as its clock. Every node the store shows as live, or as possibly
// running shards, is treated as live for one more full lease from now, and
// no rebalance happens before then: a node may have renewed just before the
// previous controller stopped. It records a controller_start event; with
// cfg.Replica it writes nothing and follows until Lead (ha.go).
func New(ctx context.Context, st *store.Store, cfg Config, now func() time.Time, log *slog.Logger) (*Controller, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c, restored, err := load(ctx, st, cfg, now, log, false)
	if err != nil {
		return nil, err
	}
	if cfg.Replica {
		// A follower writes nothing: its start is recorded when it
		// takes the lead (Lead), fenced by its term; what load staged
		// (a budget row the store lacks) is staged again then.
		c.stage = stage{}
		c.ha.enabled = true
		log.Info("controller loaded; following until this replica leads", "nodes", len(c.nodes), "generation", c.gen,
			"total_shards", cfg.TotalShards, "max_concurrency", cfg.MaxConcurrency, "lease", cfg.Lease)
		return c, nil
	}
	c.eventLocked(now(), EventControllerStart, "", nil, c.loadDetail(restored))
	if err := c.Flush(ctx); err != nil {
		return nil, fmt.Errorf("controller: %w", err)
	}
	log.Info("controller loaded", "nodes", len(c.nodes), "restored_live", restored, "generation", c.gen,
		"total_shards", cfg.TotalShards, "max_concurrency", cfg.MaxConcurrency, "lease", cfg.Lease)
	return c, nil
}

// loadDetail is the detail of the controller_start event of a load that
// restored restored nodes live.
func (c *Controller) loadDetail(restored int) string {
	if restored > 0 && c.graceUntil.IsZero() {
		return fmt.Sprintf("generation %d, %d nodes restored live until their stored lease deadlines", c.gen, restored)
	}
	if restored > 0 {
		return fmt.Sprintf("generation %d, %d nodes restored live; no rebalance before %s",
			c.gen, restored, c.graceUntil.Format(time.RFC3339))
	}
	return fmt.Sprintf("generation %d, no node restored", c.gen)
}

// load builds a controller from the store's state without writing
// anything; New and a replica taking the lead (ha.go) use it. It returns
// how many nodes it restored live.
//
// With leases (replicas), a restored node's lease runs until its deadline
// committed before its last answer (store.RenewLease), read against the
// database's clock; only a node without one (written by an older version)
// gets a full lease from now, and the restart grace (no rebalance) covers
// those nodes only. Without leases (a single controller, whose renewals
// reach the store up to a flush later), every restored node gets a full
// lease from now and the grace.
func load(ctx context.Context, st *store.Store, cfg Config, now func() time.Time, log *slog.Logger, leases bool) (*Controller, int, error) {
	c := &Controller{
		planChanged: make(chan struct{}, 1),
		cfg:         cfg,
		now:         now,
		st:          st,
		log:         log,
		nodes:       map[string]*node{},
		holder:      make([]*node, cfg.TotalShards),
		grantGen:    make([]uint64, cfg.TotalShards),
		lastGrant:   make([]time.Time, cfg.MaxConcurrency),
		answering:   make([]int, cfg.MaxConcurrency),
	}
	t := now()
	var left map[string]time.Duration
	var leftAt time.Time
	if leases {
		var err error
		if left, err = st.LeaseRemaining(ctx); err != nil {
			return nil, 0, fmt.Errorf("controller: load node leases: %w", err)
		}
		// Read after the statement: the remaining times are measured no
		// earlier than it, so leftAt plus one is never before the stored
		// deadline.
		leftAt = now()
	}
	unleased := false
	rows, err := st.Nodes(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("controller: load nodes: %w", err)
	}
	plan, havePlan, err := st.LoadPlan(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("controller: load plan: %w", err)
	}
	sameTotal := !havePlan || plan.TotalShards == cfg.TotalShards
	restored := 0
	for _, r := range rows {
		n := &node{id: r.ID, createdAt: r.CreatedAt, draining: r.Draining, capacity: uint32(r.Capacity),
			firstSeen: r.FirstSeen, lastSeen: r.LastSeen, ackedGen: r.AckedGeneration, address: r.Address,
			counts: [4]int{r.Ready, r.Starting, r.Backoff, r.Fatal}}
		copy(n.credHash[:], r.CredHash)
		c.nodes[n.id] = n
		if !r.Live && r.Held == "" {
			continue
		}
		if !sameTotal && r.Held != "" {
			return nil, 0, fmt.Errorf("controller: store has %d shards, config %d, node %s: %w", plan.TotalShards, cfg.TotalShards, r.ID, ErrTotalChanged)
		}
		held, err := decodeHeld(r.Held, cfg.TotalShards)
		if err != nil {
			return nil, 0, fmt.Errorf("controller: node %s: %w", r.ID, err)
		}
		n.live = true
		if d, ok := left[n.id]; ok {
			n.deadline = leftAt.Add(d)
			// Lapsed on the database's clock: no follower can renew it
			// any more (followrenew.go), so it expires at once.
			n.lapseChecked = d <= 0
		} else {
			n.deadline = t.Add(cfg.Lease)
			unleased = true
		}
		if n.capacity == 0 {
			n.capacity = 1
		}
		for _, s := range held {
			if other := c.holder[s]; other != nil {
				// Stored state is a consistent snapshot, so this
				// cannot happen unless the file was edited; the
				// second claim is dropped and reported.
				log.Error("stored held sets overlap; keeping the first", "shard", s, "node", n.id, "other", other.id)
				continue
			}
			c.holder[s] = n
			n.held = append(n.held, s)
		}
		c.live = append(c.live, n)
		restored++
	}
	slices.SortFunc(c.live, func(a, b *node) int { return strings.Compare(a.id, b.id) })
	if havePlan && sameTotal {
		c.gen = plan.Generation
		c.planChangedAt = plan.ChangedAt
		for _, r := range plan.Ranges {
			if n := c.nodes[r.NodeID]; n != nil && n.live {
				n.plan = Range{r.Start, r.Count}
			}
		}
	} else if havePlan {
		c.gen = plan.Generation
	}
	for s, n := range c.holder {
		if n != nil {
			c.grantGen[s] = c.gen // or the holder's stored record's, below
		}
	}
	if err := c.loadSessions(ctx, t); err != nil {
		return nil, 0, fmt.Errorf("controller: load shard sessions: %w", err)
	}
	// Recompute the plan once the grace is over: nodes may have joined or
	// left after the stored plan was written. The generation moves only if
	// the assignment does.
	c.dirty = true
	if restored > 0 && (!leases || unleased) {
		c.graceUntil = t.Add(cfg.Lease)
	}
	c.nextSweep = t.Add(cfg.Lease)
	for _, n := range c.live {
		if n.deadline.Before(c.nextSweep) {
			c.nextSweep = n.deadline.Add(time.Nanosecond)
		}
	}
	if err := c.loadStartOrder(ctx); err != nil {
		return nil, 0, fmt.Errorf("controller: load identify history: %w", err)
	}
	// Identify: each bucket's window runs from its last stored grant, on
	// the database's clock, instead of a blind window from this load.
	if err := c.loadGrants(ctx); err != nil {
		return nil, 0, fmt.Errorf("controller: load identify grants: %w", err)
	}
	c.gatherUntil = t.Add(min(startGather, cfg.IdentifyWindow))
	if b, ok, err := st.LoadBudget(ctx); err != nil {
		return nil, 0, fmt.Errorf("controller: load budget: %w", err)
	} else if ok {
		c.budget = b
	} else {
		c.budget = store.Budget{Total: cfg.SessionBudget, Remaining: cfg.SessionBudget, ResetAt: t.Add(budgetPeriod)}
		c.stage.budget = true
	}
	return c, restored, nil
}

// Config returns the controller's effective configuration (MaxConcurrency
// follows GET /gateway/bot when the Gateway API is set).
func (c *Controller) Config() Config {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cfg
}

// HashCredential returns the stored form of a node credential (SHA-256;
// credentials are 256-bit random, so no slow hash is needed).
func HashCredential(cred string) [sha256.Size]byte { return sha256.Sum256([]byte(cred)) }

// NewCredential returns a fresh node credential: 32 random bytes in
// unpadded base64url, which appliance.ValidateCredential accepts.
func NewCredential() (string, error) {
	b := make([]byte, credentialBytes)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// AddNode creates a node in the inventory and returns its credential,
// which is not stored anywhere in clear.
func (c *Controller) AddNode(ctx context.Context, id string) (string, error) {
	if err := appliance.ValidateNodeID(id); err != nil {
		return "", err
	}
	cred, err := NewCredential()
	if err != nil {
		return "", err
	}
	h := HashCredential(cred)
	t := c.now()
	if err := c.st.CreateNode(ctx, id, h[:], t); err != nil {
		return "", err
	}
	c.mu.Lock()
	c.nodes[id] = &node{id: id, credHash: h, createdAt: t}
	c.eventLocked(t, EventNodeAdded, id, nil, "")
	c.mu.Unlock()
	c.log.Info("node added", "node", id)
	return cred, nil
}

// RotateCredential gives an existing node a new credential and returns it;
// the old one stops working at once. Netboot uses it to put a fresh
// credential on the kernel command line of each boot, since only hashes
// are stored.
func (c *Controller) RotateCredential(ctx context.Context, id string) (string, error) {
	cred, err := NewCredential()
	if err != nil {
		return "", err
	}
	h := HashCredential(cred)
	if err := c.st.SetCredential(ctx, id, h[:]); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return "", fmt.Errorf("node %s: %w", id, ErrUnknownNode)
		}
		return "", err
	}
	c.mu.Lock()
	if n := c.nodes[id]; n != nil {
		n.credHash = h
	} else {
		c.nodes[id] = &node{id: id, credHash: h, createdAt: c.now()}
	}
	c.mu.Unlock()
	c.log.Info("node credential rotated", "node", id)
	return cred, nil
}

// OnNodeLive registers f to be called, outside the controller's lock, each
// time a node enters the live set (first check-in, or first after its lease
// expired), with the address it checked in from. The boot timeline uses it
// for its "first check-in" step. Call it before serving requests.
func (c *Controller) OnNodeLive(f func(nodeID, addr string)) {
	c.mu.Lock()
	c.onLive = f
	c.mu.Unlock()
}

// sweepLocked expires the leases that passed by t (seed 004: a node whose
// last check-in is older than the lease leaves the live set) and releases
// what those nodes held: they stop their shards by their own deadline,
// which is never later than ours.
func (c *Controller) sweepLocked(t time.Time) {
	if t.Before(c.nextSweep) {
		return
	}
	next := t.Add(c.cfg.Lease)
	kept := c.live[:0]
	for _, n := range c.live {
		if t.After(n.deadline) {
			if c.lapseUnconfirmedLocked(n) {
				// A replica may have renewed it (followrenew.go): the
				// store is asked first, and the sweep comes back.
				if r := t.Add(lapseRecheck); r.Before(next) {
					next = r
				}
				kept = append(kept, n)
				continue
			}
			c.expireLocked(t, n)
			continue
		}
		if n.deadline.Before(next) {
			next = n.deadline
		}
		kept = append(kept, n)
	}
	clear(c.live[len(kept):])
	c.live = kept
	c.nextSweep = next.Add(time.Nanosecond)
}

// expireLocked takes n out of the live set; the caller removes it from c.live.
func (c *Controller) expireLocked(t time.Time, n *node) {
	n.live = false
	n.lapseChecked = false
	c.crashHandoffsLocked(t, n)
	for _, s := range n.held {
		if c.holder[s] == n {
			c.holder[s] = nil
		}
	}
	n.held = nil
	n.plan = Range{}
	n.status = nil
	n.delivery, n.deliveryOK, n.broker = NodeDelivery{}, false, nil
	if len(n.restart) > 0 {
		c.pruneRestartsLocked(n, "lease expired")
	}
	c.dirty = true
	c.stageNodeLocked(n)
	c.eventLocked(t, EventLeaseExpired, n.id, nil, fmt.Sprintf("last check-in %s", n.lastSeen.Format(time.RFC3339Nano)))
	c.log.Warn("lease expired", "node", n.id, "last_seen", n.lastSeen)
}

// maybeRebalanceLocked recomputes the plan if membership changed, the
// restart grace is over and the last rebalance is old enough.
func (c *Controller) maybeRebalanceLocked(t time.Time) {
	if !c.dirty || t.Before(c.graceUntil) {
		return
	}
	if c.cfg.RebalanceEvery > 0 && !c.lastRebalance.IsZero() && t.Sub(c.lastRebalance) < c.cfg.RebalanceEvery {
		return
	}
	c.rebalanceLocked(t)
}

// rebalanceLocked recomputes the plan for the live set and bumps the
// generation if any shard changed node (seed 004 step 7).
func (c *Controller) rebalanceLocked(t time.Time) {
	c.dirty = false
	c.lastRebalance = t
	members := make([]Member, len(c.live))
	ids := make([]string, len(c.live))
	old := make([]Range, len(c.live))
	for i, n := range c.live {
		members[i] = Member{ID: n.id, Capacity: n.capacity, Draining: n.draining}
		ids[i] = n.id
		old[i] = n.plan
	}
	next := Rebalance(members, c.cfg.TotalShards)
	// Nodes that left the live set had their range cleared on expiry, so
	// comparing the live nodes' ranges covers every shard, except when a
	// departed node's shards are now unassigned: counted by the totals.
	changed := !SameAssignment(ids, old, ids, next) || c.assignedTotalLocked() != sumCounts(next)
	for i, n := range c.live {
		n.plan = next[i]
		if len(n.restart) > 0 {
			c.pruneRestartsLocked(n, "the shards left the node's assignment")
		}
	}
	if !changed {
		return
	}
	c.gen++
	c.planChangedAt = t
	c.stage.plan = true
	c.stage.seq++ // a new generation must be durable before anyone sees it
	c.genSeq = c.stage.seq
	c.eventLocked(t, EventPlanChanged, "", nil, fmt.Sprintf("generation %d, %d live nodes, %d shards assigned", c.gen, len(c.live), sumCounts(next)))
	c.log.Info("plan changed", "generation", c.gen, "live_nodes", len(c.live), "assigned", sumCounts(next))
	select {
	case c.planChanged <- struct{}{}:
	default: // one signal is waiting already
	}
}

// assignedTotalLocked counts the shards of the previous plan, before the
// live nodes' ranges are overwritten. Nodes outside the live set have none.
func (c *Controller) assignedTotalLocked() uint32 {
	var s uint32
	for _, n := range c.live {
		s += n.plan.Count
	}
	return s
}

func sumCounts(rs []Range) uint32 {
	var s uint32
	for _, r := range rs {
		s += r.Count
	}
	return s
}

// Tick expires leases and runs a due rebalance. The server calls it a few
// times a second; tests call it with their clock.
func (c *Controller) Tick() {
	t := c.now()
	c.mu.Lock()
	if c.haCheckLocked() != nil {
		c.mu.Unlock()
		return
	}
	c.sweepLocked(t)
	c.maybeRebalanceLocked(t)
	if len(c.handoffs) > 0 {
		c.pruneHandoffsLocked(t)
	}
	c.mu.Unlock()
}

// SetDraining drains (true) or undrains a node: a draining node gets no
// shards in the next plan and hands its shards off safely.
func (c *Controller) SetDraining(ctx context.Context, id string, draining bool) error {
	t := c.now()
	c.mu.Lock()
	n := c.nodes[id]
	if n == nil {
		c.mu.Unlock()
		return fmt.Errorf("node %s: %w", id, ErrUnknownNode)
	}
	c.sweepLocked(t)
	seq := c.setDrainingLocked(t, n, draining)
	c.mu.Unlock()
	return c.waitDurable(ctx, seq)
}
