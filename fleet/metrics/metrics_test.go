package metrics_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/metrics"
	"github.com/discord-pxe/dpxe/fleet/netboot/stats"
	"github.com/discord-pxe/dpxe/fleet/security"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// clock is a clock the test moves.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// fleet is a real controller over a real SQLite file.
type fleet struct {
	t     *testing.T
	c     *controller.Controller
	st    *store.Store
	clock *clock
	gen   map[string]uint64
	// broker is what each node reports as its broker connection (none
	// when absent).
	broker map[string]*appliance.BrokerStatus
}

func newFleet(t testing.TB, cfg controller.Config) *fleet {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "dpxe.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ck := &clock{t: time.Date(2026, 12, 2, 2, 0, 0, 0, time.UTC)}
	if cfg.RebalanceEvery == 0 {
		cfg.RebalanceEvery = -1
	}
	c, err := controller.New(ctx, st, cfg, ck.now, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &fleet{c: c, st: st, clock: ck, gen: map[string]uint64{}, broker: map[string]*appliance.BrokerStatus{}}
}

// checkin checks node id in, reporting status for the shards the
// callback gives (nil: none), and returns the shards it may run.
func (f *fleet) checkin(t testing.TB, id string, capacity int, status func(s uint32) *appliance.ShardStatus, run []uint32) []uint32 {
	t.Helper()
	req := appliance.CheckinRequest{NodeID: id, Capacity: capacity, Generation: f.gen[id], NATS: f.broker[id]}
	for _, s := range run {
		if status != nil {
			if st := status(s); st != nil {
				st.ID = s
				req.Shards = append(req.Shards, *st)
			}
		}
	}
	resp, err := f.c.Checkin(context.Background(), &req, "127.0.0.1")
	if err != nil {
		t.Fatalf("checkin %s: %v", id, err)
	}
	f.gen[id] = resp.Generation
	pending := map[uint32]bool{}
	for _, p := range resp.Pending {
		pending[p] = true
	}
	var out []uint32
	for _, a := range resp.Assigned {
		if !pending[a] {
			out = append(out, a)
		}
	}
	return out
}

// settle checks every node in until all hold their ranges and have
// reported status, four rounds (learn, acknowledge, hold, report), and
// returns the shards each may run.
func (f *fleet) settle(t testing.TB, ids []string, capacity int, status func(node string, s uint32) *appliance.ShardStatus) map[string][]uint32 {
	t.Helper()
	run := map[string][]uint32{}
	for range 4 {
		for _, id := range ids {
			run[id] = f.checkin(t, id, capacity, func(s uint32) *appliance.ShardStatus { return status(id, s) }, run[id])
		}
	}
	return run
}

func addNodes(t testing.TB, c *controller.Controller, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if _, err := c.AddNode(context.Background(), id); err != nil {
			t.Fatal(err)
		}
	}
}

// scrape returns the registry's output in the Prometheus text format.
func scrape(t testing.TB, m *metrics.Metrics) []byte {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

// TestCollectorReadsController checks the fleet metrics against a fleet
// whose state the test knows, and lints them.
func TestCollectorReadsController(t *testing.T) {
	f := newFleet(t, controller.Config{TotalShards: 12, SessionBudget: 100, SessionReserve: 5})
	addNodes(t, f.c, "a", "b", "c")
	refusals := security.New(nil)
	refusals.Refused(security.AdminToken, "127.0.0.1", "test refusal")
	m := metrics.New(f.c, metrics.Options{Refusals: refusals})
	// a: 0..5, b: 6..11; c never checks in.
	f.settle(t, []string{"a", "b"}, 6, func(node string, s uint32) *appliance.ShardStatus {
		switch s {
		case 0:
			return &appliance.ShardStatus{State: appliance.ShardReady, PingMS: 20, HeartbeatMisses: 2, Reconnects: 1}
		case 1:
			return &appliance.ShardStatus{State: appliance.ShardReady, PingMS: 30, Reconnects: 3}
		case 2:
			return &appliance.ShardStatus{State: appliance.ShardStarting, CloseCode: 4000}
		case 3:
			return &appliance.ShardStatus{State: appliance.ShardFatal, CloseCode: 4004}
		case 4:
			return &appliance.ShardStatus{State: appliance.ShardBackoff, CloseCode: 4999}
		case 5:
			return nil // not reported
		}
		return &appliance.ShardStatus{State: appliance.ShardReady, PingMS: 700}
	})
	m.ObserveIdentify(appliance.IdentifyResponse{Granted: true})
	m.ObserveIdentify(appliance.IdentifyResponse{Reason: appliance.ReasonBucketBusy})
	m.ObserveIdentify(appliance.IdentifyResponse{Reason: "something new"})

	want := `
# HELP dpxe_nodes Inventory nodes by state: live, draining (live and draining) or down.
# TYPE dpxe_nodes gauge
dpxe_nodes{state="down"} 1
dpxe_nodes{state="draining"} 0
dpxe_nodes{state="live"} 2
# HELP dpxe_shards Shards of the plan by state: ready, starting, backoff, fatal (as their node reports), assigned (held, no state reported), pending (hand-off not done) or unowned.
# TYPE dpxe_shards gauge
dpxe_shards{state="assigned"} 1
dpxe_shards{state="backoff"} 1
dpxe_shards{state="fatal"} 1
dpxe_shards{state="pending"} 0
dpxe_shards{state="ready"} 8
dpxe_shards{state="starting"} 1
dpxe_shards{state="unowned"} 0
# HELP dpxe_node_shards Shards in the node's plan range: ready (it reports READY), not_ready (held, any other or no state), pending (hand-off not done).
# TYPE dpxe_node_shards gauge
dpxe_node_shards{node="a",state="not_ready"} 4
dpxe_node_shards{node="a",state="pending"} 0
dpxe_node_shards{node="a",state="ready"} 2
dpxe_node_shards{node="b",state="not_ready"} 0
dpxe_node_shards{node="b",state="pending"} 0
dpxe_node_shards{node="b",state="ready"} 6
# HELP dpxe_node_heartbeat_misses Sum of the heartbeat misses the node's shards report (each since the shard started there; falls when shards leave).
# TYPE dpxe_node_heartbeat_misses gauge
dpxe_node_heartbeat_misses{node="a"} 2
dpxe_node_heartbeat_misses{node="b"} 0
dpxe_node_heartbeat_misses{node="c"} 0
# HELP dpxe_node_reconnects Sum of the reconnects the node's shards report (each since the shard started there; falls when shards leave).
# TYPE dpxe_node_reconnects gauge
dpxe_node_reconnects{node="a"} 4
dpxe_node_reconnects{node="b"} 0
dpxe_node_reconnects{node="c"} 0
# HELP dpxe_node_shard_ping_seconds Last heartbeat-to-ACK latency of the node's held shards that have one.
# TYPE dpxe_node_shard_ping_seconds histogram
dpxe_node_shard_ping_seconds_bucket{node="a",le="0.01"} 0
dpxe_node_shard_ping_seconds_bucket{node="a",le="0.025"} 1
dpxe_node_shard_ping_seconds_bucket{node="a",le="0.05"} 2
dpxe_node_shard_ping_seconds_bucket{node="a",le="0.1"} 2
dpxe_node_shard_ping_seconds_bucket{node="a",le="0.25"} 2
dpxe_node_shard_ping_seconds_bucket{node="a",le="0.5"} 2
dpxe_node_shard_ping_seconds_bucket{node="a",le="1"} 2
dpxe_node_shard_ping_seconds_bucket{node="a",le="2.5"} 2
dpxe_node_shard_ping_seconds_bucket{node="a",le="5"} 2
dpxe_node_shard_ping_seconds_bucket{node="a",le="+Inf"} 2
dpxe_node_shard_ping_seconds_sum{node="a"} 0.05
dpxe_node_shard_ping_seconds_count{node="a"} 2
dpxe_node_shard_ping_seconds_bucket{node="b",le="0.01"} 0
dpxe_node_shard_ping_seconds_bucket{node="b",le="0.025"} 0
dpxe_node_shard_ping_seconds_bucket{node="b",le="0.05"} 0
dpxe_node_shard_ping_seconds_bucket{node="b",le="0.1"} 0
dpxe_node_shard_ping_seconds_bucket{node="b",le="0.25"} 0
dpxe_node_shard_ping_seconds_bucket{node="b",le="0.5"} 0
dpxe_node_shard_ping_seconds_bucket{node="b",le="1"} 6
dpxe_node_shard_ping_seconds_bucket{node="b",le="2.5"} 6
dpxe_node_shard_ping_seconds_bucket{node="b",le="5"} 6
dpxe_node_shard_ping_seconds_bucket{node="b",le="+Inf"} 6
dpxe_node_shard_ping_seconds_sum{node="b"} 4.2
dpxe_node_shard_ping_seconds_count{node="b"} 6
# HELP dpxe_fleet_ready 1 when every shard of the plan is READY on a live node with a ping within the bound (GET /readyz).
# TYPE dpxe_fleet_ready gauge
dpxe_fleet_ready 0
# HELP dpxe_fleet_unready_shards Shards that are not ready, by the first reason that applies (docs/api.md, GET /v1/health).
# TYPE dpxe_fleet_unready_shards gauge
dpxe_fleet_unready_shards{reason="ack_slow"} 0
dpxe_fleet_unready_shards{reason="handoff_pending"} 0
dpxe_fleet_unready_shards{reason="no_ping"} 0
dpxe_fleet_unready_shards{reason="not_ready"} 3
dpxe_fleet_unready_shards{reason="not_reported"} 1
dpxe_fleet_unready_shards{reason="ping_over_bound"} 0
dpxe_fleet_unready_shards{reason="unowned"} 0
# HELP dpxe_session_budget_remaining Session starts left in the current budget window.
# TYPE dpxe_session_budget_remaining gauge
dpxe_session_budget_remaining 100
# HELP dpxe_session_budget_reserve Session starts kept back from Identify grants.
# TYPE dpxe_session_budget_reserve gauge
dpxe_session_budget_reserve 5
# HELP dpxe_identify_grants_total Identify claims granted.
# TYPE dpxe_identify_grants_total counter
dpxe_identify_grants_total 1
# HELP dpxe_identify_refusals_total Identify claims refused, by reason.
# TYPE dpxe_identify_refusals_total counter
dpxe_identify_refusals_total{reason="bucket_busy"} 1
dpxe_identify_refusals_total{reason="budget"} 0
dpxe_identify_refusals_total{reason="not_owner"} 0
dpxe_identify_refusals_total{reason="order"} 0
dpxe_identify_refusals_total{reason="other"} 1
`
	names := []string{"dpxe_nodes", "dpxe_shards", "dpxe_node_shards", "dpxe_node_heartbeat_misses", "dpxe_node_reconnects",
		"dpxe_node_shard_ping_seconds", "dpxe_fleet_ready", "dpxe_fleet_unready_shards", "dpxe_session_budget_remaining",
		"dpxe_session_budget_reserve", "dpxe_identify_grants_total", "dpxe_identify_refusals_total"}
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
	text := string(scrape(t, m))
	for _, line := range []string{`dpxe_shards_by_close_code{code="4000"} 1`, `dpxe_shards_by_close_code{code="4004"} 1`,
		`dpxe_shards_by_close_code{code="other"} 1`, `dpxe_node_up{node="c"} 0`, `dpxe_plan_total_shards 12`,
		`dpxe_refusals_total{reason="admin_token"} 1`, `dpxe_shard_ping_seconds_count 8`} {
		if !strings.Contains(text, line+"\n") {
			t.Errorf("scrape lacks %q", line)
		}
	}
	if strings.Contains(text, `dpxe_node_shards{node="c"`) || strings.Contains(text, `dpxe_node_lease_remaining_seconds{node="c"}`) {
		t.Error("a node that is not live has range or lease series")
	}
	problems, err := testutil.GatherAndLint(m.Registry())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	promtool(t, bytes.NewReader([]byte(text)), "check", "metrics")

	// The verdict the collector exports is the one Verdict gives.
	v := m.Verdict()
	if v.Ready || v.NotReadyCount != 4 || v.Reasons[metrics.ReasonNotReady] != 3 {
		t.Fatalf("verdict %+v", v.Summary)
	}
}

// TestReplicaMetrics: a single controller says it acts, at term 0; a
// replica that does not lead says it does not, and counts the check-ins it
// answered itself (here one, with no leader at all: renewals without a
// leader) as a counter.
func TestReplicaMetrics(t *testing.T) {
	f := newFleet(t, controller.Config{TotalShards: 4, Lease: 10 * time.Second})
	addNodes(t, f.c, "a")
	f.settle(t, []string{"a"}, 4, func(string, uint32) *appliance.ShardStatus {
		return &appliance.ShardStatus{State: appliance.ShardReady, PingMS: 10}
	})
	single := metrics.New(f.c, metrics.Options{Refusals: security.New(nil)})
	want := `
# HELP dpxe_replica_acting 1 while this dpxe serve process acts on the fleet: a single controller, or the leading replica; 0 for a follower (docs/ha.md).
# TYPE dpxe_replica_acting gauge
dpxe_replica_acting 1
# HELP dpxe_replica_term The latest leader term this replica saw (0 for a single controller).
# TYPE dpxe_replica_term gauge
dpxe_replica_term 0
# HELP dpxe_replica_follower_checkins_total Node check-ins this replica answered itself because no leader answered them (renewals without a leader, docs/ha.md).
# TYPE dpxe_replica_follower_checkins_total counter
dpxe_replica_follower_checkins_total 0
`
	names := []string{"dpxe_replica_acting", "dpxe_replica_term", "dpxe_replica_follower_checkins_total"}
	if err := testutil.GatherAndCompare(single.Registry(), strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
	// A second process on the same store, as a replica that follows and
	// answers a's check-in itself: a's stored lease runs (written under a
	// leader term that has ended since) and a applied the stored plan.
	ctx := context.Background()
	if err := f.c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := f.st.Campaign(ctx, "gone", "http://gone", time.Minute)
	if err != nil || !l.Leader {
		t.Fatalf("campaign: %+v %v", l, err)
	}
	if err := f.st.RenewLease(ctx, store.Fence{Holder: "gone", Term: l.Term}, "a", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := f.st.Resign(ctx, "gone", l.Term); err != nil {
		t.Fatal(err)
	}
	fc, err := controller.New(ctx, f.st, controller.Config{TotalShards: 4, Lease: 10 * time.Second, Replica: true}, f.clock.now, nil)
	if err != nil {
		t.Fatal(err)
	}
	fc.EnableHA(nil)
	if _, err := fc.Checkin(controller.AnswerAsFollower(ctx), &appliance.CheckinRequest{NodeID: "a", Capacity: 4, Generation: f.gen["a"]}, "127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	follower := metrics.New(fc, metrics.Options{Refusals: security.New(nil)})
	want = `
# HELP dpxe_replica_acting 1 while this dpxe serve process acts on the fleet: a single controller, or the leading replica; 0 for a follower (docs/ha.md).
# TYPE dpxe_replica_acting gauge
dpxe_replica_acting 0
# HELP dpxe_replica_follower_checkins_total Node check-ins this replica answered itself because no leader answered them (renewals without a leader, docs/ha.md).
# TYPE dpxe_replica_follower_checkins_total counter
dpxe_replica_follower_checkins_total 1
`
	if err := testutil.GatherAndCompare(follower.Registry(), strings.NewReader(want), "dpxe_replica_acting", "dpxe_replica_follower_checkins_total"); err != nil {
		t.Fatal(err)
	}
}

// TestSeriesBounded: the number of series depends on the nodes, never on
// the shard count.
func TestSeriesBounded(t *testing.T) {
	count := func(total uint32) int {
		f := newFleet(t, controller.Config{TotalShards: total})
		addNodes(t, f.c, "a", "b")
		m := metrics.New(f.c, metrics.Options{})
		f.settle(t, []string{"a", "b"}, appliance.MaxShardsPerNode, func(node string, s uint32) *appliance.ShardStatus {
			return &appliance.ShardStatus{State: appliance.ShardReady, PingMS: float64(s%500 + 1), CloseCode: uint16(4000 + s%20)}
		})
		n := 0
		for _, line := range strings.Split(string(scrape(t, m)), "\n") {
			if strings.HasPrefix(line, "dpxe_") {
				n++
			}
		}
		return n
	}
	small, large := count(8), count(2*appliance.MaxShardsPerNode)
	if small != large || small == 0 {
		t.Fatalf("dpxe_ series: %d at 8 shards, %d at %d shards", small, large, 2*appliance.MaxShardsPerNode)
	}
}

// TestNodeSeriesLimit: by default (NodeSeriesAuto) the series labelled
// by node are exported while the inventory has at most the limit of
// nodes, SeriesPerNode for a live node, and none above the limit, so a
// scrape has at most the fleet-wide series plus SeriesPerNode × the limit
// whatever the fleet's size; dpxe_metrics_node_series says which. On and
// Off override the limit.
func TestNodeSeriesLimit(t *testing.T) {
	f := newFleet(t, controller.Config{TotalShards: 16})
	ids := []string{"a", "b", "c"}
	addNodes(t, f.c, ids...)
	const limit = 3
	m := metrics.New(f.c, metrics.Options{NodeSeriesLimit: limit})
	// Every series a node can have: delivery figures, a known publish
	// rate (a fifth round of check-ins a second later) and a broker report.
	published := uint32(10)
	status := func(node string, s uint32) *appliance.ShardStatus {
		return &appliance.ShardStatus{State: appliance.ShardReady, PingMS: float64(s + 1), EventsPublished: published,
			EventsAckedSeq: published, SeqValid: true, SessionID: "s", Seq: published, ResumeURL: "ws://10.0.0.9:9000/"}
	}
	for _, id := range ids {
		f.broker[id] = &appliance.BrokerStatus{State: appliance.BrokerUp, Connects: 1}
	}
	run := f.settle(t, ids, 8, status)
	f.clock.advance(time.Second)
	published = 20
	for _, id := range ids {
		f.checkin(t, id, 8, func(s uint32) *appliance.ShardStatus { return status(id, s) }, run[id])
	}
	count := func(mode metrics.NodeSeriesMode) (all, node int, text string) {
		t.Helper()
		m.SetNodeSeries(mode, limit)
		text = string(scrape(t, m))
		for _, line := range strings.Split(text, "\n") {
			if strings.HasPrefix(line, "dpxe_") {
				all++
				if strings.Contains(line, `node="`) {
					node++
				}
			}
		}
		return all, node, text
	}
	base, node, text := count(metrics.NodeSeriesOff)
	if node != 0 || !strings.Contains(text, "dpxe_metrics_node_series 0\n") {
		t.Fatalf("off: %d node series", node)
	}
	all, node, text := count(metrics.NodeSeriesAuto)
	if node != limit*metrics.SeriesPerNode || all != base+node || !strings.Contains(text, "dpxe_metrics_node_series 1\n") {
		t.Fatalf("auto at %d nodes (the limit): %d node series of %d, want %d of %d", limit, node, all, limit*metrics.SeriesPerNode, base+limit*metrics.SeriesPerNode)
	}
	addNodes(t, f.c, "d") // one over the limit (not live: 5 series when on)
	all, node, text = count(metrics.NodeSeriesAuto)
	if node != 0 || all != base || !strings.Contains(text, "dpxe_metrics_node_series 0\n") {
		t.Fatalf("auto at %d nodes: %d node series of %d, want none of %d", limit+1, node, all, base)
	}
	if bound := base + limit*metrics.SeriesPerNode; all > bound {
		t.Fatalf("%d series over the bound %d", all, bound)
	}
	if _, node, _ = count(metrics.NodeSeriesOn); node != limit*metrics.SeriesPerNode+5 {
		t.Fatalf("on at %d nodes: %d node series, want %d", limit+1, node, limit*metrics.SeriesPerNode+5)
	}
}

// promtool runs promtool with args and stdin, failing the test on a
// non-zero exit. Without promtool the test is skipped.
func promtool(t *testing.T, stdin *bytes.Reader, args ...string) {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (tools/scripts/deps.sh test installs Debian's prometheus)")
	}
	cmd := exec.Command(path, args...)
	if stdin != nil {
		cmd.Stdin = stdin
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	if strings.Contains(string(out), "problem") || (len(args) > 1 && args[1] == "metrics" && len(bytes.TrimSpace(out)) > 0) {
		t.Fatalf("promtool %s reports:\n%s", strings.Join(args, " "), out)
	}
}

const (
	rulesFile     = "../../docs/prometheus/dpxe-rules.yml"
	rulesTestFile = "../../docs/prometheus/dpxe-rules.test.yml"
)

// TestShippedRules checks docs/prometheus/dpxe-rules.yml with promtool
// check rules and test rules (dpxe-rules.test.yml), and that every dpxe_
// metric it names is one the controller exports.
func TestShippedRules(t *testing.T) {
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	// A fleet with a node and a request answered, so that every family
	// has a series (a vector without one is not gathered).
	f := newFleet(t, controller.Config{TotalShards: 4})
	addNodes(t, f.c, "a")
	m := metrics.New(f.c, metrics.Options{Refusals: security.New(nil)})
	f.settle(t, []string{"a"}, 4, func(string, uint32) *appliance.ShardStatus {
		return &appliance.ShardStatus{State: appliance.ShardReady, PingMS: 10}
	})
	m.ObserveRequest(metrics.RouteCheckin, 200, time.Millisecond)
	m.SetNetboot(stats.New()) // as with dpxe serve --interface
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, mf := range mfs {
		name := mf.GetName()
		exported[name] = true
		if strings.HasSuffix(mf.GetType().String(), "HISTOGRAM") {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				exported[name+s] = true
			}
		}
	}
	used := regexp.MustCompile(`\bdpxe_[a-z_]+`).FindAllString(string(b), -1)
	if len(used) == 0 {
		t.Fatal("the rules name no dpxe_ metric")
	}
	sort.Strings(used)
	for _, name := range used {
		if !exported[name] {
			t.Errorf("%s names %s, which the controller does not export", rulesFile, name)
		}
	}
	promtool(t, nil, "check", "rules", rulesFile)
	// The rules' own unit tests (alerts fire when, and only when, they should).
	promtool(t, nil, "test", "rules", rulesTestFile)
}

// BenchmarkScrape measures one scrape (gather and text encoding) at the
// scale of issue 21: 10,000 live nodes checked in to a real controller,
// 131,072 shards, every shard READY with a ping; and at
// DefaultNodeSeriesLimit nodes, the largest fleet that has the node
// series by default. Each in the three node series modes (auto is the
// default), and controller.FleetStats alone (the part under the
// controller's lock). It reports the series and bytes of a scrape. Run it
// with make bench (DPXE_BENCH=1).
func BenchmarkScrape(b *testing.B) {
	if os.Getenv("DPXE_BENCH") == "" {
		b.Skip("set DPXE_BENCH=1 (make bench)")
	}
	// The scale of the issue (the node series over the limit, so off by
	// default), and a fleet of exactly DefaultNodeSeriesLimit nodes (on by
	// default) with as many shards as they can hold.
	for _, sc := range []struct {
		nodes    int
		total    uint32
		capacity int
	}{
		{10000, appliance.MaxTotalShards, 14},
		{metrics.DefaultNodeSeriesLimit, metrics.DefaultNodeSeriesLimit * appliance.MaxShardsPerNode, appliance.MaxShardsPerNode},
	} {
		b.Run(fmt.Sprintf("nodes=%d/shards=%d", sc.nodes, sc.total), func(b *testing.B) {
			benchScrape(b, sc.nodes, sc.total, sc.capacity)
		})
	}
}

// benchScrape checks nodes in until every one of total shards is READY
// with a ping, then measures FleetStats and one scrape in each node
// series mode.
func benchScrape(b *testing.B, nodes int, total uint32, capacity int) {
	f := newFleet(b, controller.Config{TotalShards: total, RebalanceEvery: 10 * time.Minute, Lease: time.Hour})
	ids := make([]string, nodes)
	for i := range ids {
		ids[i] = fmt.Sprintf("node-%05d", i)
	}
	addNodes(b, f.c, ids...)
	status := func(s uint32) *appliance.ShardStatus {
		return &appliance.ShardStatus{State: appliance.ShardReady, PingMS: float64(s%300) + 0.5}
	}
	// Rounds of check-ins from 32 goroutines, so that commits group: the
	// first check-in rebalances at once and the next rebalance waits its
	// ten minutes, which the clock then skips, then rounds until every
	// node holds and reports its range.
	var mu sync.Mutex
	run := map[string][]uint32{}
	round := func() {
		var wg sync.WaitGroup
		ch := make(chan string)
		for range 32 {
			wg.Go(func() {
				for id := range ch {
					mu.Lock()
					r := run[id]
					mu.Unlock()
					r = f.checkinLocked(b, &mu, id, capacity, status, r)
					mu.Lock()
					run[id] = r
					mu.Unlock()
				}
			})
		}
		for _, id := range ids {
			ch <- id
		}
		close(ch)
		wg.Wait()
	}
	round()
	f.clock.advance(10 * time.Minute)
	f.c.Tick()
	m := metrics.New(f.c, metrics.Options{Refusals: security.New(nil)})
	for i := 0; !m.Verdict().Ready; i++ {
		if i == 8 {
			b.Fatalf("fleet not ready after 8 rounds: %+v", m.Verdict().Summary)
		}
		round()
	}
	b.Run("FleetStats", func(b *testing.B) {
		for b.Loop() {
			f.c.FleetStats()
		}
	})
	for _, mode := range []struct {
		name string
		mode metrics.NodeSeriesMode
	}{{"auto", metrics.NodeSeriesAuto}, {"off", metrics.NodeSeriesOff}, {"on", metrics.NodeSeriesOn}} {
		b.Run("node-series="+mode.name, func(b *testing.B) {
			m.SetNodeSeries(mode.mode, 0)
			var out []byte
			for b.Loop() {
				out = scrape(b, m)
			}
			series := 0
			for _, line := range bytes.Split(out, []byte("\n")) {
				if len(line) > 0 && line[0] != '#' {
					series++
				}
			}
			b.ReportMetric(float64(series), "series")
			b.ReportMetric(float64(len(out)), "bytes/scrape")
		})
	}
}

// checkinLocked is checkin for concurrent callers: the generation map is
// guarded by mu.
func (f *fleet) checkinLocked(t testing.TB, mu *sync.Mutex, id string, capacity int, status func(s uint32) *appliance.ShardStatus, run []uint32) []uint32 {
	t.Helper()
	mu.Lock()
	gen := f.gen[id]
	mu.Unlock()
	req := appliance.CheckinRequest{NodeID: id, Capacity: capacity, Generation: gen}
	for _, s := range run {
		st := status(s)
		st.ID = s
		req.Shards = append(req.Shards, *st)
	}
	resp, err := f.c.Checkin(context.Background(), &req, "127.0.0.1")
	if err != nil {
		t.Errorf("checkin %s: %v", id, err)
		return nil
	}
	mu.Lock()
	f.gen[id] = resp.Generation
	mu.Unlock()
	pending := map[uint32]bool{}
	for _, p := range resp.Pending {
		pending[p] = true
	}
	var out []uint32
	for _, a := range resp.Assigned {
		if !pending[a] {
			out = append(out, a)
		}
	}
	return out
}
