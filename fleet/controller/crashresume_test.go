package controller

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/store"
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

// TestOwnResumeRefusedCountsGap: a session a node reported for a shard it
// still holds under the same grant, and then stopped running without a
// Resume (Discord refused it: op 9, 4007, 4009), is counted as a gap once,
// whether the controller learns it from the node's Identify claim or from
// a check-in that shows the shard without that session; the ended record
// is dropped durably, so a controller restart does not count it again. A
// first Identify, an Identify after a hand-off (counted as the hand-off's
// gap) and an Identify the operator asked for (restart of a FATAL shard)
// are not counted.
func TestOwnResumeRefusedCountsGap(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, Config{TotalShards: 4, Lease: 30 * time.Second, ResumeTTL: time.Minute, IdentifyWindow: time.Second})
	h.add("a", "b")
	gen := h.checkin("a", 4, 0).Generation
	before := 0 // gaps counted by an earlier controller run (events stay)
	gaps := func(want int, what string) {
		t.Helper()
		if got := h.c.Gateway().SessionGaps + before; got != want {
			t.Fatalf("%s: session_gaps %d, want %d", what, got, want)
		}
		if got := len(h.events(EventSessionGap)); got != want {
			t.Fatalf("%s: %d session_gap events, want %d", what, got, want)
		}
	}
	lastGap := func() store.Event {
		t.Helper()
		evs := h.events(EventSessionGap)
		return evs[len(evs)-1]
	}
	claim := func(node string, s uint32) {
		t.Helper()
		h.claim(node, s)
		h.clock.Advance(time.Second) // past the bucket's window
	}
	for s := uint32(0); s < 4; s++ {
		claim("a", s) // first Identifies: no session ended
	}
	gaps(0, "first Identifies")
	h.checkinWith("a", 4, gen, running(0, "s0", 50), running(1, "s1", 60), running(2, "s2", 70), running(3, "s3", 80))
	gaps(0, "sessions reported")

	// Shard 0: the Resume after a drop is refused; the claim shows it.
	claim("a", 0)
	gaps(1, "claim after the session of shard 0")
	if e := lastGap(); e.NodeID != "a" || e.ShardID == nil || *e.ShardID != 0 || !strings.Contains(e.Detail, "after seq 50 ") ||
		!strings.Contains(e.Detail, "claimed an Identify") || strings.Contains(e.Detail, "s0") {
		t.Fatalf("gap event %+v", e)
	}
	claim("a", 0) // a claim again (the first was refused, or its grant unused)
	gaps(1, "second claim for shard 0")
	// The dropped record is durable: a restarted controller does not
	// count the same ending again.
	if err := h.c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	h.restart()
	before = 1
	claim("a", 0)
	gaps(1, "claim after a controller restart")
	h.checkinWith("a", 4, gen, running(0, "s0b", 5), running(1, "s1", 61), running(2, "s2", 71), running(3, "s3", 81))
	gaps(1, "shard 0's new session reported")

	// Shard 1: a check-in between the refusal and the claim shows it
	// (BACKOFF without a session, closed 4009); the claim is not a second gap.
	h.checkinWith("a", 4, gen, running(0, "s0b", 6),
		appliance.ShardStatus{ID: 1, State: appliance.ShardBackoff, CloseCode: 4009},
		running(2, "s2", 72), running(3, "s3", 82))
	gaps(2, "shard 1 reported without its session")
	if e := lastGap(); *e.ShardID != 1 || !strings.Contains(e.Detail, "after seq 61 ") || !strings.Contains(e.Detail, "close code 4009") {
		t.Fatalf("gap event %+v", e)
	}
	claim("a", 1)
	gaps(2, "claim for shard 1 after its check-in")
	// Shard 2: a report of another session, the claim not seen.
	h.checkinWith("a", 4, gen, running(0, "s0b", 7), running(1, "s1b", 3), running(2, "s2b", 1), running(3, "s3", 83))
	gaps(3, "shard 2 reported with another session")
	// Shard 3 goes FATAL (4004): no gap, and its restart asked by the
	// operator is a new session on purpose.
	fatal := appliance.ShardStatus{ID: 3, State: appliance.ShardFatal, CloseCode: 4004}
	h.checkinWith("a", 4, gen, running(0, "s0b", 8), running(1, "s1b", 4), running(2, "s2b", 2), fatal)
	gaps(3, "shard 3 FATAL")
	if _, err := h.c.RestartFatal(ctx, "a", []uint32{3}); err != nil {
		t.Fatal(err)
	}
	claim("a", 3)
	h.checkinWith("a", 4, gen, running(0, "s0b", 9), running(1, "s1b", 5), running(2, "s2b", 3), running(3, "s3b", 1))
	gaps(3, "shard 3 restarted by the operator")

	// a crashes: b takes its sessions over. b's Resume of shard 0 is
	// refused and b Identifies: one gap (the hand-off's), not two.
	h.clock.Advance(31 * time.Second)
	h.c.Tick()
	rb := h.checkin("b", 4, 0)
	if len(resumeOf(rb)) != 4 {
		t.Fatalf("b's hand-offs: %+v", rb.Resume)
	}
	claim("b", 0)
	gaps(3, "b claims shard 0 after the hand-off")
	h.checkinWith("b", 4, rb.Generation, running(0, "sb0", 1), running(1, "s1b", 5), running(2, "s2b", 3), running(3, "s3b", 1))
	gaps(4, "b runs another session of shard 0")
	if e := lastGap(); *e.ShardID != 0 || !strings.Contains(e.Detail, "hand-off from a at seq 9") {
		t.Fatalf("gap event %+v", e)
	}
	// b's own session of shard 0 then ends unresumed: counted on b.
	claim("b", 0)
	gaps(5, "b's own session of shard 0")
	if e := lastGap(); e.NodeID != "b" || *e.ShardID != 0 || !strings.Contains(e.Detail, "after seq 1 ") {
		t.Fatalf("gap event %+v", e)
	}
}
