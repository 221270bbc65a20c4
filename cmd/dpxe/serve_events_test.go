package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/discord-pxe/dpxe/fleet/events"
	"github.com/discord-pxe/dpxe/fleet/events/eventstest"
)

// startNATSCluster starts three routed NATS servers with JetStream on
// loopback (stand-ins for an operator's cluster) and returns their client
// URLs.
func startNATSCluster(t *testing.T) []string {
	t.Helper()
	return eventstest.StartEmbedded(t, "ext").URLs
}

// TestServeEventsExternalCluster: with --nats-url, `dpxe serve` starts no
// embedded server, creates the R3 event stream on the given cluster, and
// events published there reach `dpxe events tail`.
func TestServeEventsExternalCluster(t *testing.T) {
	dir := t.TempDir()
	bin, err := buildDpxe(dir)
	if err != nil {
		t.Fatal(err)
	}
	urls := startNATSCluster(t)
	list := strings.Join(urls, ",")
	// The cluster elects its JetStream leader in a few seconds after
	// start; serve retries creating the stream meanwhile.
	p := startServe(t, bin, "--db", filepath.Join(dir, "dpxe.db"), "--no-dashboard", "--nats-url", list, "--events-replicas", "3")
	logs := p.logs()
	if !strings.Contains(logs, "embedded=false") || !strings.Contains(logs, "stream=DPXE_EVENTS_bot") {
		t.Fatalf("serve did not use the cluster:\n%s", logs)
	}
	if _, err := os.Stat(filepath.Join(dir, "nats")); !os.IsNotExist(err) {
		t.Errorf("an embedded store was created with --nats-url: %v", err)
	}
	nc, err := nats.Connect(list)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), e2eDeadline)
	defer cancel()
	st, err := js.Stream(ctx, "DPXE_EVENTS_bot")
	if err != nil {
		t.Fatal(err)
	}
	if r := st.CachedInfo().Config.Replicas; r != 3 {
		t.Errorf("stream replicas %d, want 3", r)
	}
	pub, _ := events.NewPublisher(nc, events.PublisherConfig{App: "bot", Node: "n1"})
	sp, _ := pub.Session(1, "s1", 0)
	if err := sp.Publish(ctx, events.Dispatch{Seq: 1, Event: "READY", Payload: []byte(`{"op":0,"t":"READY","s":1,"d":{}}`), Received: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := sp.Flush(ctx); err != nil || sp.Acked() != 1 {
		t.Fatalf("not acknowledged: %v %+v", err, sp.Stats())
	}
	out, err := exec.CommandContext(ctx, bin, "events", "tail", "--nats-url", urls[2], "--all", "--count", "1").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "shard 1  seq 1  READY") {
		t.Fatalf("tail from the third server: %v\n%s", err, out)
	}
	p.stop(t)
}
