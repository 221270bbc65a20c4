package controller

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
)

// shardsIn reports shards lo..hi-1 READY except the given ones in state st.
func shardsIn(lo, hi uint32, st appliance.ShardState, odd ...uint32) []appliance.ShardStatus {
	var out []appliance.ShardStatus
	for s := lo; s < hi; s++ {
		ss := appliance.ShardStatus{ID: s, State: appliance.ShardReady, SeqValid: true}
		for _, o := range odd {
			if o == s {
				ss = appliance.ShardStatus{ID: s, State: st, CloseCode: 4004, LastError: "gateway: close 4004"}
			}
		}
		out = append(out, ss)
	}
	return out
}

// restartEvents returns the shard IDs of the stored events of one kind.
func restartEvents(t *testing.T, h *harness, kind string) []uint32 {
	t.Helper()
	evs, err := h.c.Events(context.Background(), 0, kind, 1000)
	if err != nil {
		t.Fatal(err)
	}
	out := []uint32{}
	for _, e := range evs {
		if e.ShardID == nil || e.NodeID == "" {
			t.Fatalf("%s event without node or shard: %+v", kind, e)
		}
		out = append(out, *e.ShardID)
	}
	return out
}

func TestRestartFatalUntilReported(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 8})
	ctx := context.Background()
	h.add("a")
	gen := h.checkin("a", 8, 0).Generation
	fatal3 := shardsIn(0, 8, appliance.ShardFatal, 3)
	if r := h.checkinWith("a", 8, gen, fatal3...); r.RestartShards != nil {
		t.Fatalf("restart_shards before any request: %v", r.RestartShards)
	}

	// Malformed lists and shards that are not FATAL are refused, naming
	// the shard; nothing is recorded.
	var fe *appliance.FieldError
	for _, c := range []struct {
		only  []uint32
		field string
	}{{[]uint32{}, "shards"}, {[]uint32{3, 3}, "shards[1]"}, {[]uint32{3, 8}, "shards[1]"}} {
		if _, err := h.c.RestartFatal(ctx, "a", c.only); !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("RestartFatal(%v): %v, want a field error for %s", c.only, err, c.field)
		}
	}
	var nf *NotFatalError
	if _, err := h.c.RestartFatal(ctx, "a", []uint32{3, 2}); !errors.Is(err, ErrNotFatal) || !errors.As(err, &nf) ||
		nf.Shard != 2 || nf.Index != 1 || nf.Why != "it is READY" {
		t.Fatalf("restart of READY shard 2: %v", err)
	}
	if _, err := h.c.RestartFatal(ctx, "ghost", nil); !errors.Is(err, ErrUnknownNode) {
		t.Fatalf("unknown node: %v", err)
	}
	if d, _ := h.c.Node(ctx, "a"); d.RestartShards != nil {
		t.Fatalf("a refused request left %v", d.RestartShards)
	}

	// The request: the next answers list 3 until a check-in shows it out
	// of FATAL. Asking twice keeps one request.
	for i := 0; i < 2; i++ {
		got, err := h.c.RestartFatal(ctx, "a", nil)
		if err != nil || !reflect.DeepEqual(got, []uint32{3}) {
			t.Fatalf("request %d: %v %v", i, got, err)
		}
	}
	if got, err := h.c.RestartFatal(ctx, "a", []uint32{3}); err != nil || !reflect.DeepEqual(got, []uint32{3}) {
		t.Fatalf("request naming 3: %v %v", got, err)
	}
	if ev := restartEvents(t, h, EventRestartRequested); !reflect.DeepEqual(ev, []uint32{3}) {
		t.Fatalf("restart_requested events %v, want one for shard 3", ev)
	}
	if d, _ := h.c.Node(ctx, "a"); !reflect.DeepEqual(d.RestartShards, []uint32{3}) {
		t.Fatalf("node detail restart_shards %v", d.RestartShards)
	}
	for i := 0; i < 2; i++ {
		if r := h.checkinWith("a", 8, gen, fatal3...); !reflect.DeepEqual(r.RestartShards, []uint32{3}) {
			t.Fatalf("answer %d while 3 is still FATAL: restart_shards %v", i, r.RestartShards)
		}
	}
	// Counts only (no per-shard status) say nothing about shard 3.
	if r := h.checkin("a", 8, gen); !reflect.DeepEqual(r.RestartShards, []uint32{3}) {
		t.Fatalf("answer to a count-only check-in: restart_shards %v", r.RestartShards)
	}
	if len(restartEvents(t, h, EventShardRestarted)) != 0 {
		t.Fatal("shard_restarted before the node reported 3 out of FATAL")
	}
	for _, st := range []appliance.ShardState{appliance.ShardAssigned, appliance.ShardStarting} {
		if _, err := h.c.RestartFatal(ctx, "a", nil); err != nil {
			t.Fatal(err)
		}
		if r := h.checkinWith("a", 8, gen, shardsIn(0, 8, st, 3)...); r.RestartShards != nil {
			t.Fatalf("answer to the check-in reporting 3 %s: restart_shards %v", st, r.RestartShards)
		}
		if d, _ := h.c.Node(ctx, "a"); d.RestartShards != nil {
			t.Fatalf("request left after 3 was reported %s: %v", st, d.RestartShards)
		}
		// Back to FATAL (the cause was not fixed): not restarted again
		// unless asked.
		if r := h.checkinWith("a", 8, gen, fatal3...); r.RestartShards != nil {
			t.Fatalf("3 FATAL again without a request: restart_shards %v", r.RestartShards)
		}
	}
	if ev := restartEvents(t, h, EventShardRestarted); !reflect.DeepEqual(ev, []uint32{3, 3}) {
		t.Fatalf("shard_restarted events %v, want two for shard 3", ev)
	}
	// The first loop round found the request still pending: one event.
	if ev := restartEvents(t, h, EventRestartRequested); !reflect.DeepEqual(ev, []uint32{3, 3}) {
		t.Fatalf("restart_requested events %v", ev)
	}

	// An Identify claim for the shard shows the node took the request up,
	// even if the shard is FATAL again by its next check-in: no endless
	// restarts of a shard whose cause is not fixed.
	if _, err := h.c.RestartFatal(ctx, "a", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := h.c.Identify(ctx, appliance.IdentifyRequest{NodeID: "a", ShardID: 3}); err != nil {
		t.Fatal(err)
	}
	if r := h.checkinWith("a", 8, gen, fatal3...); r.RestartShards != nil {
		t.Fatalf("answer after the Identify claim: restart_shards %v", r.RestartShards)
	}
	// A claim for another shard leaves the request alone.
	if _, err := h.c.RestartFatal(ctx, "a", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := h.c.Identify(ctx, appliance.IdentifyRequest{NodeID: "a", ShardID: 4}); err != nil {
		t.Fatal(err)
	}
	if r := h.checkinWith("a", 8, gen, fatal3...); !reflect.DeepEqual(r.RestartShards, []uint32{3}) {
		t.Fatalf("answer after a claim for shard 4: restart_shards %v", r.RestartShards)
	}
}

func TestRestartFatalLeavesWithAssignment(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 8})
	ctx := context.Background()
	h.add("a", "b")
	gen := h.checkin("a", 8, 0).Generation
	h.checkinWith("a", 8, gen, shardsIn(0, 8, appliance.ShardFatal, 2, 6)...)
	if got, err := h.c.RestartFatal(ctx, "a", nil); err != nil || !reflect.DeepEqual(got, []uint32{2, 6}) {
		t.Fatalf("request: %v %v", got, err)
	}
	// b joins: a keeps 0..3, 4..7 move to b. The request for 6 goes with
	// them; the one for 2 stays.
	rb := h.checkin("b", 8, 0)
	if !reflect.DeepEqual(rb.Assigned, span(4, 8)) || rb.RestartShards != nil {
		t.Fatalf("b joins: %+v", rb)
	}
	ra := h.checkinWith("a", 8, gen, shardsIn(0, 8, appliance.ShardFatal, 2, 6)...)
	if !reflect.DeepEqual(ra.Assigned, span(0, 4)) || !reflect.DeepEqual(ra.RestartShards, []uint32{2}) {
		t.Fatalf("a after b joined: %+v", ra)
	}
	if d, _ := h.c.Node(ctx, "a"); !reflect.DeepEqual(d.RestartShards, []uint32{2}) {
		t.Fatalf("a's requests after b joined: %v", d.RestartShards)
	}
	// A shard outside the assignment cannot be asked for.
	var nf *NotFatalError
	if _, err := h.c.RestartFatal(ctx, "a", []uint32{6}); !errors.As(err, &nf) || nf.Shard != 6 {
		t.Fatalf("restart of a shard outside the assignment: %v", err)
	}
	// Draining a empties its assignment: no request is left.
	if err := h.c.SetDraining(ctx, "a", true); err != nil {
		t.Fatal(err)
	}
	if d, _ := h.c.Node(ctx, "a"); d.RestartShards != nil {
		t.Fatalf("a's requests after draining: %v", d.RestartShards)
	}
	if ra := h.checkinWith("a", 8, ra.Generation, shardsIn(0, 4, appliance.ShardFatal, 2)...); ra.RestartShards != nil {
		t.Fatalf("a drained: restart_shards %v", ra.RestartShards)
	}
}

func TestRestartFatalLeaseLapse(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 4})
	ctx := context.Background()
	h.add("a", "idle")
	if _, err := h.c.RestartFatal(ctx, "idle", nil); !errors.Is(err, ErrNotLive) {
		t.Fatalf("node that never checked in: %v", err)
	}
	gen := h.checkin("a", 4, 0).Generation
	h.checkinWith("a", 4, gen, shardsIn(0, 4, appliance.ShardFatal, 1)...)
	if got, err := h.c.RestartFatal(ctx, "a", nil); err != nil || !reflect.DeepEqual(got, []uint32{1}) {
		t.Fatalf("request: %v %v", got, err)
	}
	h.clock.Advance(31 * time.Second)
	h.c.Tick()
	if d, _ := h.c.Node(ctx, "a"); d.Live || d.RestartShards != nil {
		t.Fatalf("after the lease lapsed: live %v, requests %v", d.Live, d.RestartShards)
	}
	if _, err := h.c.RestartFatal(ctx, "a", nil); !errors.Is(err, ErrNotLive) {
		t.Fatalf("request for an expired node: %v", err)
	}
	// Back with shard 1 still FATAL: the old request is gone.
	r := h.checkin("a", 4, 0)
	if r = h.checkinWith("a", 4, r.Generation, shardsIn(0, 4, appliance.ShardFatal, 1)...); r.RestartShards != nil {
		t.Fatalf("after rejoining: restart_shards %v", r.RestartShards)
	}
}

func TestRestartFatalAcrossControllerRestart(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 4})
	ctx := context.Background()
	h.add("a")
	gen := h.checkin("a", 4, 0).Generation
	h.checkinWith("a", 4, gen, shardsIn(0, 4, appliance.ShardFatal, 0, 2)...)
	if _, err := h.c.RestartFatal(ctx, "a", []uint32{2}); err != nil {
		t.Fatal(err)
	}
	if err := h.c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	h.restart()
	// The request is forgotten; before a's next check-in the stored
	// status (what the dashboard shows) tells which shards are FATAL.
	if d, _ := h.c.Node(ctx, "a"); d.RestartShards != nil || !d.Live {
		t.Fatalf("after the restart: %+v", d)
	}
	got, err := h.c.RestartFatal(ctx, "a", nil)
	if err != nil || !reflect.DeepEqual(got, []uint32{0, 2}) {
		t.Fatalf("request from the stored status: %v %v", got, err)
	}
	if r := h.checkinWith("a", 4, gen, shardsIn(0, 4, appliance.ShardFatal, 0, 2)...); !reflect.DeepEqual(r.RestartShards, []uint32{0, 2}) {
		t.Fatalf("answer after the restart: restart_shards %v", r.RestartShards)
	}
}
