package api

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/metrics"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// manualClock is a clock the test moves, so leases lapse without sleeping.
type manualClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *manualClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *manualClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// healthServer is the API on loopback over a real SQLite file, with a
// manual clock, a metrics token and a log the test reads.
type healthServer struct {
	*testServer
	clock   *manualClock
	metrics string // the metrics token
	logBuf  *syncBuffer
}

func newHealthServer(t *testing.T, cfg controller.Config) *healthServer {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(dir, "dpxe.db"))
	if err != nil {
		t.Fatal(err)
	}
	clock := &manualClock{t: time.Date(2026, 12, 2, 2, 0, 0, 0, time.UTC)}
	ctrl, err := controller.New(ctx, st, cfg, clock.now, nil)
	if err != nil {
		t.Fatal(err)
	}
	adminHash, _, err := LoadOrCreateAdminToken(ctx, st, filepath.Join(dir, "admin.token"), false)
	if err != nil {
		t.Fatal(err)
	}
	metricsFile := filepath.Join(dir, "metrics.token")
	metricsHash, created, err := LoadOrCreateMetricsToken(ctx, st, metricsFile, false)
	if err != nil || !created {
		t.Fatalf("metrics token: created %v, %v", created, err)
	}
	if h2, again, _ := LoadOrCreateMetricsToken(ctx, st, metricsFile, false); again || h2 != metricsHash {
		t.Fatal("second start made a new metrics token")
	}
	if metricsHash == adminHash {
		t.Fatal("metrics token equals the admin token")
	}
	admin, _ := os.ReadFile(filepath.Join(dir, "admin.token"))
	mtok, _ := os.ReadFile(metricsFile)
	buf := &syncBuffer{}
	srv := New(ctrl, adminHash, slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	srv.SetMetricsToken(metricsHash)
	srv.ready.reuse = 0 // every GET /readyz judges afresh (the clock is manual)
	mux := http.NewServeMux()
	srv.Register(mux)
	hs := httptest.NewServer(mux)
	t.Cleanup(func() { hs.Close(); st.Close() })
	return &healthServer{
		testServer: &testServer{t: t, url: hs.URL, admin: strings.TrimSpace(string(admin)), ctrl: ctrl, st: st},
		clock:      clock, metrics: strings.TrimSpace(string(mtok)), logBuf: buf,
	}
}

// simNode is a node that checks in over HTTP and reports every shard it
// may start in the state its test gives it.
type simNode struct {
	s    *healthServer
	id   string
	cred string
	gen  uint64 // generation of the last answer, acknowledged next time
	// run: the shards it may start (assigned, not pending) after the
	// last answer.
	run []uint32
	// state gives a shard's reported status; nil: READY with a 42 ms ping.
	state func(id uint32) appliance.ShardStatus
}

func (s *healthServer) node(id string) *simNode {
	return &simNode{s: s, id: id, cred: s.addNode(id)}
}

// checkin sends one check-in reporting the shards the node runs.
func (n *simNode) checkin() appliance.CheckinResponse {
	n.s.t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, `{"node_id":%q,"capacity":8,"generation":%d,"shards":[`, n.id, n.gen)
	for i, id := range n.run {
		st := appliance.ShardStatus{ID: id, State: appliance.ShardReady, PingMS: 42, PingAvgMS: 40, PingMaxMS: 50}
		if n.state != nil {
			st = n.state(id)
			st.ID = id
		}
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"id":%d,"state":%q,"ping_ms":%g,"ack_slow":%t,"heartbeat_misses":%d,"reconnects":%d,"close_code":%d}`,
			st.ID, st.State, st.PingMS, st.AckSlow, st.HeartbeatMisses, st.Reconnects, st.CloseCode)
	}
	b.WriteString("]}")
	var r appliance.CheckinResponse
	if code := n.s.call("POST", "/v1/checkin", n.cred, b.String(), &r); code != 200 {
		n.s.t.Fatalf("%s check-in: %d", n.id, code)
	}
	n.gen = r.Generation
	n.run = n.run[:0]
	pending := map[uint32]bool{}
	for _, p := range r.Pending {
		pending[p] = true
	}
	for _, a := range r.Assigned {
		if !pending[a] {
			n.run = append(n.run, a)
		}
	}
	return r
}

// verdict reads GET /v1/health with the metrics token.
func (s *healthServer) verdict() (int, metrics.Verdict) {
	s.t.Helper()
	var v metrics.Verdict
	code := s.call("GET", "/v1/health", s.metrics, "", &v)
	return code, v
}

// wantRuns checks the verdict's status and runs of unready shards.
func (s *healthServer) wantRuns(step string, want ...metrics.ShardRun) {
	s.t.Helper()
	code, v := s.verdict()
	wantCode := 200
	if len(want) > 0 {
		wantCode = 503
	}
	if code != wantCode || v.Ready != (len(want) == 0) || fmt.Sprint(v.NotReady) != fmt.Sprint(want) {
		s.t.Fatalf("%s: GET /v1/health = %d ready=%v runs %+v, want %d runs %+v", step, code, v.Ready, v.NotReady, wantCode, want)
	}
	var sum metrics.Summary
	if code := s.call("GET", "/readyz", "", "", &sum); code != wantCode || sum.Ready != v.Ready || sum.NotReadyCount != v.NotReadyCount {
		s.t.Fatalf("%s: GET /readyz = %d %+v, verdict %+v", step, code, sum, v.Summary)
	}
	var notReady uint32
	for _, r := range want {
		notReady += r.Last - r.First + 1
	}
	if v.NotReadyCount != notReady || v.ReadyShards != v.TotalShards-notReady {
		s.t.Fatalf("%s: counts %+v, want %d not ready", step, v.Summary, notReady)
	}
}

func run(first, last uint32, reason, node string) metrics.ShardRun {
	return metrics.ShardRun{First: first, Last: last, Reason: reason, Node: node}
}

// TestHealthVerdictThroughDrainAndLapse follows the verdict of GET
// /v1/health and GET /readyz through a fleet's life: no node, two nodes
// sharing the plan (hand-off), unhealthy shards of each kind, a drain, and
// a node whose lease lapses.
func TestHealthVerdictThroughDrainAndLapse(t *testing.T) {
	const lease = 30 * time.Second
	s := newHealthServer(t, controller.Config{TotalShards: 8, RebalanceEvery: -1, Lease: lease})
	n1, n2 := s.node("n1"), s.node("n2")
	s.wantRuns("no node", run(0, 7, metrics.ReasonUnowned, ""))

	n1.checkin()
	s.wantRuns("n1 holds all, reported nothing yet", run(0, 7, metrics.ReasonNotReported, "n1"))
	n1.checkin()
	s.wantRuns("n1 ready")

	n2.checkin()
	s.wantRuns("n2 joined, hand-off", run(4, 7, metrics.ReasonHandoffPending, "n2"))
	n1.checkin() // learns the new generation
	s.wantRuns("n1 still holds 4..7", run(4, 7, metrics.ReasonHandoffPending, "n2"))
	n1.checkin() // acknowledges it: releases 4..7
	n2.checkin()
	s.wantRuns("n2 holds 4..7, not reported", run(4, 7, metrics.ReasonNotReported, "n2"))
	n2.checkin()
	s.wantRuns("both ready")

	n2.state = func(id uint32) appliance.ShardStatus {
		switch id {
		case 4:
			return appliance.ShardStatus{State: appliance.ShardStarting}
		case 5:
			return appliance.ShardStatus{State: appliance.ShardReady} // no ACK yet
		case 6:
			return appliance.ShardStatus{State: appliance.ShardReady, PingMS: 900, AckSlow: true}
		case 7:
			return appliance.ShardStatus{State: appliance.ShardReady, PingMS: 6000}
		}
		return appliance.ShardStatus{State: appliance.ShardReady, PingMS: 1}
	}
	n2.checkin()
	code, v := s.verdict()
	want := []metrics.ShardRun{
		{First: 4, Last: 4, Reason: metrics.ReasonNotReady, Node: "n2", State: "STARTING"},
		{First: 5, Last: 5, Reason: metrics.ReasonNoPing, Node: "n2"},
		{First: 6, Last: 6, Reason: metrics.ReasonAckSlow, Node: "n2"},
		{First: 7, Last: 7, Reason: metrics.ReasonPingOverBound, Node: "n2", PingMaxMS: 6000},
	}
	if code != 503 || fmt.Sprint(v.NotReady) != fmt.Sprint(want) || v.PingBoundMS != 5000 {
		t.Fatalf("unhealthy shards: %d %+v", code, v)
	}
	n2.state = nil
	n2.checkin()
	s.wantRuns("healthy again")

	// Drain n1: its shards go to n2 by hand-off.
	if code := s.call("POST", "/v1/nodes/n1/drain", s.admin, "", nil); code != 200 {
		t.Fatalf("drain: %d", code)
	}
	n2.checkin()
	s.wantRuns("drain, hand-off pending", run(0, 3, metrics.ReasonHandoffPending, "n2"))
	n1.checkin() // learns the drain's generation
	n1.checkin() // acknowledges it: releases 0..3
	s.wantRuns("drain, released, n2 not told yet", run(0, 3, metrics.ReasonHandoffPending, "n2"))
	n2.checkin()
	s.wantRuns("drain, n2 holds 0..3", run(0, 3, metrics.ReasonNotReported, "n2"))
	n2.checkin()
	s.wantRuns("drained")
	if code := s.call("POST", "/v1/nodes/n1/undrain", s.admin, "", nil); code != 200 {
		t.Fatalf("undrain: %d", code)
	}
	n1.checkin() // a rebalance gives n1 0..3 back, pending
	n2.checkin() // learns the generation
	n2.checkin() // acknowledges it: releases 0..3
	n1.checkin() // holds them
	n1.checkin() // reports them
	s.wantRuns("undrained")

	// n2 stops checking in: once its lease lapses its shards are unowned
	// until n1 takes them over.
	s.clock.advance(lease / 2)
	n1.checkin()
	n2.checkin()
	s.wantRuns("both renewed")
	s.clock.advance(lease / 2)
	n1.checkin()
	s.wantRuns("n2's lease not over yet")
	s.clock.advance(lease/2 + time.Second)
	s.wantRuns("n2's lease lapsed", run(4, 7, metrics.ReasonUnowned, ""))
	n1.checkin()
	s.wantRuns("n1 took over", run(4, 7, metrics.ReasonNotReported, "n1"))
	n1.checkin()
	s.wantRuns("n1 runs all")
}

// TestHealthAuth checks who may read what: /readyz and /healthz without a
// token, /v1/health and /metrics only with the metrics or admin token, and
// no token in the server's log.
func TestHealthAuth(t *testing.T) {
	s := newHealthServer(t, controller.Config{TotalShards: 4, RebalanceEvery: -1})
	n := s.node("n1")
	n.checkin()
	n.checkin()

	var h HealthResponse
	if code := s.call("GET", "/healthz", "", "", &h); code != 200 || !h.OK || h.Store != "writable" || h.LiveNodes != 1 {
		t.Fatalf("healthz: %d %+v", code, h)
	}
	code, body := s.raw("GET", "/readyz", "", "")
	if code != 200 || strings.Contains(body, "n1") {
		t.Fatalf("readyz without token: %d %s (must not name nodes)", code, body)
	}
	for _, path := range []string{"/v1/health", "/metrics"} {
		for _, tc := range []struct {
			token string
			want  int
		}{{"", 401}, {"wrong", 401}, {n.cred, 401}, {s.metrics, 200}, {s.admin, 200}} {
			if code, _ := s.raw("GET", path, tc.token, ""); code != tc.want {
				t.Errorf("GET %s with token %.4s...: %d, want %d", path, tc.token, code, tc.want)
			}
		}
	}
	// The metrics token is read-only: operator endpoints refuse it.
	if code, _ := s.raw("GET", "/v1/nodes", s.metrics, ""); code != 401 {
		t.Errorf("GET /v1/nodes with the metrics token: %d, want 401", code)
	}
	_, text := s.raw("GET", "/metrics", s.metrics, "")
	for _, want := range []string{`dpxe_fleet_ready 1`, `dpxe_node_up{node="n1"} 1`, `dpxe_shards{state="ready"} 4`,
		`dpxe_node_request_duration_seconds_count{code="200",route="checkin"} 2`, `dpxe_refusals_total{reason="admin_token"}`} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	logs := s.logBuf.String()
	if !strings.Contains(logs, "metrics request refused") {
		t.Errorf("refusals not logged: %s", logs)
	}
	for _, secret := range []string{s.metrics, s.admin, n.cred} {
		if strings.Contains(logs, secret) {
			t.Fatalf("a token is in the log: %s", logs)
		}
	}
}

// TestHealthzStoreNotWritable: GET /healthz answers 503 and says why when
// the store refuses writes (its connection closed under it).
func TestHealthzStoreNotWritable(t *testing.T) {
	s := newHealthServer(t, controller.Config{TotalShards: 4})
	s.st.Close()
	var h HealthResponse
	if code := s.call("GET", "/healthz", "", "", &h); code != 503 || h.OK || !strings.Contains(h.Store, "store") {
		t.Fatalf("healthz with a closed store: %d %+v", code, h)
	}
}

// TestReadyzReusesVerdict: an unauthenticated GET /readyz answers from a
// verdict at most readyReuse old, so a flood cannot hold the controller's
// lock back to back; GET /v1/health always judges afresh.
func TestReadyzReusesVerdict(t *testing.T) {
	s := newHealthServer(t, controller.Config{TotalShards: 2, RebalanceEvery: -1})
	srv := New(s.ctrl, [32]byte{}, nil)
	srv.ready.reuse = time.Hour
	mux := http.NewServeMux()
	srv.RegisterMetricsListener(mux)
	hs := httptest.NewServer(mux)
	defer hs.Close()
	get := func() int {
		resp, err := http.Get(hs.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(); code != 503 {
		t.Fatalf("readyz with no node: %d", code)
	}
	n := s.node("n1")
	n.checkin()
	n.checkin()
	if code, _ := s.verdict(); code != 200 {
		t.Fatalf("verdict after check-ins: %d", code)
	}
	if code := get(); code != 503 {
		t.Fatalf("readyz within the reuse time: %d, want the cached 503", code)
	}
	srv.ready.mu.Lock()
	srv.ready.reuse = 0
	srv.ready.mu.Unlock()
	if code := get(); code != 200 {
		t.Fatalf("readyz after the reuse time: %d", code)
	}
}
