package controller

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
)

// checkinWith is harness.checkin with per-shard statuses.
func (h *harness) checkinWith(id string, capacity int, gen uint64, shards ...appliance.ShardStatus) appliance.CheckinResponse {
	h.t.Helper()
	resp, err := h.c.Checkin(context.Background(), &appliance.CheckinRequest{NodeID: id, Capacity: capacity, Generation: gen, Shards: shards}, "127.0.0.1")
	if err != nil {
		h.t.Fatalf("checkin %s: %v", id, err)
	}
	if err := h.c.CheckInvariants(); err != nil {
		h.t.Fatal(err)
	}
	if err := resp.Validate(); err != nil {
		h.t.Fatalf("checkin %s: answer %+v: %v", id, resp, err)
	}
	return resp
}

// released is the final status a node reports for a shard it stopped
// resumably because it left its assignment.
func released(id uint32, session string, seq uint32) appliance.ShardStatus {
	return appliance.ShardStatus{ID: id, State: appliance.ShardAssigned, SeqValid: true, CloseCode: 4200,
		SessionID: session, Seq: seq, ResumeURL: "ws://10.0.0.9:9000/resume"}
}

func resumeOf(r appliance.CheckinResponse) map[uint32]appliance.ResumeState {
	m := map[uint32]appliance.ResumeState{}
	for _, rs := range r.Resume {
		m[rs.ShardID] = rs
	}
	return m
}

// drainSetup: a holds 0..3 at generation 1, then drains; b joins and gets
// 0..3 pending. It returns the drain generation.
func drainSetup(t *testing.T, h *harness) uint64 {
	t.Helper()
	h.add("a", "b", "c")
	ra := h.checkin("a", 4, 0)
	if len(ra.Pending) != 0 || len(ra.Resume) != 0 {
		t.Fatalf("a first: %+v", ra)
	}
	if err := h.c.SetDraining(context.Background(), "a", true); err != nil {
		t.Fatal(err)
	}
	rb := h.checkin("b", 4, 0)
	if !reflect.DeepEqual(rb.Pending, span(0, 4)) || len(rb.Resume) != 0 {
		t.Fatalf("b before a releases: %+v", rb)
	}
	return rb.Generation
}

func TestResumeHandoffOnDrain(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 4})
	gen := drainSetup(t, h)
	// a applied the drain generation: it closed 0..3 with 4200 and
	// reports three sessions (shard 3's sequence is not valid).
	st3 := released(3, "s3", 9)
	st3.SeqValid = false
	h.checkinWith("a", 4, gen, released(0, "s0", 100), released(1, "s1", 101), released(2, "s2", 102), st3)
	rb := h.checkin("b", 4, gen)
	if len(rb.Pending) != 0 {
		t.Fatalf("b still pending: %+v", rb)
	}
	got := resumeOf(rb)
	want := map[uint32]appliance.ResumeState{
		0: {ShardID: 0, SessionID: "s0", Seq: 100, ResumeURL: "ws://10.0.0.9:9000/resume?v=10&encoding=json"},
		1: {ShardID: 1, SessionID: "s1", Seq: 101, ResumeURL: "ws://10.0.0.9:9000/resume?v=10&encoding=json"},
		2: {ShardID: 2, SessionID: "s2", Seq: 102, ResumeURL: "ws://10.0.0.9:9000/resume?v=10&encoding=json"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("b's hand-offs %+v, want %+v", got, want)
	}
	// Repeated while b has not shown it no longer needs them; a, which
	// released them, never gets them back.
	if ra := h.checkin("a", 4, gen); len(ra.Resume) != 0 || len(ra.Assigned) != 0 {
		t.Fatalf("a after release: %+v", ra)
	}
	h.clock.Advance(time.Second)
	rb = h.checkinWith("b", 4, gen,
		appliance.ShardStatus{ID: 0, State: appliance.ShardReady, SeqValid: true, SessionID: "s0", Seq: 140, ResumeURL: "ws://10.0.0.9:9000/resume"}, // resumed
		appliance.ShardStatus{ID: 1, State: appliance.ShardStarting, SessionID: "s1", Seq: 101, ResumeURL: "ws://10.0.0.9:9000/resume"},              // resuming
		appliance.ShardStatus{ID: 2, State: appliance.ShardStarting, SessionID: "fresh", ResumeURL: "ws://10.0.0.9:9000/resume"},                     // identified instead
		appliance.ShardStatus{ID: 3, State: appliance.ShardStarting})
	if got := resumeOf(rb); len(got) != 1 || got[1].SessionID != "s1" {
		t.Fatalf("after b's progress: %+v", rb.Resume)
	}
	if v := h.c.Gateway(); v.Handoffs != 1 {
		t.Fatalf("hand-offs on offer: %d", v.Handoffs)
	}
	// A check-in without statuses keeps it; READY clears it.
	if rb = h.checkin("b", 4, gen); len(rb.Resume) != 1 {
		t.Fatalf("no statuses: %+v", rb.Resume)
	}
	rb = h.checkinWith("b", 4, gen, appliance.ShardStatus{ID: 1, State: appliance.ShardReady})
	if len(rb.Resume) != 0 || h.c.Gateway().Handoffs != 0 {
		t.Fatalf("after READY: %+v", rb.Resume)
	}
	// The record events name shard and node, never the session.
	evs, err := h.c.Events(context.Background(), 0, EventResumeHandoff, 100)
	if err != nil || len(evs) != 3 {
		t.Fatalf("hand-off events %v %v", evs, err)
	}
	for _, e := range evs {
		if e.NodeID != "a" || strings.Contains(e.Detail, "s0") {
			t.Fatalf("event %+v", e)
		}
	}
}

func TestResumeHandoffOnlyAtRelease(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 4})
	gen := drainSetup(t, h)
	// a reports sessions while still acting on the old generation: it
	// still runs 0..3, nothing is released or recorded.
	h.checkinWith("a", 4, gen-1, released(0, "early", 5))
	if rb := h.checkin("b", 4, gen); len(rb.Resume) != 0 || len(rb.Pending) != 4 {
		t.Fatalf("recorded before release: %+v", rb)
	}
	// Running shards in range with sessions are never recorded either.
	h2 := newHarness(t, Config{TotalShards: 4})
	h2.add("x")
	r := h2.checkin("x", 4, 0)
	h2.checkinWith("x", 4, r.Generation, released(0, "live", 5))
	if v := h2.c.Gateway(); v.Handoffs != 0 {
		t.Fatalf("in-range session recorded")
	}
	// The release check-in without a session for shard 0 (the node had
	// none to keep) hands nothing over: b Identifies.
	h.checkinWith("a", 4, gen, appliance.ShardStatus{ID: 0, State: appliance.ShardAssigned, SeqValid: true})
	if rb := h.checkin("b", 4, gen); len(rb.Resume) != 0 || len(rb.Pending) != 0 {
		t.Fatalf("b: %+v", rb)
	}
}

// A node may report its released sessions once, in a check-in that still
// acknowledges an older generation (the answer's generation moved on):
// the record waits for the release, and the release check-in, which no
// longer carries the statuses, keeps it.
func TestResumeHandoffReportedBeforeRelease(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 4})
	gen := drainSetup(t, h)
	// a reports gen-1 with shard 0 stopped and shard 1 still running.
	h.checkinWith("a", 4, gen-1, released(0, "s0", 5), appliance.ShardStatus{ID: 1, State: appliance.ShardReady, SessionID: "s1", SeqValid: true, Seq: 9, ResumeURL: "ws://h/"})
	if rb := h.checkin("b", 4, gen); len(rb.Resume) != 0 || len(rb.Pending) != 4 {
		t.Fatalf("offered before the release: %+v", rb)
	}
	if v := h.c.Gateway(); v.Handoffs != 1 {
		t.Fatalf("a running shard's session recorded: %d", v.Handoffs)
	}
	h.checkin("a", 4, gen) // the release, without statuses
	rb := h.checkin("b", 4, gen)
	if got := resumeOf(rb); len(got) != 1 || got[0].SessionID != "s0" || got[0].Seq != 5 {
		t.Fatalf("b: %+v", rb.Resume)
	}
}

func TestResumeHandoffTTL(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 4, ResumeTTL: 30 * time.Second})
	gen := drainSetup(t, h)
	h.checkinWith("a", 4, gen, released(0, "s0", 1), released(1, "s1", 2))
	h.clock.Advance(30 * time.Second)
	if rb := h.checkin("b", 4, gen); len(rb.Resume) != 2 {
		t.Fatalf("at the TTL: %+v", rb.Resume)
	}
	h.clock.Advance(time.Millisecond)
	if rb := h.checkin("b", 4, gen); len(rb.Resume) != 0 {
		t.Fatalf("after the TTL: %+v", rb.Resume)
	}
	// Records for shards nobody was granted are pruned by Tick.
	h3 := newHarness(t, Config{TotalShards: 4, ResumeTTL: 30 * time.Second})
	h3.add("a")
	r := h3.checkin("a", 4, 0)
	h3.c.SetDraining(context.Background(), "a", true)
	h3.checkinWith("a", 4, r.Generation+1, released(2, "s2", 3))
	if h3.c.Gateway().Handoffs != 1 {
		t.Fatal("not recorded")
	}
	h3.clock.Advance(31 * time.Second)
	h3.c.Tick()
	if h3.c.Gateway().Handoffs != 0 {
		t.Fatal("not pruned")
	}
}

// A hand-off goes to whoever is granted the shard next, once: when that
// node releases it in turn, its own last word replaces the record.
func TestResumeHandoffChain(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 4})
	gen := drainSetup(t, h)
	h.checkinWith("a", 4, gen, released(0, "s0", 10))
	if rb := h.checkin("b", 4, gen); len(rb.Resume) != 1 {
		t.Fatalf("b: %+v", rb)
	}
	// b is drained before it used the session; c is the next owner.
	if err := h.c.SetDraining(context.Background(), "b", true); err != nil {
		t.Fatal(err)
	}
	rc := h.checkin("c", 4, 0)
	if len(rc.Resume) != 0 || len(rc.Pending) != 4 {
		t.Fatalf("c while b holds: %+v", rc)
	}
	gen2 := rc.Generation
	// b resumed shard 0 meanwhile and reports its own final session.
	h.checkinWith("b", 4, gen2, released(0, "s0", 55))
	rc = h.checkin("c", 4, gen2)
	if got := resumeOf(rc); len(got) != 1 || got[0].Seq != 55 {
		t.Fatalf("c: %+v", rc.Resume)
	}
	if rb := h.checkin("b", 4, gen2); len(rb.Resume) != 0 {
		t.Fatalf("b after release: %+v", rb.Resume)
	}
}

func TestResumeHandoffDroppedOnExpiry(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 4, Lease: 30 * time.Second, ResumeTTL: 5 * time.Minute})
	gen := drainSetup(t, h)
	h.checkinWith("a", 4, gen, released(0, "s0", 10))
	if rb := h.checkin("b", 4, gen); len(rb.Resume) != 1 {
		t.Fatalf("b: %+v", rb)
	}
	// b goes silent (it may have resumed and advanced the session); its
	// lease lapses and c takes over without the stale session.
	h.clock.Advance(20 * time.Second)
	h.checkin("c", 4, 0)
	h.clock.Advance(11 * time.Second)
	h.c.Tick()
	rc := h.checkin("c", 4, h.c.Plan().Generation)
	if len(rc.Pending) != 0 || len(rc.Assigned) != 4 || len(rc.Resume) != 0 {
		t.Fatalf("c after b expired: %+v", rc)
	}
}

func TestGatewaySettingsInCheckin(t *testing.T) {
	var logs bytes.Buffer
	h := newHarness(t, Config{TotalShards: 2})
	h.c.log = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h.add("a")
	if r := h.checkin("a", 2, 0); r.GatewayURL != "" || r.BotToken != "" || r.Intents != 0 {
		t.Fatalf("no settings yet: %+v", r)
	}
	const tok = "MTIzNDU2Nzg5.abc-DEF_ghi.secret-token-value"
	if err := h.c.SetGateway(GatewaySettings{URL: "ws://127.0.0.1:9000", Token: tok}); err != nil {
		t.Fatal(err)
	}
	r := h.checkin("a", 2, 1)
	if r.GatewayURL != "ws://127.0.0.1:9000/?v=10&encoding=json" || r.BotToken != tok || r.Intents != DefaultIntents {
		t.Fatalf("settings: %+v", r)
	}
	for _, bad := range []GatewaySettings{{URL: "WSS://gateway.discord.gg"}, {URL: "http://x"}, {Token: "a b"}, {Token: `a"b`}, {Token: strings.Repeat("t", 257)}} {
		err := h.c.SetGateway(bad)
		if !errors.Is(err, ErrConfig) {
			t.Errorf("SetGateway(%+v) = %v", bad, err)
		}
		if err != nil && bad.Token != "" && strings.Contains(err.Error(), bad.Token) {
			t.Errorf("error repeats the token: %v", err)
		}
	}
	// wss:// is handed out as it is: the kernel speaks TLS 1.3.
	if err := h.c.SetGateway(GatewaySettings{URL: "wss://gateway.discord.gg", Token: tok}); err != nil {
		t.Fatalf("SetGateway(wss://): %v", err)
	}
	if r := h.checkin("a", 2, 1); r.GatewayURL != "wss://gateway.discord.gg/?v=10&encoding=json" {
		t.Fatalf("wss settings: %+v", r)
	}
	if err := h.c.SetGateway(GatewaySettings{URL: "ws://127.0.0.1:9000", Token: tok}); err != nil {
		t.Fatal(err)
	}
	v := h.c.Gateway()
	if !v.TokenSet || v.URLSource != "operator" {
		t.Fatalf("view %+v", v)
	}
	h.c.log.Info("gateway", "state", h.c.gw.token, "view", v)
	if strings.Contains(logs.String(), tok) {
		t.Fatalf("token in logs:\n%s", logs.String())
	}
}

func gatewayBot(url string, shards, total, remaining, mc int, resetMS int64) GatewayBot {
	var g GatewayBot
	g.URL, g.Shards = url, shards
	g.SessionStartLimit.Total, g.SessionStartLimit.Remaining = total, remaining
	g.SessionStartLimit.ResetAfter, g.SessionStartLimit.MaxConcurrency = resetMS, mc
	return g
}

func TestApplyGatewayBot(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, Config{TotalShards: 8, IdentifyWindow: 5 * time.Second})
	if err := h.c.SetGateway(GatewaySettings{Token: "tok"}); err != nil {
		t.Fatal(err)
	}
	h.add("a")
	r := h.checkin("a", 8, 0)
	if r.GatewayURL != "" || r.BotToken != "tok" {
		t.Fatalf("before the first fetch: %+v", r)
	}
	// A fresh store: shard 0 may start at once (max_concurrency 1).
	if g, err := h.c.Identify(ctx, appliance.IdentifyRequest{NodeID: "a", ShardID: 0}); err != nil || !g.Granted {
		t.Fatalf("first identify: %+v %v", g, err)
	}
	if err := h.c.ApplyGatewayBot(ctx, gatewayBot("ws://127.0.0.1:9000", 8, 1000, 990, 2, 3_600_000)); err != nil {
		t.Fatal(err)
	}
	r = h.checkin("a", 8, r.Generation)
	if r.GatewayURL != "ws://127.0.0.1:9000/?v=10&encoding=json" || r.MaxConcurrency != 2 {
		t.Fatalf("after the fetch: %+v", r)
	}
	b := h.c.Budget()
	if b.Total != 1000 || b.Remaining != 990 || !b.ResetAt.Equal(h.clock.Now().Add(time.Hour)) {
		t.Fatalf("budget %+v", b)
	}
	// A new bucket count: no bucket grants within a window of the last
	// grant under the old one (shard 0's, in bucket 0 of 1).
	if g, err := h.c.Identify(ctx, appliance.IdentifyRequest{NodeID: "a", ShardID: 1}); err != nil || g.Granted || g.Bucket != 1 ||
		g.Reason != appliance.ReasonBucketBusy || g.RetryAfterMS != 5000 {
		t.Fatalf("identify right after the change: %+v %v", g, err)
	}
	h.clock.Advance(5 * time.Second)
	if g, err := h.c.Identify(ctx, appliance.IdentifyRequest{NodeID: "a", ShardID: 1}); err != nil || !g.Granted {
		t.Fatalf("identify a window later: %+v %v", g, err)
	}
	if h.c.Budget().Remaining != 989 {
		t.Fatal("grant did not take from Discord's budget")
	}
	// A URL nodes cannot dial (upper-case scheme) is not handed out; the
	// rest is used.
	if err := h.c.ApplyGatewayBot(ctx, gatewayBot("WSS://gateway.discord.gg", 8, 1000, 985, 2, 3_600_000)); err != nil {
		t.Fatal(err)
	}
	if v := h.c.Gateway(); v.URL != "ws://127.0.0.1:9000/?v=10&encoding=json" || !strings.Contains(v.LastError, "wss://") || h.c.Budget().Remaining != 985 {
		t.Fatalf("after a WSS answer: %+v", v)
	}
	// Bad answers change nothing and are recorded.
	for _, g := range []GatewayBot{
		gatewayBot("ws://h", 0, 1000, 990, 2, 0),
		gatewayBot("ws://h", 8, 1000, 1001, 2, 0),
		gatewayBot("ws://h", 8, 1000, 990, 0, 0),
		gatewayBot("ws://h", 8, 1000, 990, 2, -1),
	} {
		if err := h.c.ApplyGatewayBot(ctx, g); err == nil {
			t.Errorf("accepted %+v", g)
		}
	}
	v := h.c.Gateway()
	if v.Failures != 4 || v.LastError == "" || v.URL != "ws://127.0.0.1:9000/?v=10&encoding=json" || v.MaxConcurrency != 2 || v.URLSource != "gateway_bot" {
		t.Fatalf("view after bad answers: %+v", v)
	}
	// A different recommended shard count is reported, not applied.
	if err := h.c.ApplyGatewayBot(ctx, gatewayBot("ws://127.0.0.1:9000", 16, 1000, 980, 2, 3_600_000)); err != nil {
		t.Fatal(err)
	}
	if p := h.c.Plan(); p.TotalShards != 8 {
		t.Fatalf("total changed to %d", p.TotalShards)
	}
	evs, _ := h.c.Events(ctx, 0, EventGatewayShards, 10)
	if len(evs) != 1 || !strings.Contains(evs[0].Detail, "16") {
		t.Fatalf("shard events %+v", evs)
	}
	if v := h.c.Gateway(); v.Failures != 0 || v.DiscordShards != 16 {
		t.Fatalf("view %+v", v)
	}
}

func TestApplyGatewayBotOperatorLimits(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, Config{TotalShards: 8, MaxConcurrency: 4})
	if err := h.c.SetGateway(GatewaySettings{URL: "ws://fixed:1/", MaxConcurrencyFixed: true}); err != nil {
		t.Fatal(err)
	}
	// Discord allows 16: the operator's 4 stays. Discord allows 2: 2.
	if err := h.c.ApplyGatewayBot(ctx, gatewayBot("ws://other:2", 8, 1000, 1000, 16, 0)); err != nil {
		t.Fatal(err)
	}
	if v := h.c.Gateway(); v.MaxConcurrency != 4 || v.URL != "ws://fixed:1/?v=10&encoding=json" {
		t.Fatalf("view %+v", v)
	}
	if err := h.c.ApplyGatewayBot(ctx, gatewayBot("ws://other:2", 8, 1000, 1000, 2, 0)); err != nil {
		t.Fatal(err)
	}
	if v := h.c.Config().MaxConcurrency; v != 2 {
		t.Fatalf("max_concurrency %d", v)
	}
}

// Two new owners: each receives the sessions of its own shards only.
func TestResumeHandoffOnlyNewOwner(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 4})
	h.add("a", "b", "c")
	ra := h.checkin("a", 4, 0)
	h.checkin("b", 4, 0)
	h.checkin("c", 4, 0)
	if err := h.c.SetDraining(context.Background(), "a", true); err != nil {
		t.Fatal(err)
	}
	gen := h.c.Plan().Generation
	if gen == ra.Generation {
		t.Fatal("no new generation")
	}
	h.checkinWith("a", 4, gen, released(0, "s0", 1), released(1, "s1", 2), released(2, "s2", 3), released(3, "s3", 4))
	rb := h.checkin("b", 4, gen)
	rc := h.checkin("c", 4, gen)
	for _, r := range []appliance.CheckinResponse{rb, rc} {
		if len(r.Pending) != 0 || len(r.Resume) != len(r.Assigned) {
			t.Fatalf("%+v", r)
		}
		for i, rs := range r.Resume {
			if rs.ShardID != r.Assigned[i] || rs.SessionID != "s"+string(rune('0'+rs.ShardID)) {
				t.Fatalf("hand-off %+v outside %v", rs, r.Assigned)
			}
		}
	}
}
