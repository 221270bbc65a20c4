package web

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/history"
	"github.com/discord-pxe/dpxe/fleet/store"
	"github.com/discord-pxe/dpxe/web/view"
)

// reportPings checks a settled node in once more, reporting each shard it
// runs in its configured state with the ping ping(shard) (0: none yet).
func (f *testFleet) reportPings(id string, ping func(s uint32) float64) {
	f.t.Helper()
	f.mu.Lock()
	req := &appliance.CheckinRequest{NodeID: id, Capacity: f.caps[id], Generation: f.gens[id]}
	runs := f.runs[id]
	f.mu.Unlock()
	for _, s := range runs {
		st := f.stateOf(s)
		x := appliance.ShardStatus{ID: s, State: st, SeqValid: true, HeartbeatAcks: 3}
		if st == appliance.ShardReady {
			x.PingMS = ping(s)
			req.ReadyShards++
		} else if st == appliance.ShardFatal {
			req.FatalShards++
		}
		req.Shards = append(req.Shards, x)
	}
	if _, err := f.ctrl.Checkin(context.Background(), req, "127.0.0.1"); err != nil {
		f.t.Fatalf("checkin %s: %v", id, err)
	}
}

// TestLatencyAndHistoryPages: a real store and controller, two nodes
// reporting pings, one FATAL shard. Before any sample the fleet page says
// there is no history; after the sampler's first sample (and older ones
// stored for the chart) the page, fetched as plain HTML with no script
// run, holds both charts with their accessible title and description, the
// table fallback and the fleet's percentiles; the node page shows each
// shard's ping in text and colour; /latency colours the map and gives
// each node's percentiles.
func TestLatencyAndHistoryPages(t *testing.T) {
	f := newTestFleet(t, fleetOpts{total: 64, maxConc: 4})
	f.addNodes(32, "node-a", "node-b")
	f.mu.Lock()
	f.state["40"] = appliance.ShardFatal
	f.mu.Unlock()
	f.settle("node-a", "node-b")
	// node-a: 0..31 at 20..51 ms; node-b: 32..63 at 300 ms (40 FATAL, 63 not measured yet).
	f.reportPings("node-a", func(s uint32) float64 { return 20 + float64(s) })
	f.reportPings("node-b", func(s uint32) float64 {
		if s == 63 {
			return 0
		}
		return 300
	})
	c := f.client()
	f.login(c, testToken)

	code, page := get(t, c, f.srv.URL+"/")
	if code != http.StatusOK || !strings.Contains(page, "No history yet") || !strings.Contains(page, "No READY shard has a measured heartbeat latency yet") {
		t.Fatalf("fleet page before any sample: %d\n%.2000s", code, page)
	}
	ctx := context.Background()
	// Three hours ago the fleet had 10 shards FATAL for a minute.
	now := time.Now()
	if err := f.store.AddHistory(ctx, store.HistorySample{At: now.Add(-3 * time.Hour), Ready: 54, Fatal: 10,
		PingCount: 54, PingP50: 35, PingP90: 250, PingP99: 2500, PingMax: 3000}); err != nil {
		t.Fatal(err)
	}
	sampler := history.Sampler{Stats: f.ctrl.FleetStats, Store: f.store}
	if err := sampler.Once(ctx); err != nil {
		t.Fatal(err)
	}
	code, page = get(t, c, f.srv.URL+"/")
	// 62 measured: 20..51 (32) and 300 (30). p50 is the 31st: 50 ms; p90
	// the 56th and p99 the 62nd: 300 ms.
	for _, want := range []string{
		`id="latency"`, "over 62 READY shards",
		`<dt>p50</dt><dd><span class="lat l-1" title="50.000 ms"><i aria-hidden="true"></i>50 ms</span>`,
		`<dt>p90</dt><dd><span class="lat l-3" title="300.000 ms">`,
		`<figure class="chart" id="chart-states">`, `<svg viewBox="0 0 1440 300" role="img" aria-labelledby="chart-states-t chart-states-d"`,
		`<desc id="chart-states-d">Worst minute`, "10 of 64 shards not READY", `<desc id="chart-ping-d">Highest p99 2.50 s`,
		`class="series s-r area" d="M`, `class="series s-f area" d="M`, `class="series q50" d="M`,
		`<details id="history-table">`, "2 minutes sampled",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("fleet page lacks %q", want)
		}
	}
	if t.Failed() {
		t.Fatalf("fleet page:\n%s", page[strings.Index(page, `id="latency"`)-20:])
	}

	_, node := get(t, c, f.srv.URL+"/nodes/node-b")
	for _, want := range []string{
		`id="node-latency"`, "30 READY shards", `<dt>Ping</dt><dd><span class="lat l-3" title="300.000 ms">`,
		`<dt>Ping</dt><dd><span class="lat l-n"><i aria-hidden="true"></i>no ping</span>`,
		`aria-label="Latency colour scale"`,
	} {
		if !strings.Contains(node, want) {
			t.Errorf("node page lacks %q", want)
		}
	}

	code, lat := get(t, c, f.srv.URL+"/latency")
	if code != http.StatusOK {
		t.Fatalf("/latency: %d", code)
	}
	for _, want := range []string{
		"64 shards, one cell each", "62 READY shards measured", `<a href="/nodes/node-a">node-a</a>`,
		`<i class=l-1 title="0: 20 ms"></i>`, `<i class=l-3 title="32: 300 ms"></i>`, `<i class=l-n title="40: no ping"></i>`,
		`p50 <span class="lat l-1" title="35.000 ms">`, // node-a's 32 pings 20..51: the 16th
	} {
		if !strings.Contains(lat, want) {
			t.Errorf("/latency lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("/latency:\n%s", lat)
	}
	// Logged out, the new page is not served.
	if code, _ := get(t, f.client(), f.srv.URL+"/latency"); code != http.StatusSeeOther {
		t.Errorf("/latency without a session: %d, want a redirect to the login", code)
	}
}

// TestLatencyMapAggregates: at 131,072 shards the latency map has the
// shard map's 32 shards per cell, a cell shows its highest READY ping,
// shards not READY or pending do not count, and a gap between ranges is
// a "no owner" group.
func TestLatencyMapAggregates(t *testing.T) {
	const total, nodes = 131072, 8
	fs := controller.FleetStats{Shards: make([]controller.ShardStats, total)}
	per := uint32(total / nodes)
	for i := range nodes {
		start := uint32(i) * per
		count := per
		if i == 1 {
			start, count = start+64, count-64 // shards per..per+63 have no owner
		}
		fs.Nodes = append(fs.Nodes, controller.NodeStats{ID: fmt.Sprintf("n%d", i), Live: true, Range: controller.Range{Start: start, Count: count}})
	}
	fs.Nodes = append(fs.Nodes, controller.NodeStats{ID: "down"})
	for s := range fs.Shards {
		n := int32(uint32(s) / per)
		if n == 1 && uint32(s) < per+64 {
			fs.Shards[s] = controller.ShardStats{Node: -1}
			continue
		}
		fs.Shards[s] = controller.ShardStats{Node: n, Held: true, Reported: true, State: appliance.ShardReady, PingMS: float64(s%32) + 1}
	}
	fs.Shards[63] = controller.ShardStats{Node: 0, Held: true, Reported: true, State: appliance.ShardFatal, PingMS: 999}
	fs.Shards[95].Held = false // pending hand-off
	fs.Shards[95].PingMS = 999
	m := BuildLatencyMap(&fs)
	if m.BlockSize != 32 || len(m.Groups) != nodes+1 || len(m.Groups[0].Cells) != int(per)/32 {
		t.Fatalf("block %d, %d groups, %d cells in the first", m.BlockSize, len(m.Groups), len(m.Groups[0].Cells))
	}
	if c := m.Groups[0].Cells[0]; c.Title != "0–31: highest 32 ms" || c.Band != view.BandFast {
		t.Errorf("cell 0: %+v", c)
	}
	if c := m.Groups[0].Cells[1]; c.Title != "32–63: highest 31 ms" {
		t.Errorf("cell 1 (its FATAL shard's ping left out): %+v", c)
	}
	if c := m.Groups[0].Cells[2]; c.Title != "64–95: highest 31 ms" {
		t.Errorf("cell 2 (its pending shard's ping left out): %+v", c)
	}
	if g := m.Groups[1]; g.NodeID != "" || g.Start != per || g.End != per+63 || g.Ping.N != 0 || len(g.Cells) != 2 || g.Cells[0].Band != view.BandNone {
		t.Errorf("the gap: %q %d–%d, %d pings, %d cells", g.NodeID, g.Start, g.End, g.Ping.N, len(g.Cells))
	}
	if m.Fleet.N != total-64-2 || m.Fleet.P50.MS != 16 || m.Fleet.Max.MS != 32 {
		t.Errorf("fleet percentiles %+v", m.Fleet)
	}
}

// TestLatencyMapCompact: with more groups than CompactGroups the latency
// map is one grid of MaxMapCells cells over every shard, and its text is
// the SlowestNodes nodes by p99, slowest first.
func TestLatencyMapCompact(t *testing.T) {
	const total, nodes = 131072, 1024
	fs := controller.FleetStats{Shards: make([]controller.ShardStats, total)}
	per := uint32(total / nodes)
	for i := range nodes {
		fs.Nodes = append(fs.Nodes, controller.NodeStats{ID: fmt.Sprintf("n%04d", i), Live: true, Range: controller.Range{Start: uint32(i) * per, Count: per}})
	}
	for s := range fs.Shards {
		n := int32(uint32(s) / per)
		fs.Shards[s] = controller.ShardStats{Node: n, Held: true, Reported: true, State: appliance.ShardReady, PingMS: 10 + float64(n)}
	}
	m := BuildLatencyMap(&fs)
	if !m.Compact || len(m.Groups) != 1 || len(m.Groups[0].Cells) != MaxMapCells {
		t.Fatalf("compact %v, %d groups, %d cells", m.Compact, len(m.Groups), len(m.Groups[0].Cells))
	}
	if len(m.Slowest) != SlowestNodes || m.Slowest[0].NodeID != "n1023" || m.Slowest[0].Ping.P99.MS != 1033 || m.Slowest[19].NodeID != "n1004" {
		t.Fatalf("slowest: %d, first %+v, last %q", len(m.Slowest), m.Slowest[0], m.Slowest[len(m.Slowest)-1].NodeID)
	}
	if m.Fleet.N != total || m.Fleet.Max.MS != 1033 {
		t.Fatalf("fleet %+v", m.Fleet)
	}
}

// TestBuildHistoryWindow: the charts cover the 1,440 minutes up to and
// including now's; older samples are left out, and the latency panel
// shows the newest sample.
func TestBuildHistoryWindow(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 30, 40, 0, time.UTC)
	samples := []store.HistorySample{
		{At: now.Add(-24 * time.Hour).Truncate(time.Minute), Ready: 1},                    // the minute just outside
		{At: now.Add(-24*time.Hour + time.Minute).Truncate(time.Minute), Ready: 2},        // the oldest inside
		{At: now.Truncate(time.Minute), Ready: 3, PingCount: 3, PingP50: 7, PingMax: 9.5}, // now's minute
	}
	p, h := BuildHistory(samples, now)
	if h.Minutes != 2 || h.From != time.Date(2026, 12, 1, 12, 31, 0, 0, time.UTC) || h.To != time.Date(2026, 12, 2, 12, 31, 0, 0, time.UTC) {
		t.Fatalf("window %v..%v with %d minutes", h.From, h.To, h.Minutes)
	}
	if p.N != 3 || p.P50.MS != 7 || p.Max.MS != 9.5 || !p.At.Equal(now.Truncate(time.Minute)) {
		t.Fatalf("latest percentiles %+v", p)
	}
	if len(samples) != 3 {
		t.Fatal("BuildHistory changed its argument")
	}
}
