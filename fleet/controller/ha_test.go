package controller

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// replicaPair is two controllers with EnableHA on one store (a SQLite file,
// or PostgreSQL with DPXE_TEST_STORE=postgres), each with its own
// connection pool, like two `dpxe serve` processes. The pair's fake clock
// is both controllers' clock and the database's, so a leader's lease runs
// out only when the test advances the clock: however slowly a loaded
// machine runs the test, the leader's writes are not fenced off early.
type replicaPair struct {
	t     *testing.T
	clock *fakeClock
	st    [2]*store.Store
	c     [2]*Controller
}

func newReplicaPair(t *testing.T, cfg Config) *replicaPair {
	t.Helper()
	if cfg.RebalanceEvery == 0 {
		cfg.RebalanceEvery = -1
	}
	cfg.Replica = true // as `dpxe serve` on PostgreSQL: nothing written before Lead
	p := &replicaPair{t: t, clock: newFakeClock()}
	path := newStorePath(t)
	for i := range 2 {
		st, err := store.Open(context.Background(), path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		st.SetDBClock(p.clock.Now)
		c, err := New(context.Background(), st, cfg, p.clock.Now, nil)
		if err != nil {
			t.Fatal(err)
		}
		c.EnableHA(nil)
		p.st[i], p.c[i] = st, c
	}
	return p
}

// lead makes replica i campaign for a lease of ttl until it leads, and
// act. While another replica's lease runs, the clock is advanced to its
// end on the database's clock (the other replica stopped renewing) and
// replica i campaigns again, which must win.
func (p *replicaPair) lead(i int, ttl time.Duration) uint64 {
	p.t.Helper()
	ctx := context.Background()
	holder := string(rune('a' + i))
	for try := 0; ; try++ {
		l, err := p.st[i].Campaign(ctx, holder, "http://"+holder, ttl)
		if err != nil {
			p.t.Fatal(err)
		}
		if l.Leader {
			if err := p.c[i].Lead(ctx, store.Fence{Holder: holder, Term: l.Term}, "http://"+holder, time.Now().Add(time.Hour)); err != nil {
				p.t.Fatal(err)
			}
			return l.Term
		}
		if try == 1 {
			p.t.Fatalf("replica %d does not lead once the other's lease ended: %+v", i, l)
		}
		p.clock.Advance(l.ExpiresAt.Sub(l.Now))
	}
}

// TestReplicaFollowerRefusesAndLeaderFenced: a follower answers no
// check-in or claim (ErrNotLeader); the leader does, with its term. When
// the other replica takes the lease while the first still believes it
// leads (a paused leader whose trust deadline has not passed, forced here
// by a long one), the deposed leader's grant fails in its commit
// (store.ErrFenced), so it is not answered, and the replica steps down;
// the new leader, loaded from the store, keeps the shards with their
// holder and refuses a grant in the bucket a granted moments before: that
// grant's window, dated on the database's clock, is not over (b takes
// over when a's lease ends, 8 s after a's grant, within its 30 s window). With
// fencing disabled (the deliberate mutation) the deposed leader's grant
// goes through.
func TestReplicaFollowerRefusesAndLeaderFenced(t *testing.T) {
	for _, mutate := range []bool{false, true} {
		p := newReplicaPair(t, Config{TotalShards: 4, MaxConcurrency: 1, IdentifyWindow: 30 * time.Second, Lease: 10 * time.Minute})
		ctx := context.Background()
		a, b := p.c[0], p.c[1]
		cred, err := a.AddNode(ctx, "n1")
		if err != nil {
			t.Fatal(err)
		}
		_ = cred
		req := &appliance.CheckinRequest{NodeID: "n1", Capacity: 4}
		if _, err := a.Checkin(ctx, req, "127.0.0.1"); !errors.Is(err, ErrNotLeader) {
			t.Fatalf("check-in at a replica that never led: %v", err)
		}
		const ttl = 10 * time.Second // a's lease outlasts the 2 s the clock moves while a leads
		term := p.lead(0, ttl)
		r, err := a.Checkin(ctx, req, "127.0.0.1")
		if err != nil || r.Term != term || len(r.Assigned) != 4 || len(r.Pending) != 0 {
			t.Fatalf("check-in at the leader: %+v %v", r, err)
		}
		if _, err := b.Checkin(ctx, req, "127.0.0.1"); !errors.Is(err, ErrNotLeader) {
			t.Fatalf("check-in at the follower: %v", err)
		}
		p.clock.Advance(2 * time.Second)
		if g, err := a.Identify(ctx, appliance.IdentifyRequest{NodeID: "n1", ShardID: 0}); err != nil || !g.Granted {
			t.Fatalf("first grant: %+v %v", g, err)
		}
		if mutate {
			a.DisableFencing()
		}
		// b takes over once a's lease expires on the database's clock
		// (lead advances the clock 8 s, to the end of a's lease).
		term2 := p.lead(1, time.Minute) // b's lease outlasts the 31 s below
		if term2 != term+1 {
			t.Fatalf("term %d after %d", term2, term)
		}
		if owners := b.Owners(); owners[0] != "n1" || owners[3] != "n1" {
			t.Fatalf("new leader's owners: %v", owners)
		}
		if g, err := b.Identify(ctx, appliance.IdentifyRequest{NodeID: "n1", ShardID: 1}); err != nil || g.Granted {
			t.Fatalf("new leader granted at once after takeover: %+v %v", g, err)
		}
		p.clock.Advance(31 * time.Second) // a's window is over in its memory
		g, err := a.Identify(ctx, appliance.IdentifyRequest{NodeID: "n1", ShardID: 1})
		if mutate {
			if err != nil || !g.Granted {
				t.Fatalf("mutation: the deposed leader's grant should land: %+v %v", g, err)
			}
			continue
		}
		if !(errors.Is(err, ErrNotLeader) || errors.Is(err, store.ErrFenced)) || g.Granted {
			t.Fatalf("deposed leader's grant: %+v %v", g, err)
		}
		if a.Role().Leading {
			t.Fatal("a still leads after its write was fenced")
		}
		if _, err := a.Checkin(ctx, req, "127.0.0.1"); !errors.Is(err, ErrNotLeader) {
			t.Fatalf("deposed leader's check-in: %v", err)
		}
		r, err = b.Checkin(ctx, &appliance.CheckinRequest{NodeID: "n1", Capacity: 4, Generation: r.Generation}, "127.0.0.1")
		if err != nil || r.Term != term2 || len(r.Pending) != 0 || len(r.Assigned) != 4 {
			t.Fatalf("check-in at the new leader: %+v %v", r, err)
		}
	}
}

// TestReplicaTakeoverKeepsHandoffsAndRestarts: a resume hand-off and a
// FATAL-restart request recorded by one leader are offered and repeated
// by the next, which loads them from the store. The leader dies right
// after answering the last of them (nothing of it reaches the database
// after that answer: no flush, no Run), so each must have been committed
// before it was answered; the test runs once with each answered last, as
// the later one's commit would carry the earlier one. With
// AnswerBeforeHandoffCommit (the mutation: both wait for the next batch,
// as before) the new leader loses the one answered last.
func TestReplicaTakeoverKeepsHandoffsAndRestarts(t *testing.T) {
	for _, mutate := range []bool{false, true} {
		for _, restartLast := range []bool{false, true} {
			lostHandoff, lostRestart := takeoverAfterAnswers(t, mutate, restartLast)
			lostLast := lostHandoff
			if restartLast {
				lostLast = lostRestart
			}
			switch {
			case !mutate && (lostHandoff || lostRestart):
				t.Fatalf("restart requested last %v: the new leader lost what the old one answered: hand-off lost %v, restart request lost %v",
					restartLast, lostHandoff, lostRestart)
			case mutate && !lostLast:
				t.Fatalf("mutation AnswerBeforeHandoffCommit, restart requested last %v: the one answered last should be lost with the leader; hand-off lost %v, restart request lost %v",
					restartLast, lostHandoff, lostRestart)
			}
		}
	}
}

// takeoverAfterAnswers runs TestReplicaTakeoverKeepsHandoffsAndRestarts
// once and reports what the new leader does not offer or repeat.
func takeoverAfterAnswers(t *testing.T, mutate, restartLast bool) (lostHandoff, lostRestart bool) {
	t.Helper()
	p := newReplicaPair(t, Config{TotalShards: 4, MaxConcurrency: 1})
	ctx := context.Background()
	a, b := p.c[0], p.c[1]
	for _, id := range []string{"n1", "n2"} {
		if _, err := a.AddNode(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if mutate {
		a.AnswerBeforeHandoffCommit()
	}
	const ttl = 300 * time.Millisecond
	p.lead(0, ttl)
	checkin := func(c *Controller, id string, gen uint64, shards ...appliance.ShardStatus) appliance.CheckinResponse {
		t.Helper()
		r, err := c.Checkin(ctx, &appliance.CheckinRequest{NodeID: id, Capacity: 4, Generation: gen, Shards: shards}, "127.0.0.1")
		if err != nil {
			t.Fatalf("check-in of %s: %v", id, err)
		}
		return r
	}
	restart := func() {
		t.Helper()
		if got, err := a.RestartFatal(ctx, "n1", []uint32{0}); err != nil || len(got) != 1 {
			t.Fatalf("restart request: %v %v", got, err)
		}
	}
	r1 := checkin(a, "n1", 0)
	r1 = checkin(a, "n1", r1.Generation, shardsIn(0, 4, appliance.ShardFatal, 0)...)
	r2 := checkin(a, "n2", 0) // n2 joins: shards 2-3 move to it, pending
	if len(r2.Pending) != 2 {
		t.Fatalf("n2 joins: %+v", r2)
	}
	if !restartLast {
		restart()
	}
	st := shardsIn(0, 2, appliance.ShardFatal, 0)
	st = append(st, released(2, "s2", 20), released(3, "s3", 30))
	r1 = checkin(a, "n1", r2.Generation, st...) // acknowledges, releasing 2-3 resumably
	if restartLast {
		restart()
	}
	// a dies here, right after those answers.
	p.lead(1, ttl)
	r2 = checkin(b, "n2", r2.Generation)
	// The commit that carries the hand-off carries n1's release too;
	// without it n2's shards are still pending on n1, and nothing is offered.
	res := resumeOf(r2)
	lostHandoff = len(r2.Pending) != 0 || res[2].SessionID != "s2" || res[3].Seq != 30
	r1 = checkin(b, "n1", r1.Generation, shardsIn(0, 2, appliance.ShardFatal, 0)...)
	lostRestart = len(r1.RestartShards) != 1 || r1.RestartShards[0] != 0
	t.Logf("mutate %v, restart last %v: n2 pending %v resumes %+v, n1 restarts %v", mutate, restartLast, r2.Pending, r2.Resume, r1.RestartShards)
	return lostHandoff, lostRestart
}

// TestReplicaTakeoverTrustsCommittedLeases: a check-in's lease renewal is
// committed, on the database's clock, before it is answered, so a new
// leader restores each node until its stored deadline with no restart
// grace: it changes the plan at the first check-in after the takeover,
// and never grants a shard whose holder's own lease (from its send time)
// still runs. Both stores use the test's fake clock as the database's. The
// old leader renews n1 6 s after its first check-in and dies before any
// further batch; the new leader takes over 2 s later, and n2 joins 3 s
// after that. With AnswerBeforeLeaseCommit (the mutation: renewals reach
// the database with the next batch, which never comes), the new leader
// reads n1's first deadline, expires n1 while n1's own lease still runs,
// and gives n2 n1's shards to start: two live owners, which this test
// detects.
func TestReplicaTakeoverTrustsCommittedLeases(t *testing.T) {
	for _, mutate := range []bool{false, true} {
		cfg := Config{TotalShards: 4, MaxConcurrency: 1, IdentifyWindow: time.Second, Lease: 10 * time.Second, RebalanceEvery: -1}
		clock := newFakeClock()
		path := newStorePath(t)
		ctx := context.Background()
		var cs [2]*Controller
		var sts [2]*store.Store
		for i := range 2 {
			st, err := store.Open(ctx, path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			st.SetDBClock(clock.Now)
			c, err := New(ctx, st, cfg, clock.Now, nil)
			if err != nil {
				t.Fatal(err)
			}
			c.EnableHA(nil)
			cs[i], sts[i] = c, st
		}
		a, b := cs[0], cs[1]
		for _, id := range []string{"n1", "n2"} {
			if _, err := a.AddNode(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		if mutate {
			a.AnswerBeforeLeaseCommit()
		}
		lead := func(i int, holder string, ttl time.Duration) uint64 {
			t.Helper()
			l, err := sts[i].Campaign(ctx, holder, "http://"+holder, ttl)
			if err != nil || !l.Leader {
				t.Fatalf("campaign of %s: %+v %v", holder, l, err)
			}
			if err := cs[i].Lead(ctx, store.Fence{Holder: holder, Term: l.Term}, "http://"+holder, time.Now().Add(time.Hour)); err != nil {
				t.Fatal(err)
			}
			return l.Term
		}
		lead(0, "a", 7*time.Second) // a's lease runs out 7 s from now on the database's clock
		r1, err := a.Checkin(ctx, &appliance.CheckinRequest{NodeID: "n1", Capacity: 4}, "127.0.0.1")
		if err != nil || len(r1.Assigned) != 4 || len(r1.Pending) != 0 {
			t.Fatalf("n1's first check-in: %+v %v", r1, err)
		}
		clock.Advance(6 * time.Second)
		r1, err = a.Checkin(ctx, &appliance.CheckinRequest{NodeID: "n1", Capacity: 4, Generation: r1.Generation}, "127.0.0.1")
		if err != nil || len(r1.Assigned) != 4 || len(r1.Pending) != 0 {
			t.Fatalf("n1's renewal: %+v %v", r1, err)
		}
		n1Until := clock.Now().Add(cfg.Lease) // n1's own deadline, from its send time
		n1Runs := startableSet(r1)
		// a dies here: nothing more of it reaches the database.
		clock.Advance(2 * time.Second)
		lead(1, "b", time.Minute)
		clock.Advance(3 * time.Second)
		if _, err := b.Checkin(ctx, &appliance.CheckinRequest{NodeID: "n2", Capacity: 4}, "127.0.0.2"); err != nil {
			t.Fatal(err)
		}
		// n1's lease is over in b's memory: b reads its stored one
		// (followrenew.go), then n2 checks in again.
		settleLapses(t, b)
		r2, err := b.Checkin(ctx, &appliance.CheckinRequest{NodeID: "n2", Capacity: 4}, "127.0.0.2")
		if err != nil {
			t.Fatal(err)
		}
		var both []uint32
		for s := range startableSet(r2) {
			if n1Runs[s] && clock.Now().Before(n1Until) {
				both = append(both, s)
			}
		}
		if mutate {
			if len(both) == 0 {
				t.Fatalf("mutation: the new leader should have given n2 a shard n1 still runs: %+v", r2)
			}
			continue
		}
		if len(both) > 0 {
			t.Fatalf("shards %v granted to n2 while n1's own lease runs until %s: %+v", both, n1Until, r2)
		}
		if r2.Generation <= r1.Generation || r2.RangeCount == 0 || len(r2.Pending) != int(r2.RangeCount) {
			t.Fatalf("the new leader should rebalance at once (no restart grace), n2's half pending on n1: %+v (n1 had generation %d)", r2, r1.Generation)
		}
	}
}

// startableSet is the set of shards a check-in answer lets its node start.
func startableSet(r appliance.CheckinResponse) map[uint32]bool {
	m := map[uint32]bool{}
	for _, s := range r.Assigned {
		m[s] = true
	}
	for _, s := range r.Pending {
		delete(m, s)
	}
	return m
}

// TestLeaseQueueConcurrent: many check-ins' renewals at once, with up to
// leaseCommitsInFlight statements in flight, each return, and every node's
// lease is stored. Some calls carry a stale fence (the leadership changing
// under them): they start a group of their own, leaving the group they
// replaced as next to be committed by its own members, which must not
// wait for it forever. With a group committed only while it is still next
// (the orphaned group never committed), the calls hang and the test fails.
func TestLeaseQueueConcurrent(t *testing.T) {
	p := newReplicaPair(t, Config{TotalShards: 4, MaxConcurrency: 1, Lease: 10 * time.Second})
	ctx := context.Background()
	term := p.lead(0, time.Hour)
	c := p.c[0]
	const nodes, rounds = 40, 25
	var ids []string
	for i := range nodes {
		id := fmt.Sprintf("q%02d", i)
		if _, err := c.AddNode(ctx, id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	good := store.Fence{Holder: "a", Term: term}
	stale := store.Fence{Holder: "a", Term: term - 1}
	errs := make(chan error, nodes*rounds)
	var staleOK atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		for i, id := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for r := range rounds {
					f := good
					if i%8 == 7 && r%5 == 4 {
						f = stale
					}
					err := c.commitLease(ctx, f, id, 10*time.Second)
					switch {
					case f == stale && err == nil:
						staleOK.Add(1)
					case f == good && err != nil:
						errs <- fmt.Errorf("%s round %d: %w", id, r, err)
					}
				}
			}()
		}
		wg.Wait()
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("renewals still waiting after 30 s: a group nobody commits")
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := staleOK.Load(); n > 0 {
		t.Errorf("%d renewals under a stale fence committed", n)
	}
	left, err := p.st[0].LeaseRemaining(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if left[id] != 10*time.Second {
			t.Errorf("node %s: lease %v left on the database's clock, want 10s", id, left[id])
		}
	}
}
