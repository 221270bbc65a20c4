// Package dpxe is the Go SDK for bots whose Gateway shards run on
// Discord-PXE. Nodes publish every Discord dispatch into a NATS JetStream
// stream (docs/events.md); this package reads it:
//
//   - Service: a durable pull consumer per bot service (all processes of a
//     service share it, each event goes to one of them), filtered by
//     event name, acknowledged after the handler returns without error,
//     delivered again (after AckWait, or at once on an error) otherwise.
//   - Watch: an ephemeral ordered read without acknowledgements, for
//     tools such as `dpxe events tail`.
//
// Each event arrives as an Event: shard, Discord sequence, session, event
// name and the raw Discord frame. Delivery into the stream is at least
// once and duplicates are removed by message ID (session:seq), so a
// handler sees an event again only when it failed or timed out; a handler
// that must not act twice can key on (Session, Seq).
package dpxe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/discord-pxe/dpxe/fleet/events"
)

// Errors of the SDK.
var (
	// ErrBadConfig means a Config or WatchConfig field is wrong; wrapped
	// with the field at fault.
	ErrBadConfig = errors.New("bad SDK config")
	// ErrBadEvent means a stored message is not a dispatch of the scheme
	// (wrong subject or headers); the Service terminates such messages.
	ErrBadEvent = errors.New("not a Discord-PXE event")
)

// Event is one Discord dispatch as a node received it.
type Event struct {
	Shard    uint32    // the shard that received it
	Seq      uint64    // Discord's s in its session
	Session  string    // the Gateway session ID
	Name     string    // Discord's t, e.g. MESSAGE_CREATE
	Node     string    // the node that published it
	Received time.Time // when the node read it
	// StreamSeq is the event's position in the stream; Delivered counts
	// deliveries to this consumer (1 the first time).
	StreamSeq, Delivered uint64
	// Raw is the Discord frame unchanged: {"op":0,"t":...,"s":...,"d":...}.
	Raw json.RawMessage
}

// Data returns the frame's "d" (the event's payload).
func (e *Event) Data() (json.RawMessage, error) {
	var f struct {
		D json.RawMessage `json:"d"`
	}
	if err := json.Unmarshal(e.Raw, &f); err != nil {
		return nil, fmt.Errorf("event %s seq %d: frame: %w", e.Name, e.Seq, err)
	}
	return f.D, nil
}

// Decode unmarshals the frame's "d" into v.
func (e *Event) Decode(v any) error {
	d, err := e.Data()
	if err != nil {
		return err
	}
	if err := json.Unmarshal(d, v); err != nil {
		return fmt.Errorf("event %s seq %d: d: %w", e.Name, e.Seq, err)
	}
	return nil
}

// eventOf reads a stored message into an Event.
func eventOf(m jetstream.Msg) (*Event, error) {
	subj, err := events.ParseSubject(m.Subject())
	if err != nil || subj.Kind != events.KindEvent {
		return nil, fmt.Errorf("%w: subject %q", ErrBadEvent, m.Subject())
	}
	meta, err := events.ParseHeader(m.Headers())
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadEvent, err)
	}
	if meta.Shard != subj.Shard {
		return nil, fmt.Errorf("%w: %s %d but subject shard %d", ErrBadEvent, events.HeaderShard, meta.Shard, subj.Shard)
	}
	ev := &Event{Shard: meta.Shard, Seq: meta.Seq, Session: meta.Session, Name: subj.Event, Node: meta.Node,
		Received: meta.Received, Raw: m.Data()}
	if md, err := m.Metadata(); err == nil {
		ev.StreamSeq, ev.Delivered = md.Sequence.Stream, md.NumDelivered
	}
	return ev, nil
}

// Config configures a Service.
type Config struct {
	App     string   // the app name in subjects (dpxe serve --events-app)
	Service string   // the durable consumer's name: one per bot service
	Events  []string // event names to receive; none means all
	// FromStart makes a new service read the whole stream; otherwise it
	// starts with events published after it is created. An existing
	// service always continues where it left off.
	FromStart bool
	// AckWait is how long a handler may take before the event is
	// delivered again (default 30 s); MaxAckPending bounds events handed
	// out and not yet acknowledged across all processes (default 1000).
	AckWait       time.Duration
	MaxAckPending int
}

// Service is a bot service's durable consumer.
type Service struct {
	cons jetstream.Consumer
	cfg  Config
}

// NewService creates or updates the durable consumer cfg.Service on the
// app's event stream, through nc (which it does not close).
func NewService(ctx context.Context, nc *nats.Conn, cfg Config) (*Service, error) {
	stream, err := events.StreamName(cfg.App)
	if err != nil {
		return nil, fmt.Errorf("%w: app: %v", ErrBadConfig, err)
	}
	if err := events.ValidateApp(cfg.Service); err != nil {
		return nil, fmt.Errorf("%w: service (same rules as an app name): %v", ErrBadConfig, err)
	}
	if cfg.AckWait == 0 {
		cfg.AckWait = 30 * time.Second
	}
	if cfg.MaxAckPending == 0 {
		cfg.MaxAckPending = 1000
	}
	if cfg.AckWait < time.Second || cfg.MaxAckPending < 1 {
		return nil, fmt.Errorf("%w: ack_wait %v (at least 1s), max_ack_pending %d (at least 1)", ErrBadConfig, cfg.AckWait, cfg.MaxAckPending)
	}
	var filters []string
	for _, name := range cfg.Events {
		f, err := events.EventFilter(cfg.App, nil, name)
		if err != nil {
			return nil, fmt.Errorf("%w: events: %v", ErrBadConfig, err)
		}
		filters = append(filters, f)
	}
	if len(filters) == 0 {
		f, _ := events.StreamSubjects(cfg.App)
		filters = []string{f}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	deliver := jetstream.DeliverNewPolicy
	if cfg.FromStart {
		deliver = jetstream.DeliverAllPolicy
	}
	cc := jetstream.ConsumerConfig{Durable: cfg.Service, Description: "Discord-PXE bot service " + cfg.Service,
		FilterSubjects: filters, AckPolicy: jetstream.AckExplicitPolicy, AckWait: cfg.AckWait,
		MaxAckPending: cfg.MaxAckPending, DeliverPolicy: deliver}
	// An existing service keeps its position: the server refuses to
	// change a durable's deliver policy, so only filters and limits are
	// updated.
	if old, err := js.Consumer(ctx, stream, cfg.Service); err == nil {
		cc.DeliverPolicy = old.CachedInfo().Config.DeliverPolicy
	} else if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("service %s on stream %s: %w", cfg.Service, stream, err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, cc)
	if err != nil {
		return nil, fmt.Errorf("service %s on stream %s: %w", cfg.Service, stream, err)
	}
	return &Service{cons: cons, cfg: cfg}, nil
}

// Handler handles one event. Returning nil acknowledges it; an error
// makes the stream deliver it again (after retry, at least 1 s).
type Handler func(ctx context.Context, ev *Event) error

// Run hands events to h one at a time until ctx ends (then it returns
// nil) or the consumer fails. Run more processes (or goroutines, each
// with its own Run) to handle more at once: they share the service.
// A message that is not a Discord-PXE event is terminated (never
// delivered again) and reported to bad, if not nil.
func (s *Service) Run(ctx context.Context, h Handler, bad func(error)) error {
	it, err := s.cons.Messages()
	if err != nil {
		return err
	}
	defer it.Stop()
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return fmt.Errorf("service %s: %w", s.cfg.Service, err)
		}
		ev, err := eventOf(m)
		if err != nil {
			m.TermWithReason(err.Error())
			if bad != nil {
				bad(err)
			}
			continue
		}
		if herr := h(ctx, ev); herr != nil {
			m.NakWithDelay(time.Second)
			continue
		}
		if err := m.Ack(); err != nil {
			return fmt.Errorf("service %s: ack stream seq %d: %w", s.cfg.Service, ev.StreamSeq, err)
		}
	}
}

// WatchConfig selects what Watch reads.
type WatchConfig struct {
	App       string
	Shard     *uint32 // nil: every shard
	Event     string  // "": every event
	FromStart bool    // read what the stream holds first
}

// Watch reads the app's events in stream order with an ephemeral ordered
// consumer (no acknowledgements, nothing left behind on the server) and
// calls fn for each until ctx ends (nil) or fn returns an error (which
// Watch returns). Messages that are not events go to fn's caller as
// ErrBadEvent errors through bad, if not nil.
func Watch(ctx context.Context, nc *nats.Conn, cfg WatchConfig, fn func(*Event) error, bad func(error)) error {
	stream, err := events.StreamName(cfg.App)
	if err != nil {
		return fmt.Errorf("%w: app: %v", ErrBadConfig, err)
	}
	filter, err := events.EventFilter(cfg.App, cfg.Shard, cfg.Event)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBadConfig, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	deliver := jetstream.DeliverNewPolicy
	if cfg.FromStart {
		deliver = jetstream.DeliverAllPolicy
	}
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}, DeliverPolicy: deliver})
	if err != nil {
		return fmt.Errorf("watch %s: %w", stream, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return err
	}
	defer it.Stop()
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return fmt.Errorf("watch %s: %w", stream, err)
		}
		ev, err := eventOf(m)
		if err != nil {
			if bad != nil {
				bad(err)
			}
			continue
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
}
