package view

import (
	"strconv"
	"time"
)

// Band is a step of the dashboard's heartbeat-latency colour scale. Every
// latency shown in a band's colour also shows its number in text, so colour
// is never the only signal.
type Band uint8

// Latency bands, from no measurement to the slowest. The bounds follow
// what an operator does about them: under 100 ms is a healthy Gateway
// connection, a few hundred is a distant or busy node, a second and more
// is near the point where the kernel flags an ACK late (ack_slow) and the
// health verdict's bound (5 s).
const (
	BandNone Band = iota // no heartbeat ACK measured yet
	BandFast             // under 100 ms
	BandFair             // 100 to 250 ms
	BandSlow             // 250 to 500 ms
	BandPoor             // 500 ms to 1 s
	BandBad              // 1 s and more
	NumBands
)

// bandUpper are the bands' exclusive upper bounds in milliseconds.
var bandUpper = [NumBands]float64{BandFast: 100, BandFair: 250, BandSlow: 500, BandPoor: 1000}

var bandInfo = [NumBands][2]string{
	BandNone: {"l-n", "no ping yet"},
	BandFast: {"l-1", "under 100 ms"},
	BandFair: {"l-2", "100–250 ms"},
	BandSlow: {"l-3", "250–500 ms"},
	BandPoor: {"l-4", "500 ms–1 s"},
	BandBad:  {"l-5", "1 s and more"},
}

// BandOf returns the band of a latency in milliseconds; 0 or less (and
// NaN) means not measured.
func BandOf(ms float64) Band {
	if !(ms > 0) {
		return BandNone
	}
	for b := BandFast; b < BandBad; b++ {
		if ms < bandUpper[b] {
			return b
		}
	}
	return BandBad
}

// Class is the CSS class that gives the band its colour.
func (b Band) Class() string { return bandInfo[b%NumBands][0] }

// Label names the band's range, for the legend.
func (b Band) Label() string { return bandInfo[b%NumBands][1] }

// BandOrder is the legend's order.
var BandOrder = []Band{BandFast, BandFair, BandSlow, BandPoor, BandBad, BandNone}

// Ping is one latency for display: a shard's last ping or a percentile.
type Ping struct {
	MS float64 // 0: not measured
}

// Band is the ping's colour band.
func (p Ping) Band() Band { return BandOf(p.MS) }

// Text is the latency as people read it: "42 ms", "3.2 ms", "1.25 s",
// "no ping" when not measured.
func (p Ping) Text() string {
	switch {
	case !(p.MS > 0):
		return "no ping"
	case p.MS < 10:
		return strconv.FormatFloat(p.MS, 'f', 1, 64) + " ms"
	case p.MS < 1000:
		return strconv.FormatFloat(p.MS, 'f', 0, 64) + " ms"
	}
	return strconv.FormatFloat(p.MS/1000, 'f', 2, 64) + " s"
}

// Exact is the latency to the microsecond, for a title on hover.
func (p Ping) Exact() string {
	if !(p.MS > 0) {
		return "no heartbeat ACK measured yet"
	}
	return strconv.FormatFloat(p.MS, 'f', 3, 64) + " ms"
}

// Percentiles are the heartbeat latencies of a set of READY shards.
type Percentiles struct {
	N                  int // shards measured; 0: none
	P50, P90, P99, Max Ping
	// At is when they were measured (a history sample's minute); zero
	// for "now".
	At time.Time
}

// LatencyCell is one cell of the latency map: one shard, or a block of
// shards shown by the highest last ping among its READY shards.
type LatencyCell struct {
	Band  Band
	Title string // its range and latency, shown on hover
}

// LatencyGroup is one node's range (or a range no live node has) in the
// latency map, with its percentiles in text.
type LatencyGroup struct {
	NodeID     string // "" for shards in no live node's range
	Href       string
	Start, End uint32 // End inclusive
	Ping       Percentiles
	Cells      []LatencyCell
}

// ID is the group's element ID.
func (g LatencyGroup) ID() string { return "lg" + strconv.FormatUint(uint64(g.Start), 10) }

// LatencyMap is the latency view of the shard map: every shard's last
// heartbeat latency in the colour scale, grouped by owning node.
type LatencyMap struct {
	Page
	Total     uint32
	BlockSize uint32 // shards per cell
	Fleet     Percentiles
	// Groups are the nodes' ranges with their cells; in a compact map
	// (many nodes) a single group of every shard, without a node.
	Groups  []LatencyGroup
	Compact bool
	// Slowest are the nodes with the highest p99, slowest first, without
	// cells: the compact map's text.
	Slowest []LatencyGroup
}
