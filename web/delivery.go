package web

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/events"
	"github.com/discord-pxe/dpxe/web/view"
)

// BuildDelivery is the event delivery panel for a stream's state.
func BuildDelivery(st events.StreamState) view.Delivery {
	v := view.Delivery{Connected: st.Connected, Read: st.Read,
		Messages: groupDigits(st.Messages), Bytes: binaryBytes(st.Bytes)}
	for _, c := range st.Consumers {
		v.Services = append(v.Services, view.EventService{Name: c.Name, Pending: groupDigits(c.Pending),
			Unacked: groupDigits(c.Unacked), Lag: groupDigits(c.Lag()), Behind: c.Lag() > 0})
	}
	return v
}

// groupDigits writes n with a comma every three digits: 12,345.
func groupDigits(n uint64) string {
	s := strconv.FormatUint(n, 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// binaryBytes writes n bytes in the largest binary unit that keeps the
// number at least 1: 512 B, 3.2 KiB, 7.0 MiB.
func binaryBytes(n uint64) string {
	if n < 1024 {
		return strconv.FormatUint(n, 10) + " B"
	}
	v, unit := float64(n), ""
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"} {
		v /= 1024
		unit = u
		if v < 1024 {
			break
		}
	}
	return fmt.Sprintf("%.1f %s", v, unit)
}

// BuildNodeDelivery formats a node's event delivery summary; nil when it
// reports none.
func BuildNodeDelivery(d *controller.NodeDelivery) *view.NodeDelivery {
	if d == nil {
		return nil
	}
	v := &view.NodeDelivery{Published: groupDigits(d.Published), InFlight: groupDigits(d.InFlight),
		Lost: groupDigits(d.Lost), Skipped: groupDigits(d.Skipped), HasLost: d.Lost > 0, RateValue: -1}
	if d.RateWindowMS > 0 {
		v.Rate, v.RateValue = eventRate(d.PublishRate), d.PublishRate
		v.Window = view.Span(time.Duration(d.RateWindowMS) * time.Millisecond)
	}
	return v
}

// eventRate writes events per second with one decimal below 100 and
// grouped whole numbers above: 0.0, 12.5, 1,250.
func eventRate(r float64) string {
	if r < 100 {
		return strconv.FormatFloat(r, 'f', 1, 64)
	}
	return groupDigits(uint64(math.Round(r)))
}

// BuildShardDelivery formats one shard's event delivery; nil when its
// node reports none (delivery is reported per node: a publishing node
// reports every shard, at 0 too).
//
// The lag is the received sequence minus the acknowledged one
// (appliance.DeliveryLag): without a resumable session, or with an
// acknowledged sequence above the received one (an older session's),
// there is no lag to show.
func BuildShardDelivery(st appliance.ShardStatus, reported bool) *view.ShardDelivery {
	if !reported {
		return nil
	}
	v := &view.ShardDelivery{Published: groupDigits(uint64(st.EventsPublished)), AckedSeq: groupDigits(uint64(st.EventsAckedSeq)),
		InFlight: groupDigits(uint64(st.EventsInFlight)), Lost: groupDigits(uint64(st.EventsLost)),
		Skipped: groupDigits(uint64(st.EventsSkipped)), HasLost: st.EventsLost > 0}
	if lag, ok := appliance.DeliveryLag(&st); ok {
		v.Lag, v.Lagging = groupDigits(lag), lag > 0
	}
	return v
}

// BuildBroker formats a node's broker connection; nil when it reports
// none.
func BuildBroker(b *appliance.BrokerStatus) *view.Broker {
	if b == nil {
		return nil
	}
	return &view.Broker{State: b.State, Up: b.State == appliance.BrokerUp, Connects: groupDigits(b.Connects),
		Drops: groupDigits(b.Drops), Refused: groupDigits(b.Refused)}
}
