package templates

import (
	"strings"
	"testing"
	"time"

	"github.com/a-h/templ"

	"github.com/discord-pxe/dpxe/web/view"
)

// TestLatencyAndHistoryComponents renders the latency and history
// components: every latency shows its number in text and its exact value
// on hover beside the colour, the charts are inline SVG with a title and
// description the SVG is labelled by, and the table fallback is there
// without any script.
func TestLatencyAndHistoryComponents(t *testing.T) {
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	from, to := at.Add(-24*time.Hour), at
	var pts []view.HistoryPoint
	for m := range 24 * 60 {
		p := view.HistoryPoint{At: from.Add(time.Duration(m) * time.Minute), PingN: 60, P50: 40, P90: 90, P99: 300}
		p.Counts[view.Ready], p.Counts[view.Fatal] = 60, 4
		pts = append(pts, p)
	}
	hist := view.History{From: from, To: to, Minutes: len(pts), States: view.StatesChart(pts, from, to, view.ChartBuckets),
		Ping: view.PingChart(pts, from, to, view.ChartBuckets), Hours: view.HourRows(pts, from, to)}
	pct := view.Percentiles{N: 60, At: at, P50: view.Ping{MS: 40}, P90: view.Ping{MS: 90}, P99: view.Ping{MS: 300}, Max: view.Ping{MS: 1200.5}}
	cases := []struct {
		name  string
		comp  templ.Component
		has   []string
		hasnt []string
	}{
		{"ping value", PingValue(view.Ping{MS: 41.5}), []string{`class="lat l-1"`, `title="41.500 ms"`, `<i aria-hidden="true"></i>42 ms`}, nil},
		{"no ping", PingValue(view.Ping{}), []string{`<span class="lat l-n"><i aria-hidden="true"></i>no ping</span>`}, []string{"title"}},
		{"legend", LatencyLegend(), []string{`aria-label="Latency colour scale"`, "under 100 ms", "1 s and more", "no ping yet", `class="lat l-5"`}, nil},
		{"latency panel", LatencyPanel(pct), []string{`id="latency"`, "over 60 READY shards", `datetime="2026-12-01T12:00:00.000Z"`,
			"<dt>p99</dt><dd><span class=\"lat l-3\"", "1.20 s", `href="/latency"`}, []string{"No READY shard"}},
		{"latency panel empty", LatencyPanel(view.Percentiles{}), []string{"No READY shard has a measured heartbeat latency yet"}, []string{"<dt>p50"}},
		{"history", HistoryPanel(hist), []string{`id="history"`, "1440 minutes sampled", `<figure class="chart" id="chart-states">`,
			`role="img" aria-labelledby="chart-states-t chart-states-d"`, `<title id="chart-states-t">Shards by state, 12:00Z to 12:00Z</title>`,
			`<desc id="chart-ping-d">Highest p99 300 ms`, `class="series s-r area" d="M`, `class="series s-f area"`, `class="series q99" d="M`,
			`<details id="history-table">`, `<th scope="row">Nov 30 12:00Z</th>`, `<td class="n">60–60</td>`, `xmlns="http://www.w3.org/2000/svg"`},
			[]string{"<script", "No history yet", `class="series s-p`}},
		{"history empty", HistoryPanel(view.History{From: from, To: to}), []string{"No history yet"}, []string{"<svg"}},
		{"history error", HistoryPanel(view.History{Error: "disk on fire"}), []string{`<p class="error">disk on fire</p>`}, nil},
		{"shard map links its latency view", ShardMapHead(view.ShardMap{Total: 8, BlockSize: 1}), []string{`<a href="/latency" id="map-latency">`}, nil},
		{"node latency", NodeLatency(pct), []string{`id="node-latency"`, "60 READY shards", "<dt>max</dt>"}, nil},
		{"shard card ping", ShardCard(view.ShardRow{ID: 3, State: view.Ready, Ping: view.Ping{MS: 612}}),
			[]string{"<dt>Ping</dt><dd><span class=\"lat l-4\" title=\"612.000 ms\">", "612 ms"}, nil},
		{"latency map", LatencyPage(view.LatencyMap{Total: 64, BlockSize: 32, Fleet: pct, Groups: []view.LatencyGroup{
			{NodeID: "n1", Href: "/nodes/n1", Start: 0, End: 31, Ping: pct, Cells: []view.LatencyCell{{Band: view.BandSlow, Title: "0–31: highest 300 ms"}}},
			{Start: 32, End: 63, Cells: []view.LatencyCell{{Band: view.BandNone, Title: `32–63: no "ping"`}}}}}),
			[]string{"32 per cell", `<i class=l-3 title="0–31: highest 300 ms"></i>`, `title="32–63: no &#34;ping&#34;"`, `id="lg32"`,
				"no READY shard with a ping", `<a href="/nodes/n1">n1</a>`, "60 READY shards measured"}, []string{`no "ping"`}},
	}
	for _, c := range cases {
		html := render(t, c.comp)
		for _, s := range c.has {
			if !strings.Contains(html, s) {
				t.Errorf("%s: missing %q in\n%.3000s", c.name, s, html)
			}
		}
		for _, s := range c.hasnt {
			if strings.Contains(html, s) {
				t.Errorf("%s: should not contain %q", c.name, s)
			}
		}
	}
}
