package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// Load shape of the check-in benchmark.
const (
	benchWorkers     = 32               // concurrent keep-alive clients in the closed-loop run
	benchRequests    = 20000            // requests per closed-loop run
	benchRounds      = 3                // alternating closed-loop rounds per peer
	benchPacedRate   = 1000             // check-ins per second: 10,000 nodes every 10 s
	benchPacedPeriod = 5 * time.Second  // length of the paced run
	benchFlushEvery  = time.Second      // the server's batched-write period, as in dpxe serve
	benchTimeout     = 30 * time.Second // per request
)

// loadResult is one run's throughput and latency.
type loadResult struct {
	perSec   float64
	p50, p99 time.Duration
	errors   int
}

// benchTarget is a server under load and the bodies and credentials to send.
type benchTarget struct {
	url    string
	bodies [][]byte
	creds  []string
}

func newClient() *http.Client {
	return &http.Client{Timeout: benchTimeout, Transport: &http.Transport{
		MaxIdleConns: benchWorkers * 2, MaxIdleConnsPerHost: benchWorkers * 2, IdleConnTimeout: time.Minute}}
}

func (bt *benchTarget) send(c *http.Client, i int) error {
	req, _ := http.NewRequest("POST", bt.url+"/v1/checkin", bytes.NewReader(bt.bodies[i]))
	req.Header.Set("Authorization", "Bearer "+bt.creds[i])
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

func percentiles(lat []time.Duration) (p50, p99 time.Duration) {
	slices.Sort(lat)
	return lat[len(lat)/2], lat[len(lat)*99/100]
}

// closedLoop sends n check-ins from benchWorkers clients as fast as the
// server answers, cycling through the nodes.
func (bt *benchTarget) closedLoop(n int) loadResult {
	c := newClient()
	defer c.CloseIdleConnections()
	lat := make([]time.Duration, n)
	var next, errs int
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < benchWorkers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= n {
					return
				}
				t0 := time.Now()
				if err := bt.send(c, i%len(bt.bodies)); err != nil {
					mu.Lock()
					errs++
					mu.Unlock()
				}
				lat[i] = time.Since(t0)
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	p50, p99 := percentiles(lat)
	return loadResult{perSec: float64(n) / el.Seconds(), p50: p50, p99: p99, errors: errs}
}

// paced sends check-ins at a fixed rate (open loop): request i is due at
// start + i/rate, and its latency counts from that due time, so queueing
// behind a slow answer is measured rather than hidden.
func (bt *benchTarget) paced(rate int, period time.Duration) loadResult {
	c := newClient()
	defer c.CloseIdleConnections()
	n := int(float64(rate) * period.Seconds())
	interval := time.Second / time.Duration(rate)
	lat := make([]time.Duration, n)
	jobs := make(chan int, n)
	for i := 0; i < n; i++ {
		jobs <- i
	}
	close(jobs)
	var wg sync.WaitGroup
	var mu sync.Mutex
	errs := 0
	start := time.Now()
	for w := 0; w < benchWorkers*4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				due := start.Add(time.Duration(i) * interval)
				time.Sleep(time.Until(due)) // pacing of the open-loop load
				if err := bt.send(c, i%len(bt.bodies)); err != nil {
					mu.Lock()
					errs++
					mu.Unlock()
				}
				lat[i] = time.Since(due)
			}
		}()
	}
	wg.Wait()
	p50, p99 := percentiles(lat)
	return loadResult{perSec: float64(n) / time.Since(start).Seconds(), p50: p50, p99: p99, errors: errs}
}

func serveMux(b *testing.B, h http.Handler) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	b.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// bareHandler is the ceiling: it decodes the same check-in JSON with the
// same decoder and answers a fixed, pre-encoded reply of realistic size.
func bareHandler(reply []byte) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, appliance.MaxCheckinBody))
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		if _, err := appliance.ParseCheckinRequest(body); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(reply)
	})
}

func rssMiB() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

// BenchmarkCheckin measures check-ins over loopback HTTP against the real
// API (SQLite persistence on, batched writes as in dpxe serve) beside a
// bare net/http handler decoding the same JSON, with 1,000 and 10,000
// nodes: closed-loop throughput and p50/p99, the ratio of the two
// throughputs, and p50/p99 at 1,000 check-ins/s (10,000 nodes every 10 s).
// RSS is the whole benchmark process (server, store and load generator).
func BenchmarkCheckin(b *testing.B) {
	if os.Getenv("DPXE_BENCH") == "" {
		b.Skip("set DPXE_BENCH=1 (make bench)")
	}
	for _, nodes := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) { benchCheckin(b, nodes, false) })
	}
	// The same with every check-in carrying per-shard status for all its
	// shards, which the controller keeps and writes to the store.
	b.Run("nodes=10000/status", func(b *testing.B) { benchCheckin(b, 10000, true) })
}

// checkinServer is the real API on a store, with a fleet of nodes joined
// and settled on one plan.
type checkinServer struct {
	*benchTarget
	ctrl     *controller.Controller
	plan     controller.PlanView
	capacity int
	settle   time.Duration
	rounds   int
}

// startCheckinServer serves the API on st (lead, when not nil, makes the
// controller the leading replica) and joins nodes nodes, whose check-ins
// then carry per-shard status when withStatus. The controller runs until
// the benchmark ends.
func startCheckinServer(b *testing.B, st *store.Store, lead func(*controller.Controller), nodes int, withStatus bool) *checkinServer {
	ctx := context.Background()
	total := uint32(min(nodes*13, appliance.MaxTotalShards))
	capacity := int(total)/nodes + 1
	ctrl, err := controller.New(ctx, st, controller.Config{TotalShards: total, MaxConcurrency: 16}, time.Now, nil)
	if err != nil {
		b.Fatal(err)
	}
	if lead != nil {
		lead(ctrl)
	}
	runCtx, stop := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	go func() { runDone <- ctrl.Run(runCtx, benchFlushEvery) }()
	b.Cleanup(func() { stop(); <-runDone })
	mux := http.NewServeMux()
	New(ctrl, HashToken("bench-admin"), nil).Register(mux)
	bt := &benchTarget{url: serveMux(b, mux)}
	for i := 0; i < nodes; i++ {
		id := fmt.Sprintf("node-%05d", i)
		cred, err := ctrl.AddNode(ctx, id)
		if err != nil {
			b.Fatal(err)
		}
		bt.creds = append(bt.creds, cred)
	}
	ranges := map[string]controller.PlanEntry{}
	setBodies := func(gen uint64) {
		bt.bodies = bt.bodies[:0]
		for i := 0; i < nodes; i++ {
			req := appliance.CheckinRequest{NodeID: fmt.Sprintf("node-%05d", i), Capacity: capacity,
				Generation: gen, ReadyShards: capacity - 1, StartingShards: 1}
			if r, ok := ranges[req.NodeID]; ok && withStatus {
				for s := r.Start; s < r.Start+r.Count; s++ {
					req.Shards = append(req.Shards, appliance.ShardStatus{ID: s, State: appliance.ShardReady,
						SeqValid: true, HeartbeatAcks: 120, Reconnects: 1, LastError: "tls: read: connection reset", CloseCode: 4000})
				}
			}
			body, _ := json.Marshal(req)
			bt.bodies = append(bt.bodies, body)
		}
	}
	// Join everyone, let the plan settle, acknowledge it: the steady state
	// of a fleet whose nodes renew every lease/3.
	settleStart := time.Now()
	rounds := 0
	for i := 0; i < 10 && ctrl.Plan().Owned < total; i++ {
		rounds++
		setBodies(ctrl.Plan().Generation)
		if r := bt.closedLoop(nodes); r.errors > 0 {
			b.Fatalf("setup round %d: %d errors", i, r.errors)
		}
		time.Sleep(controller.DefaultRebalanceEvery) // let the coalesced rebalance run
		ctrl.Tick()
	}
	settle := time.Since(settleStart)
	p := ctrl.Plan()
	for _, r := range p.Ranges {
		ranges[r.NodeID] = r
	}
	setBodies(p.Generation)
	if p.Owned != total {
		b.Fatalf("setup: %d of %d shards owned: %+v", p.Owned, total, p.Ranges[:1])
	}
	return &checkinServer{benchTarget: bt, ctrl: ctrl, plan: p, capacity: capacity, settle: settle, rounds: rounds}
}

// checkSteady fails the benchmark if the load changed the plan: steady
// check-ins must not.
func (cs *checkinServer) checkSteady(b *testing.B) {
	if g := cs.ctrl.Plan().Generation; g != cs.plan.Generation {
		b.Fatalf("steady check-ins changed the generation %d -> %d", cs.plan.Generation, g)
	}
}

func benchCheckin(b *testing.B, nodes int, withStatus bool) {
	st, lead := benchStore(b) // bench_ha_test.go: SQLite, or a PostgreSQL leader
	defer st.Close()
	cs := startCheckinServer(b, st, lead, nodes, withStatus)
	bt, p, capacity := cs.benchTarget, cs.plan, cs.capacity
	reply, _ := json.Marshal(appliance.CheckinResponse{Generation: p.Generation, TotalShards: p.TotalShards,
		Assigned: make([]uint32, capacity-1), Pending: []uint32{}, RangeCount: uint32(capacity - 1), LeaseSeconds: 30, MaxConcurrency: 16, NextCheckinMS: 10000})
	bare := &benchTarget{url: serveMux(b, bareHandler(reply)), bodies: bt.bodies, creds: bt.creds}

	runtime.GC()
	rss := rssMiB()
	var heap runtime.MemStats
	runtime.ReadMemStats(&heap)
	for b.Loop() {
		rb, rd, pb, pd := sideBySide(b, "bare", bare, "dpxe", bt)
		b.ReportMetric(rd.perSec, "dpxe-checkins/s")
		b.ReportMetric(rb.perSec, "bare-checkins/s")
		b.ReportMetric(rd.perSec/rb.perSec, "ratio")
		b.ReportMetric(ms(rd.p50), "dpxe-p50-ms")
		b.ReportMetric(ms(rd.p99), "dpxe-p99-ms")
		b.ReportMetric(ms(rb.p50), "bare-p50-ms")
		b.ReportMetric(ms(rb.p99), "bare-p99-ms")
		b.ReportMetric(ms(pd.p50), "dpxe-1k/s-p50-ms")
		b.ReportMetric(ms(pd.p99), "dpxe-1k/s-p99-ms")
		b.ReportMetric(ms(pb.p99), "bare-1k/s-p99-ms")
		b.ReportMetric(cs.settle.Seconds(), "join-settle-s")
		b.ReportMetric(float64(cs.rounds), "join-rounds")
		b.ReportMetric(rss, "rss-MiB")
		b.ReportMetric(rssMiB(), "rss-after-load-MiB")
		b.ReportMetric(float64(heap.HeapInuse)/(1<<20), "heap-MiB")
	}
	cs.checkSteady(b)
}

// sideBySide runs the same load against peers x and y: benchRounds
// closed-loop rounds each, alternating so background load on a shared
// machine hits both alike (each one's median round kept), then a paced
// run each. Any failed request fails the benchmark.
func sideBySide(b *testing.B, xname string, x *benchTarget, yname string, y *benchTarget) (rx, ry, px, py loadResult) {
	var rxs, rys []loadResult
	for r := 0; r < benchRounds; r++ {
		rxs = append(rxs, x.closedLoop(benchRequests))
		rys = append(rys, y.closedLoop(benchRequests))
	}
	rx, ry = median(rxs), median(rys)
	px = x.paced(benchPacedRate, benchPacedPeriod)
	py = y.paced(benchPacedRate, benchPacedPeriod)
	if rx.errors+px.errors+ry.errors+py.errors > 0 {
		b.Fatalf("errors: %s %d+%d %s %d+%d", xname, rx.errors, px.errors, yname, ry.errors, py.errors)
	}
	return rx, ry, px, py
}

// median returns the run with the median throughput.
func median(rs []loadResult) loadResult {
	slices.SortFunc(rs, func(a, b loadResult) int {
		switch {
		case a.perSec < b.perSec:
			return -1
		case a.perSec > b.perSec:
			return 1
		}
		return 0
	})
	return rs[len(rs)/2]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
