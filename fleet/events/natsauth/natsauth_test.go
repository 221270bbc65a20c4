package natsauth

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/events"
	"github.com/discord-pxe/dpxe/fleet/events/embedded"
	"github.com/discord-pxe/dpxe/sdk/dpxe"
)

// violations collects the asynchronous permission errors of a connection.
type violations struct {
	mu   sync.Mutex
	errs []string
}

func (v *violations) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	v.mu.Lock()
	v.errs = append(v.errs, err.Error())
	v.mu.Unlock()
}

// await waits until a violation mentioning subject was reported.
func (v *violations) await(t *testing.T, subject string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		v.mu.Lock()
		for _, e := range v.errs {
			if strings.Contains(e, "Permissions Violation") && strings.Contains(e, subject) {
				v.mu.Unlock()
				return
			}
		}
		got := append([]string(nil), v.errs...)
		v.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("no permissions violation for %s; errors: %q", subject, got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCredentialsAndPermissions runs the embedded server with the
// credentials file's Authorizer: node n1 (shards 0 and 1) publishes its
// own dispatches and answers its commands, but cannot publish to n2's
// shard 2 or subscribe to its commands; a wrong password, an unknown
// node and an unknown worker cannot connect; a worker added while the
// server runs reads events with the SDK and sends a command that n1
// answers, but cannot publish an event; the stream holds only n1's own
// dispatch.
func TestCredentialsAndPermissions(t *testing.T) {
	dir := t.TempDir()
	f, err := Open(filepath.Join(dir, FileName))
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(dir, FileName)); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("credentials file: %v %v", st.Mode(), err)
	}
	owned := map[string][]uint32{"n1": {0, 1}, "n2": {2}}
	auth, err := f.Authorizer("bot", func(id string) ([]uint32, bool) { s, ok := owned[id]; return s, ok })
	if err != nil {
		t.Fatal(err)
	}
	srv, err := embedded.Start(embedded.ServerConfig{StoreDir: filepath.Join(dir, "nats"), Listen: "127.0.0.1:0", Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	admin, err := srv.Connect()
	if err != nil {
		t.Fatalf("in-process: %v", err)
	}
	defer admin.Close()
	ajs, _ := jetstream.New(admin)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := events.EnsureStream(ctx, ajs, "bot", events.DefaultStreamLimits())
	if err != nil {
		t.Fatal(err)
	}
	connect := func(user, pass string, v *violations) (*nats.Conn, error) {
		opts := []nats.Option{nats.UserInfo(user, pass), nats.MaxReconnects(0)}
		if v != nil {
			opts = append(opts, nats.ErrorHandler(v.handler))
		}
		return nats.Connect(srv.ClientURL(), opts...)
	}
	for _, c := range [][2]string{{"node-n1", "wrong"}, {"node-n3", f.NodePassword("n3")}, {"worker-w1", "x"}, {"", ""}, {"node-n1", f.NodePassword("n2")}} {
		if nc, err := connect(c[0], c[1], nil); err == nil {
			nc.Close()
			t.Errorf("user %q connected", c[0])
		}
	}

	var nv violations
	n1, err := connect("node-n1", f.NodePassword("n1"), &nv)
	if err != nil {
		t.Fatalf("node n1: %v", err)
	}
	defer n1.Close()
	pub, _ := events.NewPublisher(n1, events.PublisherConfig{App: "bot", Node: "n1", AckTimeout: 2 * time.Second})
	sp, _ := pub.Session(0, "s0", 0)
	if err := sp.Publish(ctx, events.Dispatch{Seq: 1, Event: "MESSAGE_CREATE", Payload: []byte(`{"op":0,"t":"MESSAGE_CREATE","s":1,"d":{}}`), Received: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := sp.Flush(ctx); err != nil || sp.Acked() != 1 {
		t.Fatalf("n1's own shard: acked %d, %v", sp.Acked(), err)
	}
	// n2's shard: the server refuses the publish.
	n1.Publish("dpxe.bot.events.2.MESSAGE_CREATE", []byte(`{}`))
	nv.await(t, "dpxe.bot.events.2.MESSAGE_CREATE")
	if _, err := n1.SubscribeSync("dpxe.bot.commands.2"); err == nil {
		n1.Flush()
	}
	nv.await(t, "dpxe.bot.commands.2")
	var log appliance.SendLog
	sub, err := events.ServeCommands(n1, "bot", 0, func(body []byte) events.CommandReply {
		_, r := events.CheckCommand(body, events.ShardView{Shard: 0, TotalShards: 3, Owned: true, Ready: true,
			Log: &log, NowTSC: 1, CyclesPerMS: 1e6, HeartbeatMS: 41250})
		return r
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	n1.Flush()

	// A worker, added while the server runs.
	token, err := f.AddWorker("w1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.AddWorker("w1"); !errors.Is(err, ErrExists) {
		t.Errorf("second w1: %v", err)
	}
	if _, err := f.AddWorker("W 1"); !errors.Is(err, ErrBadName) {
		t.Errorf("bad name: %v", err)
	}
	var wv violations
	w1, err := connect("worker-w1", token, &wv)
	if err != nil {
		t.Fatalf("worker w1: %v", err)
	}
	defer w1.Close()
	svc, err := dpxe.NewService(ctx, w1, dpxe.Config{App: "bot", Service: "w1", FromStart: true})
	if err != nil {
		t.Fatalf("worker's service: %v", err)
	}
	got := make(chan *dpxe.Event, 1)
	rctx, stopRun := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- svc.Run(rctx, func(_ context.Context, ev *dpxe.Event) error { got <- ev; return nil }, nil)
	}()
	select {
	case ev := <-got:
		if ev.Shard != 0 || ev.Seq != 1 || ev.Node != "n1" {
			t.Errorf("worker read %+v", ev)
		}
	case <-ctx.Done():
		t.Fatal("the worker read no event")
	}
	stopRun()
	if err := <-done; err != nil {
		t.Errorf("worker's Run: %v", err)
	}
	cmd, _ := dpxe.NewCommander(w1, dpxe.CommandConfig{App: "bot", Shards: 3})
	if err := cmd.SendToShard(ctx, 0, dpxe.OpPresenceUpdate, map[string]any{"status": "idle"}); err != nil {
		t.Errorf("worker's command to n1: %v", err)
	}
	wjs, _ := jetstream.New(w1)
	pctx, pcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = wjs.Publish(pctx, "dpxe.bot.events.0.MESSAGE_CREATE", []byte(`{}`), jetstream.WithMsgID("forged:1"))
	pcancel()
	if err == nil {
		t.Error("a worker published an event")
	}
	wv.await(t, "dpxe.bot.events.0.MESSAGE_CREATE")
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Errorf("the stream holds %d messages, want n1's one", info.State.Msgs)
	}
}

// TestOpenRefusesBadFiles: a malformed file is refused with the field.
func TestOpenRefusesBadFiles(t *testing.T) {
	for name, body := range map[string]string{
		"not json":    `{`,
		"node_secret": `{"node_secret":"c2hvcnQ=","workers":{}}`,
		"sha256":      `{"node_secret":"` + strings.Repeat("A", 44) + `","workers":{"w":{"sha256":"zz"}}}`,
		"worker name": `{"node_secret":"` + strings.Repeat("A", 44) + `","workers":{"W W":{"sha256":"` + strings.Repeat("0", 64) + `"}}}`,
	} {
		p := filepath.Join(t.TempDir(), FileName)
		os.WriteFile(p, []byte(body), 0o600)
		if _, err := Open(p); err == nil {
			t.Errorf("%s: accepted", name)
		} else if name != "not json" && !strings.Contains(err.Error(), strings.Fields(name)[0]) {
			t.Errorf("%s: %v does not name the field", name, err)
		}
	}
}

// FuzzOpen: any file content is refused with an error or accepted with a
// usable secret and valid worker names; never a panic.
func FuzzOpen(f *testing.F) {
	good := `{"node_secret":"` + strings.Repeat("A", 44) + `","workers":{"w":{"sha256":"` + strings.Repeat("0", 64) + `","created":"2026-01-01T00:00:00Z"}}}`
	for _, s := range []string{good, `{}`, `{"node_secret":null}`, `[]`, `{"workers":{"":{}}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		p := filepath.Join(t.TempDir(), FileName)
		if err := os.WriteFile(p, body, 0o600); err != nil {
			t.Fatal(err)
		}
		file, err := Open(p)
		if err != nil {
			return
		}
		if file.NodePassword("n1") == "" || file.NodePassword("n1") == file.NodePassword("n2") {
			t.Fatal("accepted file gives no usable node passwords")
		}
		names, err := file.Workers()
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			if events.ValidateApp(n) != nil {
				t.Fatalf("accepted worker name %q", n)
			}
		}
	})
}

// TestSweepRevokes: Sweep leaves connections whose permissions still hold
// alone, disconnects a node whose shards changed and a node whose lease
// lapsed, and the node that reconnects gets its new, smaller permissions.
func TestSweepRevokes(t *testing.T) {
	dir := t.TempDir()
	f, err := Open(filepath.Join(dir, FileName))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	owned := map[string][]uint32{"n1": {0, 1}, "n2": {2}}
	auth, err := f.Authorizer("bot", func(id string) ([]uint32, bool) {
		mu.Lock()
		defer mu.Unlock()
		s, ok := owned[id]
		return s, ok
	})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := embedded.Start(embedded.ServerConfig{StoreDir: filepath.Join(dir, "nats"), Listen: "127.0.0.1:0", Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	connect := func(id string, v *violations) (*nats.Conn, chan struct{}) {
		closed := make(chan struct{})
		opts := []nats.Option{nats.UserInfo(NodePrefix+id, f.NodePassword(id)), nats.MaxReconnects(0),
			nats.ClosedHandler(func(*nats.Conn) { close(closed) })}
		if v != nil {
			opts = append(opts, nats.ErrorHandler(v.handler))
		}
		nc, err := nats.Connect(srv.ClientURL(), opts...)
		if err != nil {
			t.Fatalf("node %s: %v", id, err)
		}
		t.Cleanup(nc.Close)
		return nc, closed
	}
	_, n1closed := connect("n1", nil)
	_, n2closed := connect("n2", nil)
	isClosed := func(c chan struct{}) bool {
		select {
		case <-c:
			return true
		case <-time.After(3 * time.Second):
			return false
		}
	}
	if users, err := auth.Sweep(srv); err != nil || len(users) != 0 {
		t.Fatalf("nothing changed, swept %v (%v)", users, err)
	}
	mu.Lock()
	owned["n1"] = []uint32{0}
	mu.Unlock()
	if users, err := auth.Sweep(srv); err != nil || len(users) != 1 || users[0] != "node-n1" {
		t.Fatalf("n1 lost shard 1: swept %v (%v)", users, err)
	}
	if !isClosed(n1closed) {
		t.Error("n1's connection is still open")
	}
	mu.Lock()
	delete(owned, "n2")
	mu.Unlock()
	if users, err := auth.Sweep(srv); err != nil || len(users) != 1 || users[0] != "node-n2" {
		t.Fatalf("n2's lease lapsed: swept %v (%v)", users, err)
	}
	if !isClosed(n2closed) {
		t.Error("n2's connection is still open")
	}
	if nc, err := nats.Connect(srv.ClientURL(), nats.UserInfo("node-n2", f.NodePassword("n2")), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Error("n2 reconnected after its lease lapsed")
	}
	var v violations
	n1, _ := connect("n1", &v)
	n1.Publish("dpxe.bot.events.1.MESSAGE_CREATE", []byte(`{}`))
	v.await(t, "dpxe.bot.events.1.MESSAGE_CREATE")
	if users, err := auth.Sweep(srv); err != nil || len(users) != 0 {
		t.Errorf("after n1 reconnected, swept %v (%v)", users, err)
	}
}
