package web

import (
	"cmp"
	"net/http"
	"net/url"
	"slices"
	"strconv"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/history"
	"github.com/discord-pxe/dpxe/web/templates"
	"github.com/discord-pxe/dpxe/web/view"
)

// This file is the latency map (GET /latency): the shard map's layout
// coloured by each shard's last heartbeat latency. It reads the
// controller's FleetStats (one pass over the shards) on request only; the
// fleet page's live updates never compute it.

// percentilesOf turns measured pings (sorted in place) into a view.
func percentilesOf(pings []float64) view.Percentiles {
	q := history.Percentiles(pings)
	return view.Percentiles{N: q.N, P50: view.Ping{MS: q.P50}, P90: view.Ping{MS: q.P90}, P99: view.Ping{MS: q.P99}, Max: view.Ping{MS: q.Max}}
}

// readyPing is a shard's last ping when it counts for latency: READY on
// the node whose range has it, with a measured ping; 0 otherwise.
func readyPing(sh *controller.ShardStats) float64 {
	if sh.Node < 0 || !sh.Held || !sh.Reported || sh.State != appliance.ShardReady {
		return 0
	}
	return sh.PingMS
}

// SlowestNodes is how many nodes a compact latency map lists by p99.
const SlowestNodes = 20

// BuildLatencyMap groups the shards by the live node whose range has them
// (the rest in "no owner" groups), in blocks of the shard map's size,
// each cell showing the highest ping of its READY shards. Above
// CompactGroups groups it draws one grid of every shard instead (a cell
// may then span nodes) and lists the SlowestNodes nodes by p99 in text.
func BuildLatencyMap(fs *controller.FleetStats) view.LatencyMap {
	total := uint32(len(fs.Shards))
	m := view.LatencyMap{Total: total, BlockSize: mapBlockSize(total)}
	type span struct {
		node       string
		start, end uint32 // end exclusive
	}
	var spans []span
	for _, n := range fs.Nodes {
		if n.Live && n.Range.Count > 0 && n.Range.Start < total {
			spans = append(spans, span{n.ID, n.Range.Start, min(total, n.Range.Start+n.Range.Count)})
		}
	}
	slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.start, b.start) })
	var groups []span
	next := uint32(0)
	for _, sp := range spans {
		if sp.start > next {
			groups = append(groups, span{start: next, end: sp.start})
		}
		if sp.end > sp.start {
			groups = append(groups, sp)
		}
		next = max(next, sp.end)
	}
	if next < total {
		groups = append(groups, span{start: next, end: total})
	}
	m.Compact = len(groups) > CompactGroups
	all := make([]float64, 0, total)
	pings := make([]float64, 0, 1024)
	// cells appends the cells of [start, end) to g, and the READY pings
	// of the range to pings.
	cells := func(g *view.LatencyGroup, start, end uint32) {
		for s := start; s < end; s += m.BlockSize {
			hi := min(end, s+m.BlockSize)
			worst := 0.0
			for i := s; i < hi; i++ {
				if p := readyPing(&fs.Shards[i]); p > 0 {
					pings = append(pings, p)
					worst = max(worst, p)
				}
			}
			ping := view.Ping{MS: worst}
			title := strconv.FormatUint(uint64(s), 10)
			if hi-s > 1 {
				title += "–" + strconv.FormatUint(uint64(hi-1), 10) + ": highest "
			} else {
				title += ": "
			}
			g.Cells = append(g.Cells, view.LatencyCell{Band: ping.Band(), Title: title + ping.Text()})
		}
	}
	for _, sp := range groups {
		g := view.LatencyGroup{NodeID: sp.node, Start: sp.start, End: sp.end - 1}
		if sp.node != "" {
			g.Href = "/nodes/" + url.PathEscape(sp.node)
		}
		pings = pings[:0]
		if m.Compact {
			for i := sp.start; i < sp.end; i++ {
				if p := readyPing(&fs.Shards[i]); p > 0 {
					pings = append(pings, p)
				}
			}
		} else {
			cells(&g, sp.start, sp.end)
		}
		all = append(all, pings...)
		g.Ping = percentilesOf(pings)
		if m.Compact {
			if sp.node != "" && g.Ping.N > 0 {
				m.Slowest = append(m.Slowest, g)
			}
			continue
		}
		m.Groups = append(m.Groups, g)
	}
	if m.Compact {
		g := view.LatencyGroup{Start: 0, End: total - 1}
		cells(&g, 0, total)
		m.Groups = []view.LatencyGroup{g}
		slices.SortStableFunc(m.Slowest, func(a, b view.LatencyGroup) int { return cmp.Compare(b.Ping.P99.MS, a.Ping.P99.MS) })
		m.Slowest = m.Slowest[:min(len(m.Slowest), SlowestNodes)]
	}
	m.Fleet = percentilesOf(all)
	return m
}

func (s *Server) latency(w http.ResponseWriter, r *http.Request) {
	fs := s.cfg.Controller.FleetStats()
	v := BuildLatencyMap(&fs)
	v.Page = s.page(r, "Shard latency", "fleet")
	s.render(w, r, http.StatusOK, templates.LatencyPage(v))
}
