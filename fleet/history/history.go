// Package history samples the fleet once a minute for the dashboard's
// 24-hour charts: shard counts by state and the percentiles of the READY
// shards' heartbeat latency (ping_ms), from the controller's one-pass
// FleetStats, stored with store.AddHistory (which keeps the table at 1,440
// rows). It owns no state of the fleet; it reads and writes.
package history

import (
	"context"
	"log/slog"
	"math"
	"slices"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// Every is the sampling period: the history's resolution.
const Every = time.Minute

// Sample summarises fs: every shard counted once in the state the shard
// map shows (unowned, pending hand-off, assigned without a report, or the
// reported state), and the nearest-rank percentiles of the last pings of
// the READY shards that have one. It costs one pass over the shards and a
// sort of the measured pings (about 10 ms at 131,072 on one core).
func Sample(fs *controller.FleetStats) store.HistorySample {
	h := store.HistorySample{At: fs.At}
	pings := make([]float64, 0, len(fs.Shards))
	for i := range fs.Shards {
		sh := &fs.Shards[i]
		switch {
		case sh.Node < 0:
			h.Unowned++
		case !sh.Held:
			h.Pending++
		case !sh.Reported:
			h.Assigned++
		default:
			switch sh.State {
			case appliance.ShardReady:
				h.Ready++
				if sh.PingMS > 0 {
					pings = append(pings, sh.PingMS)
				}
			case appliance.ShardStarting:
				h.Starting++
			case appliance.ShardBackoff:
				h.Backoff++
			case appliance.ShardFatal:
				h.Fatal++
			default:
				h.Assigned++
			}
		}
	}
	p := Percentiles(pings)
	h.PingCount, h.PingP50, h.PingP90, h.PingP99, h.PingMax = uint32(p.N), p.P50, p.P90, p.P99, p.Max
	return h
}

// Ping is a latency distribution: how many measurements and their
// nearest-rank percentiles, in milliseconds; all zero when N is 0.
type Ping struct {
	N                  int
	P50, P90, P99, Max float64
}

// Percentiles sorts pings in place and returns their nearest-rank 50th,
// 90th and 99th percentiles and maximum: the p-th percentile is the
// smallest value with at least p % of the values at or below it.
func Percentiles(pings []float64) Ping {
	if len(pings) == 0 {
		return Ping{}
	}
	slices.Sort(pings)
	rank := func(p float64) float64 {
		i := int(math.Ceil(p/100*float64(len(pings)))) - 1
		return pings[min(max(i, 0), len(pings)-1)]
	}
	return Ping{N: len(pings), P50: rank(50), P90: rank(90), P99: rank(99), Max: pings[len(pings)-1]}
}

// Sampler writes one sample of the fleet per period to the store.
type Sampler struct {
	// Stats returns the fleet now (Controller.FleetStats).
	Stats func() controller.FleetStats
	Store *store.Store
	Log   *slog.Logger
	// Every is the period; 0 means Every (one minute).
	Every time.Duration
	// Acting reports whether this process's view of the fleet is the
	// fleet's: with controller replicas only the leader's is (a follower
	// answers nothing and would store an empty fleet over the leader's
	// minute). nil means always, as on SQLite.
	Acting func() bool
}

// Run samples at once and then every period until ctx ends; it returns
// nil then. A failed write is logged and the next period tries again.
func (s *Sampler) Run(ctx context.Context) error {
	every := s.Every
	if every <= 0 {
		every = Every
	}
	log := s.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		if err := s.Once(ctx); err != nil && ctx.Err() == nil {
			log.Warn("history: sample not stored", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// Once takes one sample and stores it, unless this process is not
// Acting for the fleet (then it stores nothing and returns nil).
func (s *Sampler) Once(ctx context.Context) error {
	if s.Acting != nil && !s.Acting() {
		return nil
	}
	fs := s.Stats()
	return s.Store.AddHistory(ctx, Sample(&fs))
}
