package web

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/history"
	"github.com/discord-pxe/dpxe/fleet/store"
	"github.com/discord-pxe/dpxe/web/templates"
)

// BenchmarkDashboardHistory measures the pages that show latency and
// history at 10,000 nodes over 131,072 shards (about 13 shards each), every
// READY shard reporting a ping: the fleet page before any history and with
// a full day (1,440 minutes) stored, the node page, the latency map, and
// one sampler tick (FleetStats, percentiles, the store write), each also
// as process CPU time per operation (cpu-ms/op). Run with
// DPXE_BENCH=1 (DPXE_BENCH_NODES changes the node count):
//
//	DPXE_BENCH=1 go test -run '^$' -bench DashboardHistory -benchtime 20x ./web/
func BenchmarkDashboardHistory(b *testing.B) {
	if os.Getenv("DPXE_BENCH") != "1" {
		b.Skip("set DPXE_BENCH=1 to run the dashboard benchmarks")
	}
	nodes := 10000
	if v, err := strconv.Atoi(os.Getenv("DPXE_BENCH_NODES")); err == nil && v > 0 {
		nodes = v
	}
	start := time.Now()
	f := newTestFleet(b, fleetOpts{total: benchShards, maxConc: 16, liveEvery: time.Hour})
	ids := make([]string, nodes)
	for i := range ids {
		ids[i] = fmt.Sprintf("node-%05d", i)
	}
	capacity := min(128, (benchShards+nodes-1)/nodes+2)
	f.addNodes(capacity, ids...)
	f.settle(ids...)
	for _, id := range ids {
		f.reportPings(id, func(s uint32) float64 { return 20 + float64(s%400) })
	}
	b.Logf("seeded %d nodes, %d shards through the controller in %v", nodes, benchShards, time.Since(start).Round(time.Millisecond))
	sid, _ := f.web.sess.create(time.Now())
	cookie := &http.Cookie{Name: sessionCookie, Value: sid}
	mux := http.NewServeMux()
	f.web.Register(mux)
	get := func(b *testing.B, path string) int {
		req := httptest.NewRequest("GET", path, nil)
		req.AddCookie(cookie)
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		if w.Code != http.StatusOK {
			b.Fatalf("GET %s: %d", path, w.Code)
		}
		return w.Body.Len()
	}
	page := func(b *testing.B, path string) {
		get(b, path) // warm up outside the measurement
		runtime.GC() // and leave the seeding's garbage out of it
		var size int
		cpu := cpuTime()
		for b.Loop() {
			size = get(b, path)
		}
		b.ReportMetric(float64(size)/1024, "page-KiB")
		b.ReportMetric(float64(cpuTime()-cpu)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
	}
	b.Run("fleet-page-no-history", func(b *testing.B) { page(b, "/") })
	// A full day, one sample a minute, ending now.
	ctx := context.Background()
	now := time.Now()
	fill := time.Now()
	for m := store.HistoryMinutes - 1; m >= 0; m-- {
		h := store.HistorySample{At: now.Add(-time.Duration(m) * time.Minute), Ready: benchShards - 40, Starting: 10, Backoff: 20, Fatal: 10,
			PingCount: benchShards - 40, PingP50: 120 + float64(m%60), PingP90: 300 + float64(m%90), PingP99: 600 + float64(m%240), PingMax: 2000}
		if err := f.store.AddHistory(ctx, h); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("stored %d minutes of history in %v", store.HistoryMinutes, time.Since(fill).Round(time.Millisecond))
	b.Run("fleet-page-24h", func(b *testing.B) { page(b, "/") })
	b.Run("node-page", func(b *testing.B) { page(b, "/nodes/"+ids[nodes/2]) })
	b.Run("latency-page", func(b *testing.B) { page(b, "/latency") })
	b.Run("history-read", func(b *testing.B) {
		cpu := cpuTime()
		defer func() { b.ReportMetric(float64(cpuTime()-cpu)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op") }()
		for b.Loop() {
			if _, err := f.store.History(ctx, now.Add(-24*time.Hour)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("sampler-tick", func(b *testing.B) {
		s := history.Sampler{Stats: f.ctrl.FleetStats, Store: f.store}
		cpu := cpuTime()
		defer func() { b.ReportMetric(float64(cpuTime()-cpu)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op") }()
		for b.Loop() {
			if err := s.Once(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// cpuTime is the process's user and system CPU time so far: on a shared,
// loaded machine it varies far less than the wall time of a request.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkHistoryPanel is what a day of history adds to one fleet page
// besides the store read: the charts' geometry and the panels' HTML.
func BenchmarkHistoryPanel(b *testing.B) {
	now := time.Now()
	samples := make([]store.HistorySample, 0, store.HistoryMinutes)
	for m := store.HistoryMinutes - 1; m >= 0; m-- {
		samples = append(samples, store.HistorySample{At: now.Add(-time.Duration(m) * time.Minute).Truncate(time.Minute),
			Ready: benchShards - 40, Starting: 10, Backoff: 20, Fatal: 10, PingCount: benchShards - 40,
			PingP50: 120 + float64(m%60), PingP90: 300 + float64(m%90), PingP99: 600 + float64(m%240), PingMax: 2000})
	}
	var size int
	for b.Loop() {
		p, h := BuildHistory(samples, now)
		var buf strings.Builder
		if err := templates.LatencyPanel(p).Render(context.Background(), &buf); err != nil {
			b.Fatal(err)
		}
		if err := templates.HistoryPanel(h).Render(context.Background(), &buf); err != nil {
			b.Fatal(err)
		}
		size = buf.Len()
	}
	b.ReportMetric(float64(size)/1024, "html-KiB")
}
