package web

import (
	"context"
	"slices"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/history"
	"github.com/discord-pxe/dpxe/fleet/store"
	"github.com/discord-pxe/dpxe/web/view"
)

// This file builds the latency and 24-hour history views: the store's
// one-a-minute samples (fleet/history) for the fleet page, and the pings
// the node reported for its page.

// historyWindow is the span of the history charts.
const historyWindow = 24 * time.Hour

// HistoryPoints converts stored samples to chart points.
func HistoryPoints(samples []store.HistorySample) []view.HistoryPoint {
	out := make([]view.HistoryPoint, len(samples))
	for i, h := range samples {
		p := view.HistoryPoint{At: h.At, PingN: int(h.PingCount), P50: h.PingP50, P90: h.PingP90, P99: h.PingP99}
		p.Counts[view.Ready], p.Counts[view.Held], p.Counts[view.Starting] = int(h.Ready), int(h.Assigned), int(h.Starting)
		p.Counts[view.Pending], p.Counts[view.Backoff], p.Counts[view.Fatal] = int(h.Pending), int(h.Backoff), int(h.Fatal)
		p.Counts[view.Unowned] = int(h.Unowned)
		out[i] = p
	}
	return out
}

// historySpan is the charts' window ending at now: the 1,440 minutes up
// to and including now's.
func historySpan(now time.Time) (from, to time.Time) {
	to = now.UTC().Truncate(time.Minute).Add(time.Minute)
	return to.Add(-historyWindow), to
}

// BuildHistory makes the fleet page's latency panel (from the newest
// sample) and 24-hour charts from samples, oldest first, ending at now.
func BuildHistory(samples []store.HistorySample, now time.Time) (view.Percentiles, view.History) {
	from, to := historySpan(now)
	samples = slices.DeleteFunc(slices.Clone(samples), func(h store.HistorySample) bool { return h.At.Before(from) || !h.At.Before(to) })
	pts := HistoryPoints(samples)
	h := view.History{From: from, To: to, Minutes: len(pts),
		States: view.StatesChart(pts, from, to, view.ChartBuckets),
		Ping:   view.PingChart(pts, from, to, view.ChartBuckets),
		Hours:  view.HourRows(pts, from, to)}
	var p view.Percentiles
	if n := len(samples); n > 0 {
		last := samples[n-1]
		p = view.Percentiles{N: int(last.PingCount), At: last.At, P50: view.Ping{MS: last.PingP50}, P90: view.Ping{MS: last.PingP90},
			P99: view.Ping{MS: last.PingP99}, Max: view.Ping{MS: last.PingMax}}
	}
	return p, h
}

// historyView reads the last 24 hours from the store for the fleet page.
// A failed read is shown on the page, not as an error page.
func (s *Server) historyView(ctx context.Context, now time.Time) (*view.Percentiles, *view.History) {
	if s.cfg.Store == nil {
		return nil, nil
	}
	from, _ := historySpan(now)
	samples, err := s.cfg.Store.History(ctx, from)
	p, h := BuildHistory(samples, now)
	if err != nil {
		s.log.Warn("dashboard: history", "err", err)
		h.Error = "The history could not be read: " + err.Error()
	}
	return &p, &h
}

// addPings puts each shard's reported ping on its row and returns the
// percentiles over the READY shards with a measured ping.
func addPings(rows []view.ShardRow, reported []appliance.ShardStatus) view.Percentiles {
	byID := make(map[uint32]float64, len(reported))
	for _, st := range reported {
		byID[st.ID] = st.PingMS
	}
	var pings []float64
	for i := range rows {
		ms, ok := byID[rows[i].ID]
		if !ok {
			continue
		}
		rows[i].Ping = view.Ping{MS: ms}
		if rows[i].State == view.Ready && ms > 0 {
			pings = append(pings, ms)
		}
	}
	q := history.Percentiles(pings)
	return view.Percentiles{N: q.N, P50: view.Ping{MS: q.P50}, P90: view.Ping{MS: q.P90}, P99: view.Ping{MS: q.P99}, Max: view.Ping{MS: q.Max}}
}
