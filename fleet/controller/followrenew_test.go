package controller

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
)

// TestLeaderExpiresOnlyLapsedLeases: a follower answers a steady node's
// check-in itself (AnswerAsFollower), renewing its stored lease, while the
// leader hears nothing from the node. When the leader's memory's deadline
// for the node passes, the leader reads the stored one first: it keeps
// the node, and a newcomer gets none of the shards the node still runs
// under the follower's renewal; once the stored lease lapses too, the
// leader expires the node. The follower refuses a check-in that is not
// steady. With ExpireWithoutStoreCheck (the mutation: the leader expires
// on its memory's deadline, as before) the newcomer is handed shards the
// node still runs, and the test fails.
func TestLeaderExpiresOnlyLapsedLeases(t *testing.T) {
	for _, mutate := range []bool{false, true} {
		overlap := leaderExpiresOnlyLapsed(t, mutate)
		switch {
		case mutate && !overlap:
			t.Fatal("mutation: the leader should have handed the newcomer shards the node still runs")
		case !mutate && overlap:
			t.Fatal("the leader handed the newcomer shards the node still runs under a follower's renewal")
		}
	}
}

func leaderExpiresOnlyLapsed(t *testing.T, mutate bool) (overlap bool) {
	cfg := Config{TotalShards: 4, MaxConcurrency: 1, Lease: 10 * time.Second}
	p := newReplicaPair(t, cfg)
	a, b := p.c[0], p.c[1]
	ctx := context.Background()
	for _, id := range []string{"n1", "n2"} {
		if _, err := a.AddNode(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if mutate {
		a.ExpireWithoutStoreCheck()
	}
	p.lead(0, time.Hour)
	r, err := a.Checkin(ctx, &appliance.CheckinRequest{NodeID: "n1", Capacity: 4}, "127.0.0.1")
	if err != nil || len(startableSet(r)) != 4 {
		t.Fatalf("n1's first check-in: %+v %v", r, err)
	}
	gen := r.Generation
	if r, err = a.Checkin(ctx, &appliance.CheckinRequest{NodeID: "n1", Capacity: 4, Generation: gen}, "127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// From here on n1 checks in at the follower only.
	follower := AnswerAsFollower(ctx)
	if _, err := b.Checkin(follower, &appliance.CheckinRequest{NodeID: "n1", Capacity: 4, Generation: gen + 1}, "127.0.0.1"); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("the follower answered a check-in of another generation: %v", err)
	}
	if _, err := b.Checkin(ctx, &appliance.CheckinRequest{NodeID: "n1", Capacity: 4, Generation: gen}, "127.0.0.1"); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("the follower answered a check-in not marked AnswerAsFollower: %v", err)
	}
	var n1Until time.Time // n1's own deadline, from its last send
	for range 2 {
		p.clock.Advance(4 * time.Second)
		fr, err := b.Checkin(follower, &appliance.CheckinRequest{NodeID: "n1", Capacity: 4, Generation: gen}, "127.0.0.1")
		if err != nil {
			t.Fatalf("the follower's answer: %v", err)
		}
		if fr.Generation != gen || len(startableSet(fr)) != 4 || fr.Term == 0 {
			t.Fatalf("the follower's answer: %+v, want generation %d with the 4 shards n1 holds", fr, gen)
		}
		n1Until = p.clock.Now().Add(cfg.Lease)
	}
	if n, _ := b.FollowerAnswers(); n != 2 {
		t.Fatalf("follower answers: %d, want 2", n)
	}
	// 12 s after n1's last check-in at the leader, 4 s after its last at
	// the follower: the leader's memory says its lease is over.
	p.clock.Advance(4 * time.Second)
	r2, err := a.Checkin(ctx, &appliance.CheckinRequest{NodeID: "n2", Capacity: 4}, "127.0.0.2")
	if err != nil {
		t.Fatal(err)
	}
	for s := range startableSet(r2) {
		if p.clock.Now().Before(n1Until) {
			overlap = true
			t.Logf("shard %d granted to n2 while n1 runs it until %s", s, n1Until)
		}
	}
	if mutate {
		return overlap
	}
	// The leader adopts the stored deadline (n1Until), keeps n1 until it,
	// and expires n1 once it is over.
	live := func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.nodes["n1"].live
	}
	waitLease := func(wantLive bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			a.Tick()
			a.mu.Lock()
			n := a.nodes["n1"]
			settled := !n.live || (n.deadline.After(p.clock.Now()) && !a.ha.confirming)
			a.mu.Unlock()
			if settled && live() == wantLive {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Fatalf("n1 live %v at %s (its stored lease runs until %s), want %v", live(), p.clock.Now(), n1Until, wantLive)
	}
	waitLease(true)
	p.clock.Advance(n1Until.Sub(p.clock.Now()) - time.Second)
	waitLease(true)
	p.clock.Advance(2 * time.Second)
	waitLease(false)
	return overlap
}

// settleLapses lets leader c read the stored leases of the nodes its
// sweep found overdue (confirmLapses) and apply what it read, so the
// next call sees them expired or kept.
func settleLapses(t *testing.T, c *Controller) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	c.Tick()
	for {
		c.mu.Lock()
		busy := c.ha.confirming
		c.mu.Unlock()
		if !busy {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the leader's read of stored leases did not finish in 10 s")
		}
		time.Sleep(2 * time.Millisecond)
	}
	c.Tick()
}

// TestFollowerGrantsIdentify: a follower grants an Identify claim no
// leader answers (AnswerAsFollower) when the store shows the node owning
// the shard, the bucket's window over and the budget above its reserve,
// and the leader, whose memory knows nothing of that grant, is refused by
// the store when it grants in the same bucket within the window: the
// claim gets bucket_busy with what is left of the window. The budget
// counts both replicas' grants, in the store and then in the leader's
// memory. The follower refuses a node the store does not show owning the
// shard, and a second grant in the bucket.
func TestFollowerGrantsIdentify(t *testing.T) {
	cfg := Config{TotalShards: 4, MaxConcurrency: 1, Lease: 10 * time.Second, IdentifyWindow: 5 * time.Second,
		SessionBudget: 100, SessionReserve: 2}
	p := newReplicaPair(t, cfg)
	a, b := p.c[0], p.c[1]
	ctx := context.Background()
	for _, id := range []string{"n1", "n2"} {
		if _, err := a.AddNode(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	p.lead(0, time.Hour)
	if err := a.SetBudget(ctx, 100, 10, time.Hour); err != nil {
		t.Fatal(err)
	}
	r, err := a.Checkin(ctx, &appliance.CheckinRequest{NodeID: "n1", Capacity: 4}, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Checkin(ctx, &appliance.CheckinRequest{NodeID: "n1", Capacity: 4, Generation: r.Generation}, "127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	p.clock.Advance(startGather)
	claim := func(c *Controller, ctx context.Context, node string, shard uint32) appliance.IdentifyResponse {
		t.Helper()
		g, err := c.Identify(ctx, appliance.IdentifyRequest{NodeID: node, ShardID: shard})
		if err != nil {
			t.Fatalf("%s's claim of shard %d: %v", node, shard, err)
		}
		return g
	}
	if g := claim(a, ctx, "n1", 0); !g.Granted {
		t.Fatalf("the leader's grant of shard 0: %+v", g)
	}
	if err := a.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	follower := AnswerAsFollower(ctx)
	if _, err := b.Identify(ctx, appliance.IdentifyRequest{NodeID: "n1", ShardID: 1}); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("the follower answered a claim not marked AnswerAsFollower: %v", err)
	}
	if g := claim(b, follower, "n1", 1); g.Granted || g.Reason != appliance.ReasonBucketBusy || g.RetryAfterMS > 5000 {
		t.Fatalf("the follower's answer within the window of the leader's grant: %+v", g)
	}
	p.clock.Advance(cfg.IdentifyWindow)
	if g := claim(b, follower, "n2", 1); g.Granted || g.Reason != appliance.ReasonNotOwner {
		t.Fatalf("the follower's answer to a node not owning the shard: %+v", g)
	}
	if g := claim(b, follower, "n1", 1); !g.Granted || g.UseWithinMS == 0 {
		t.Fatalf("the follower's grant of shard 1: %+v", g)
	}
	if _, grants := b.FollowerAnswers(); grants != 1 {
		t.Fatalf("follower grants: %d, want 1", grants)
	}
	// The leader's memory says bucket 0 has been free for a window. (Shard
	// 0 claims again, as after an invalidated session: a shard that
	// started before is not held back by the start order, which the
	// leader's memory does not know shard 1 kept.)
	p.clock.Advance(time.Second)
	g := claim(a, ctx, "n1", 0)
	if g.Granted || g.Reason != appliance.ReasonBucketBusy || g.RetryAfterMS < 3500 || g.RetryAfterMS > 4000 {
		t.Fatalf("the leader's answer 1 s after the follower's grant: %+v, want bucket_busy for about 4 s", g)
	}
	if g := claim(a, ctx, "n1", 0); g.Granted {
		t.Fatalf("the leader granted at once after the store's refusal: %+v", g)
	}
	p.clock.Advance(4 * time.Second)
	if g := claim(a, ctx, "n1", 0); !g.Granted {
		t.Fatalf("the leader's grant a window after the follower's: %+v", g)
	}
	stored, ok, err := p.st[0].LoadBudget(ctx)
	if err != nil || !ok || stored.Remaining != 7 {
		t.Fatalf("stored budget after three grants from 10: %+v %v %v", stored, ok, err)
	}
	if bu := a.Budget(); bu.Remaining != 7 {
		t.Fatalf("the leader's budget after three grants from 10 (one the follower's): %+v", bu)
	}
}
