package controller

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
)

// simNode is a node as the simulation models it: it obeys the protocol
// (stops what a response no longer assigns, starts only non-pending shards,
// stops everything when its own lease deadline, counted from the send time
// of its last answered check-in, passes), and it can crash, be cut off from
// the controller, be drained, see its requests delayed by up to 2 s, and
// lose answers.
type simNode struct {
	id          string
	capacity    int
	joined      bool
	crashed     bool
	partitioned bool
	running     map[uint32]bool       // shards with a live Gateway connection
	identified  map[uint32]bool       // shards whose session has started
	sessions    map[uint32]simSession // the session of each identified shard
	// final holds the sessions of shards stopped because they left the
	// assignment, closed resumably; reported until an answer's generation
	// equals the generation the check-in reported.
	final       map[uint32]simSession
	unused      map[uint32]bool // shards whose last grant arrived too late
	once        bool            // reports a released session in one check-in only
	gen         uint64
	deadline    time.Time
	nextCheckin time.Time
}

// simSession is a Gateway session as a node knows it.
type simSession struct {
	id  string
	seq uint32
}

func (n *simNode) stopAll() {
	clear(n.running)
	clear(n.identified)
	clear(n.sessions)
	clear(n.final)
}

// sortedKeys returns a map's shard IDs in ascending order: the simulation
// iterates in a fixed order so that a seed repeats a run exactly.
func sortedKeys[V any](m map[uint32]V) []uint32 {
	keys := make([]uint32, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

type grant struct {
	at    time.Time
	node  string
	shard uint32
}

// TestSimulation drives hundreds of nodes through joins, crashes,
// partitions, drains, capacity changes and controller crash-restarts on one
// SQLite file, with a fake clock, and checks after every step that no shard
// runs on two nodes, that every running shard is one the controller counts
// as held by that node, that no Identify bucket got two grants within the
// window, that once membership is stable no shard's first grant comes
// before a shard of an earlier start group started, and finally that every shard is owned and running once
// membership has been stable for two lease periods. Nodes carry Gateway
// sessions: a shard moved by the plan is closed resumably and its session
// reported; the check is that a resume hand-off only ever reaches a node
// that may start the shard, for a session no node has open, never
// beyond the session's last sequence, and that moves do resume.
func TestSimulation(t *testing.T) {
	seed := uint64(1)
	if s := os.Getenv("DPXE_SIM_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	for _, s := range []uint64{seed, seed + 1} {
		t.Run(fmt.Sprint("seed", s), func(t *testing.T) { runSimulation(t, s, simSize{nodes: 200, total: 256, maxCap: 8, chaosSteps: 1000}) })
	}
}

// TestScaleSimulation is TestSimulation with 2,000 nodes and 8,192 shards
// (make test-scale).
func TestScaleSimulation(t *testing.T) {
	if os.Getenv("DPXE_SCALE") == "" {
		t.Skip("set DPXE_SCALE=1 (make test-scale)")
	}
	runSimulation(t, 7, simSize{nodes: 2000, total: 8192, maxCap: 16, chaosSteps: 600})
}

// simSize is the scale of one simulation run.
type simSize struct {
	nodes, total, maxCap, chaosSteps int
}

func runSimulation(t *testing.T, seed uint64, size simSize) {
	const (
		mc     = 4
		lease  = 30 * time.Second
		window = 5 * time.Second
		step   = 500 * time.Millisecond
	)
	nodes, total, chaosSteps := size.nodes, uint32(size.total), size.chaosSteps
	rng := rand.New(rand.NewPCG(seed, seed*7+1))
	h := newHarness(t, Config{TotalShards: total, MaxConcurrency: mc, Lease: lease, IdentifyWindow: window,
		RebalanceEvery: time.Second, SessionBudget: 1_000_000})
	ctx := context.Background()
	sim := make([]*simNode, nodes)
	for i := range sim {
		sim[i] = &simNode{id: fmt.Sprintf("n%03d", i), capacity: 1 + rng.IntN(size.maxCap), joined: i < nodes*3/4,
			running: map[uint32]bool{}, identified: map[uint32]bool{}, sessions: map[uint32]simSession{}, final: map[uint32]simSession{}, unused: map[uint32]bool{},
			once: i%2 == 1}
		h.add(sim[i].id)
	}
	lastGrant := map[uint32]grant{}
	// When each bucket's last Identify left its node: a grant's answer may
	// be late in the network, and the node uses it only within its
	// use_within_ms (appliance.GrantUsable).
	lastSent := map[uint32]grant{}
	guard := appliance.GrantUseWithin(window)
	discarded := 0
	// Start-group order as Discord sees it: when each shard's first
	// Identify left its node (a used grant). Sessions start only from
	// grants, so a READY report never names a shard missing here. A shard's
	// first Identify must leave after every shard of the earlier start
	// groups has sent one. Out-of-order Identifies are counted during chaos
	// (a crashed or cut-off holder excuses them) and fatal once membership
	// has been stable for a lease.
	firstIdentify := map[uint32]time.Time{}
	strictOrder, outOfOrder, ordered := false, 0, 0
	grants, restarts, checkins, lost := 0, 0, 0, 0
	// The Gateway's side: which node has each session open, and each
	// session's latest sequence.
	open := map[string]string{}
	dseq := map[string]uint32{}
	lastOpen := map[string]string{} // the node that last had each session open
	resumes, stale, sessionNo := 0, 0, 0
	stopAll := func(n *simNode) {
		for _, ss := range n.sessions {
			delete(open, ss.id)
		}
		n.stopAll()
	}

	checkin := func(n *simNode, now time.Time) {
		req := appliance.CheckinRequest{NodeID: n.id, Capacity: n.capacity, Generation: n.gen}
		for _, s := range sortedKeys(n.final) {
			ss := n.final[s]
			req.Shards = append(req.Shards, appliance.ShardStatus{ID: s, State: appliance.ShardAssigned, SeqValid: true,
				CloseCode: 4200, SessionID: ss.id, Seq: ss.seq, ResumeURL: "ws://gw/resume"})
		}
		for _, s := range sortedKeys(n.running) {
			state := appliance.ShardStarting // connected, waiting for its Identify claim
			if n.identified[s] {
				state = appliance.ShardReady
			}
			req.Shards = append(req.Shards, appliance.ShardStatus{ID: s, State: state})
		}
		if len(req.Shards) > appliance.MaxShardsPerNode {
			req.Shards = req.Shards[:appliance.MaxShardsPerNode]
		}
		// The request left the node up to 2 s before the controller read
		// it; the node counts its lease from the send time.
		sent := now.Add(-time.Duration(rng.IntN(2000)) * time.Millisecond)
		if err := req.Validate(); err != nil {
			// The API would refuse it: the node could never renew its lease.
			t.Fatalf("seed %d: %s's check-in is invalid: %v", seed, n.id, err)
		}
		resp, err := h.c.Checkin(ctx, &req, "127.0.0.1")
		if err != nil {
			t.Fatalf("seed %d: checkin %s: %v", seed, n.id, err)
		}
		if err := resp.Validate(); err != nil {
			t.Fatalf("seed %d: checkin %s: answer %+v: %v", seed, n.id, resp, err)
		}
		if got := len(resp.Assigned) - len(resp.Pending); got > req.Capacity {
			t.Fatalf("seed %d: %s reported capacity %d and was answered with %d startable shards (%+v)", seed, n.id, req.Capacity, got, resp)
		}
		checkins++
		if rng.IntN(50) == 0 {
			// The answer is lost: the controller acted on the request, the
			// node never sees the answer and tries again soon.
			lost++
			n.nextCheckin = now.Add(time.Second)
			return
		}
		if !now.Before(sent.Add(time.Duration(resp.LeaseSeconds) * time.Second)) {
			return // an answer whose lease already ran out is not applied
		}
		assigned := map[uint32]bool{}
		for _, s := range resp.Assigned {
			assigned[s] = true
		}
		for _, s := range resp.Pending {
			assigned[s] = false
		}
		// Odd nodes report a released session once, as the kernel does;
		// even ones until an answer's generation equals the one reported.
		if resp.Generation == req.Generation || n.once {
			clear(n.final)
		}
		for s := range n.running {
			if !assigned[s] {
				// Closed with a non-1000 code: the session stays
				// resumable, and the node reports it.
				if ss, ok := n.sessions[s]; ok {
					delete(open, ss.id)
					n.final[s] = ss
				}
				delete(n.running, s)
				delete(n.identified, s)
				delete(n.sessions, s)
			}
		}
		for s := range n.final {
			if _, back := assigned[s]; back {
				delete(n.final, s)
			}
		}
		for _, rs := range resp.Resume {
			if ok, in := assigned[rs.ShardID]; !in || !ok {
				t.Fatalf("seed %d: hand-off of shard %d to %s, which may not start it (%v)", seed, rs.ShardID, n.id, resp.Assigned)
			}
			if n.running[rs.ShardID] {
				continue // already running: the node ignores it
			}
			if other, live := open[rs.SessionID]; live {
				t.Fatalf("seed %d: shard %d: %s would resume session %s still open on %s", seed, rs.ShardID, n.id, rs.SessionID, other)
			}
			// Never beyond the session's last sequence (events would be
			// lost). An older one replays events twice; it happens only
			// when the node that advanced the session stopped it without
			// reporting it (its own lease ran out), and gets it back.
			switch d := dseq[rs.SessionID]; {
			case rs.Seq > d:
				t.Fatalf("seed %d: hand-off of shard %d to %s at seq %d, beyond the session's %d", seed, rs.ShardID, n.id, rs.Seq, d)
			case rs.Seq < d && lastOpen[rs.SessionID] != n.id:
				t.Fatalf("seed %d: hand-off of shard %d to %s at seq %d, the session is at %d on %s", seed, rs.ShardID, n.id, rs.Seq, d, lastOpen[rs.SessionID])
			case rs.Seq < d:
				stale++
			}
			n.running[rs.ShardID] = true
			n.identified[rs.ShardID] = true
			n.sessions[rs.ShardID] = simSession{rs.SessionID, dseq[rs.SessionID]} // replayed up to date
			open[rs.SessionID] = n.id
			lastOpen[rs.SessionID] = n.id
			resumes++
		}
		// Like the kernel, never more than its capacity, lowest shards first.
		for _, s := range resp.Assigned {
			if ok := assigned[s]; ok && !n.running[s] && len(n.running) < n.capacity {
				n.running[s] = true
			}
		}
		n.gen = resp.Generation
		n.deadline = sent.Add(time.Duration(resp.LeaseSeconds) * time.Second)
		n.nextCheckin = now.Add(time.Duration(resp.NextCheckinMS)*time.Millisecond + time.Duration(rng.IntN(300))*time.Millisecond)
	}

	// maxDelay bounds a grant answer's network delay: seconds during chaos,
	// under orderSettle once membership is stable (a grant discarded later
	// than that can let the next start group overtake it: docs/api.md).
	maxDelay := 2 * time.Second
	identify := func(n *simNode, now time.Time) {
		tries := 0
		for _, s := range sortedKeys(n.running) {
			if n.identified[s] || tries >= 2 {
				continue
			}
			tries++
			r, err := h.c.Identify(ctx, appliance.IdentifyRequest{NodeID: n.id, ShardID: s, UnusedGrant: n.unused[s]})
			delete(n.unused, s)
			if err != nil {
				t.Fatalf("seed %d: identify: %v", seed, err)
			}
			if !r.Granted {
				continue
			}
			b := appliance.IdentifyBucket(s, mc)
			if g, ok := lastGrant[b]; ok && now.Sub(g.at) < window {
				t.Fatalf("seed %d: bucket %d granted to %s/%d at %v and %s/%d at %v", seed, b, g.node, g.shard, g.at, n.id, s, now)
			}
			lastGrant[b] = grant{now, n.id, s}
			// The answer reaches the node after a network delay: usually
			// milliseconds, sometimes (a congested switch, a retransmitted
			// segment) seconds. The claim was sent at now.
			delay := time.Duration(rng.IntN(20)) * time.Millisecond
			if rng.IntN(10) == 0 {
				delay = time.Duration(rng.Int64N(int64(maxDelay)))
			}
			if !appliance.GrantUsable(delay, r.UseWithinMS) {
				discarded++ // the node claims again later, saying so
				n.unused[s] = true
				continue
			}
			at := now.Add(delay)
			if g, ok := lastSent[b]; ok && at.Sub(g.at) < window-guard {
				t.Fatalf("seed %d: bucket %d: Identifies left %s/%d at %v and %s/%d at %v, %v apart, under window - use_within = %v",
					seed, b, g.node, g.shard, g.at, n.id, s, at, at.Sub(g.at), window-guard)
			}
			lastSent[b] = grant{at, n.id, s}
			if _, again := firstIdentify[s]; !again {
				for x := uint32(0); x < s/mc*mc; x++ {
					if first, ok := firstIdentify[x]; ok && first.Before(at) {
						continue
					}
					if strictOrder {
						t.Fatalf("seed %d: shard %d's first Identify left %s at %v before shard %d of an earlier start group sent one (%v)",
							seed, s, n.id, at, x, firstIdentify[x])
					}
					outOfOrder++
					break
				}
				if strictOrder {
					ordered++
				}
				firstIdentify[s] = at
			}
			n.identified[s] = true
			sessionNo++
			ss := simSession{id: fmt.Sprintf("sess%d", sessionNo)}
			n.sessions[s] = ss
			open[ss.id] = n.id
			lastOpen[ss.id] = n.id
			dseq[ss.id] = 0
			grants++
		}
	}

	check := func(stepNo int) {
		if err := h.c.CheckInvariants(); err != nil {
			t.Fatalf("seed %d step %d: %v", seed, stepNo, err)
		}
		owners := h.c.Owners()
		runner := map[uint32]string{}
		for _, n := range sim {
			for s := range n.running {
				if other, dup := runner[s]; dup {
					t.Fatalf("seed %d step %d: shard %d runs on %s and %s", seed, stepNo, s, other, n.id)
				}
				runner[s] = n.id
				if owners[s] != n.id {
					t.Fatalf("seed %d step %d: shard %d runs on %s but the controller's owner is %q", seed, stepNo, s, n.id, owners[s])
				}
			}
			for s, ss := range n.sessions {
				if !n.running[s] || open[ss.id] != n.id {
					t.Fatalf("seed %d step %d: %s's session %s of shard %d is not its open connection", seed, stepNo, n.id, ss.id, s)
				}
			}
		}
		if len(open) > len(runner) {
			t.Fatalf("seed %d step %d: %d open sessions for %d running shards", seed, stepNo, len(open), len(runner))
		}
	}

	run := func(steps int, chaos bool) {
		for i := 0; i < steps; i++ {
			h.clock.Advance(step)
			now := h.clock.Now()
			for _, n := range sim {
				if n.joined && !n.crashed && !n.deadline.IsZero() && !now.Before(n.deadline) {
					stopAll(n) // node-side lease safety
				}
				for s, ss := range n.sessions { // one dispatch per step
					ss.seq++
					n.sessions[s] = ss
					dseq[ss.id] = ss.seq
				}
			}
			for e := 0; chaos && e < 3; e++ {
				n := sim[rng.IntN(nodes)]
				switch r := rng.IntN(1000); {
				case r < 40 && !n.joined:
					n.joined = true
				case r < 50 && n.joined && !n.crashed:
					n.crashed = true
					stopAll(n)
					n.gen, n.deadline = 0, time.Time{}
				case r < 80 && n.crashed:
					n.crashed = false
					n.nextCheckin = now
				case r < 90 && n.joined:
					n.partitioned = true
				case r < 130 && n.partitioned:
					n.partitioned = false
				case r < 140:
					if err := h.c.SetDraining(ctx, n.id, rng.IntN(2) == 0); err != nil {
						t.Fatal(err)
					}
				case r < 145 && !n.crashed:
					// A reboot with another boot config: nothing runs,
					// and the first check-in reports the new capacity.
					stopAll(n)
					n.gen, n.deadline = 0, time.Time{}
					n.capacity = 1 + rng.IntN(size.maxCap)
					n.nextCheckin = now
				case r < 147:
					h.restart()
					restarts++
				}
			}
			h.c.Tick()
			if i%4 == 0 {
				if err := h.c.Flush(ctx); err != nil {
					t.Fatal(err)
				}
			}
			for _, n := range sim {
				if !n.joined || n.crashed || n.partitioned || now.Before(n.nextCheckin) {
					continue
				}
				checkin(n, now)
			}
			for _, n := range sim {
				if n.joined && !n.crashed && !n.partitioned {
					identify(n, now)
				}
			}
			check(i)
		}
	}

	run(chaosSteps, true)
	// Stable membership: everyone up, connected and undrained.
	for _, n := range sim {
		if !n.joined || n.crashed {
			n.joined, n.crashed = true, false
			n.nextCheckin = h.clock.Now()
		}
		n.partitioned = false
		if err := h.c.SetDraining(ctx, n.id, false); err != nil {
			t.Fatal(err)
		}
	}
	run(int(lease/step), false)
	strictOrder = true
	maxDelay = orderSettle - 100*time.Millisecond
	run(int(lease/step)+10, false)
	owners := h.c.Owners()
	for s := uint32(0); s < total; s++ {
		if owners[s] == "" {
			t.Fatalf("seed %d: shard %d unowned after two stable lease periods (plan %+v)", seed, s, h.c.Plan())
		}
		found := false
		for _, n := range sim {
			if n.id == owners[s] && n.running[s] {
				found = true
			}
		}
		if !found {
			t.Fatalf("seed %d: shard %d owned by %s but not running there", seed, s, owners[s])
		}
	}
	// Identify is paced at mc grants per window, so big fleets cannot
	// identify every shard within the run; ask for a fair number.
	if restarts == 0 || grants < min(int(total), 200) || resumes == 0 || discarded == 0 {
		t.Fatalf("seed %d: simulation too tame: %d restarts, %d grants, %d resumes, %d late grants discarded", seed, restarts, grants, resumes, discarded)
	}
	t.Logf("seed %d: %d late grants discarded", seed, discarded)
	t.Logf("seed %d: %d check-ins (%d answers lost), %d Identify grants (%d first grants checked for start order once stable, %d out of order under chaos), %d hand-off resumes (%d at an older sequence), %d controller restarts, generation %d",
		seed, checkins, lost, grants, ordered, outOfOrder, resumes, stale, restarts, h.c.Plan().Generation)
}
