package lab

import (
	"context"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
)

// A check-in answer's restart_shards starts a listed FATAL shard afresh
// (a new session from ASSIGNED, as the kernel's gw_restart_fatal does) and
// leaves a listed shard that is not FATAL, and every unlisted one, alone.
func TestSimRestartFatal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The Gateway is a closed loopback port: a started shard's dial fails
	// and it waits in BACKOFF until the test ends it.
	s := &simNode{id: "sim-test", gateway: "ws://127.0.0.1:1", shards: map[uint32]*simShard{}}
	idle := func(state appliance.ShardState) *simShard {
		sctx, stop := context.WithCancel(ctx)
		sh := &simShard{st: appliance.ShardStatus{State: state}, cancel: stop, done: make(chan struct{})}
		go func() { <-sctx.Done(); close(sh.done) }()
		return sh
	}
	before := map[uint32]*simShard{0: idle(appliance.ShardReady), 1: idle(appliance.ShardFatal), 2: idle(appliance.ShardReady), 3: idle(appliance.ShardFatal)}
	for id, sh := range before {
		sh.st.ID = id
		s.shards[id] = sh
	}
	s.apply(ctx, appliance.CheckinResponse{Generation: 2, TotalShards: 4, Assigned: []uint32{0, 1, 2, 3}, RestartShards: []uint32{1, 2}})

	s.mu.Lock()
	after := map[uint32]*simShard{}
	for id, sh := range s.shards {
		after[id] = sh
	}
	applied := s.applied
	s.mu.Unlock()
	if len(after) != 4 || applied != 2 {
		t.Fatalf("after apply: %d shards, generation %d; want 4 and 2", len(after), applied)
	}
	for _, id := range []uint32{0, 2, 3} {
		if after[id] != before[id] {
			t.Errorf("shard %d was restarted; only the listed FATAL shard 1 should be", id)
		}
	}
	if after[1] == before[1] {
		t.Fatal("shard 1 (FATAL, listed) was not restarted")
	}
	select {
	case <-before[1].done:
	default:
		t.Error("the old session of shard 1 is still running")
	}
	after[1].mu.Lock()
	st := after[1].st
	after[1].mu.Unlock()
	if st.State == appliance.ShardFatal || st.CloseCode != 0 {
		t.Errorf("restarted shard 1: %+v, want a fresh status", st)
	}
	s.stopShards(nil)
	if len(s.shards) != 0 {
		t.Errorf("%d shards left after stopping all", len(s.shards))
	}
}
