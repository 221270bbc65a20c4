package controller

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
)

// running is the status of a shard a node runs with a resumable session
// (the kernel reports its hand-over sequence as seq).
func running(id uint32, session string, seq uint32) appliance.ShardStatus {
	return appliance.ShardStatus{ID: id, State: appliance.ShardReady, SeqValid: true, SessionID: session, Seq: seq,
		ResumeURL: "ws://10.0.0.9:9000/resume", EventsAckedSeq: seq}
}

// TestCrashResumeFromReportedSession: a node's reports of its running
// shards' sessions are kept (and stored: they survive a controller
// restart); when its lease lapses, each such shard is handed to its next
// owner from the last reported sequence, and a shard reported without a
// session is not. A late report of the deposed node changes nothing; the
// next owner's own reports replace the record, and a hand-off it did not
// resume (another session) is counted as a gap. Its own crash then hands
// over its sessions in turn.
func TestCrashResumeFromReportedSession(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, Config{TotalShards: 4, Lease: 30 * time.Second, ResumeTTL: time.Minute})
	h.add("a", "b", "c")
	ra := h.checkin("a", 4, 0)
	if len(ra.Assigned) != 4 || len(ra.Pending) != 0 {
		t.Fatalf("a: %+v", ra)
	}
	gen := ra.Generation
	noSession := appliance.ShardStatus{ID: 3, State: appliance.ShardReady, SeqValid: true}
	h.checkinWith("a", 4, gen, running(0, "sa0", 100), running(1, "sa1", 101), running(2, "sa2", 102), noSession)
	h.clock.Advance(10 * time.Second)
	h.checkinWith("a", 4, gen, running(0, "sa0", 150), running(1, "sa1", 101), running(2, "sa2", 102), noSession)
	if v := h.c.Gateway(); v.Handoffs != 0 {
		t.Fatalf("running sessions offered while a holds them: %d", v.Handoffs)
	}
	// The controller restarts (its writes flushed); a is restored live for
	// one more lease, then goes silent: it crashed.
	if err := h.c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	h.restart()
	h.clock.Advance(31 * time.Second)
	h.c.Tick()
	if v := h.c.Gateway(); v.Handoffs != 3 {
		t.Fatalf("hand-offs after a's lease lapsed: %d, want 3", v.Handoffs)
	}
	rb := h.checkin("b", 4, 0)
	if len(rb.Assigned) != 4 || len(rb.Pending) != 0 {
		t.Fatalf("b: %+v", rb)
	}
	got := resumeOf(rb)
	url := "ws://10.0.0.9:9000/resume?v=10&encoding=json"
	want := map[uint32]appliance.ResumeState{
		0: {ShardID: 0, SessionID: "sa0", Seq: 150, ResumeURL: url},
		1: {ShardID: 1, SessionID: "sa1", Seq: 101, ResumeURL: url},
		2: {ShardID: 2, SessionID: "sa2", Seq: 102, ResumeURL: url},
	}
	if len(got) != len(want) {
		t.Fatalf("b's hand-offs %+v, want %+v", got, want)
	}
	for s, w := range want {
		if got[s] != w {
			t.Fatalf("b's hand-off of shard %d: %+v, want %+v", s, got[s], w)
		}
	}
	// a comes back and reports what it ran: it holds nothing, so nothing
	// of it is kept or offered.
	h.clock.Advance(time.Second)
	h.checkinWith("a", 4, gen, running(0, "sa0", 999), running(1, "sa1", 999))
	h.c.mu.Lock()
	h0, h1, r0 := h.c.handoffs[0], h.c.handoffs[1], h.c.sessions[0]
	h.c.mu.Unlock()
	if h0 == nil || h1 == nil || h0.state.Seq != 150 || h1.state.Seq != 101 || r0 == nil || r0.node.id != "a" || r0.state.Seq != 150 {
		t.Fatalf("after a's late report: hand-offs %+v %+v, record %+v", h0, h1, r0)
	}
	// a rejoining moved the plan: b keeps holding 0..3 until it
	// acknowledges, and acknowledges only after its report below.
	// b resumed shard 0 and advanced it; shard 1's Resume was refused and
	// b identified afresh (a gap); shard 2 is still resuming.
	h.checkinWith("b", 4, rb.Generation, running(0, "sa0", 160),
		appliance.ShardStatus{ID: 1, State: appliance.ShardStarting, SeqValid: true, SessionID: "fresh1", Seq: 1, ResumeURL: "ws://10.0.0.9:9000/resume"},
		appliance.ShardStatus{ID: 2, State: appliance.ShardStarting, SeqValid: true, SessionID: "sa2", Seq: 102, ResumeURL: "ws://10.0.0.9:9000/resume"})
	if v := h.c.Gateway(); v.SessionGaps != 1 || v.Handoffs != 1 {
		t.Fatalf("gaps %d (want 1), hand-offs %d (want 1: shard 2)", v.SessionGaps, v.Handoffs)
	}
	if err := h.c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := h.st.ShardSessions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[uint32]string{}
	for _, r := range rows {
		seen[r.ShardID] = r.NodeID + "/" + r.SessionID + "/" + itoa(r.Seq)
	}
	if seen[0] != "b/sa0/160" || seen[1] != "b/fresh1/1" || seen[2] != "b/sa2/102" {
		t.Fatalf("stored sessions %v", seen)
	}
	// b crashes in turn: c gets b's sessions.
	h.clock.Advance(31 * time.Second)
	h.c.Tick()
	ra = h.checkin("a", 4, 0) // a is live again: it is granted b's shards
	offered := resumeOf(ra)
	if offered[0].Seq != 160 || offered[1].SessionID != "fresh1" || offered[2].SessionID != "sa2" || len(offered) != 3 {
		t.Fatalf("after b's crash: %+v", offered)
	}
	// Events name node and shard, never a session ID.
	for _, kind := range []string{EventCrashHandoff, EventSessionGap} {
		evs, err := h.c.Events(ctx, 0, kind, 100)
		if err != nil || len(evs) == 0 {
			t.Fatalf("%s events: %v %v", kind, evs, err)
		}
		for _, e := range evs {
			if strings.Contains(e.Detail, "sa0") || strings.Contains(e.Detail, "fresh1") || strings.Contains(e.Detail, "sa1") {
				t.Fatalf("event %+v names a session", e)
			}
		}
	}
}

// TestCrashResumeDisabled is the mutation the test above must catch: with
// crash resume off, a lapsed lease hands nothing over.
func TestCrashResumeDisabled(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 2, Lease: 30 * time.Second})
	h.add("a", "b")
	ra := h.checkin("a", 2, 0)
	h.checkinWith("a", 2, ra.Generation, running(0, "sa0", 10), running(1, "sa1", 11))
	h.c.DisableCrashResume()
	h.clock.Advance(31 * time.Second)
	h.c.Tick()
	if rb := h.checkin("b", 2, 0); len(rb.Resume) != 0 {
		t.Fatalf("hand-offs with crash resume off: %+v", rb.Resume)
	}
}

func itoa(v uint32) string {
	b := []byte{}
	for {
		b = append([]byte{byte('0' + v%10)}, b...)
		if v /= 10; v == 0 {
			return string(b)
		}
	}
}

// TestPublishShardsKeepsMovingShards: a node may publish for the shards
// of its range and for those it still holds outside it, until it
// acknowledges the generation that moved them; a node whose lease lapsed
// may publish for none.
func TestPublishShardsKeepsMovingShards(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 4, Lease: 30 * time.Second})
	gen := drainSetup(t, h) // a holds 0..3 and drains; b's range is 0..3, pending
	check := func(id string, want []uint32, wantOK bool) {
		t.Helper()
		got, ok := h.c.PublishShards(id)
		if ok != wantOK || len(got) != len(want) {
			t.Fatalf("%s may publish %v (%v), want %v (%v)", id, got, ok, want, wantOK)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%s may publish %v, want %v", id, got, want)
			}
		}
	}
	check("a", span(0, 4), true) // not released yet: it still runs them
	check("b", span(0, 4), true)
	h.checkinWith("a", 4, gen, released(0, "s0", 1))
	check("a", nil, true) // released: nothing
	h.clock.Advance(31 * time.Second)
	h.c.Tick()
	check("a", nil, false)
	check("c", nil, false) // never checked in
	// A range and held shards on both sides of it.
	h2 := newHarness(t, Config{TotalShards: 6, Lease: 30 * time.Second})
	h2.add("x")
	h2.checkin("x", 6, 0)
	h2.c.mu.Lock()
	x := h2.c.nodes["x"]
	x.plan = Range{Start: 2, Count: 2}
	h2.c.mu.Unlock()
	got, _ := h2.c.PublishShards("x")
	if len(got) != 6 || got[0] != 0 || got[5] != 5 {
		t.Fatalf("x: %v, want 0..5", got)
	}
}

// TestPlanChangesSignalled: a rebalance that changes the plan signals
// PlanChanges (dpxe serve's NATS authorizer sweeps at once), a steady
// check-in does not, and changes coalesce into one pending signal.
func TestPlanChangesSignalled(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 16})
	h.add("a", "b")
	signalled := func() bool {
		select {
		case <-h.c.PlanChanges():
			return true
		default:
			return false
		}
	}
	signalled() // whatever loading did
	h.checkin("a", 16, 0)
	if !signalled() {
		t.Fatal("a's first check-in made generation 1 without a signal")
	}
	h.clock.Advance(10 * time.Second)
	h.checkin("a", 16, 1)
	if signalled() {
		t.Fatal("a steady check-in signalled a plan change")
	}
	h.checkin("b", 4, 0)
	if err := h.c.SetDraining(context.Background(), "b", true); err != nil {
		t.Fatal(err)
	}
	if !signalled() || signalled() {
		t.Fatal("two plan changes: want one pending signal")
	}
}
