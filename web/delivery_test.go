package web

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/discord-pxe/dpxe/fleet/events"
	"github.com/discord-pxe/dpxe/fleet/events/embedded"
	"github.com/discord-pxe/dpxe/sdk/dpxe"
)

// TestFleetPageEventDelivery: the fleet page's event delivery panel reads
// a real JetStream stream holding 1,200 dispatches, with one bot service
// that has read nothing: the count, the bytes and the service's lag; once
// serve's connection is closed it says so instead.
func TestFleetPageEventDelivery(t *testing.T) {
	srv, err := embedded.Start(embedded.ServerConfig{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, _ := jetstream.New(nc)
	st, err := events.EnsureStream(ctx, js, "bot", events.DefaultStreamLimits())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dpxe.NewService(ctx, nc, dpxe.Config{App: "bot", Service: "pingbot", FromStart: true}); err != nil {
		t.Fatal(err)
	}
	pub, _ := events.NewPublisher(nc, events.PublisherConfig{App: "bot", Node: "n1"})
	sp, _ := pub.Session(3, "s", 0)
	for seq := uint64(1); seq <= 1200; seq++ {
		frame := fmt.Sprintf(`{"op":0,"s":%d,"t":"MESSAGE_CREATE","d":{}}`, seq)
		if err := sp.Publish(ctx, events.Dispatch{Seq: seq, Event: "MESSAGE_CREATE", Payload: []byte(frame), Received: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	if err := sp.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	f := newTestFleet(t, fleetOpts{total: 4, maxConc: 1, events: func(ctx context.Context) (events.StreamState, bool) {
		return events.ReadStreamState(ctx, nc, st), true
	}})
	c := f.client()
	f.login(c, testToken)
	_, body := get(t, c, f.srv.URL+"/")
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`<h2 id="delivery-h">Event delivery</h2>`, "1,200 <span class=\"muted\">events stored (" + binaryBytes(info.State.Bytes) + ")",
		`<th scope="row">pingbot</th><td class="num">1,200</td><td class="num">0</td><td class="num warn">1,200</td>`} {
		if !strings.Contains(body, want) {
			t.Errorf("fleet page lacks %s", want)
		}
	}
	nc.Close()
	_, body = get(t, c, f.srv.URL+"/")
	if !strings.Contains(body, "dpxe serve is not connected to the NATS broker") || strings.Contains(body, "events stored") {
		t.Error("with serve's connection closed, the panel does not say so")
	}
}

func TestDeliveryFormats(t *testing.T) {
	for n, want := range map[uint64]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567"} {
		if got := groupDigits(n); got != want {
			t.Errorf("groupDigits(%d) = %q, want %q", n, got, want)
		}
	}
	for n, want := range map[uint64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 3 << 20: "3.0 MiB", 5 << 40: "5.0 TiB"} {
		if got := binaryBytes(n); got != want {
			t.Errorf("binaryBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
