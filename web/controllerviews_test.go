package web

import (
	"context"
	"testing"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
)

// TestControllerShardMap checks the controller's read-only shard map (in
// fleet/controller/dashboard_views.go) through a drain and its hand-off.
func TestControllerShardMap(t *testing.T) {
	f := seeded(t, nil)
	ctx := context.Background()
	ready := controller.NewShardFact(true, appliance.ShardReady)
	count := func(m controller.ShardMapView) map[controller.ShardFact]int {
		out := map[controller.ShardFact]int{}
		for _, f := range m.Shards {
			out[f]++
		}
		return out
	}
	m := f.ctrl.ShardMap()
	if c := count(m); c[ready] != 64 || len(m.Groups) != 3 {
		t.Fatalf("settled fleet: %v, %d groups", c, len(m.Groups))
	}
	f.mu.Lock()
	f.state["1"] = appliance.ShardFatal
	f.mu.Unlock()
	f.checkin("node-a")
	if m := f.ctrl.ShardMap(); m.Shards[1] != controller.NewShardFact(true, appliance.ShardFatal) || m.Shards[0] != ready {
		t.Fatalf("reported FATAL: facts %+v", m.Shards[:4])
	}
	f.mu.Lock()
	f.state["1"] = appliance.ShardReady
	f.mu.Unlock()

	b, _ := f.ctrl.Node(ctx, "node-b")
	if err := f.ctrl.SetDraining(ctx, "node-b", true); err != nil {
		t.Fatal(err)
	}
	m = f.ctrl.ShardMap()
	for _, g := range m.Groups {
		if g.NodeID == "node-b" {
			t.Fatal("a draining node still has a range")
		}
	}
	for s := b.RangeStart; s < b.RangeStart+b.RangeCount; s++ {
		if m.Shards[s].Held {
			t.Fatalf("shard %d of the drained node is %+v, want pending (not held) until released", s, m.Shards[s])
		}
	}
	// The others take their new shards only after node-b releases them.
	f.checkin("node-a")
	f.checkin("node-c")
	if m := f.ctrl.ShardMap(); m.Shards[b.RangeStart].Held {
		t.Fatal("shard granted before its previous owner released it")
	}
	f.settle("node-a", "node-b", "node-c")
	if c := count(f.ctrl.ShardMap()); c[ready] != 64 {
		t.Fatalf("after the hand-off: %v", c)
	}
}

// TestControllerEventLog checks the filtered, newest-first audit log.
func TestControllerEventLog(t *testing.T) {
	f := seeded(t, nil)
	ctx := context.Background()
	for _, on := range []bool{true, false, true} {
		if err := f.ctrl.SetDraining(ctx, "node-c", on); err != nil {
			t.Fatal(err)
		}
	}
	evs, err := f.ctrl.EventLog(ctx, controller.EventFilter{NodeID: "node-c", Kind: controller.EventDrain, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 || evs[0].ID <= evs[1].ID || evs[0].NodeID != "node-c" || evs[0].Kind != controller.EventDrain {
		t.Fatalf("drain events of node-c: %+v", evs)
	}
	older, err := f.ctrl.EventLog(ctx, controller.EventFilter{NodeID: "node-c", Kind: controller.EventDrain, Before: evs[0].ID, Limit: 10})
	if err != nil || len(older) != 1 || older[0].ID != evs[1].ID {
		t.Fatalf("before %d: %+v %v", evs[0].ID, older, err)
	}
	all, _ := f.ctrl.EventLog(ctx, controller.EventFilter{Limit: 1000})
	for _, e := range all {
		if e.NodeID != "" && e.NodeID != "node-a" && e.NodeID != "node-b" && e.NodeID != "node-c" {
			t.Fatalf("unexpected node in %+v", e)
		}
	}
	if _, err := f.ctrl.EventLog(ctx, controller.EventFilter{Limit: 0}); err == nil {
		t.Fatal("limit 0 accepted")
	}
}
