package events

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/discord-pxe/dpxe/fleet/events/embedded"
)

// testDeadline bounds every wait in this package's tests.
const testDeadline = 20 * time.Second

// startServer starts an embedded server on a temporary store (in-process
// only when listen is ""), shut down at the end of the test.
func startServer(t *testing.T, dir, listen string) *embedded.Server {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	s, err := embedded.Start(embedded.ServerConfig{Listen: listen, StoreDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// connect opens an in-process connection closed at the end of the test.
func connect(t *testing.T, s *embedded.Server, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := s.Connect(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// testStream creates the event stream of app "bot" with small messages
// refused above 1 KiB.
func testStream(t *testing.T, nc *nats.Conn) jetstream.Stream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	l := DefaultStreamLimits()
	l.MaxMsgSize = 1024
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	st, err := EnsureStream(ctx, js, "bot", l)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func streamMsgs(t *testing.T, st jetstream.Stream) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func dispatch(seq uint64, size int) Dispatch {
	return Dispatch{Seq: seq, Event: "MESSAGE_CREATE", Payload: bytes.Repeat([]byte{'x'}, size), Received: time.Now()}
}

func flush(t *testing.T, sp *SessionPublisher) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	if err := sp.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestDedupeOnReplay: the same dispatch published twice (as Discord's
// replay after a Resume does) is stored once; the second PubAck says
// duplicate.
func TestDedupeOnReplay(t *testing.T) {
	s := startServer(t, "", "")
	nc := connect(t, s)
	st := testStream(t, nc)
	p, err := NewPublisher(nc, PublisherConfig{App: "bot", Node: "sim-1"})
	if err != nil {
		t.Fatal(err)
	}
	sp, err := p.Session(0, "sess-a", 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for range 2 {
		if err := sp.Publish(ctx, dispatch(1, 10)); err != nil {
			t.Fatal(err)
		}
		flush(t, sp)
	}
	if n := streamMsgs(t, st); n != 1 {
		t.Errorf("stream holds %d messages, want 1", n)
	}
	stats := sp.Stats()
	if stats.Stored != 1 || stats.Duplicates != 1 || stats.Acked != 1 {
		t.Errorf("stats = %+v, want 1 stored, 1 duplicate, acked 1", stats)
	}
	// Another session's seq 1 is another event.
	sp2, _ := p.Session(0, "sess-b", 0)
	if err := sp2.Publish(ctx, dispatch(1, 10)); err != nil {
		t.Fatal(err)
	}
	flush(t, sp2)
	if n := streamMsgs(t, st); n != 2 {
		t.Errorf("stream holds %d messages after a second session, want 2", n)
	}
	// What was stored carries the headers and the body unchanged.
	msg, err := st.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	m, err := ParseHeader(msg.Header)
	if err != nil {
		t.Fatal(err)
	}
	if m.Session != "sess-a" || m.Seq != 1 || m.Node != "sim-1" || msg.Subject != "dpxe.bot.events.0.MESSAGE_CREATE" || len(msg.Data) != 10 {
		t.Errorf("stored %s %+v, %d bytes", msg.Subject, m, len(msg.Data))
	}
}

// TestAckedIsContiguous: a dispatch the stream refuses holds the Resume
// sequence back even though later ones are stored; when the replay
// publishes it again, Acked moves over the whole run, and the replayed
// later ones are dropped as duplicates.
func TestAckedIsContiguous(t *testing.T) {
	s := startServer(t, "", "")
	nc := connect(t, s)
	st := testStream(t, nc)
	p, err := NewPublisher(nc, PublisherConfig{App: "bot", Node: "sim-1", Window: 8})
	if err != nil {
		t.Fatal(err)
	}
	sp, _ := p.Session(3, "sess", 0)
	ctx := context.Background()
	// seq 2 is larger than the stream's 1 KiB max_msg_size: refused by
	// the server with an error PubAck.
	for _, d := range []Dispatch{dispatch(1, 10), dispatch(2, 2000), dispatch(3, 10), dispatch(4, 10)} {
		if err := sp.Publish(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	flush(t, sp)
	stats := sp.Stats()
	if stats.Acked != 1 || stats.Stored != 3 || stats.Failed != 1 || !strings.Contains(stats.LastErr, "seq 2") {
		t.Fatalf("after a refused seq 2: %+v, want acked 1, 3 stored, 1 failed", stats)
	}
	// Discord replays 2..4 after a Resume from 1 (now small enough).
	for _, d := range []Dispatch{dispatch(2, 10), dispatch(3, 10), dispatch(4, 10)} {
		if err := sp.Publish(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	flush(t, sp)
	stats = sp.Stats()
	if stats.Acked != 4 || stats.Stored != 4 || stats.Duplicates != 2 {
		t.Fatalf("after the replay: %+v, want acked 4, 4 stored, 2 duplicates", stats)
	}
	if n := streamMsgs(t, st); n != 4 {
		t.Errorf("stream holds %d messages, want 4", n)
	}
	// A session resumed from 4 (its successor) starts there.
	next, _ := p.Session(3, "sess", 4)
	if err := next.Publish(ctx, dispatch(5, 10)); err != nil {
		t.Fatal(err)
	}
	flush(t, next)
	if a := next.Acked(); a != 5 {
		t.Errorf("resumed session acked %d, want 5", a)
	}
}

// TestWindowFullWhenBrokerGone: with the broker gone no PubAck comes, so
// the window fills and Publish blocks until its context ends; Acked stays
// where the last acknowledgement left it.
func TestWindowFullWhenBrokerGone(t *testing.T) {
	s, err := embedded.Start(embedded.ServerConfig{Listen: "127.0.0.1:0", StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(s.ClientURL(), nats.MaxReconnects(-1))
	if err != nil {
		s.Shutdown()
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	testStream(t, nc)
	p, err := NewPublisher(nc, PublisherConfig{App: "bot", Node: "sim-1", Window: 4, AckTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	sp, _ := p.Session(0, "sess", 0)
	ctx := context.Background()
	if err := sp.Publish(ctx, dispatch(1, 10)); err != nil {
		t.Fatal(err)
	}
	flush(t, sp)
	s.Shutdown()
	// Wait until the client knows (it then buffers publishes for the
	// reconnect, and their PubAcks cannot come).
	deadline := time.Now().Add(testDeadline)
	for nc.IsConnected() {
		if time.Now().After(deadline) {
			t.Fatal("client still connected to a stopped server")
		}
		time.Sleep(5 * time.Millisecond)
	}
	for seq := uint64(2); seq <= 5; seq++ {
		if err := sp.Publish(ctx, dispatch(seq, 10)); err != nil {
			t.Fatalf("seq %d: %v", seq, err)
		}
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	err = sp.Publish(short, dispatch(6, 10))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("publish into a full window: %v, want deadline exceeded (%+v)", err, sp.Stats())
	}
	if st := sp.Stats(); st.Acked != 1 || st.InFlight != 4 {
		t.Errorf("stats = %+v, want acked 1 with 4 in flight", st)
	}
}

// TestStreamSurvivesRestart: the file store keeps the events and the
// stream across a restart of the embedded server.
func TestStreamSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	s, err := embedded.Start(embedded.ServerConfig{StoreDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := s.Connect()
	if err != nil {
		s.Shutdown()
		t.Fatal(err)
	}
	testStream(t, nc)
	p, _ := NewPublisher(nc, PublisherConfig{App: "bot", Node: "n"})
	sp, _ := p.Session(0, "sess", 0)
	for seq := uint64(1); seq <= 3; seq++ {
		if err := sp.Publish(context.Background(), dispatch(seq, 10)); err != nil {
			t.Fatal(err)
		}
	}
	flush(t, sp)
	nc.Close()
	s.Shutdown()
	s2 := startServer(t, dir, "")
	nc2 := connect(t, s2)
	if n := streamMsgs(t, testStream(t, nc2)); n != 3 {
		t.Errorf("after restart the stream holds %d messages, want 3", n)
	}
}

func TestConfigRefusals(t *testing.T) {
	l := DefaultStreamLimits()
	l.DuplicateWindow = 48 * time.Hour
	if err := l.Validate(); !errors.Is(err, ErrBadStreamConfig) {
		t.Errorf("duplicate window beyond max age: %v", err)
	}
	if _, err := embedded.Start(embedded.ServerConfig{StoreDir: t.TempDir(), Listen: ":4222"}); !errors.Is(err, embedded.ErrServerConfig) {
		t.Errorf("listen without host: %v", err)
	}
	if _, err := NewPublisher(nil, PublisherConfig{App: "bot", Node: "n", Window: 5000}); !errors.Is(err, ErrBadPublisherConfig) {
		t.Errorf("window 5000: %v", err)
	}
}

// TestSkipCountsAsAcked: dispatches a node skips (the check-in answer's
// nats.skip) are not sent, are counted, and Acked moves over them; a skip
// beyond a refused dispatch does not move Acked past the hole.
func TestSkipCountsAsAcked(t *testing.T) {
	s := startServer(t, "", "")
	nc := connect(t, s)
	st := testStream(t, nc)
	p, err := NewPublisher(nc, PublisherConfig{App: "bot", Node: "sim-1", Window: 8})
	if err != nil {
		t.Fatal(err)
	}
	sp, _ := p.Session(0, "sess", 0)
	ctx := context.Background()
	if err := sp.Publish(ctx, dispatch(1, 10)); err != nil {
		t.Fatal(err)
	}
	sp.Skip(2)
	sp.Skip(3)
	if err := sp.Publish(ctx, dispatch(4, 10)); err != nil {
		t.Fatal(err)
	}
	flush(t, sp)
	if st := sp.Stats(); st.Acked != 4 || st.Skipped != 2 || st.Stored != 2 || st.Published != 2 {
		t.Errorf("stats = %+v, want acked 4, 2 skipped, 2 stored and published", st)
	}
	if n := streamMsgs(t, st); n != 2 {
		t.Errorf("stream holds %d messages, want 2 (the skipped are not sent)", n)
	}
	// 5 refused (over the stream's 1 KiB), 6 skipped: Acked stays at 4.
	if err := sp.Publish(ctx, dispatch(5, 2000)); err != nil {
		t.Fatal(err)
	}
	sp.Skip(6)
	flush(t, sp)
	if a := sp.Acked(); a != 4 {
		t.Errorf("Acked = %d past a refused dispatch, want 4", a)
	}
	// The replay of 5 fills the hole: Acked moves over it and the skip.
	if err := sp.Publish(ctx, dispatch(5, 10)); err != nil {
		t.Fatal(err)
	}
	flush(t, sp)
	if a := sp.Acked(); a != 6 {
		t.Errorf("Acked = %d after the replay, want 6", a)
	}
}
