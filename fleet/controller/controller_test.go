package controller

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// fakeClock is a manually advanced clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (f *fakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.t
}

func (f *fakeClock) Advance(d time.Duration) {
	f.mu.Lock()
	f.t = f.t.Add(d)
	f.mu.Unlock()
}

// harness is a controller on a real store (a SQLite file, or PostgreSQL
// with DPXE_TEST_STORE=postgres) with a fake clock.
type harness struct {
	t     *testing.T
	path  string
	clock *fakeClock
	cfg   Config
	st    *store.Store
	c     *Controller
	creds map[string]string
}

func newHarness(t *testing.T, cfg Config) *harness {
	t.Helper()
	if cfg.RebalanceEvery == 0 {
		cfg.RebalanceEvery = -1
	}
	h := &harness{t: t, path: newStorePath(t), clock: newFakeClock(), cfg: cfg, creds: map[string]string{}}
	h.open()
	t.Cleanup(func() { h.st.Close() })
	return h
}

func (h *harness) open() {
	h.t.Helper()
	st, err := store.Open(context.Background(), h.path)
	if err != nil {
		h.t.Fatal(err)
	}
	// The database's clock is the fake clock too: grant times written
	// before a restart are read back after it on the same clock.
	st.SetDBClock(h.clock.Now)
	c, err := New(context.Background(), st, h.cfg, h.clock.Now, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	h.st, h.c = st, c
}

// restart drops the controller without flushing its batched writes, as a
// crash would, and opens a new one on the same file.
func (h *harness) restart() {
	h.t.Helper()
	h.st.Close()
	h.open()
}

func (h *harness) add(ids ...string) {
	h.t.Helper()
	for _, id := range ids {
		cred, err := h.c.AddNode(context.Background(), id)
		if err != nil {
			h.t.Fatal(err)
		}
		if err := appliance.ValidateCredential(cred); err != nil {
			h.t.Fatalf("credential %v", err)
		}
		h.creds[id] = cred
	}
}

func (h *harness) checkin(id string, capacity int, gen uint64) appliance.CheckinResponse {
	h.t.Helper()
	resp, err := h.c.Checkin(context.Background(), &appliance.CheckinRequest{NodeID: id, Capacity: capacity, Generation: gen}, "127.0.0.1")
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

func span(a, b uint32) []uint32 {
	out := []uint32{}
	for s := a; s < b; s++ {
		out = append(out, s)
	}
	return out
}

func TestCheckinAssignsAndGenerationIsStable(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 16})
	h.add("a", "b")
	r := h.checkin("a", 16, 0)
	if r.Generation != 1 || !reflect.DeepEqual(r.Assigned, span(0, 16)) || len(r.Pending) != 0 || r.RangeStart != 0 || r.RangeCount != 16 {
		t.Fatalf("first check-in: %+v", r)
	}
	if r.LeaseSeconds != 30 || r.MaxConcurrency != 1 || r.TotalShards != 16 {
		t.Fatalf("constants: %+v", r)
	}
	for i := 0; i < 3; i++ {
		h.clock.Advance(10 * time.Second)
		if r2 := h.checkin("a", 16, r.Generation); r2.Generation != r.Generation || r2.NextCheckinMS != 10000 {
			t.Fatalf("steady check-in changed generation or pacing: %+v", r2)
		}
	}
	// b joins (16×16/20=12, 16×4/20=3, remainder to a): a new generation.
	rb := h.checkin("b", 4, 0)
	if rb.Generation != 2 || !reflect.DeepEqual(rb.Assigned, span(13, 16)) {
		t.Fatalf("b joins: %+v", rb)
	}
	// Draining b moves its shards back: another generation. Draining it
	// again, or the same capacity again, changes nothing.
	if err := h.c.SetDraining(context.Background(), "b", true); err != nil {
		t.Fatal(err)
	}
	gen := h.c.Plan().Generation
	if gen != 3 {
		t.Fatalf("drain: generation %d", gen)
	}
	h.checkin("b", 4, gen)
	if err := h.c.SetDraining(context.Background(), "b", true); err != nil {
		t.Fatal(err)
	}
	if g := h.c.Plan().Generation; g != gen {
		t.Fatalf("no-op drain changed generation %d -> %d", gen, g)
	}
}

func TestHandOffWaitsForRelease(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 16})
	h.add("a", "b")
	ra := h.checkin("a", 16, 0)
	rb := h.checkin("b", 16, 0)
	if rb.Generation != ra.Generation+1 || !reflect.DeepEqual(rb.Assigned, span(8, 16)) || !reflect.DeepEqual(rb.Pending, span(8, 16)) {
		t.Fatalf("b before a releases: %+v", rb)
	}
	if rb.NextCheckinMS != 1000 {
		t.Fatalf("b with pending shards should check in soon, got %d ms", rb.NextCheckinMS)
	}
	// a checks in still acting on the old generation: nothing released.
	ra2 := h.checkin("a", 16, ra.Generation)
	if !reflect.DeepEqual(ra2.Assigned, span(0, 8)) || len(ra2.Pending) != 0 {
		t.Fatalf("a at new generation: %+v", ra2)
	}
	if rb = h.checkin("b", 16, rb.Generation); len(rb.Pending) != 8 {
		t.Fatalf("b pending before a's ack: %+v", rb)
	}
	if owners := h.c.Owners(); owners[8] != "a" {
		t.Fatalf("shard 8 owner %q before release", owners[8])
	}
	// a acknowledges the new generation: 8..15 are released.
	h.checkin("a", 16, ra2.Generation)
	if rb = h.checkin("b", 16, rb.Generation); len(rb.Pending) != 0 {
		t.Fatalf("b still pending after a's ack: %+v", rb)
	}
	if owners := h.c.Owners(); owners[8] != "b" || owners[7] != "a" {
		t.Fatalf("owners after hand-off: %v", owners)
	}
}

func TestHandOffAfterLeaseExpiry(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 8, Lease: 30 * time.Second})
	h.add("a", "b")
	h.checkin("a", 8, 0)
	h.clock.Advance(time.Second)
	h.checkin("b", 8, 0) // a keeps everything; b gets half, pending
	h.c.SetDraining(context.Background(), "a", true)
	rb := h.checkin("b", 8, 0)
	if !reflect.DeepEqual(rb.Assigned, span(0, 8)) || !reflect.DeepEqual(rb.Pending, span(0, 8)) {
		t.Fatalf("b after a drains: %+v", rb)
	}
	// a goes silent. Until its lease has run out b must wait.
	h.clock.Advance(29 * time.Second)
	if rb = h.checkin("b", 8, rb.Generation); len(rb.Pending) != 8 {
		t.Fatalf("b at 30 s: %+v", rb)
	}
	h.clock.Advance(time.Second + time.Millisecond)
	if rb = h.checkin("b", 8, rb.Generation); len(rb.Pending) != 0 {
		t.Fatalf("b after a's lease: %+v", rb)
	}
	ev, err := h.c.Events(context.Background(), 0, EventLeaseExpired, 10)
	if err != nil || len(ev) != 1 || ev[0].NodeID != "a" {
		t.Fatalf("lease events %+v %v", ev, err)
	}
}

func TestRestartKeepsLeasesAndDefersRebalance(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 8, Lease: 30 * time.Second})
	h.add("a", "b", "c")
	r := h.checkin("a", 8, 0)
	h.checkin("a", 8, r.Generation)
	h.clock.Advance(20 * time.Second) // a's persisted deadline is 10 s away
	h.restart()
	// A new node joins right after the restart: no reassignment for a full lease.
	rb := h.checkin("b", 8, 0)
	if len(rb.Assigned) != 0 || rb.Generation != r.Generation {
		t.Fatalf("b got shards during restart grace: %+v", rb)
	}
	h.clock.Advance(29 * time.Second)
	h.c.Tick()
	if owners := h.c.Owners(); owners[0] != "a" {
		t.Fatalf("a lost shard 0 before its lease could have lapsed: %v", owners)
	}
	// a never comes back; once the grace and its lease are over, b takes over.
	h.clock.Advance(2 * time.Second)
	rb = h.checkin("b", 8, rb.Generation)
	if !reflect.DeepEqual(rb.Assigned, span(0, 8)) || len(rb.Pending) != 0 || rb.Generation != r.Generation+1 {
		t.Fatalf("b after grace: %+v", rb)
	}
	// A node checking in during the grace keeps its persisted assignment.
	h.restart()
	rb2 := h.checkin("b", 8, rb.Generation)
	if !reflect.DeepEqual(rb2.Assigned, rb.Assigned) || len(rb2.Pending) != 0 || rb2.Generation != rb.Generation {
		t.Fatalf("b after second restart: %+v", rb2)
	}
}

func TestRestartRemembersGrantsThatWereNotAcknowledged(t *testing.T) {
	// a is granted 0..7; b joins and gets 4..7 pending. After a crash and
	// restart b must still see them pending: a's grant was durable.
	h := newHarness(t, Config{TotalShards: 8})
	h.add("a", "b")
	h.checkin("a", 8, 0)
	rb := h.checkin("b", 8, 0)
	if len(rb.Pending) != 4 {
		t.Fatalf("b: %+v", rb)
	}
	h.restart()
	rb = h.checkin("b", 8, rb.Generation)
	if len(rb.Pending) != 4 {
		t.Fatalf("b after restart: %+v", rb)
	}
}

func TestTotalChangeRefusedWhileHeld(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 8})
	h.add("a")
	h.checkin("a", 8, 0)
	h.st.Close()
	st, _ := store.Open(context.Background(), h.path)
	defer st.Close()
	if _, err := New(context.Background(), st, Config{TotalShards: 16}, h.clock.Now, nil); !errors.Is(err, ErrTotalChanged) {
		t.Fatalf("total change: %v", err)
	}
	h.st = st // closed by cleanup
}

func TestIdentifyClaims(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 8, MaxConcurrency: 2, IdentifyWindow: 5 * time.Second, SessionBudget: 20, SessionReserve: 17})
	h.add("a", "b")
	ctx := context.Background()
	h.checkin("a", 8, 0)
	rb := h.checkin("b", 8, 0)
	if len(rb.Pending) != 4 {
		t.Fatalf("setup: %+v", rb)
	}
	id := func(node string, shard uint32) appliance.IdentifyResponse {
		t.Helper()
		r, err := h.c.Identify(ctx, appliance.IdentifyRequest{NodeID: node, ShardID: shard})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// What waits right after a start is TestIdentifyAfterStart's.
	h.clock.Advance(5 * time.Second)
	h.checkin("a", 8, 0)
	if r := id("b", 4); r.Granted || r.Reason != appliance.ReasonNotOwner {
		t.Fatalf("pending owner: %+v", r)
	}
	if r := id("a", 7); r.Granted || r.Reason != appliance.ReasonNotOwner {
		t.Fatalf("non-owner: %+v", r)
	}
	if r := id("a", 0); !r.Granted || r.Bucket != 0 {
		t.Fatalf("first grant: %+v", r)
	}
	if r := id("a", 1); !r.Granted || r.Bucket != 1 {
		t.Fatalf("other bucket: %+v", r)
	}
	h.clock.Advance(1500 * time.Millisecond)
	if r := id("a", 2); r.Granted || r.Reason != appliance.ReasonBucketBusy || r.RetryAfterMS != 3500 {
		t.Fatalf("busy bucket: %+v", r)
	}
	h.clock.Advance(3500 * time.Millisecond)
	// Budget: 20 total, reserve 17, two spent: one left above the reserve.
	if r := id("a", 2); !r.Granted {
		t.Fatalf("third grant: %+v", r)
	}
	if r := id("a", 3); r.Granted || r.Reason != appliance.ReasonBudget || r.RetryAfterMS <= 0 {
		t.Fatalf("budget: %+v", r)
	}
	if b := h.c.Budget(); b.Remaining != 17 || b.Total != 20 || b.Reserve != 17 {
		t.Fatalf("budget view %+v", b)
	}
	h.clock.Advance(24 * time.Hour)
	h.checkin("a", 8, 0) // its lease ran out meanwhile; it rejoins
	if r := id("a", 3); !r.Granted {
		t.Fatalf("after budget reset: %+v", r)
	}
	if err := h.c.SetBudget(ctx, 1000, 0, time.Hour); err != nil {
		t.Fatal(err)
	}
	h.clock.Advance(10 * time.Second)
	if r := id("a", 0); r.Reason != appliance.ReasonBudget || r.RetryAfterMS != 3590000 {
		t.Fatalf("set budget: %+v", r)
	}
	if err := h.c.SetBudget(ctx, 10, 11, 0); !errors.Is(err, ErrConfig) {
		t.Fatalf("bad budget accepted: %v", err)
	}
	g, _ := h.c.Events(ctx, 0, EventIdentifyGranted, 100)
	rf, _ := h.c.Events(ctx, 0, EventIdentifyRefused, 100)
	if len(g) != 4 || len(rf) == 0 || len(rf) > 6 {
		t.Fatalf("identify events: %d granted, %d refused", len(g), len(rf))
	}
}

func TestAuthenticateAndUnknownNodes(t *testing.T) {
	h := newHarness(t, Config{})
	h.add("a")
	ctx := context.Background()
	if err := h.c.Authenticate(ctx, "a", h.creds["a"]); err != nil {
		t.Fatal(err)
	}
	if err := h.c.Authenticate(ctx, "a", h.creds["a"]+"x"); !errors.Is(err, ErrBadCredential) {
		t.Fatalf("wrong credential: %v", err)
	}
	if err := h.c.Authenticate(ctx, "zz", "whatever-credential"); !errors.Is(err, ErrUnknownNode) {
		t.Fatalf("unknown node: %v", err)
	}
	if _, err := h.c.AddNode(ctx, "a"); !errors.Is(err, store.ErrExists) {
		t.Fatalf("duplicate add: %v", err)
	}
	if _, err := h.c.AddNode(ctx, "bad id"); err == nil {
		t.Fatal("bad ID accepted")
	}
	// A node added by another process straight into the store.
	cred, _ := NewCredential()
	hash := HashCredential(cred)
	if err := h.st.CreateNode(ctx, "late", hash[:], h.clock.Now()); err != nil {
		t.Fatal(err)
	}
	if err := h.c.Authenticate(ctx, "late", cred); err != nil {
		t.Fatalf("node added by another process: %v", err)
	}
	if _, err := h.c.Checkin(ctx, &appliance.CheckinRequest{NodeID: "nobody", Capacity: 1}, ""); !errors.Is(err, ErrUnknownNode) {
		t.Fatalf("unknown check-in: %v", err)
	}
	_, err := h.c.Checkin(ctx, &appliance.CheckinRequest{NodeID: "a", Capacity: 1,
		Shards: []appliance.ShardStatus{{ID: 99, State: appliance.ShardReady}}}, "")
	var fe *appliance.FieldError
	if !errors.As(err, &fe) || fe.Field != "shards[0].id" {
		t.Fatalf("shard beyond total: %v", err)
	}
}

func TestShardStatusAndRoute(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 4})
	h.add("a")
	ctx := context.Background()
	if _, err := h.c.Route(1 << 22); !errors.Is(err, ErrNoOwner) {
		t.Fatalf("route before any node: %v", err)
	}
	st := []appliance.ShardStatus{{ID: 1, State: appliance.ShardBackoff, Reconnects: 3, LastError: "tcp reset", CloseCode: 4000}}
	if _, err := h.c.Checkin(ctx, &appliance.CheckinRequest{NodeID: "a", Capacity: 4, BackoffShards: 1, Shards: st}, "127.0.0.9"); err != nil {
		t.Fatal(err)
	}
	v, err := h.c.Route(5 << 22) // shard 5 % 4 = 1
	if err != nil || v.ShardID != 1 || v.NodeID != "a" || v.Address != "127.0.0.9" {
		t.Fatalf("route: %+v %v", v, err)
	}
	d, err := h.c.Node(ctx, "a")
	if err != nil || !reflect.DeepEqual(d.Shards, st) || d.BackoffShards != 1 {
		t.Fatalf("node detail %+v %v", d, err)
	}
	h.c.Flush(ctx)
	h.restart()
	d, err = h.c.Node(ctx, "a")
	if err != nil || !reflect.DeepEqual(d.Shards, st) {
		t.Fatalf("node detail after restart %+v %v", d, err)
	}
}

func TestConfigBounds(t *testing.T) {
	for _, c := range []Config{
		{TotalShards: appliance.MaxTotalShards + 1},
		{MaxConcurrency: MaxMaxConcurrency + 1},
		{Lease: time.Millisecond},
		{SessionBudget: 5, SessionReserve: 5},
	} {
		if err := c.fill(); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v accepted: %v", c, err)
		}
	}
}

func TestRotateCredentialAndLiveHook(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 4})
	h.add("a")
	ctx := context.Background()
	var live []string
	h.c.OnNodeLive(func(id, addr string) { live = append(live, id+"@"+addr) })
	cred, err := h.c.RotateCredential(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.c.Authenticate(ctx, "a", h.creds["a"]); !errors.Is(err, ErrBadCredential) {
		t.Fatalf("old credential after rotation: %v", err)
	}
	if err := h.c.Authenticate(ctx, "a", cred); err != nil {
		t.Fatalf("new credential: %v", err)
	}
	if _, err := h.c.RotateCredential(ctx, "nobody"); !errors.Is(err, ErrUnknownNode) {
		t.Fatalf("rotate unknown: %v", err)
	}
	h.checkin("a", 4, 0)
	h.checkin("a", 4, 1)
	h.clock.Advance(31 * time.Second)
	h.c.Tick()
	h.checkin("a", 4, 1)
	if !reflect.DeepEqual(live, []string{"a@127.0.0.1", "a@127.0.0.1"}) {
		t.Fatalf("live hook calls %v", live)
	}
	// The rotated credential survives a restart.
	h.restart()
	if err := h.c.Authenticate(ctx, "a", cred); err != nil {
		t.Fatalf("rotated credential after restart: %v", err)
	}
}

// TestGrantNotAnsweredUntilDurable injects a write failure with a SQLite
// trigger: a check-in whose grant cannot be committed fails, and so does
// its retry, until the store accepts the write again.
func TestGrantNotAnsweredUntilDurable(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 8})
	h.add("a", "b")
	ctx := context.Background()
	r := h.checkin("a", 8, 0)
	rb := h.checkin("b", 8, 0)
	h.checkin("a", 8, rb.Generation) // a releases 4..7
	_ = r
	restore := h.failNodeUpdates()
	for i := 0; i < 2; i++ {
		if resp, err := h.c.Checkin(ctx, &appliance.CheckinRequest{NodeID: "b", Capacity: 8, Generation: rb.Generation}, ""); err == nil {
			t.Fatalf("attempt %d: answered %+v although the grant is not durable", i, resp)
		}
	}
	restore()
	if rb = h.checkin("b", 8, rb.Generation); len(rb.Pending) != 0 || len(rb.Assigned) != 4 {
		t.Fatalf("after recovery: %+v", rb)
	}
	h.restart()
	if owners := h.c.Owners(); owners[4] != "b" {
		t.Fatalf("grant not persisted: %v", owners)
	}
}

func TestTotalChangeAllowedWhenNothingHeld(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 8})
	h.add("a")
	h.checkin("a", 8, 0)
	h.clock.Advance(time.Minute)
	h.c.Tick() // a expires and releases everything
	if err := h.c.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	h.cfg.TotalShards = 16
	h.restart()
	r := h.checkin("a", 8, 0)
	if r.TotalShards != 16 || r.RangeCount != 8 || r.Generation < 2 {
		t.Fatalf("after total change: %+v", r)
	}
}

// TestCheckinCarriesControllerTime: every answer carries the controller's
// clock as Unix milliseconds (time_ms), the kernel's trusted time after a
// pinned check-in, and the field is in the JSON even when zero.
func TestCheckinCarriesControllerTime(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 4})
	h.add("a")
	r := h.checkin("a", 4, 0)
	if want := uint64(h.clock.Now().UnixMilli()); r.TimeMS != want {
		t.Fatalf("time_ms %d, want the controller clock %d", r.TimeMS, want)
	}
	h.clock.Advance(1500 * time.Millisecond)
	if r2 := h.checkin("a", 4, r.Generation); r2.TimeMS != r.TimeMS+1500 {
		t.Fatalf("time_ms %d after 1.5 s, want %d", r2.TimeMS, r.TimeMS+1500)
	}
	b, err := json.Marshal(appliance.CheckinResponse{})
	if err != nil || !strings.Contains(string(b), `"time_ms":0`) {
		t.Fatalf("time_ms must always be sent: %s %v", b, err)
	}
}
