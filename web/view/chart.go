package view

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// This file is the geometry of the dashboard's 24-hour history charts:
// server-rendered SVG, so the templ component only writes out the paths
// and labels computed here. A chart is drawn in a fixed viewBox and scales
// with the page. The minutes are grouped into buckets (five minutes each
// over a day) so a chart stays a few kilobytes: a bucket shows its worst
// minute (fewest READY shards) and its highest percentiles, so a short
// incident is not averaged away. Buckets without samples (dpxe serve was
// down) leave a gap.

// HistoryPoint is one stored minute as the charts take it.
type HistoryPoint struct {
	At     time.Time
	Counts [NumStates]int
	// PingN is how many READY shards the percentiles are over; 0: none.
	PingN         int
	P50, P90, P99 float64 // milliseconds
}

// total is the number of shards in the point.
func (p HistoryPoint) total() int {
	n := 0
	for _, c := range p.Counts {
		n += c
	}
	return n
}

// Chart viewBox and plot area, in viewBox units.
const (
	ChartW     = 1440
	ChartH     = 300
	plotLeft   = 110 // room for the y labels
	plotRight  = 60
	plotTop    = 16
	plotBottom = 44 // room for the x labels
)

// Rect is a rectangle in viewBox units.
type Rect struct{ X, Y, W, H int }

// Tick is an axis label at a position (X for the time axis, Y for the
// value axis).
type Tick struct {
	Pos   int
	Label string
}

// ChartSeries is one drawn series: a filled band of a stacked chart or a
// line.
type ChartSeries struct {
	Label string
	Class string // CSS class giving the colour (a state's or a percentile's)
	D     string // SVG path data, "" when the series has nothing to draw
	Area  bool   // a filled band rather than a line
}

// Chart is one SVG chart.
type Chart struct {
	ID     string // element ID; the title and description are ID-t and ID-d
	Title  string
	Desc   string // what the chart shows, in words, for screen readers
	Plot   Rect
	XTicks []Tick
	YTicks []Tick
	Series []ChartSeries
}

// ViewBox is the SVG viewBox attribute.
func (c Chart) ViewBox() string { return "0 0 " + strconv.Itoa(ChartW) + " " + strconv.Itoa(ChartH) }

// plotRect is the plot area of every chart.
var plotRect = Rect{X: plotLeft, Y: plotTop, W: ChartW - plotLeft - plotRight, H: ChartH - plotTop - plotBottom}

// bucket is one column of a chart: its worst minute for states and the
// highest percentiles for pings.
type bucket struct {
	has           bool
	worst         HistoryPoint // the minute with the fewest READY shards
	pinged        bool
	p50, p90, p99 float64
}

// bucketize groups points in [from, to) into n equal buckets.
func bucketize(points []HistoryPoint, from, to time.Time, n int) []bucket {
	out := make([]bucket, n)
	span := to.Sub(from)
	if span <= 0 || n <= 0 {
		return out
	}
	for _, p := range points {
		if p.At.Before(from) || !p.At.Before(to) {
			continue
		}
		i := int(int64(p.At.Sub(from)) * int64(n) / int64(span))
		b := &out[i]
		if !b.has || p.Counts[Ready] < b.worst.Counts[Ready] {
			b.worst = p
		}
		b.has = true
		if p.PingN > 0 {
			b.pinged = true
			b.p50, b.p90, b.p99 = max(b.p50, p.P50), max(b.p90, p.P90), max(b.p99, p.P99)
		}
	}
	return out
}

// edge is the x of bucket i's left edge (i == n: the right end).
func edge(i, n int) int { return plotRect.X + i*plotRect.W/n }

// yOf places v on a value axis from 0 (bottom) to top.
func yOf(v, top float64) int {
	if top <= 0 {
		return plotRect.Y + plotRect.H
	}
	f := min(max(v/top, 0), 1)
	return plotRect.Y + plotRect.H - int(math.Round(f*float64(plotRect.H)))
}

// stepPath draws a step line through runs of buckets that have a value:
// each bucket is a flat segment across its width; a bucket without one
// ends the run. With a lower function each run is closed along that
// lower step line, right to left, into a filled band (stacked areas).
// Neighbouring buckets at the same height share one segment.
func stepPath(n int, val func(i int) (float64, bool), lower func(i int) float64, top float64) string {
	var b strings.Builder
	// steps writes the segments from x0: for each bucket, a vertical move
	// to its height (when it differs) and a horizontal one to its far edge,
	// merged while the height stays.
	steps := func(ys []int, xs []int) {
		for k := range ys {
			if k > 0 && ys[k] != ys[k-1] {
				b.WriteString("V" + strconv.Itoa(ys[k]))
			}
			if k == len(ys)-1 || ys[k+1] != ys[k] {
				b.WriteString("H" + strconv.Itoa(xs[k]))
			}
		}
	}
	for i := 0; i < n; {
		if _, ok := val(i); !ok {
			i++
			continue
		}
		start := i
		var ys, xs []int
		for ; i < n; i++ {
			v, ok := val(i)
			if !ok {
				break
			}
			ys, xs = append(ys, yOf(v, top)), append(xs, edge(i+1, n))
		}
		b.WriteString("M" + strconv.Itoa(edge(start, n)) + "," + strconv.Itoa(ys[0]))
		steps(ys, xs)
		if lower != nil {
			ys, xs = ys[:0], xs[:0]
			for j := i - 1; j >= start; j-- {
				ys, xs = append(ys, yOf(lower(j), top)), append(xs, edge(j, n))
			}
			b.WriteString("V" + strconv.Itoa(ys[0]))
			steps(ys, xs)
			b.WriteByte('Z')
		}
	}
	return b.String()
}

// timeTicks labels the time axis every six hours from from, and at to.
func timeTicks(from, to time.Time) []Tick {
	var out []Tick
	span := to.Sub(from)
	step := span / 4
	if step <= 0 {
		return nil
	}
	for i := 0; i <= 4; i++ {
		t := from.Add(time.Duration(i) * step)
		out = append(out, Tick{Pos: plotRect.X + int(int64(i)*int64(plotRect.W)/4), Label: t.UTC().Format("15:04Z")})
	}
	return out
}

// valueTicks labels the value axis at 0, half and top.
func valueTicks(top float64, format func(float64) string) []Tick {
	return []Tick{{yOf(0, top), format(0)}, {yOf(top/2, top), format(top / 2)}, {yOf(top, top), format(top)}}
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// ChartBuckets is how many columns a 24-hour chart has: five minutes each.
const ChartBuckets = 288

// chartStack is the stacking order of the states chart, bottom up:
// READY first, then the states in order of attention.
var chartStack = []State{Ready, Held, Starting, Pending, Backoff, Fatal, Unowned}

// StatesChart is a stacked step chart of shard counts by state over
// [from, to), the states with no shard in the window left out.
func StatesChart(points []HistoryPoint, from, to time.Time, n int) Chart {
	c := Chart{ID: "chart-states", Title: "Shards by state, " + from.UTC().Format("15:04Z") + " to " + to.UTC().Format("15:04Z"),
		Plot: plotRect, XTicks: timeTicks(from, to)}
	bs := bucketize(points, from, to, n)
	top := 0
	seen := [NumStates]bool{}
	worst, worstAt := -1, time.Time{}
	for _, b := range bs {
		if !b.has {
			continue
		}
		top = max(top, b.worst.total())
		for s, v := range b.worst.Counts {
			seen[s] = seen[s] || v > 0
		}
		if t := b.worst.total() - b.worst.Counts[Ready]; t > worst {
			worst, worstAt = t, b.worst.At
		}
	}
	c.YTicks = valueTicks(float64(top), func(v float64) string { return strconv.Itoa(int(math.Round(v))) })
	for k, s := range chartStack {
		if !seen[s] {
			continue
		}
		below := func(i int) float64 {
			sum := 0
			for _, t := range chartStack[:k] {
				sum += bs[i].worst.Counts[t]
			}
			return float64(sum)
		}
		val := func(i int) (float64, bool) {
			if !bs[i].has {
				return 0, false
			}
			return below(i) + float64(bs[i].worst.Counts[s]), true
		}
		c.Series = append(c.Series, ChartSeries{Label: s.Name(), Class: s.Class(), Area: true,
			D: stepPath(n, val, below, float64(top))})
	}
	switch {
	case top == 0:
		c.Desc = "No samples in this window."
	case worst <= 0:
		c.Desc = fmt.Sprintf("Every sampled minute had all %d shards READY.", top)
	default:
		last := lastPoint(points)
		c.Desc = fmt.Sprintf("Worst minute %s: %d of %d shards not READY. Latest minute %s: %d READY, %d not.",
			worstAt.UTC().Format("15:04Z"), worst, top, last.At.UTC().Format("15:04Z"), last.Counts[Ready], last.total()-last.Counts[Ready])
	}
	return c
}

// lastPoint is the newest point (points are oldest first).
func lastPoint(points []HistoryPoint) HistoryPoint {
	if len(points) == 0 {
		return HistoryPoint{}
	}
	return points[len(points)-1]
}

// PingChart is a step chart of the ping percentiles p50, p90 and p99 over
// [from, to), on a scale from 0 to a round number above the highest p99.
func PingChart(points []HistoryPoint, from, to time.Time, n int) Chart {
	c := Chart{ID: "chart-ping", Title: "Shard heartbeat latency p50, p90 and p99, " + from.UTC().Format("15:04Z") + " to " + to.UTC().Format("15:04Z"),
		Plot: plotRect, XTicks: timeTicks(from, to)}
	bs := bucketize(points, from, to, n)
	peak, peakAt := 0.0, time.Time{}
	for i, b := range bs {
		if b.pinged && b.p99 > peak {
			peak, peakAt = b.p99, from.Add(time.Duration(int64(i)*int64(to.Sub(from))/int64(n)))
		}
	}
	top := niceCeil(max(peak, 10))
	c.YTicks = valueTicks(top, func(v float64) string {
		if v == 0 {
			return "0"
		}
		return Ping{MS: v}.Text()
	})
	for _, s := range []struct {
		label, class string
		get          func(b bucket) float64
	}{
		{"p50", "q50", func(b bucket) float64 { return b.p50 }},
		{"p90", "q90", func(b bucket) float64 { return b.p90 }},
		{"p99", "q99", func(b bucket) float64 { return b.p99 }},
	} {
		val := func(i int) (float64, bool) { return s.get(bs[i]), bs[i].pinged }
		c.Series = append(c.Series, ChartSeries{Label: s.label, Class: s.class, D: stepPath(n, val, nil, top)})
	}
	if peak == 0 {
		c.Desc = "No READY shard had a measured ping in this window."
	} else {
		c.Desc = fmt.Sprintf("Highest p99 %s, in the 5 minutes from %s.", Ping{MS: peak}.Text(), peakAt.UTC().Format("15:04Z"))
		for i := len(points) - 1; i >= 0; i-- {
			if p := points[i]; p.PingN > 0 {
				c.Desc += fmt.Sprintf(" Latest minute %s: p50 %s, p90 %s, p99 %s over %d shards.", p.At.UTC().Format("15:04Z"),
					Ping{p.P50}.Text(), Ping{p.P90}.Text(), Ping{p.P99}.Text(), p.PingN)
				break
			}
		}
	}
	return c
}

// HourRow is one hour of the history table, the charts' text fallback.
type HourRow struct {
	Hour     string // "Dec 1 11:00Z"
	Minutes  int    // minutes sampled in the hour
	ReadyMin int    // fewest READY shards in a minute
	ReadyMax int
	// NotReadyMax is the most shards not READY in one minute.
	NotReadyMax   int
	P50, P90, P99 Ping // the hour's highest
}

// HourRows summarises the points in [from, to) hour by hour, oldest
// first; hours without samples are left out.
func HourRows(points []HistoryPoint, from, to time.Time) []HourRow {
	var out []HourRow
	for _, p := range points {
		if p.At.Before(from) || !p.At.Before(to) {
			continue
		}
		h := p.At.UTC().Truncate(time.Hour).Format("Jan 2 15:04Z")
		if len(out) == 0 || out[len(out)-1].Hour != h {
			out = append(out, HourRow{Hour: h, ReadyMin: p.Counts[Ready]})
		}
		r := &out[len(out)-1]
		r.Minutes++
		r.ReadyMin, r.ReadyMax = min(r.ReadyMin, p.Counts[Ready]), max(r.ReadyMax, p.Counts[Ready])
		r.NotReadyMax = max(r.NotReadyMax, p.total()-p.Counts[Ready])
		if p.PingN > 0 {
			r.P50.MS, r.P90.MS, r.P99.MS = max(r.P50.MS, p.P50), max(r.P90.MS, p.P90), max(r.P99.MS, p.P99)
		}
	}
	return out
}

// History is the fleet page's 24-hour history panel.
type History struct {
	From, To time.Time
	Minutes  int // samples in the window
	States   Chart
	Ping     Chart
	Hours    []HourRow
	Error    string // the history could not be read
}
