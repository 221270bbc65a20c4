package metrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// EventsState is the event stream as dpxe serve sees it at a scrape: its
// NATS connection and, when the stream could be read, its size and each
// bot service's consumer lag.
type EventsState struct {
	Connected bool // serve's own NATS connection is up
	// StreamRead: Messages, Bytes and Consumers below were read (false:
	// the broker did not answer within the scrape's bound).
	StreamRead      bool
	Messages, Bytes uint64
	Consumers       []EventsConsumer
}

// EventsConsumer is one durable consumer of the event stream (a bot
// service): Pending are stored and not yet delivered, Unacked delivered
// and not yet acknowledged; their sum is its lag in events.
type EventsConsumer struct {
	Name             string
	Pending, Unacked uint64
}

// EventsSource reads the event stream's state; ctx bounds the broker's
// answer.
type EventsSource func(ctx context.Context) EventsState

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

// collectEvents exports the event stream's state, when a source is set.
func (m *Metrics) collectEvents(ch chan<- prometheus.Metric) {
	p := m.events.Load()
	if p == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), EventsReadTimeout)
	defer cancel()
	st := (*p)(ctx)
	ch <- gauge(descEvConnected, boolf(st.Connected))
	ch <- gauge(descEvRead, boolf(st.StreamRead))
	if !st.StreamRead {
		return
	}
	ch <- gauge(descEvMessages, float64(st.Messages))
	ch <- gauge(descEvBytes, float64(st.Bytes))
	for _, c := range st.Consumers {
		ch <- gauge(descEvPending, float64(c.Pending), c.Name)
		ch <- gauge(descEvUnacked, float64(c.Unacked), c.Name)
	}
}
