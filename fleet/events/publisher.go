package events

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Defaults of the Publisher.
const (
	// DefaultWindow is how many of a session's dispatches may await their
	// PubAck at once. It must stay far below Discord's replay buffer (in
	// 2016 max(100, min(3500, guilds*75)) events) so that everything not
	// yet acknowledged can still be replayed after a Resume.
	DefaultWindow = 256
	// DefaultAckTimeout is how long a publish waits for its PubAck before
	// it counts as failed (not acknowledged, so not skipped by Resume).
	DefaultAckTimeout = 5 * time.Second
	// maxAsyncPending lets the client library hold every window of a
	// node (128 shards × DefaultWindow) without stalling.
	maxAsyncPending = 1 << 16
)

// Errors of the Publisher.
var (
	// ErrBadPublisherConfig means a Publisher setting is out of range;
	// wrapped with the field at fault.
	ErrBadPublisherConfig = errors.New("publisher setting out of range")
	// ErrNotAcknowledged means the stream refused a dispatch or its PubAck
	// did not come in time.
	ErrNotAcknowledged = errors.New("dispatch not acknowledged by the stream")
)

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	App        string        // the bot's app name in subjects
	Node       string        // Dpxe-Node of everything published
	Window     int           // in-flight dispatches per session; 0 = DefaultWindow
	AckTimeout time.Duration // 0 = DefaultAckTimeout
}

// Publisher publishes dispatches into the event stream. One Publisher
// serves a node; each Gateway session gets a SessionPublisher. Safe for
// concurrent use.
type Publisher struct {
	js  jetstream.JetStream
	cfg PublisherConfig
}

// NewPublisher publishes through nc (which it does not close).
func NewPublisher(nc *nats.Conn, cfg PublisherConfig) (*Publisher, error) {
	if err := ValidateApp(cfg.App); err != nil {
		return nil, err
	}
	if err := checkToken("node", cfg.Node, maxNodeLen); err != nil {
		return nil, err
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.AckTimeout == 0 {
		cfg.AckTimeout = DefaultAckTimeout
	}
	if cfg.Window < 1 || cfg.Window > 4096 {
		return nil, fmt.Errorf("window %d: 1..4096: %w", cfg.Window, ErrBadPublisherConfig)
	}
	if cfg.AckTimeout < 10*time.Millisecond {
		return nil, fmt.Errorf("ack_timeout %v: at least 10ms: %w", cfg.AckTimeout, ErrBadPublisherConfig)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(maxAsyncPending),
		jetstream.WithPublishAsyncTimeout(cfg.AckTimeout))
	if err != nil {
		return nil, err
	}
	return &Publisher{js: js, cfg: cfg}, nil
}

// Dispatch is one Gateway dispatch (op 0) as a node received it: the raw
// frame is published unchanged as the message body.
type Dispatch struct {
	Seq      uint64    // Discord's s
	Event    string    // Discord's t, e.g. MESSAGE_CREATE
	Payload  []byte    // the frame as received
	Received time.Time // when the node read it
}

// Session starts publishing the dispatches of one Gateway session.
// acked is the sequence the session starts from: 0 for a new session
// (READY is 1), or the acknowledged sequence it was resumed from.
func (p *Publisher) Session(shard uint32, session string, acked uint64) (*SessionPublisher, error) {
	if err := checkToken("session", session, maxSessionLen); err != nil {
		return nil, err
	}
	return &SessionPublisher{p: p, shard: shard, session: session, acked: acked,
		slots: make(chan struct{}, p.cfg.Window), above: map[uint64]struct{}{}}, nil
}

// SessionStats counts what a SessionPublisher did.
type SessionStats struct {
	Published  uint64 // handed to the connection
	Stored     uint64 // acknowledged as new messages
	Duplicates uint64 // acknowledged as duplicates of a stored Msg-Id
	Failed     uint64 // refused, timed out or not sent
	Skipped    uint64 // not published by choice (Skip): counted as acknowledged
	InFlight   int    // awaiting a PubAck now
	Acked      uint64 // the Resume sequence (see Acked)
	LastErr    string // the last failure, "" if none
}

// SessionPublisher publishes one session's dispatches with a bounded
// in-flight window and keeps the session's Resume sequence. Safe for
// concurrent use, though a shard publishes in order from one goroutine.
type SessionPublisher struct {
	p       *Publisher
	shard   uint32
	session string
	slots   chan struct{} // one token per dispatch in flight

	mu    sync.Mutex
	acked uint64              // every seq in 1..acked is stored
	above map[uint64]struct{} // acknowledged seqs beyond acked+1's gap
	stats SessionStats
}

// Acked is the highest sequence S such that every dispatch up to S (from
// the sequence the session started at) is acknowledged by the stream. It
// is the only sequence a shard may Resume from or hand over: a Resume from
// it makes Discord replay whatever was not stored, and the stream drops
// the replayed dispatches it already has by their Msg-Id.
func (s *SessionPublisher) Acked() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.acked
}

// Stats returns the counters.
func (s *SessionPublisher) Stats() SessionStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Acked = s.acked
	st.InFlight = len(s.slots)
	return st
}

// Publish sends d and returns once it is on its way; its PubAck is awaited
// in the background and moves Acked. When the window is full it blocks
// until a PubAck frees a slot or ctx ends (a shard then stops reading from
// Discord, which is the back-pressure the no-loss rule needs). An error
// means d was not sent; Acked does not pass it until it is sent again
// (Discord's replay after a Resume does that). A dispatch whose PubAck
// fails later is counted in Stats; either way the shard should Resume from
// Acked soon, since acknowledgements beyond the hole are held in memory
// until it is filled.
func (s *SessionPublisher) Publish(ctx context.Context, d Dispatch) error {
	subj, err := EventSubject(s.p.cfg.App, s.shard, d.Event)
	if err != nil {
		return fmt.Errorf("shard %d seq %d: %w", s.shard, d.Seq, err)
	}
	meta := Meta{Shard: s.shard, Seq: d.Seq, Session: s.session, Node: s.p.cfg.Node, Received: d.Received}
	h, err := meta.Header()
	if err != nil {
		return fmt.Errorf("shard %d seq %d: %w", s.shard, d.Seq, err)
	}
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("shard %d seq %d: window of %d full: %w", s.shard, d.Seq, cap(s.slots), context.Cause(ctx))
	}
	fut, err := s.p.js.PublishMsgAsync(&nats.Msg{Subject: subj, Header: h, Data: d.Payload})
	if err != nil {
		<-s.slots
		err = fmt.Errorf("shard %d seq %d: %w: %w", s.shard, d.Seq, ErrNotAcknowledged, err)
		s.record(d.Seq, nil, err)
		return err
	}
	s.mu.Lock()
	s.stats.Published++
	s.mu.Unlock()
	go func() {
		select {
		case ack := <-fut.Ok():
			s.record(d.Seq, ack, nil)
		case err := <-fut.Err():
			s.record(d.Seq, nil, fmt.Errorf("shard %d seq %d: %w: %w", s.shard, d.Seq, ErrNotAcknowledged, err))
		}
		<-s.slots
	}()
	return nil
}

// Skip books dispatch seq as one the node chose not to publish (its type
// is in the check-in answer's nats.skip, appliance.NATSAccess.Skip): it is
// counted in Stats.Skipped and counts as acknowledged, so Acked moves over
// it once every dispatch before it is stored. Nothing is sent.
func (s *SessionPublisher) Skip(seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.Skipped++
	s.advance(seq)
}

// record books one outcome and advances acked over a contiguous run.
func (s *SessionPublisher) record(seq uint64, ack *jetstream.PubAck, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.stats.Failed++
		s.stats.LastErr = err.Error()
		return
	}
	if ack.Duplicate {
		s.stats.Duplicates++
	} else {
		s.stats.Stored++
	}
	s.advance(seq)
}

// advance books seq as acknowledged and moves acked over the contiguous
// run; s.mu is held.
func (s *SessionPublisher) advance(seq uint64) {
	if seq <= s.acked {
		return
	}
	s.above[seq] = struct{}{}
	for {
		if _, ok := s.above[s.acked+1]; !ok {
			break
		}
		delete(s.above, s.acked+1)
		s.acked++
	}
}

// Flush waits until no dispatch of the session is in flight (every one
// acknowledged or failed), or ctx ends. A drain calls it before it reports
// the final Acked and closes the session for its successor.
func (s *SessionPublisher) Flush(ctx context.Context) error {
	n := 0
	defer func() {
		for ; n > 0; n-- {
			<-s.slots
		}
	}()
	for ; n < cap(s.slots); n++ {
		select {
		case s.slots <- struct{}{}:
		case <-ctx.Done():
			return fmt.Errorf("shard %d: flush: %d in flight: %w", s.shard, cap(s.slots)-n, context.Cause(ctx))
		}
	}
	return nil
}
