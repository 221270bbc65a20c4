package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/events"
	"github.com/discord-pxe/dpxe/fleet/events/embedded"
	"github.com/discord-pxe/dpxe/sdk/dpxe"
)

// TestEventsStats publishes 3 dispatches on shard 1 and 2 on shard 7 of
// two sessions, lets a service consume and acknowledge 2 of the 5, and
// checks what `dpxe events stats` reads: per shard the stored count, the
// newest sequence, session and node; per consumer the lag (pending plus
// unacknowledged).
func TestEventsStats(t *testing.T) {
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
	ctx, cancel := context.WithTimeout(context.Background(), e2eDeadline)
	defer cancel()
	js, _ := jetstream.New(nc)
	if _, err := events.EnsureStream(ctx, js, "bot", events.DefaultStreamLimits()); err != nil {
		t.Fatal(err)
	}
	if _, err := dpxe.NewService(ctx, nc, dpxe.Config{App: "bot", Service: "svc", FromStart: true}); err != nil {
		t.Fatal(err)
	}
	pub, _ := events.NewPublisher(nc, events.PublisherConfig{App: "bot", Node: "sim-9"})
	for _, p := range []struct {
		shard uint32
		sess  string
		n     uint64
	}{{1, "sa", 3}, {7, "sb", 2}} {
		sp, _ := pub.Session(p.shard, p.sess, 0)
		for seq := uint64(1); seq <= p.n; seq++ {
			frame := fmt.Sprintf(`{"op":0,"t":"MESSAGE_CREATE","s":%d,"d":{}}`, seq)
			if err := sp.Publish(ctx, events.Dispatch{Seq: seq, Event: "MESSAGE_CREATE", Payload: []byte(frame), Received: time.Now()}); err != nil {
				t.Fatal(err)
			}
		}
		if err := sp.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	cons, _ := js.Consumer(ctx, "DPXE_EVENTS_bot", "svc")
	batch, err := cons.Fetch(2, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for m := range batch.Messages() {
		m.DoubleAck(ctx)
		got++
	}
	if got != 2 {
		t.Fatalf("fetched %d", got)
	}
	st, err := collectStats(ctx, nc, "bot")
	if err != nil {
		t.Fatal(err)
	}
	if st.Messages != 5 || len(st.Shards) != 2 || len(st.Consumers) != 1 {
		t.Fatalf("stats: %+v", st)
	}
	if s := st.Shards[0]; s.Shard != 1 || s.Stored != 3 || s.LastSeq != 3 || s.Session != "sa" || s.Node != "sim-9" {
		t.Errorf("shard 1: %+v", s)
	}
	if s := st.Shards[1]; s.Shard != 7 || s.Stored != 2 || s.LastSeq != 2 || s.Session != "sb" {
		t.Errorf("shard 7: %+v", s)
	}
	if c := st.Consumers[0]; c.Name != "svc" || c.Pending != 3 || c.Unacked != 0 || c.Acked != 2 {
		t.Errorf("consumer: %+v", c)
	}
	var out bytes.Buffer
	if err := printStats(&out, st, false, time.Now()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "svc") || !strings.Contains(out.String(), "sim-9") {
		t.Errorf("table:\n%s", out.String())
	}
}

// TestWorkersAdd: `dpxe workers add` writes the password 0600 beside the
// credentials file, refuses a second worker of the same name and a bad
// name, and `workers list` names it.
func TestWorkersAdd(t *testing.T) {
	dir := t.TempDir()
	auth := filepath.Join(dir, "nats-auth.json")
	if err := runWorkers(context.Background(), []string{"add", "pingbot", "--auth-file", auth}); err != nil {
		t.Fatal(err)
	}
	tok := filepath.Join(dir, "worker-pingbot.token")
	if st, err := os.Stat(tok); err != nil || st.Mode().Perm() != 0o600 || st.Size() < 40 {
		t.Fatalf("token file: %v %v", st, err)
	}
	if err := runWorkers(context.Background(), []string{"add", "pingbot", "--auth-file", auth, "--token-out", filepath.Join(dir, "x")}); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("second pingbot: %v", err)
	}
	if err := runWorkers(context.Background(), []string{"add", "Ping Bot", "--auth-file", auth, "--token-out", filepath.Join(dir, "y")}); !errors.Is(err, errUsage) {
		t.Errorf("bad name: %v", err)
	}
	b, _ := os.ReadFile(auth)
	tb, _ := os.ReadFile(tok)
	if strings.Contains(string(b), strings.TrimSpace(string(tb))) {
		t.Error("the credentials file holds the token itself")
	}
}

// TestServeNATSAuth runs `dpxe serve --nats-auth`: a client without
// credentials is refused, a worker added with `dpxe workers add` reads
// the stream's stats with --nats-user and --nats-password-file.
func TestServeNATSAuth(t *testing.T) {
	dir := t.TempDir()
	bin := sharedDpxe(t)
	out, err := exec.Command(bin, "workers", "add", "w1", "--auth-file", filepath.Join(dir, "nats-auth.json")).CombinedOutput()
	if err != nil {
		t.Fatalf("workers add: %v\n%s", err, out)
	}
	p := startServe(t, bin, "--db", filepath.Join(dir, "dpxe.db"), "--no-dashboard", "--nats-listen", "127.0.0.1:0", "--nats-auth")
	m := natsLogRE.FindStringSubmatch(p.logs())
	if m == nil {
		t.Fatalf("no events line with the NATS address:\n%s", p.logs())
	}
	if nc, err := nats.Connect(m[1], nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Error("an anonymous client connected")
	}
	out, err = exec.Command(bin, "events", "stats", "--nats-url", m[1], "--nats-user", "worker-w1",
		"--nats-password-file", filepath.Join(dir, "worker-w1.token")).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "stream DPXE_EVENTS_bot: 0 events") {
		t.Errorf("events stats as worker-w1: %v\n%s", err, out)
	}
	out, err = exec.Command(bin, "events", "stats", "--nats-url", m[1]).CombinedOutput()
	if err == nil {
		t.Errorf("events stats without credentials:\n%s", out)
	}
	// A node's check-in answer carries its broker access; the server
	// lets the node in with it, and the password is in no log line.
	out, err = exec.Command(bin, "nodes", "--server", p.url, "--token-file", filepath.Join(dir, "admin.token"), "add", "n1").CombinedOutput()
	if err != nil {
		t.Fatalf("dpxe nodes add: %v\n%s", err, out)
	}
	cred := strings.TrimSpace(strings.Split(string(out), "\n")[1])
	r := nodeCheckin(t, p.url, "n1", cred, appliance.CheckinRequest{Capacity: 1})
	if r.NATS == nil || r.NATS.User != "node-n1" || len(r.NATS.URLs) != 1 || r.NATS.URLs[0] != m[1] || r.NATS.App != "bot" {
		t.Fatalf("check-in answer's nats: %+v (server at %s)", r.NATS, m[1])
	}
	nc, err := nats.Connect(r.NATS.URLs[0], nats.UserInfo(r.NATS.User, r.NATS.Password), nats.MaxReconnects(0))
	if err != nil {
		t.Fatalf("node n1 with its check-in answer's credentials: %v", err)
	}
	nc.Close()
	if strings.Contains(p.logs(), r.NATS.Password) {
		t.Error("the node's NATS password is in serve's log")
	}
}
