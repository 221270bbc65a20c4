package lab

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/events"
	"github.com/discord-pxe/dpxe/fleet/events/embedded"
)

// TestSimSkip: a simulated node whose check-in answer names GUILD_CREATE
// in nats.skip publishes READY and MESSAGE_CREATE, not the GUILD_CREATE,
// counts it skipped and acknowledges through it (Acked 3).
func TestSimSkip(t *testing.T) {
	srv, err := embedded.Start(embedded.ServerConfig{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := events.EnsureStream(ctx, js, labEventsApp, events.DefaultStreamLimits())
	if err != nil {
		t.Fatal(err)
	}
	pub, err := events.NewPublisher(nc, events.PublisherConfig{App: labEventsApp, Node: "sim-1"})
	if err != nil {
		t.Fatal(err)
	}
	s := &simNode{id: "sim-1"}
	s.apply(ctx, appliance.CheckinResponse{NATS: &appliance.NATSAccess{Skip: []string{"GUILD_CREATE"}}})
	var sp *events.SessionPublisher
	for i, f := range []string{
		`{"op":0,"s":1,"t":"READY","d":{"session_id":"sess-1"}}`,
		`{"op":0,"s":2,"t":"GUILD_CREATE","d":{"id":"1"}}`,
		`{"op":0,"s":3,"t":"MESSAGE_CREATE","d":{"id":"2"}}`,
	} {
		var p gatewayPayload
		if err := json.Unmarshal([]byte(f), &p); err != nil {
			t.Fatal(err)
		}
		p.raw = []byte(f)
		if sp, err = s.publish(ctx, pub, sp, 0, p); err != nil || sp == nil {
			t.Fatalf("dispatch %d: %v", i+1, err)
		}
	}
	if err := sp.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if stats := sp.Stats(); stats.Skipped != 1 || stats.Stored != 2 || stats.Acked != 3 {
		t.Errorf("stats %+v, want 1 skipped, 2 stored, acked 3", stats)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 2 {
		t.Errorf("the stream holds %d messages, want 2", info.State.Msgs)
	}
}
