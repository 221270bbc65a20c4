package metrics

import (
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
)

// DefaultPingBound is the heartbeat latency above which a READY shard does
// not count as ready: seed 002's 5,000 ms. The kernel flags an ACK late
// (ack_slow) much sooner, at appliance.PingSlowMS or half the interval.
const DefaultPingBound = 5 * time.Second

// MaxListedRuns bounds Verdict.NotReady: at 131,072 shards every one could
// be unready for a different reason.
const MaxListedRuns = 1000

// Reasons a shard of the plan is not ready, from first checked to last: a
// shard gets the first that applies.
const (
	// ReasonUnowned: no live node's range in the plan has the shard.
	ReasonUnowned = "unowned"
	// ReasonHandoffPending: in a live node's range, but its previous
	// owner has not released it yet (safe hand-off).
	ReasonHandoffPending = "handoff_pending"
	// ReasonNotReported: held by its node, which reported no status for it.
	ReasonNotReported = "not_reported"
	// ReasonNotReady: its node reports a state other than READY (State
	// says which).
	ReasonNotReady = "not_ready"
	// ReasonNoPing: READY, but no heartbeat ACK measured yet.
	ReasonNoPing = "no_ping"
	// ReasonAckSlow: READY, but the node flags its heartbeat ACK late
	// (ack_slow).
	ReasonAckSlow = "ack_slow"
	// ReasonPingOverBound: READY, but its last ping is over the bound.
	ReasonPingOverBound = "ping_over_bound"
)

// Reasons lists every reason, in the order they are checked.
var Reasons = []string{ReasonUnowned, ReasonHandoffPending, ReasonNotReported, ReasonNotReady,
	ReasonNoPing, ReasonAckSlow, ReasonPingOverBound}

// ShardRun is a run of consecutive shards that are not ready for the same
// reason on the same node (and in the same state).
type ShardRun struct {
	First  uint32 `json:"first"`
	Last   uint32 `json:"last"`
	Reason string `json:"reason"`
	Node   string `json:"node,omitempty"`  // the node whose range has them
	State  string `json:"state,omitempty"` // the reported state, for not_ready
	// PingMaxMS is the largest last ping in the run, for ping_over_bound.
	PingMaxMS float64 `json:"ping_max_ms,omitempty"`
}

// Summary is the verdict without node names or shard lists: what GET
// /readyz answers without a token.
type Summary struct {
	Ready         bool           `json:"ready"`
	At            time.Time      `json:"at"`
	Generation    uint64         `json:"generation"`
	TotalShards   uint32         `json:"total_shards"`
	ReadyShards   uint32         `json:"ready_shards"`
	NotReadyCount uint32         `json:"not_ready_shards"`
	LiveNodes     int            `json:"live_nodes"`
	PingBoundMS   float64        `json:"ping_bound_ms"`
	Reasons       map[string]int `json:"reasons"` // unready shards per reason, every reason present
}

// Verdict is the fleet's readiness: ready when every shard of the plan is
// READY on a live node with a measured ping no larger than the bound.
// NotReady lists the shards that are not, as runs in shard order, at most
// MaxListedRuns of them (Truncated says some were left out; the counts in
// Summary are always complete).
type Verdict struct {
	Summary
	NotReady  []ShardRun `json:"not_ready"`
	Truncated bool       `json:"truncated"`
}

// Judge computes the verdict of fs with the given ping bound.
func Judge(fs *controller.FleetStats, bound time.Duration) Verdict {
	boundMS := float64(bound) / float64(time.Millisecond)
	v := Verdict{Summary: Summary{At: fs.At, Generation: fs.Generation, TotalShards: fs.TotalShards,
		PingBoundMS: boundMS, Reasons: make(map[string]int, len(Reasons))}, NotReady: []ShardRun{}}
	for _, r := range Reasons {
		v.Reasons[r] = 0
	}
	for i := range fs.Nodes {
		if fs.Nodes[i].Live {
			v.LiveNodes++
		}
	}
	for s := range fs.Shards {
		sh := &fs.Shards[s]
		reason := shardReason(sh, boundMS)
		if reason == "" {
			v.ReadyShards++
			continue
		}
		v.NotReadyCount++
		v.Reasons[reason]++
		var node, state string
		if sh.Node >= 0 {
			node = fs.Nodes[sh.Node].ID
		}
		if reason == ReasonNotReady {
			state = string(sh.State)
		}
		id := uint32(s)
		if n := len(v.NotReady); n > 0 {
			last := &v.NotReady[n-1]
			if last.Last+1 == id && last.Reason == reason && last.Node == node && last.State == state {
				last.Last = id
				if reason == ReasonPingOverBound {
					last.PingMaxMS = max(last.PingMaxMS, sh.PingMS)
				}
				continue
			}
		}
		if len(v.NotReady) == MaxListedRuns {
			v.Truncated = true
			continue
		}
		run := ShardRun{First: id, Last: id, Reason: reason, Node: node, State: state}
		if reason == ReasonPingOverBound {
			run.PingMaxMS = sh.PingMS
		}
		v.NotReady = append(v.NotReady, run)
	}
	v.Ready = v.NotReadyCount == 0
	return v
}

// shardReason returns why a shard is not ready, or "" when it is.
func shardReason(sh *controller.ShardStats, boundMS float64) string {
	switch {
	case sh.Node < 0:
		return ReasonUnowned
	case !sh.Held:
		return ReasonHandoffPending
	case !sh.Reported:
		return ReasonNotReported
	case sh.State != appliance.ShardReady:
		return ReasonNotReady
	case sh.PingMS <= 0:
		return ReasonNoPing
	case sh.AckSlow:
		return ReasonAckSlow
	case sh.PingMS > boundMS:
		return ReasonPingOverBound
	}
	return ""
}
