package metrics_test

import (
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/metrics"
)

// TestJudgeRunsAndTruncation: runs merge consecutive shards with the same
// reason, node and state; the list stops at MaxListedRuns while the counts
// stay complete.
func TestJudgeRunsAndTruncation(t *testing.T) {
	const total = 3 * metrics.MaxListedRuns
	fs := controller.FleetStats{TotalShards: total, Nodes: []controller.NodeStats{{ID: "a", Live: true}},
		Shards: make([]controller.ShardStats, total)}
	for i := range fs.Shards {
		// Every other shard READY with a ping; the rest alternate between
		// STARTING and no ACK yet, so no two unready shards are adjacent.
		sh := controller.ShardStats{Node: 0, Held: true, Reported: true, State: appliance.ShardReady, PingMS: 10}
		switch i % 4 {
		case 1:
			sh.State, sh.PingMS = appliance.ShardStarting, 0
		case 3:
			sh.PingMS = 0
		}
		fs.Shards[i] = sh
	}
	v := metrics.Judge(&fs, time.Second)
	if v.Ready || v.NotReadyCount != total/2 || v.ReadyShards != total/2 ||
		v.Reasons[metrics.ReasonNotReady] != total/4 || v.Reasons[metrics.ReasonNoPing] != total/4 {
		t.Fatalf("counts %+v", v.Summary)
	}
	if len(v.NotReady) != metrics.MaxListedRuns || !v.Truncated {
		t.Fatalf("%d runs, truncated %v", len(v.NotReady), v.Truncated)
	}
	if r := v.NotReady[0]; r != (metrics.ShardRun{First: 1, Last: 1, Reason: metrics.ReasonNotReady, Node: "a", State: "STARTING"}) {
		t.Fatalf("first run %+v", r)
	}

	// Adjacent shards merge; a change of node, state or reason starts a run.
	fs = controller.FleetStats{TotalShards: 8, Nodes: []controller.NodeStats{{ID: "a", Live: true}, {ID: "b", Live: true}},
		Shards: []controller.ShardStats{
			{Node: -1}, {Node: -1}, // unowned
			{Node: 0, Held: true, Reported: true, State: appliance.ShardReady, PingMS: 2000},
			{Node: 0, Held: true, Reported: true, State: appliance.ShardReady, PingMS: 3000},
			{Node: 1, Held: true, Reported: true, State: appliance.ShardReady, PingMS: 1500},
			{Node: 1, Held: true, Reported: true, State: appliance.ShardBackoff},
			{Node: 1, Held: true, Reported: true, State: appliance.ShardFatal},
			{Node: 1, Held: true, Reported: true, State: appliance.ShardReady, PingMS: 1000}, // at the bound: ready
		}}
	v = metrics.Judge(&fs, time.Second)
	want := []metrics.ShardRun{
		{First: 0, Last: 1, Reason: metrics.ReasonUnowned},
		{First: 2, Last: 3, Reason: metrics.ReasonPingOverBound, Node: "a", PingMaxMS: 3000},
		{First: 4, Last: 4, Reason: metrics.ReasonPingOverBound, Node: "b", PingMaxMS: 1500},
		{First: 5, Last: 5, Reason: metrics.ReasonNotReady, Node: "b", State: "BACKOFF"},
		{First: 6, Last: 6, Reason: metrics.ReasonNotReady, Node: "b", State: "FATAL"},
	}
	if len(v.NotReady) != len(want) || v.Truncated || v.ReadyShards != 1 {
		t.Fatalf("runs %+v, ready %d", v.NotReady, v.ReadyShards)
	}
	for i := range want {
		if v.NotReady[i] != want[i] {
			t.Errorf("run %d: %+v, want %+v", i, v.NotReady[i], want[i])
		}
	}
}
