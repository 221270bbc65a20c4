package metrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/discord-pxe/dpxe/fleet/events"
)

// EventsSource reads the event stream's state; ctx bounds the broker's
// answer.
type EventsSource func(ctx context.Context) events.StreamState

// EventsReadTimeout bounds an EventsSource's reads during one scrape.
const EventsReadTimeout = 2 * time.Second

// The event delivery's metrics (docs/metrics.md#events), present when
// dpxe serve delivers events.
var (
	descEvConnected = desc("events_broker_connected", "1 while dpxe serve's own connection to the NATS broker is up.")
	descEvRead      = desc("events_stream_read", "1 when the event stream's state below was read at this scrape (0: the broker did not answer in time).")
	descEvMessages  = desc("events_stream_messages", "Dispatches stored in the event stream (acknowledged to the nodes).")
	descEvBytes     = desc("events_stream_bytes", "Bytes stored in the event stream.")
	descEvPending   = desc("events_consumer_pending", "Events stored and not yet delivered to the bot service's consumer.", "consumer")
	descEvUnacked   = desc("events_consumer_unacked", "Events delivered to the bot service's consumer and not yet acknowledged.", "consumer")
)

var eventsDescs = []*prometheus.Desc{descEvConnected, descEvRead, descEvMessages, descEvBytes, descEvPending, descEvUnacked}

// SetEvents makes the scrapes export the event stream's state read by src
// (nil: none, as without event delivery).
func (m *Metrics) SetEvents(src EventsSource) {
	if src == nil {
		m.events.Store(nil)
		return
	}
	m.events.Store(&src)
}

// Events reads the event stream's state within EventsReadTimeout; false
// when serve delivers no events.
func (m *Metrics) Events(ctx context.Context) (events.StreamState, bool) {
	p := m.events.Load()
	if p == nil {
		return events.StreamState{}, false
	}
	ctx, cancel := context.WithTimeout(ctx, EventsReadTimeout)
	defer cancel()
	return (*p)(ctx), true
}

// collectEvents exports the event stream's state, when a source is set.
func (m *Metrics) collectEvents(ch chan<- prometheus.Metric) {
	st, ok := m.Events(context.Background())
	if !ok {
		return
	}
	ch <- gauge(descEvConnected, boolf(st.Connected))
	ch <- gauge(descEvRead, boolf(st.Read))
	if !st.Read {
		return
	}
	ch <- gauge(descEvMessages, float64(st.Messages))
	ch <- gauge(descEvBytes, float64(st.Bytes))
	for _, c := range st.Consumers {
		ch <- gauge(descEvPending, float64(c.Pending), c.Name)
		ch <- gauge(descEvUnacked, float64(c.Unacked), c.Name)
	}
}
