package controller

import (
	"context"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
)

// startable counts the shards an answer lets the node start.
func startable(r appliance.CheckinResponse) int { return len(r.Assigned) - len(r.Pending) }

// overCapacity checks a node in that still runs every shard of its last
// answer (all STARTING) but now reports a smaller capacity, as a node that
// rebooted with a smaller boot config does before its next answer.
func overCapacity(t *testing.T, h *harness, id string, capacity int, gen uint64, running []uint32) appliance.CheckinResponse {
	t.Helper()
	req := &appliance.CheckinRequest{NodeID: id, Capacity: capacity, Generation: gen, StartingShards: len(running)}
	for _, s := range running {
		req.Shards = append(req.Shards, appliance.ShardStatus{ID: s, State: appliance.ShardStarting})
	}
	if err := req.Validate(); err != nil {
		t.Fatalf("the node's own check-in is refused, it could never renew its lease: %v", err)
	}
	resp, err := h.c.Checkin(context.Background(), req, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.c.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	if err := resp.Validate(); err != nil {
		t.Fatalf("answer %+v: %v", resp, err)
	}
	return resp
}

// TestCapacityShrinkDuringRateLimit is issue 22's reproduction: a node
// assigned 16 shards checks in again with capacity 4 while no rebalance may
// run (the rate limit). The answer assigns at most 4 startable shards at
// once; the node's over-capacity report is accepted; and the next
// rebalance gives the rest to another node.
func TestCapacityShrinkDuringRateLimit(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 16, Lease: 6 * time.Second, RebalanceEvery: time.Hour})
	h.add("a", "b")
	r := h.checkin("a", 16, 0)
	if r.RangeCount != 16 {
		t.Fatalf("first answer %+v", r)
	}
	r = h.checkin("a", 16, r.Generation)
	h.clock.Advance(200 * time.Millisecond)
	r2 := overCapacity(t, h, "a", 4, r.Generation, r.Assigned)
	if startable(r2) > 4 || r2.RangeCount > 4 || r2.Generation == r.Generation {
		t.Fatalf("capacity 4 answered with %d startable shards (range %d+%d, generation %d -> %d)",
			startable(r2), r2.RangeStart, r2.RangeCount, r.Generation, r2.Generation)
	}
	// Still over capacity in its next check-in (it reports the same
	// statuses until it applies the answer): accepted again, same plan.
	r3 := overCapacity(t, h, "a", 4, r2.Generation, r.Assigned)
	if startable(r3) > 4 || r3.Generation != r2.Generation {
		t.Fatalf("second over-capacity check-in: %+v", r3)
	}
	// Once the rate limit allows, b gets what a gave up, after a released it.
	h.clock.Advance(time.Hour)
	h.checkin("b", 16, 0)
	r4 := overCapacity(t, h, "a", 4, r3.Generation, r3.Assigned)
	rb := h.checkin("b", 16, r4.Generation)
	if got := startable(r4) + startable(rb); got != 16 {
		t.Fatalf("after the rebalance a has %d and b %d startable shards, want 16 together", startable(r4), startable(rb))
	}
}

// TestCapacityShrinkDuringRestartGrace: the same after a controller
// restart, while the grace forbids any rebalance.
func TestCapacityShrinkDuringRestartGrace(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 16, Lease: 6 * time.Second})
	h.add("a")
	r := h.checkin("a", 16, 0)
	r = h.checkin("a", 16, r.Generation)
	h.restart()
	if p := h.c.Plan(); p.GraceUntil.IsZero() {
		t.Fatalf("no restart grace after the restart: %+v", p)
	}
	r2 := overCapacity(t, h, "a", 4, r.Generation, r.Assigned)
	if startable(r2) > 4 {
		t.Fatalf("in the restart grace, capacity 4 answered with %d startable shards: %+v", startable(r2), r2)
	}
	// It applies the answer and runs 4; after the grace its plan stays
	// within its capacity.
	h.clock.Advance(7 * time.Second)
	r3 := overCapacity(t, h, "a", 4, r2.Generation, r2.Assigned)
	if startable(r3) > 4 {
		t.Fatalf("after the grace: %+v", r3)
	}
}
