package dpxe

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/discord-pxe/dpxe/fleet/events"
	"github.com/discord-pxe/dpxe/fleet/events/embedded"
)

const testDeadline = 20 * time.Second

// fixture is an embedded server with the "bot" stream and a publisher of
// shard 2's session "sess".
type fixture struct {
	nc *nats.Conn
	js jetstream.JetStream
	sp *events.SessionPublisher
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	srv, err := embedded.Start(embedded.ServerConfig{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	if _, err := events.EnsureStream(ctx, js, "bot", events.DefaultStreamLimits()); err != nil {
		t.Fatal(err)
	}
	p, err := events.NewPublisher(nc, events.PublisherConfig{App: "bot", Node: "sim-1"})
	if err != nil {
		t.Fatal(err)
	}
	sp, err := p.Session(2, "sess", 0)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{nc: nc, js: js, sp: sp}
}

// publish publishes Discord-like frames of the given event names with
// consecutive sequences after what the session has acknowledged, and
// waits for their PubAcks.
func (f *fixture) publish(t *testing.T, names ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	seq := f.sp.Acked()
	for _, n := range names {
		seq++
		frame := fmt.Sprintf(`{"op":0,"t":%q,"s":%d,"d":{"content":"hi %d"}}`, n, seq, seq)
		if err := f.sp.Publish(ctx, events.Dispatch{Seq: seq, Event: n, Payload: []byte(frame), Received: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.sp.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if f.sp.Acked() != seq {
		t.Fatalf("acked %d, want %d (%+v)", f.sp.Acked(), seq, f.sp.Stats())
	}
}

// runUntil runs s until n events were handled (h decides each outcome)
// or the deadline passes, and returns the events handled.
func runUntil(t *testing.T, s *Service, n int, h func(*Event) error) []*Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	var got []*Event
	err := s.Run(ctx, func(_ context.Context, ev *Event) error {
		got = append(got, ev)
		herr := h(ev)
		if len(got) == n {
			cancel()
		}
		return herr
	}, func(err error) { t.Errorf("bad event: %v", err) })
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != n {
		t.Fatalf("handled %d events before the deadline, want %d", len(got), n)
	}
	return got
}

func ok(*Event) error { return nil }

// waitAckFloor polls the consumer until its acknowledged floor reaches
// stream sequence seq.
func waitAckFloor(t *testing.T, s *Service, seq uint64) {
	t.Helper()
	deadline := time.Now().Add(testDeadline)
	for {
		info, err := s.cons.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if info.AckFloor.Stream >= seq && info.NumAckPending == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("ack floor %d, %d pending; want %d", info.AckFloor.Stream, info.NumAckPending, seq)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestServiceFiltersAndAcks(t *testing.T) {
	f := newFixture(t)
	f.publish(t, "MESSAGE_CREATE", "GUILD_CREATE", "MESSAGE_CREATE")
	ctx := context.Background()
	s, err := NewService(ctx, f.nc, Config{App: "bot", Service: "pingbot", Events: []string{"MESSAGE_CREATE"}, FromStart: true})
	if err != nil {
		t.Fatal(err)
	}
	got := runUntil(t, s, 2, ok)
	for i, want := range []uint64{1, 3} {
		ev := got[i]
		var d struct{ Content string }
		if err := ev.Decode(&d); err != nil {
			t.Fatal(err)
		}
		if ev.Seq != want || ev.Name != "MESSAGE_CREATE" || ev.Shard != 2 || ev.Session != "sess" || ev.Node != "sim-1" ||
			ev.Delivered != 1 || d.Content != fmt.Sprintf("hi %d", want) {
			t.Errorf("event %d = %+v, d %+v; want seq %d", i, ev, d, want)
		}
	}
	waitAckFloor(t, s, 3)
}

func TestServiceRedeliversAfterError(t *testing.T) {
	f := newFixture(t)
	f.publish(t, "MESSAGE_CREATE")
	s, err := NewService(context.Background(), f.nc, Config{App: "bot", Service: "flaky", FromStart: true})
	if err != nil {
		t.Fatal(err)
	}
	failed := false
	got := runUntil(t, s, 2, func(ev *Event) error {
		if !failed {
			failed = true
			return errors.New("database down")
		}
		return nil
	})
	if got[0].Seq != 1 || got[1].Seq != 1 || got[1].Delivered != 2 {
		t.Errorf("deliveries: %+v then %+v; want seq 1 twice, the second with Delivered 2", got[0], got[1])
	}
	waitAckFloor(t, s, 1)
}

// TestServiceIsDurable: a service restarted continues where it was, and
// another service reads the same events independently.
func TestServiceIsDurable(t *testing.T) {
	f := newFixture(t)
	f.publish(t, "MESSAGE_CREATE", "MESSAGE_CREATE")
	ctx := context.Background()
	cfg := Config{App: "bot", Service: "pingbot", FromStart: true}
	s, err := NewService(ctx, f.nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, s, 2, ok)
	waitAckFloor(t, s, 2)
	f.publish(t, "MESSAGE_CREATE", "TYPING_START")
	s2, err := NewService(ctx, f.nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	got := runUntil(t, s2, 2, ok)
	if got[0].Seq != 3 || got[1].Seq != 4 || got[1].Name != "TYPING_START" {
		t.Errorf("restarted service got seq %d, %d; want 3, 4", got[0].Seq, got[1].Seq)
	}
	waitAckFloor(t, s2, 4)
	audit, err := NewService(ctx, f.nc, Config{App: "bot", Service: "audit", FromStart: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := runUntil(t, audit, 4, ok); got[0].Seq != 1 || got[3].Seq != 4 {
		t.Errorf("second service got seq %d..%d, want 1..4", got[0].Seq, got[3].Seq)
	}
}

// TestServiceTerminatesForeignMessages: a message on an event subject
// without the headers is reported and never delivered again.
func TestServiceTerminatesForeignMessages(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	if _, err := f.js.Publish(ctx, "dpxe.bot.events.0.READY", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	f.publish(t, "READY")
	s, err := NewService(ctx, f.nc, Config{App: "bot", Service: "strict", FromStart: true})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var bad []error
	var got []*Event
	err = s.Run(ctx, func(_ context.Context, ev *Event) error {
		got = append(got, ev)
		cancel()
		return nil
	}, func(err error) { mu.Lock(); bad = append(bad, err); mu.Unlock() })
	if err != nil {
		t.Fatal(err)
	}
	if len(bad) != 1 || !errors.Is(bad[0], ErrBadEvent) || len(got) != 1 || got[0].Seq != 1 {
		t.Errorf("bad %v, got %d events; want one ErrBadEvent and seq 1", bad, len(got))
	}
}

func TestWatchFilters(t *testing.T) {
	f := newFixture(t)
	f.publish(t, "READY", "GUILD_CREATE", "MESSAGE_CREATE")
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	shard := uint32(2)
	var got []*Event
	err := Watch(ctx, f.nc, WatchConfig{App: "bot", Shard: &shard, Event: "GUILD_CREATE", FromStart: true}, func(ev *Event) error {
		got = append(got, ev)
		cancel()
		return nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Seq != 2 {
		t.Fatalf("watch got %d events, want seq 2", len(got))
	}
	other := uint32(7)
	if err := Watch(context.Background(), f.nc, WatchConfig{App: "bot", Shard: &other, Event: "ready"}, nil, nil); !errors.Is(err, ErrBadConfig) {
		t.Errorf("lower-case event: %v", err)
	}
}

func TestConfigRefusals(t *testing.T) {
	f := newFixture(t)
	for _, c := range []Config{
		{App: "bot", Service: "Ping"},
		{App: "bot", Service: "p.b"},
		{App: "bot", Service: "p", Events: []string{"MESSAGE_*"}},
		{App: "b*", Service: "p"},
		{App: "bot", Service: "p", AckWait: time.Millisecond},
	} {
		if _, err := NewService(context.Background(), f.nc, c); !errors.Is(err, ErrBadConfig) {
			t.Errorf("%+v: %v, want ErrBadConfig", c, err)
		}
	}
}
