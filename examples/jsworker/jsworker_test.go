package jsworker

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/discord-pxe/dpxe/fleet/events"
	"github.com/discord-pxe/dpxe/fleet/events/embedded"
)

// TestJavaScriptWorker installs the npm package "nats" at the version the
// lock file pins, and runs worker.mjs with Node.js against a real embedded
// NATS JetStream server holding the event stream: three MESSAGE_CREATE
// and one GUILD_CREATE published as a node publishes them. The worker
// must print the three messages in stream order with the shard and
// sequence from the headers, acknowledge each (the consumer's ack floor
// reaches them), skip GUILD_CREATE (its filter), and send two commands to
// shard 0: the presence update is checked ok and forwarded, the Identify
// refused with bad_op and not forwarded.
func TestJavaScriptWorker(t *testing.T) {
	if testing.Short() {
		t.Skip("installs an npm package and starts Node.js")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("no node (tools/scripts/deps.sh test installs it)")
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Skip("no npm (tools/scripts/deps.sh test installs it)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	dir := t.TempDir()
	for _, f := range []string{"worker.mjs", "package.json", "package-lock.json"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	install := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund", "--loglevel=error")
	install.Dir = dir
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("npm ci: %v\n%s", err, out)
	}

	srv, err := embedded.Start(embedded.ServerConfig{Listen: "127.0.0.1:0", StoreDir: t.TempDir()})
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
	st, err := events.EnsureStream(ctx, js, "bot", events.DefaultStreamLimits())
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := events.NewPublisher(nc, events.PublisherConfig{App: "bot", Node: "n1"})
	var want []string
	for _, d := range []struct {
		shard        uint32
		seq          uint64
		event, extra string
	}{
		{0, 5, "MESSAGE_CREATE", `"content":"!ping"`},
		{2, 9, "GUILD_CREATE", `"id":"1"`},
		{2, 10, "MESSAGE_CREATE", `"content":"héllo \"quoted\""`},
		{0, 6, "MESSAGE_CREATE", `"content":""`},
	} {
		sp, _ := pub.Session(d.shard, fmt.Sprintf("sess%d", d.shard), d.seq-1)
		frame := fmt.Sprintf(`{"op":0,"s":%d,"t":%q,"d":{%s}}`, d.seq, d.event, d.extra)
		if err := sp.Publish(ctx, events.Dispatch{Seq: d.seq, Event: d.event, Payload: []byte(frame), Received: time.Now()}); err != nil {
			t.Fatal(err)
		}
		if err := sp.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if d.event == "MESSAGE_CREATE" {
			content := strings.TrimPrefix(d.extra, `"content":`)
			want = append(want, fmt.Sprintf("event shard=%d seq=%d t=MESSAGE_CREATE content=%s", d.shard, d.seq, content))
		}
	}
	want = append(want, "command op=3 status=ok", `command op=2 status=bad_op reason=`)

	// Shard 0's node: the real command check and send budget.
	var mu sync.Mutex
	var forwarded []string
	budget := events.NewSendBudget(0)
	sub, err := events.ServeCommands(nc, "bot", 0, func(body []byte) events.CommandReply {
		mu.Lock()
		defer mu.Unlock()
		cmd, r := budget.Check(body, events.ShardView{Shard: 0, TotalShards: 4, Owned: true, Ready: true}, 41250*time.Millisecond)
		if r.Status == events.CodeOK {
			budget.Note()
			forwarded = append(forwarded, string(cmd.Frame))
		}
		r.Node = "n1"
		return r
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	run := exec.CommandContext(ctx, node, "worker.mjs")
	run.Dir = dir
	run.Env = append(os.Environ(), "NATS_URL="+srv.ClientURL(), "COUNT=3")
	out, err := run.CombinedOutput()
	if err != nil {
		t.Fatalf("node worker.mjs: %v\n%s", err, out)
	}
	var got []string
	for sc := bufio.NewScanner(strings.NewReader(string(out))); sc.Scan(); {
		got = append(got, sc.Text())
	}
	if len(got) != len(want) {
		t.Fatalf("worker printed %d lines, want %d:\n%s", len(got), len(want), out)
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) || (!strings.HasSuffix(want[i], "reason=") && got[i] != want[i]) {
			t.Errorf("line %d: %q, want %q", i+1, got[i], want[i])
		}
	}
	mu.Lock()
	if len(forwarded) != 1 || !strings.Contains(forwarded[0], `"op":3`) {
		t.Errorf("forwarded to the shard: %q, want the presence update alone", forwarded)
	}
	mu.Unlock()
	c, err := st.Consumer(ctx, "jsworker")
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumAckPending != 0 || info.NumPending != 0 || info.AckFloor.Consumer != 3 {
		t.Errorf("consumer after the worker: %d unacked, %d pending, ack floor %d, want 0, 0, 3",
			info.NumAckPending, info.NumPending, info.AckFloor.Consumer)
	}
}

// TestDocsSnippetIsTheWorker: every line of docs/events.md's JavaScript
// block is a line of worker.mjs, so the documented snippet is the code
// the test above runs.
func TestDocsSnippetIsTheWorker(t *testing.T) {
	doc, err := os.ReadFile("../../docs/events.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("worker.mjs")
	if err != nil {
		t.Fatal(err)
	}
	lines := map[string]bool{}
	for _, l := range strings.Split(string(src), "\n") {
		lines[strings.TrimSpace(l)] = true
	}
	_, block, ok := strings.Cut(string(doc), "```js\n")
	if !ok {
		t.Fatal("docs/events.md has no ```js block")
	}
	block, _, _ = strings.Cut(block, "```")
	n := 0
	for _, l := range strings.Split(block, "\n") {
		l = strings.TrimSpace(l)
		if l == "" {
			continue
		}
		n++
		if !lines[l] {
			t.Errorf("docs/events.md's snippet line %q is not in worker.mjs", l)
		}
	}
	if n < 10 {
		t.Errorf("the snippet has %d lines", n)
	}
}
