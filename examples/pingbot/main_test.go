package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/discord-pxe/dpxe/fleet/events"
	"github.com/discord-pxe/dpxe/fleet/events/embedded"
	"github.com/discord-pxe/dpxe/sdk/dpxe"
	"github.com/discord-pxe/dpxe/tools/gatewayemu"
)

// node is a minimal simulated node for one shard: it identifies with the
// emulator and publishes every dispatch through an events.Publisher, as
// the lab's simulated nodes do (heartbeats are not needed: the test's
// heartbeat interval is longer than the test).
func node(ctx context.Context, t *testing.T, emu *gatewayemu.Emulator, pub *events.Publisher, published chan<- string) error {
	conn, _, err := websocket.Dial(ctx, emu.URL()+"/?v=10&encoding=json", nil)
	if err != nil {
		return err
	}
	defer conn.CloseNow()
	conn.SetReadLimit(1 << 20)
	if _, _, err := conn.Read(ctx); err != nil { // Hello
		return err
	}
	id, _ := json.Marshal(map[string]any{"op": 2, "d": map[string]any{"token": emu.Token(), "intents": 1 | 1<<9,
		"shard": []int{0, 1}, "properties": map[string]string{"os": "linux", "browser": "test", "device": "test"}}})
	if err := conn.Write(ctx, websocket.MessageText, id); err != nil {
		return err
	}
	var sp *events.SessionPublisher
	for {
		_, b, err := conn.Read(ctx)
		if err != nil {
			return err
		}
		var f struct {
			Op int             `json:"op"`
			S  uint64          `json:"s"`
			T  string          `json:"t"`
			D  json.RawMessage `json:"d"`
		}
		if err := json.Unmarshal(b, &f); err != nil || f.Op != 0 {
			continue
		}
		if f.T == "READY" {
			var r struct {
				SessionID string `json:"session_id"`
			}
			json.Unmarshal(f.D, &r)
			if sp, err = pub.Session(0, r.SessionID, 0); err != nil {
				return err
			}
		}
		if sp == nil {
			continue
		}
		if err := sp.Publish(ctx, events.Dispatch{Seq: f.S, Event: f.T, Payload: b, Received: time.Now()}); err != nil {
			return err
		}
		if f.T == "MESSAGE_CREATE" {
			var m message
			json.Unmarshal(f.D, &m)
			if m.Content == "!ping" {
				published <- m.ID
			}
		}
	}
}

// TestPingbotEndToEnd: the emulator sends MESSAGE_CREATEs (every second
// one "!ping") to a simulated node, which publishes them into the event
// stream of an embedded NATS server; pingbot reads them with the SDK and
// replies through the emulator's REST endpoint, whose per-channel limit
// (2 per 500 ms) answers some replies with 429. Once 20 pings went
// through the node, every one of them has exactly one "pong" replying
// to it in the emulator's record, and nothing else was posted.
func TestPingbotEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	emu, err := gatewayemu.Start(ctx, "127.0.0.1:0", gatewayemu.Options{HeartbeatInterval: 5 * time.Minute,
		IdentifyWindow: time.Nanosecond, Guilds: 2, MessagesPerSecond: 40, PingEvery: 2,
		RESTMessageLimit: 2, RESTMessageWindow: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer emu.Close()
	srv, err := embedded.Start(embedded.ServerConfig{StoreDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if _, err := events.EnsureStream(ctx, js, "bot", events.DefaultStreamLimits()); err != nil {
		t.Fatal(err)
	}
	pub, err := events.NewPublisher(nc, events.PublisherConfig{App: "bot", Node: "sim-1"})
	if err != nil {
		t.Fatal(err)
	}

	// pingbot, as main runs it.
	svc, err := dpxe.NewService(ctx, nc, dpxe.Config{App: "bot", Service: "pingbot", Events: []string{"MESSAGE_CREATE"}})
	if err != nil {
		t.Fatal(err)
	}
	b := newBot(emu.APIBase(10), emu.Token(), slog.New(slog.DiscardHandler))
	botCtx, stopBot := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := svc.Run(botCtx, b.handle, func(err error) { t.Errorf("bad event: %v", err) }); err != nil {
			t.Errorf("pingbot: %v", err)
		}
	}()
	defer func() { stopBot(); wg.Wait() }()

	// The node, until 20 pings were published.
	pings := make(chan string, 1000)
	nodeCtx, stopNode := context.WithCancel(ctx)
	nodeDone := make(chan error, 1)
	go func() { nodeDone <- node(nodeCtx, t, emu, pub, pings) }()
	var sent []string
	for len(sent) < 20 {
		select {
		case id := <-pings:
			sent = append(sent, id)
		case err := <-nodeDone:
			t.Fatalf("node: %v", err)
		case <-ctx.Done():
			t.Fatalf("%d pings published in time", len(sent))
		}
	}
	stopNode()
	<-nodeDone
	close(pings)
	for id := range pings {
		sent = append(sent, id)
	}

	// Every published ping gets exactly one reply: wait until pingbot's
	// consumer has nothing pending or unacknowledged, then no more
	// replies can come.
	stream, _ := events.StreamName("bot")
	deadline := time.Now().Add(30 * time.Second)
	for {
		cons, err := js.Consumer(ctx, stream, "pingbot")
		if err != nil {
			t.Fatal(err)
		}
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumPending == 0 && info.NumAckPending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pingbot's consumer still has %d pending, %d unacknowledged", info.NumPending, info.NumAckPending)
		}
		time.Sleep(50 * time.Millisecond)
	}
	rec := emu.REST()
	replies := map[string]int{}
	for _, m := range rec.Messages {
		if m.Content != "pong" {
			t.Errorf("posted %q", m.Content)
		}
		replies[m.ReplyTo]++
	}
	for _, id := range sent {
		if replies[id] != 1 {
			t.Errorf("ping %s: %d replies, want 1", id, replies[id])
		}
		delete(replies, id)
	}
	for id, n := range replies {
		t.Errorf("%d replies to %s, which the node did not publish as a ping", n, id)
	}
	pinged := map[string]bool{}
	for _, p := range rec.Pings {
		pinged[p.MessageID] = true
	}
	for _, id := range sent {
		if !pinged[id] {
			t.Errorf("ping %s is not in the emulator's ping record", id)
		}
	}
	if rec.RateLimited == 0 {
		t.Errorf("no reply was rate limited: the test did not exercise 429")
	}
	t.Log(fmt.Sprintf("%d pings, %d replies, %d answered 429 first", len(sent), len(rec.Messages), rec.RateLimited))
}

// FuzzRetryAfter: whatever a 429 says, the wait is between 1 ms and an
// hour (a huge or negative retry_after must not turn into a negative or
// overflowing duration).
func FuzzRetryAfter(f *testing.F) {
	for _, s := range []string{`{"retry_after": 0.25}`, `{"retry_after": 1e300}`, `{"retry_after": -5}`, `{"retry_after": "x"}`, `{`, ``} {
		f.Add([]byte(s), "1")
	}
	f.Add([]byte(`{}`), "99999999999999999999")
	f.Fuzz(func(t *testing.T, body []byte, header string) {
		h := http.Header{}
		h.Set("Retry-After", header)
		if d := retryAfter(h, body); d < time.Millisecond || d > maxRetryAfter {
			t.Fatalf("retry after %v for %q / %q", d, body, header)
		}
	})
}
