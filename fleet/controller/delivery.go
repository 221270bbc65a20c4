package controller

import (
	"time"

	"github.com/discord-pxe/dpxe/appliance"
)

// This file keeps what the dashboard shows of a node's event delivery
// (docs/events.md, "The kernel's publisher"; docs/dashboard.md): the
// node's figures summed over its latest shard statuses, and its publish
// rate. The rate needs the previous check-in's statuses, which the node
// keeps anyway (node.status), so the memory per node is this one small
// struct.

// NodeDelivery is a node's event delivery summed over the shard statuses
// of its latest check-in (appliance.ShardStatus Events*), with its
// publish rate.
type NodeDelivery struct {
	Published uint64 `json:"published"` // events_published: HPUBs written, resends included
	InFlight  uint64 `json:"in_flight"` // events_in_flight: dispatches awaiting their PubAck
	Lost      uint64 `json:"lost"`      // events_lost: not published (oversize, no room)
	Skipped   uint64 `json:"skipped"`   // events_skipped: not published, their type skipped
	// Lag sums the shards' delivery lag (appliance.DeliveryLag: received
	// minus acknowledged sequence) over the shards that have one.
	Lag uint64 `json:"lag"`
	// PublishRate is the events published per second between the node's
	// two latest check-ins that carried delivery figures, RateWindowMS
	// apart; RateWindowMS is 0 (and the rate unknown) until there are two
	// such check-ins in a row, for example after the node's first report,
	// a lapse of its lease or a restart of the controller (publishedSince
	// says how moved shards and restarted counters count).
	PublishRate  float64 `json:"publish_rate"`
	RateWindowMS int64   `json:"rate_window_ms,omitempty"`
}

// reportsDelivery says whether a check-in's statuses carry event delivery
// figures: a node that publishes reports them for every shard it runs,
// and one that does not (delivery off) reports none. A status's fields
// are omitted at 0, so a publishing node whose shards have seen nothing
// yet looks like one that does not publish until its first dispatch.
func reportsDelivery(shards []appliance.ShardStatus) bool {
	for i := range shards {
		s := &shards[i]
		if s.EventsPublished|s.EventsAckedSeq|s.EventsInFlight|s.EventsLost|s.EventsSkipped != 0 {
			return true
		}
	}
	return false
}

// publishedSince counts the events published between two check-ins from
// their statuses, shard by shard, so that a counter that starts again
// never makes a negative rate:
//   - a shard in both whose events_published did not decrease adds the
//     difference;
//   - one whose counter decreased (the node restarted, so its counters
//     began again from 0) adds its new value, what it published since;
//   - a shard in only one of them adds nothing: it arrived or left, and a
//     slot's counters go on with the shard it takes next (appliance.
//     ShardStatus), so the value says nothing about the interval.
//
// It runs under the controller's lock at every check-in: a kernel node
// lists its slots in the same order each time, so the shard at the same
// index is tried first and a map is built only when the order changed.
func publishedSince(prev, cur []appliance.ShardStatus) uint64 {
	var before map[uint32]uint32
	var n uint64
	for i := range cur {
		var p uint32
		ok := i < len(prev) && prev[i].ID == cur[i].ID
		if ok {
			p = prev[i].EventsPublished
		} else {
			if before == nil {
				before = make(map[uint32]uint32, len(prev))
				for j := range prev {
					before[prev[j].ID] = prev[j].EventsPublished
				}
			}
			p, ok = before[cur[i].ID]
		}
		switch c := cur[i].EventsPublished; {
		case !ok:
		case c >= p:
			n += uint64(c - p)
		default:
			n += uint64(c)
		}
	}
	return n
}

// nextDelivery is a node's delivery after a check-in at t with the
// statuses cur, when its previous check-in with statuses (prevAt) carried
// prev; ok is false when cur carries no delivery figures.
func nextDelivery(prev []appliance.ShardStatus, prevAt time.Time, cur []appliance.ShardStatus, t time.Time) (d NodeDelivery, ok bool) {
	if !reportsDelivery(cur) {
		return NodeDelivery{}, false
	}
	for i := range cur {
		s := &cur[i]
		d.Published += uint64(s.EventsPublished)
		d.InFlight += uint64(s.EventsInFlight)
		d.Lost += uint64(s.EventsLost)
		d.Skipped += uint64(s.EventsSkipped)
		if lag, ok := appliance.DeliveryLag(s); ok {
			d.Lag += lag
		}
	}
	if dt := t.Sub(prevAt); !prevAt.IsZero() && dt >= time.Millisecond && reportsDelivery(prev) {
		d.PublishRate = float64(publishedSince(prev, cur)) / dt.Seconds()
		d.RateWindowMS = dt.Milliseconds()
	}
	return d, true
}
