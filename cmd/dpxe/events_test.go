package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/discord-pxe/dpxe/fleet/events"
)

var natsLogRE = regexp.MustCompile(`msg=events part=events nats=(nats://127\.0\.0\.1:\d+)`)

// TestEventsTail runs `dpxe serve` with its embedded NATS server on
// loopback, publishes dispatches with the Publisher over TCP as a node
// would, and reads them back with `dpxe events tail`, filtered, stored
// and live.
func TestEventsTail(t *testing.T) {
	dir := t.TempDir()
	bin := sharedDpxe(t)
	p := startServe(t, bin, "--db", filepath.Join(dir, "dpxe.db"), "--no-dashboard")
	m := natsLogRE.FindStringSubmatch(p.logs())
	if m == nil {
		t.Fatalf("no events line with the NATS address:\n%s", p.logs())
	}
	natsURL := m[1]
	if _, err := os.Stat(filepath.Join(dir, "nats", "jetstream")); err != nil {
		t.Errorf("JetStream store beside the database: %v", err)
	}
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	pub, err := events.NewPublisher(nc, events.PublisherConfig{App: "bot", Node: "sim-1"})
	if err != nil {
		t.Fatal(err)
	}
	s4, _ := pub.Session(4, "sess4", 0)
	s5, _ := pub.Session(5, "sess5", 0)
	publish := func(sp *events.SessionPublisher, seq uint64, name string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), e2eDeadline)
		defer cancel()
		frame := fmt.Sprintf(`{"op":0,"t":%q,"s":%d,"d":{"n":%d}}`, name, seq, seq)
		if err := sp.Publish(ctx, events.Dispatch{Seq: seq, Event: name, Payload: []byte(frame), Received: time.Now()}); err != nil {
			t.Fatal(err)
		}
		if err := sp.Flush(ctx); err != nil || sp.Acked() != seq {
			t.Fatalf("seq %d not acknowledged: %v %+v", seq, err, sp.Stats())
		}
	}
	publish(s4, 1, "READY")
	publish(s4, 2, "MESSAGE_CREATE")
	publish(s5, 1, "MESSAGE_CREATE")

	ctx, cancel := context.WithTimeout(context.Background(), e2eDeadline)
	defer cancel()
	tail := exec.CommandContext(ctx, bin, "events", "tail", "--nats-url", natsURL, "--json", "--all",
		"--shard", "4", "--event", "MESSAGE_CREATE", "--count", "2")
	out, err := tail.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	tail.Stderr = &stderr
	if err := tail.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	var lines []tailLine
	for sc.Scan() {
		dec := json.NewDecoder(strings.NewReader(sc.Text()))
		dec.DisallowUnknownFields()
		var l tailLine
		if err := dec.Decode(&l); err != nil {
			t.Fatalf("tail line %q: %v", sc.Text(), err)
		}
		lines = append(lines, l)
		if len(lines) == 1 {
			publish(s4, 3, "GUILD_CREATE") // filtered out
			publish(s4, 4, "MESSAGE_CREATE")
		}
	}
	if err := tail.Wait(); err != nil {
		t.Fatalf("tail: %v\n%s", err, stderr.String())
	}
	if len(lines) != 2 {
		t.Fatalf("tail printed %d events, want 2", len(lines))
	}
	for i, want := range []uint64{2, 4} {
		l := lines[i]
		if l.Shard != 4 || l.Seq != want || l.Event != "MESSAGE_CREATE" || l.Session != "sess4" || l.Node != "sim-1" ||
			string(l.Frame) != fmt.Sprintf(`{"op":0,"t":"MESSAGE_CREATE","s":%d,"d":{"n":%d}}`, want, want) {
			t.Errorf("line %d = %+v (frame %s), want shard 4 seq %d", i, l, l.Frame, want)
		}
	}

	// Text mode, every shard and event: all five, in stream order.
	text, err := exec.CommandContext(ctx, bin, "events", "tail", "--nats-url", natsURL, "--all", "--count", "5").CombinedOutput()
	if err != nil {
		t.Fatalf("tail: %v\n%s", err, text)
	}
	want := []string{"shard 4  seq 1  READY", "shard 4  seq 2  MESSAGE_CREATE", "shard 5  seq 1  MESSAGE_CREATE",
		"shard 4  seq 3  GUILD_CREATE", "shard 4  seq 4  MESSAGE_CREATE"}
	got := strings.Split(strings.TrimSpace(string(text)), "\n")
	if len(got) != len(want) {
		t.Fatalf("text tail:\n%s", text)
	}
	for i := range want {
		if !strings.Contains(got[i], want[i]) {
			t.Errorf("text line %d = %q, want %q", i, got[i], want[i])
		}
	}
	p.stop(t)
}

// TestServeEventsFlags: a duplicate window not longer than lease +
// resume TTL, an unknown app name or replicas without a cluster stop
// `dpxe serve` with a reason; --no-events starts without NATS.
func TestServeEventsFlags(t *testing.T) {
	dir := t.TempDir()
	bin := sharedDpxe(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--events-duplicate-window", "90s"}, "must exceed lease + resume-ttl (1m30s)"},
		{[]string{"--events-app", "Bot"}, "events-app"},
		{[]string{"--events-replicas", "3"}, "needs --nats-url"},
		{[]string{"--nats-url", "http://x:4222"}, "nats-url"},
		{[]string{"--events-max-age", "10m", "--events-duplicate-window", "15m"}, "duplicate_window"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), e2eDeadline)
		args := append([]string{"serve", "--db", filepath.Join(dir, "dpxe.db"), "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0"}, c.args...)
		out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
		cancel()
		if err == nil || !strings.Contains(string(out), c.want) {
			t.Errorf("%v: %v, want a refusal naming %q:\n%s", c.args, err, c.want, out)
		}
	}
	cfg := filepath.Join(dir, "serve.json")
	if err := os.WriteFile(cfg, []byte(`{"no_events": true}`), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startServe(t, bin, "--db", filepath.Join(dir, "dpxe.db"), "--no-dashboard", "--config", cfg)
	if !strings.Contains(p.logs(), "event delivery disabled") || natsLogRE.MatchString(p.logs()) {
		t.Errorf("no_events in the config file did not turn delivery off:\n%s", p.logs())
	}
	p.stop(t)
}
