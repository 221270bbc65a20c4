package controller

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
)

// claim asks for an Identify claim and fails the test on an error.
func (h *harness) claim(node string, shard uint32) appliance.IdentifyResponse {
	h.t.Helper()
	r, err := h.c.Identify(context.Background(), appliance.IdentifyRequest{NodeID: node, ShardID: shard})
	if err != nil {
		h.t.Fatalf("identify %s/%d: %v", node, shard, err)
	}
	return r
}

func wantGrant(t *testing.T, r appliance.IdentifyResponse, what string) {
	t.Helper()
	if !r.Granted {
		t.Fatalf("%s: not granted: %+v", what, r)
	}
}

func wantRefusal(t *testing.T, r appliance.IdentifyResponse, reason appliance.IdentifyReason, retryMS int64, what string) {
	t.Helper()
	if r.Granted || r.Reason != reason || (retryMS > 0 && r.RetryAfterMS != retryMS) {
		t.Fatalf("%s: %+v, want %s retry %d ms", what, r, reason, retryMS)
	}
}

func st(id uint32, state appliance.ShardState) appliance.ShardStatus {
	return appliance.ShardStatus{ID: id, State: state}
}

func TestIdentifyStartOrder(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 4, MaxConcurrency: 1, IdentifyWindow: 5 * time.Second})
	h.add("a")
	h.checkin("a", 4, 0)
	h.clock.Advance(5 * time.Second) // the window every start waits
	wantRefusal(t, h.claim("a", 2), appliance.ReasonOrder, 250, "shard 2 before 0 and 1")
	wantRefusal(t, h.claim("a", 1), appliance.ReasonOrder, 250, "shard 1 before 0")
	wantGrant(t, h.claim("a", 0), "shard 0")
	wantRefusal(t, h.claim("a", 1), appliance.ReasonBucketBusy, 5000, "shard 1 in 0's window")
	h.clock.Advance(5 * time.Second)
	wantRefusal(t, h.claim("a", 2), appliance.ReasonOrder, 250, "shard 2 before 1")
	wantGrant(t, h.claim("a", 1), "shard 1")
	h.clock.Advance(5 * time.Second)
	wantGrant(t, h.claim("a", 2), "shard 2")
	h.clock.Advance(5 * time.Second)
	// Re-identify (op 9 false, close 4007/4009): shard 0 started before,
	// nothing holds it back, not even the never started shard 3.
	wantGrant(t, h.claim("a", 0), "shard 0 again")
	h.clock.Advance(5 * time.Second)
	wantGrant(t, h.claim("a", 3), "shard 3")
	g, err := h.c.Events(context.Background(), 0, EventIdentifyGranted, 100)
	if err != nil || len(g) != 5 || g[0].Detail != "num_shards 4" {
		t.Fatalf("grant events %v %+v", err, g)
	}
	rf, err := h.c.Events(context.Background(), 0, EventIdentifyRefused, 100)
	if err != nil || len(rf) == 0 || rf[0].Detail != "order: shard 0 of an earlier start group has not started" {
		t.Fatalf("refusal events %v %+v", err, rf)
	}
}

// A grant's window runs from its answer: while its commit waits (here on
// another writer holding the database), the bucket stays closed, and the
// next grant comes a full window after the answer, not after the decision.
func TestIdentifyWindowFromAnswer(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 4, MaxConcurrency: 1, IdentifyWindow: 5 * time.Second})
	h.add("a")
	h.checkin("a", 4, 0)
	h.clock.Advance(5 * time.Second)
	ctx := context.Background()
	release := h.holdWrites()
	type answer struct {
		r   appliance.IdentifyResponse
		err error
	}
	done := make(chan answer, 1)
	go func() {
		r, err := h.c.Identify(ctx, appliance.IdentifyRequest{NodeID: "a", ShardID: 0})
		done <- answer{r, err}
	}()
	// Shard 1 is refused for start order until shard 0's grant is
	// decided, then because that grant is being answered.
	for i := 0; ; i++ {
		r := h.claim("a", 1)
		if r.Reason == appliance.ReasonBucketBusy {
			wantRefusal(t, r, appliance.ReasonBucketBusy, 5000, "shard 1 while 0's grant commits")
			break
		}
		if i == 200 {
			t.Fatalf("shard 0's grant was never decided: %+v", r)
		}
		time.Sleep(10 * time.Millisecond)
	}
	h.clock.Advance(400 * time.Millisecond) // the commit is slow
	wantRefusal(t, h.claim("a", 1), appliance.ReasonBucketBusy, 5000, "shard 1 while 0's grant still commits")
	release()
	a := <-done
	if a.err != nil {
		t.Fatal(a.err)
	}
	wantGrant(t, a.r, "shard 0 after its commit")
	h.clock.Advance(4600 * time.Millisecond) // a window after the decision
	wantRefusal(t, h.claim("a", 1), appliance.ReasonBucketBusy, 400, "shard 1 a window after 0's decision")
	h.clock.Advance(400 * time.Millisecond) // a window after the answer
	wantGrant(t, h.claim("a", 1), "shard 1 a window after 0's answer")
}

// Start groups of max_concurrency shards: within a group buckets are
// independent; a later group waits until the earlier one's first grants
// are orderSettle old, since a node sends Identify right after its grant.
func TestIdentifyStartGroups(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 6, MaxConcurrency: 2, IdentifyWindow: 5 * time.Second})
	h.add("a")
	h.checkin("a", 6, 0)
	h.clock.Advance(5 * time.Second)
	wantGrant(t, h.claim("a", 1), "shard 1 (group 0, bucket 1)")
	wantRefusal(t, h.claim("a", 2), appliance.ReasonOrder, 250, "shard 2 before shard 0")
	h.clock.Advance(5 * time.Second)
	wantGrant(t, h.claim("a", 0), "shard 0")
	h.clock.Advance(100 * time.Millisecond)
	// Bucket 1 is open, but shard 0's Identify may still be on its way.
	wantRefusal(t, h.claim("a", 3), appliance.ReasonOrder, 900, "shard 3 right after shard 0's grant")
	h.clock.Advance(900 * time.Millisecond)
	wantGrant(t, h.claim("a", 3), "shard 3 once shard 0 settled")
	h.clock.Advance(5 * time.Second)
	wantGrant(t, h.claim("a", 0), "shard 0 re-identifies")
	// Shard 5 waits for shard 2 (group 1), whose bucket 0 just granted.
	wantRefusal(t, h.claim("a", 5), appliance.ReasonOrder, 5000, "shard 5 before shard 2")
}

// One broken shard does not block the fleet: a FATAL shard, a shard whose
// owner's lease ran out, and a hand-off pending for more than a lease do
// not hold back later start groups.
func TestIdentifyOrderExceptions(t *testing.T) {
	t.Run("fatal", func(t *testing.T) {
		h := newHarness(t, Config{TotalShards: 3, MaxConcurrency: 1, IdentifyWindow: 5 * time.Second})
		h.add("a")
		h.checkinWith("a", 3, 0, st(0, appliance.ShardFatal), st(1, appliance.ShardStarting))
		h.clock.Advance(5 * time.Second)
		wantRefusal(t, h.claim("a", 2), appliance.ReasonOrder, 0, "shard 2 before 1")
		wantGrant(t, h.claim("a", 1), "shard 1 past the FATAL shard 0")
		// Shard 0 recovers (the operator fixed it): it starts now, and
		// shard 1, which started, may re-identify regardless.
		h.checkinWith("a", 3, 1, st(0, appliance.ShardBackoff), st(1, appliance.ShardReady))
		h.clock.Advance(5 * time.Second)
		wantRefusal(t, h.claim("a", 2), appliance.ReasonOrder, 0, "shard 2 before the recovered shard 0")
		wantGrant(t, h.claim("a", 1), "shard 1 re-identifies")
		h.clock.Advance(5 * time.Second)
		wantGrant(t, h.claim("a", 0), "shard 0")
		h.clock.Advance(5 * time.Second)
		wantGrant(t, h.claim("a", 2), "shard 2")
	})
	t.Run("owner lease expired", func(t *testing.T) {
		h := newHarness(t, Config{TotalShards: 4, MaxConcurrency: 1, IdentifyWindow: 5 * time.Second})
		h.add("a", "b")
		g := h.checkin("a", 2, 0).Generation
		g = h.checkin("b", 2, 0).Generation
		h.checkin("a", 2, g)
		if r := h.checkin("b", 2, g); len(r.Pending) != 0 || r.RangeStart != 2 {
			t.Fatalf("setup: %+v", r)
		}
		h.clock.Advance(20 * time.Second)
		h.checkin("b", 2, g) // a stays silent
		wantRefusal(t, h.claim("b", 2), appliance.ReasonOrder, 250, "shard 2 while a may start 0 and 1")
		h.clock.Advance(11 * time.Second) // a's lease ran out; no rebalance yet
		wantGrant(t, h.claim("b", 2), "shard 2 with shards 0 and 1 unowned")
	})
	t.Run("pending hand-off", func(t *testing.T) {
		h := newHarness(t, Config{TotalShards: 2, MaxConcurrency: 1, IdentifyWindow: 5 * time.Second})
		h.add("a", "b")
		g := h.checkin("b", 2, 0).Generation
		r := h.checkin("a", 1, 0) // shard 0 moves from b to a
		if r.Generation == g || len(r.Pending) != 1 || r.Pending[0] != 0 {
			t.Fatalf("setup: %+v", r)
		}
		h.clock.Advance(5 * time.Second)
		// b never acknowledges: shard 0 stays pending on a.
		for i := 0; i < 3; i++ {
			h.checkin("b", 2, g)
			h.checkin("a", 1, r.Generation)
			wantRefusal(t, h.claim("b", 1), appliance.ReasonOrder, 0, fmt.Sprintf("shard 1 while 0 is pending (%d)", i))
			h.clock.Advance(9 * time.Second)
		}
		h.checkin("b", 2, g)
		h.checkin("a", 1, r.Generation)
		wantGrant(t, h.claim("b", 1), "shard 1 after a lease of pending hand-off")
	})
	t.Run("ready", func(t *testing.T) {
		// A shard reported READY (resumed, or identified before the
		// history was kept) counts as started.
		h := newHarness(t, Config{TotalShards: 2, MaxConcurrency: 1, IdentifyWindow: 5 * time.Second})
		h.add("a")
		h.checkin("a", 2, 0)
		h.clock.Advance(5 * time.Second)
		wantRefusal(t, h.claim("a", 1), appliance.ReasonOrder, 250, "shard 1 before 0")
		h.checkinWith("a", 2, 1, st(0, appliance.ShardReady))
		wantGrant(t, h.claim("a", 1), "shard 1 after 0 reported READY")
	})
	t.Run("discord max_concurrency", func(t *testing.T) {
		// The operator caps max_concurrency at 2, Discord's is 3: shard 4
		// is in group 2 here, but in Discord's group 1 with shard 3, after
		// group 0 = {0,1,2}.
		h := newHarness(t, Config{TotalShards: 6, MaxConcurrency: 2, IdentifyWindow: 5 * time.Second})
		h.c.SetGateway(GatewaySettings{MaxConcurrencyFixed: true})
		if err := h.c.ApplyGatewayBot(context.Background(), gatewayBot("ws://127.0.0.1:9000", 6, 1000, 1000, 3, 0)); err != nil {
			t.Fatal(err)
		}
		h.add("a")
		h.checkinWith("a", 6, 0, st(0, appliance.ShardReady), st(1, appliance.ShardReady))
		h.clock.Advance(5 * time.Second)
		wantRefusal(t, h.claim("a", 3), appliance.ReasonOrder, 0, "shard 3 before shard 2")
		wantGrant(t, h.claim("a", 2), "shard 2")
		h.clock.Advance(5 * time.Second)
		wantGrant(t, h.claim("a", 3), "shard 3")
	})
}

// After a restart the order still holds: grants are read back from the
// audit log, and nothing else counts as started.
func TestIdentifyOrderAcrossRestart(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 4, MaxConcurrency: 1, IdentifyWindow: 5 * time.Second})
	h.add("a")
	h.checkin("a", 4, 0)
	h.clock.Advance(5 * time.Second)
	wantGrant(t, h.claim("a", 0), "shard 0")
	h.clock.Advance(5 * time.Second)
	wantGrant(t, h.claim("a", 1), "shard 1")
	h.restart() // no flush: the grants were durable when answered
	h.clock.Advance(5 * time.Second)
	wantRefusal(t, h.claim("a", 3), appliance.ReasonOrder, 250, "shard 3 before shard 2 after the restart")
	wantGrant(t, h.claim("a", 2), "shard 2 after the restart")
	h.restart()
	h.clock.Advance(5 * time.Second)
	wantGrant(t, h.claim("a", 3), "shard 3 after a second restart")
}

// TestIdentifyOrderProperty drives random fleets (shard counts, bucket
// counts, nodes, FATAL shards, silent nodes, controller restarts) with
// claims arriving in random order, and checks every shard's first grant:
// each shard of an earlier start group was granted at least orderSettle
// before, or could not start (FATAL, or no live holder). A shard's later
// grants (re-identifies) are never held back, so they are not checked: a
// shard first granted while an earlier one could not start may well
// re-identify once that one can. Every shard that can start is eventually
// granted.
func TestIdentifyOrderProperty(t *testing.T) {
	const (
		window = 5 * time.Second
		lease  = 30 * time.Second
	)
	excused := 0
	for seed := uint64(1); seed <= 60; seed++ {
		rng := rand.New(rand.NewPCG(seed, 99))
		total := uint32(1 + rng.IntN(24))
		mc := uint32(1 + rng.IntN(5))
		h := newHarness(t, Config{TotalShards: total, MaxConcurrency: mc, IdentifyWindow: window, Lease: lease, SessionBudget: 100000})
		k := 1 + rng.IntN(4)
		capacity := int(total)/k + 1
		type simN struct {
			id     string
			gen    uint64
			silent bool
		}
		nodes := make([]*simN, k)
		for i := range nodes {
			nodes[i] = &simN{id: fmt.Sprintf("n%d", i)}
			h.add(nodes[i].id)
		}
		fatal := map[uint32]bool{}
		for s := uint32(0); s < total; s++ {
			if rng.IntN(8) == 0 {
				fatal[s] = true
			}
		}
		if k > 1 && rng.IntN(3) == 0 {
			nodes[rng.IntN(k)].silent = true // checks in once, then never
		}
		granted := map[uint32]time.Time{}
		checkinAll := func(first bool) {
			for _, n := range nodes {
				if n.silent && !first {
					continue
				}
				var shards []appliance.ShardStatus
				for s := range fatal {
					shards = append(shards, st(s, appliance.ShardFatal))
				}
				r, err := h.c.Checkin(context.Background(), &appliance.CheckinRequest{NodeID: n.id, Capacity: capacity,
					Generation: n.gen, Shards: shards}, "127.0.0.1")
				if err != nil {
					t.Fatal(err)
				}
				n.gen = r.Generation
			}
		}
		checkinAll(true)
		checkinAll(true)
		restarts := 0
		deadline := h.clock.Now().Add(time.Duration(total)*window + 3*lease)
		for h.clock.Now().Before(deadline) && len(granted)+len(fatal) < int(total) {
			h.clock.Advance(time.Duration(rng.IntN(1500)) * time.Millisecond)
			if rng.IntN(4) == 0 {
				checkinAll(false)
			}
			if rng.IntN(200) == 0 {
				h.restart()
				restarts++
			}
			owners := h.c.Owners()
			for _, s := range rng.Perm(int(total)) {
				s := uint32(s)
				if fatal[s] || owners[s] == "" || rng.IntN(3) == 0 {
					continue
				}
				if _, ok := granted[s]; ok && rng.IntN(20) != 0 {
					continue // a started shard re-identifies now and then
				}
				r := h.claim(owners[s], s)
				if !r.Granted {
					continue
				}
				now := h.clock.Now()
				owners := h.c.Owners() // the claim expired leases
				if _, again := granted[s]; again {
					// A shard that started before is never held back
					// (it re-identifies): only first grants keep order.
					continue
				}
				for x := uint32(0); x < s/mc*mc; x++ {
					at, ok := granted[x]
					switch {
					case ok && now.Sub(at) >= orderSettle:
					case fatal[x] || owners[x] == "":
						excused++
					default:
						t.Fatalf("seed %d (total %d, mc %d): shard %d granted at %v before shard %d (granted %v at %v)",
							seed, total, mc, s, now, x, ok, at)
					}
				}
				granted[s] = now
			}
		}
		owners := h.c.Owners()
		for s := uint32(0); s < total; s++ {
			if _, ok := granted[s]; !ok && !fatal[s] && owners[s] != "" {
				t.Fatalf("seed %d (total %d, mc %d, %d nodes, %d restarts): shard %d of %s never granted: %+v; granted %v fatal %v plan %+v",
					seed, total, mc, k, restarts, s, owners[s], h.claim(owners[s], s), granted, fatal, h.c.Plan())
			}
		}
	}
	if excused == 0 {
		t.Fatal("no grant ever passed a shard that could not start")
	}
}

// A grant carries its validity: the part of the window beyond Discord's
// 5 s (appliance.GrantUseWithin); a refusal carries none.
func TestIdentifyGrantUseWithin(t *testing.T) {
	for _, c := range []struct {
		window time.Duration
		want   uint32
	}{{DefaultIdentifyWindow, 250}, {5500 * time.Millisecond, 500}, {5 * time.Second, 238}, {700 * time.Millisecond, 33}} {
		h := newHarness(t, Config{TotalShards: 2, MaxConcurrency: 1, IdentifyWindow: c.window})
		h.add("a")
		h.checkin("a", 2, 0)
		h.clock.Advance(c.window)
		r := h.claim("a", 0)
		wantGrant(t, r, "shard 0")
		if r.UseWithinMS != c.want {
			t.Errorf("window %v: use_within_ms %d, want %d", c.window, r.UseWithinMS, c.want)
		}
		if r := h.claim("a", 1); r.Granted || r.UseWithinMS != 0 {
			t.Errorf("window %v: refusal %+v carries a validity", c.window, r)
		}
	}
}

// A node that discards a late grant claims the shard again, saying so: the
// shard has not started, so the next start group waits for it again (it
// would otherwise Identify before it), also when a controller restart came
// between the grant and the claim.
func TestIdentifyReclaimUnusedGrant(t *testing.T) {
	for _, restart := range []bool{false, true} {
		t.Run(fmt.Sprint("restart=", restart), func(t *testing.T) {
			h := newHarness(t, Config{TotalShards: 2, MaxConcurrency: 1, IdentifyWindow: 5 * time.Second})
			h.add("a")
			h.checkin("a", 2, 0)
			h.clock.Advance(5 * time.Second)
			wantGrant(t, h.claim("a", 0), "shard 0") // its answer arrives late: discarded
			if restart {
				h.restart()
			}
			h.clock.Advance(2 * time.Second)
			r, err := h.c.Identify(context.Background(), appliance.IdentifyRequest{NodeID: "a", ShardID: 0, UnusedGrant: true})
			if err != nil || r.Granted {
				t.Fatalf("shard 0 granted again inside its window: %+v %v", r, err)
			}
			h.clock.Advance(5 * time.Second)
			wantRefusal(t, h.claim("a", 1), appliance.ReasonOrder, 0, "shard 1 while shard 0's only grant went unused")
			wantGrant(t, h.claim("a", 0), "shard 0 again")
			h.clock.Advance(5 * time.Second)
			wantGrant(t, h.claim("a", 1), "shard 1 after shard 0 started")
			if ev, err := h.c.Events(context.Background(), 0, EventIdentifyUnused, 10); err != nil || len(ev) != 1 || *ev[0].ShardID != 0 {
				t.Fatalf("identify_reclaimed events: %v %+v", err, ev)
			}
		})
	}
}
