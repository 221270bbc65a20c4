package controller

import (
	"context"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
)

// TestIdentifyAfterStart: a controller on a store with no grant waits no
// window before its first grant, only the start gather: while an enrolled
// node has not checked in, a first Identify is refused ("order", asked
// again within orderRetry); once every enrolled node is in and the plan is
// made, the same claim is granted at once, with the clock not moved; and
// if a node never comes, the gather ends at startGather.
func TestIdentifyAfterStart(t *testing.T) {
	for _, late := range []bool{false, true} {
		h := newHarness(t, Config{TotalShards: 8, MaxConcurrency: 2, IdentifyWindow: 5 * time.Second, Lease: 30 * time.Second})
		h.add("a", "b")
		h.checkin("a", 4, 0)
		wantRefusal(t, h.claim("a", 0), appliance.ReasonOrder, orderRetry.Milliseconds(), "shard 0 while b has not checked in")
		if !late {
			h.checkin("b", 4, 0)
			wantGrant(t, h.claim("a", 0), "shard 0 once every node is in")
			wantGrant(t, h.claim("a", 1), "shard 1 (the other bucket) at once")
			continue
		}
		h.clock.Advance(startGather - time.Millisecond)
		wantRefusal(t, h.claim("a", 0), appliance.ReasonOrder, 1, "shard 0 1 ms before the gather's end")
		h.clock.Advance(time.Millisecond)
		wantGrant(t, h.claim("a", 0), "shard 0 at the gather's end without b")
	}
}

// TestIdentifyWindowFromStoredGrant: across a restart (a crash: nothing
// unflushed survives), a bucket waits for the rest of the window of its
// last stored grant, and a bucket with no recent grant grants at once. It
// fails if the restarted controller does not read the stored grant times
// (then shard 0's bucket would grant twice within one window) or reads
// them as if granted at the restart (the blind wait: 5 s, not 4 s).
func TestIdentifyWindowFromStoredGrant(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 4, MaxConcurrency: 2, IdentifyWindow: 5 * time.Second})
	h.add("a")
	h.checkin("a", 4, 0)
	wantGrant(t, h.claim("a", 0), "shard 0")
	h.clock.Advance(time.Second)
	h.restart()
	wantRefusal(t, h.claim("a", 0), appliance.ReasonBucketBusy, 4000, "shard 0 again, 1 s after its grant, across a restart")
	wantGrant(t, h.claim("a", 1), "shard 1: its bucket never granted")
	h.clock.Advance(4*time.Second - time.Millisecond)
	wantRefusal(t, h.claim("a", 2), appliance.ReasonBucketBusy, 1, "shard 2, 1 ms before the end of shard 0's window")
	h.clock.Advance(time.Millisecond)
	wantGrant(t, h.claim("a", 2), "shard 2 when shard 0's window is over")
	// A restart right after a grant: the bucket waits the whole window.
	h.restart()
	wantRefusal(t, h.claim("a", 0), appliance.ReasonBucketBusy, 5000, "shard 0 right after shard 2's grant and a restart")
}

// TestIdentifyOrderSettleAcrossRestart: a first grant made just before a
// restart still holds the next start group back for orderSettle after it
// (the restarted controller dates it from the store), even when the later
// shard's own bucket is free. It fails if loaded grants count as settled.
func TestIdentifyOrderSettleAcrossRestart(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 4, MaxConcurrency: 2, IdentifyWindow: 5 * time.Second})
	h.add("a")
	h.checkin("a", 4, 0)
	wantGrant(t, h.claim("a", 1), "shard 1")
	h.clock.Advance(5 * time.Second)
	wantGrant(t, h.claim("a", 0), "shard 0")
	h.clock.Advance(400 * time.Millisecond)
	h.restart()
	wantRefusal(t, h.claim("a", 3), appliance.ReasonOrder, 600, "shard 3, 0.4 s after shard 0's first grant, across a restart")
	h.clock.Advance(600 * time.Millisecond)
	wantGrant(t, h.claim("a", 3), "shard 3 once shard 0's grant has settled")
}

// TestIdentifyStoredGrantRenumbered: a stored grant whose shard is in
// another bucket under the max_concurrency the controller restarts with
// holds every bucket for the rest of its window.
func TestIdentifyStoredGrantRenumbered(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 4, MaxConcurrency: 4, IdentifyWindow: 5 * time.Second})
	h.add("a")
	h.checkin("a", 4, 0)
	wantGrant(t, h.claim("a", 0), "shard 0")
	wantGrant(t, h.claim("a", 1), "shard 1")
	h.clock.Advance(5 * time.Second)
	wantGrant(t, h.claim("a", 3), "shard 3 (bucket 3 of 4)")
	h.clock.Advance(2 * time.Second)
	h.cfg.MaxConcurrency = 2 // shard 3 is in bucket 1 now
	h.restart()
	wantRefusal(t, h.claim("a", 2), appliance.ReasonBucketBusy, 3000, "shard 2 (bucket 0 of 2) in shard 3's window")
	h.clock.Advance(3 * time.Second)
	wantGrant(t, h.claim("a", 2), "shard 2 after shard 3's window")
}

// A controller that learns Discord's max_concurrency (GET /gateway/bot)
// before any grant renumbers no window: it grants at once. After a grant
// the new buckets wait for that grant's window (TestApplyGatewayBot).
func TestIdentifyConcurrencyLearnedBeforeAnyGrant(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, Config{TotalShards: 8, IdentifyWindow: 5 * time.Second})
	if err := h.c.SetGateway(GatewaySettings{Token: "tok"}); err != nil {
		t.Fatal(err)
	}
	h.add("a")
	r := h.checkin("a", 8, 0)
	if err := h.c.ApplyGatewayBot(ctx, gatewayBot("ws://127.0.0.1:9000", 8, 1000, 1000, 4, 3_600_000)); err != nil {
		t.Fatal(err)
	}
	h.checkin("a", 8, r.Generation)
	for s := uint32(0); s < 4; s++ {
		wantGrant(t, h.claim("a", s), "the first start group, right after max_concurrency 4 was learned")
	}
}

// TestIdentifyWaitsForTheRebalanceAfterTheGather: a node that checks in
// just as the gather's time runs out makes a rebalance due; until it has
// run, no shard's first Identify is granted, since the plan is about to
// move shards between nodes. (TestKernelGatewayLargeMessages started a
// session on a node that the rebalance 7 ms after the grant took it from.)
// It fails when the gather's end ignores a due rebalance.
func TestIdentifyWaitsForTheRebalanceAfterTheGather(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 2, MaxConcurrency: 1, IdentifyWindow: 5 * time.Second, Lease: 30 * time.Second,
		RebalanceEvery: time.Second})
	h.add("a", "b")
	h.clock.Advance(startGather)
	g := h.checkin("a", 1, 0).Generation // a alone: the plan gives it shard 0
	h.checkin("b", 1, 0)                 // a rebalance is due, at most RebalanceEvery from now
	wantRefusal(t, h.claim("a", 0), appliance.ReasonOrder, orderRetry.Milliseconds(), "shard 0 while the rebalance b made due waits")
	h.clock.Advance(time.Second)
	r := h.checkin("a", 1, g) // the rebalance runs
	if r.Generation == g {
		t.Fatalf("no rebalance after b joined: %+v", r)
	}
	owner := "a"
	if len(r.Assigned) == 0 || r.Assigned[0] != 0 {
		owner = "b"
		h.checkin("b", 1, 0)
	}
	wantGrant(t, h.claim(owner, 0), "shard 0 on its owner once the plan is made")
}
