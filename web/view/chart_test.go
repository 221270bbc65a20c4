package view

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestBands(t *testing.T) {
	for _, c := range []struct {
		ms   float64
		band Band
		text string
	}{
		{0, BandNone, "no ping"}, {-1, BandNone, "no ping"}, {0.25, BandFast, "0.2 ms"}, {42.4, BandFast, "42 ms"},
		{99.999, BandFast, "100 ms"}, {100, BandFair, "100 ms"}, {249, BandFair, "249 ms"}, {250, BandSlow, "250 ms"},
		{500, BandPoor, "500 ms"}, {999, BandPoor, "999 ms"}, {1000, BandBad, "1.00 s"}, {4999, BandBad, "5.00 s"},
	} {
		p := Ping{MS: c.ms}
		if p.Band() != c.band || p.Text() != c.text {
			t.Errorf("%v ms: band %d %q, want %d %q", c.ms, p.Band(), p.Text(), c.band, c.text)
		}
	}
	for b := Band(0); b < NumBands; b++ {
		if b.Class() == "" || b.Label() == "" {
			t.Errorf("band %d has no class or label", b)
		}
	}
}

func TestStepPath(t *testing.T) {
	e := func(i int) int { return edge(i, 4) }
	y := func(v float64) int { return yOf(v, 2) }
	vals := map[int]float64{0: 1, 1: 1, 3: 2}
	val := func(i int) (float64, bool) { v, ok := vals[i]; return v, ok }
	// A line: two equal buckets merge into one segment; the gap at 2
	// starts a new run.
	want := fmt.Sprintf("M%d,%dH%dM%d,%dH%d", e(0), y(1), e(2), e(3), y(2), e(4))
	if got := stepPath(4, val, nil, 2); got != want {
		t.Errorf("line %q, want %q", got, want)
	}
	// A band: up the steps, back along the lower line, closed.
	vals = map[int]float64{0: 2, 1: 1}
	lower := func(int) float64 { return 0 }
	want = fmt.Sprintf("M%d,%dH%dV%dH%dV%dH%dZ", e(0), y(2), e(1), y(1), e(2), y(0), e(0))
	if got := stepPath(4, val, lower, 2); got != want {
		t.Errorf("band %q, want %q", got, want)
	}
	if got := stepPath(4, func(int) (float64, bool) { return 0, false }, nil, 2); got != "" {
		t.Errorf("nothing to draw: %q", got)
	}
	// The axis runs from the bottom of the plot (0) to its top (top).
	if yOf(0, 2) != plotRect.Y+plotRect.H || yOf(2, 2) != plotRect.Y || yOf(5, 2) != plotRect.Y || yOf(1, 0) != plotRect.Y+plotRect.H {
		t.Errorf("yOf: 0→%d top→%d over→%d no scale→%d", yOf(0, 2), yOf(2, 2), yOf(5, 2), yOf(1, 0))
	}
	if edge(0, 4) != plotRect.X || edge(4, 4) != plotRect.X+plotRect.W {
		t.Errorf("edges %d..%d, want %d..%d", edge(0, 4), edge(4, 4), plotRect.X, plotRect.X+plotRect.W)
	}
}

func point(at time.Time, ready, fatal int, p99 float64) HistoryPoint {
	p := HistoryPoint{At: at}
	p.Counts[Ready], p.Counts[Fatal] = ready, fatal
	if p99 > 0 {
		p.PingN, p.P50, p.P90, p.P99 = ready, p99/4, p99/2, p99
	}
	return p
}

func TestBucketize(t *testing.T) {
	from := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	to := from.Add(time.Hour)
	pts := []HistoryPoint{
		point(from.Add(-time.Minute), 0, 8, 0), // before the window
		point(from, 8, 0, 40),
		point(from.Add(5*time.Minute), 6, 2, 300), // the worst minute of bucket 0 (12 min each)
		point(from.Add(11*time.Minute), 8, 0, 50),
		point(from.Add(59*time.Minute), 7, 1, 0), // bucket 4, no ping
		point(to, 0, 8, 0),                       // after
	}
	bs := bucketize(pts, from, to, 5)
	if !bs[0].has || bs[0].worst.Counts[Ready] != 6 || bs[0].p99 != 300 || bs[0].p50 != 75 {
		t.Errorf("bucket 0: %+v", bs[0])
	}
	if bs[1].has || bs[2].has || bs[3].has {
		t.Errorf("buckets 1..3 should be gaps: %+v", bs[1:4])
	}
	if !bs[4].has || bs[4].pinged || bs[4].worst.Counts[Fatal] != 1 {
		t.Errorf("bucket 4: %+v", bs[4])
	}
}

func TestStatesAndPingCharts(t *testing.T) {
	from := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	to := from.Add(24 * time.Hour)
	var pts []HistoryPoint
	for m := range 24 * 60 {
		ready, fatal, p99 := 2048, 0, 120.0
		if m >= 600 && m < 603 {
			ready, fatal, p99 = 2000, 48, 2400
		}
		pts = append(pts, point(from.Add(time.Duration(m)*time.Minute), ready, fatal, p99))
	}
	st := StatesChart(pts, from, to, ChartBuckets)
	if len(st.Series) != 2 || st.Series[0].Label != "READY" || st.Series[1].Label != "FATAL" || !st.Series[0].Area {
		t.Fatalf("series %+v", st.Series)
	}
	if st.YTicks[2].Label != "2048" || st.YTicks[2].Pos != plotRect.Y || st.XTicks[0].Label != "12:00Z" || st.XTicks[4].Label != "12:00Z" {
		t.Errorf("ticks %+v %+v", st.YTicks, st.XTicks)
	}
	if !strings.Contains(st.Desc, "Worst minute 22:00Z: 48 of 2048 shards not READY") || !strings.HasSuffix(st.Desc, "2048 READY, 0 not.") {
		t.Errorf("desc %q", st.Desc)
	}
	// One bucket (22:00–22:05) of FATAL: a single closed band.
	if d := st.Series[1].D; strings.Count(d, "M") != 1 || !strings.HasSuffix(d, "Z") {
		t.Errorf("fatal band %q", d)
	}
	pc := PingChart(pts, from, to, ChartBuckets)
	if len(pc.Series) != 3 || pc.YTicks[2].Label != "5.00 s" {
		t.Errorf("ping chart top %+v", pc.YTicks)
	}
	if !strings.Contains(pc.Desc, "Highest p99 2.40 s, in the 5 minutes from 22:00Z") || !strings.Contains(pc.Desc, "p99 120 ms over 2048 shards") {
		t.Errorf("desc %q", pc.Desc)
	}
	// A whole day in a few kilobytes.
	size := 0
	for _, c := range []Chart{st, pc} {
		for _, s := range c.Series {
			size += len(s.D)
		}
	}
	if size > 4000 {
		t.Errorf("paths of a steady day take %d bytes", size)
	}
	hours := HourRows(pts, from, to)
	if len(hours) != 24 || hours[10].Hour != "Dec 1 22:00Z" || hours[10].ReadyMin != 2000 || hours[10].NotReadyMax != 48 || hours[10].P99.MS != 2400 || hours[10].Minutes != 60 {
		t.Errorf("hour rows: %d, %+v", len(hours), hours[10])
	}
	empty := StatesChart(nil, from, to, ChartBuckets)
	if len(empty.Series) != 0 || empty.Desc != "No samples in this window." {
		t.Errorf("empty chart %+v", empty)
	}
	if pe := PingChart(nil, from, to, ChartBuckets); pe.Desc != "No READY shard had a measured ping in this window." || pe.YTicks[2].Label != "10 ms" || pe.YTicks[0].Label != "0" {
		t.Errorf("empty ping chart %+v", pe)
	}
}

func TestNiceCeil(t *testing.T) {
	for in, want := range map[float64]float64{0: 1, 7: 10, 10: 10, 11: 20, 120: 200, 2400: 5000, 5001: 10000} {
		if got := niceCeil(in); got != want {
			t.Errorf("niceCeil(%v) = %v, want %v", in, got, want)
		}
	}
}
