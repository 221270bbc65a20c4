package dpxe

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/events"
	"github.com/discord-pxe/dpxe/fleet/events/embedded"
)

// TestCommanderRoutesAndReports runs a node side (events.ServeCommands
// with events.CheckCommand) for shards 0 and 1 of 2 on the embedded
// server: SendCommand reaches the shard of the guild, a refusal comes
// back as a *CommandError with the node's code, a shard nobody serves is
// not_owner, and what the SDK can refuse itself (op 2, too large, a shard
// out of range, a bad config) never reaches a node.
func TestCommanderRoutesAndReports(t *testing.T) {
	f := newFixture(t)
	var mu sync.Mutex
	got := map[uint32][]string{}
	for shard := uint32(0); shard < 2; shard++ {
		var log appliance.SendLog
		sub, err := events.ServeCommands(f.nc, "bot", shard, func(body []byte) events.CommandReply {
			cmd, r := events.CheckCommand(body, events.ShardView{Shard: shard, TotalShards: 2, Owned: true, Ready: true,
				Log: &log, NowTSC: 1, CyclesPerMS: 1e6, HeartbeatMS: 41250})
			if r.Status == events.CodeOK {
				mu.Lock()
				got[shard] = append(got[shard], string(cmd.Frame))
				mu.Unlock()
			}
			return r
		})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
	}
	if _, err := NewCommander(f.nc, CommandConfig{App: "bot"}); !errors.Is(err, ErrBadConfig) {
		t.Errorf("no shard count: %v", err)
	}
	c, err := NewCommander(f.nc, CommandConfig{App: "bot", Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	guild := uint64(3) << 22 // (3 << 22) >> 22 = 3, % 2 = shard 1
	if err := c.SendCommand(ctx, guild, OpRequestGuildMembers, map[string]any{"guild_id": "12582912", "query": "", "limit": 1}); err != nil {
		t.Fatalf("members: %v", err)
	}
	if err := c.SendToShard(ctx, 0, OpPresenceUpdate, map[string]any{"status": "idle"}); err != nil {
		t.Fatalf("presence: %v", err)
	}
	var ce *CommandError
	// The guild of shard 1 sent to shard 0: the node refuses it.
	if err := c.SendToShard(ctx, 0, OpVoiceStateUpdate, map[string]any{"guild_id": "12582912"}); !errors.As(err, &ce) || ce.Code != events.CodeWrongShard || ce.Shard != 0 {
		t.Errorf("voice state for another shard's guild: %v", err)
	}
	if err := c.SendToShard(ctx, 0, 2, map[string]any{}); !errors.As(err, &ce) || ce.Code != events.CodeBadOp {
		t.Errorf("op 2: %v", err)
	}
	if err := c.SendToShard(ctx, 0, OpPresenceUpdate, map[string]string{"status": string(make([]byte, 5000))}); !errors.As(err, &ce) || ce.Code != events.CodeTooLarge {
		t.Errorf("5000 bytes: %v", err)
	}
	if err := c.SendToShard(ctx, 2, OpPresenceUpdate, map[string]any{}); !errors.Is(err, ErrBadConfig) {
		t.Errorf("shard 2 of 2: %v", err)
	}
	// Nobody serves the shard: refused at once without retries, retried
	// until the context ends with them.
	c3, _ := NewCommander(f.nc, CommandConfig{App: "other", Shards: 1, NoRetry: true})
	if err := c3.SendToShard(ctx, 0, OpPresenceUpdate, map[string]any{}); !errors.As(err, &ce) || ce.Code != events.CodeNotOwner || !ce.Retryable() {
		t.Errorf("no node serves the shard: %v", err)
	}
	retried := 0
	c3, _ = NewCommander(f.nc, CommandConfig{App: "other", Shards: 1, Timeout: 300 * time.Millisecond, OnRetry: func(error) { retried++ }})
	start := time.Now()
	err = c3.SendToShard(context.Background(), 0, OpPresenceUpdate, map[string]any{}) // Timeout bounds it
	if took := time.Since(start); !errors.As(err, &ce) || ce.Code != events.CodeNotOwner || !errors.Is(err, context.DeadlineExceeded) || retried < 3 ||
		took < 300*time.Millisecond || took > 5*time.Second || !strings.Contains(err.Error(), "refused until the context ended") {
		t.Errorf("no node serves the shard, with retries: %v after %d retries and %v", err, retried, time.Since(start))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got[0]) != 1 || len(got[1]) != 1 || got[1][0] != `{"op":8,"d":{"guild_id":"12582912","limit":1,"query":""}}` {
		t.Errorf("the node sides got %v", got)
	}
}

// openBudget is a shard view of shard of total, owned and ready, whose
// send budget always has room (a fresh log per command).
func openBudget(shard, total uint32) events.ShardView {
	return events.ShardView{Shard: shard, TotalShards: total, Owned: true, Ready: true,
		Log: &appliance.SendLog{}, NowTSC: 1, CyclesPerMS: 1e6, HeartbeatMS: 41250}
}

// TestCommanderFollowsAMovingShard: shard 0 moves from node A to node B
// while four workers send presence updates through one Commander. A
// answers, then refuses not_owner (it is releasing the shard), then
// unsubscribes (no node answers), then B subscribes and answers not_ready
// (resuming), then ok. Each phase lasts until the SDK has retried several
// refusals of it. Every command ends ok, the ones after the move from B,
// and each was sent by exactly one node exactly once: a refusal sent
// nothing, so its retry cannot duplicate.
func TestCommanderFollowsAMovingShard(t *testing.T) {
	srv, err := embedded.Start(embedded.ServerConfig{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	conn := func() *nats.Conn {
		nc, err := srv.Connect()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	ncA, ncB, worker := conn(), conn(), conn()
	var mu sync.Mutex
	sent := map[string][]int{} // node -> since values it sent
	var aOwns, bReady atomic.Bool
	aOwns.Store(true)
	serve := func(nc *nats.Conn, node string, view func() events.ShardView) *nats.Subscription {
		sub, err := events.ServeCommands(nc, "bot", 0, func(body []byte) events.CommandReply {
			cmd, r := events.CheckCommand(body, view())
			r.Node = node
			if r.Status == events.CodeOK {
				var f struct {
					D struct {
						Since int `json:"since"`
					} `json:"d"`
				}
				if err := json.Unmarshal(cmd.Frame, &f); err != nil {
					t.Errorf("%s sent %s: %v", node, cmd.Frame, err)
				}
				mu.Lock()
				sent[node] = append(sent[node], f.D.Since)
				mu.Unlock()
			}
			return r
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		return sub
	}
	subA := serve(ncA, "A", func() events.ShardView {
		v := openBudget(0, 1)
		v.Owned = aOwns.Load()
		return v
	})
	var refusals sync.Map // "A/not_owner", "/not_owner" (no responders), "B/not_ready" -> *atomic.Int64
	count := func(key string) int64 {
		v, _ := refusals.LoadOrStore(key, new(atomic.Int64))
		return v.(*atomic.Int64).Load()
	}
	c, err := NewCommander(worker, CommandConfig{App: "bot", Shards: 1, OnRetry: func(err error) {
		var ce *CommandError
		if errors.As(err, &ce) {
			v, _ := refusals.LoadOrStore(ce.Node+"/"+ce.Code, new(atomic.Int64))
			v.(*atomic.Int64).Add(1)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	stop := make(chan struct{})
	type result struct {
		since int
		err   error
	}
	results := make(chan result, 100000)
	var failed atomic.Pointer[result] // the first command that ended in an error
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				since := w*1_000_000 + i
				err := c.SendToShard(ctx, 0, OpPresenceUpdate, map[string]any{"since": since, "activities": []any{}, "status": "idle", "afk": false})
				results <- result{since, err}
				if err != nil {
					failed.CompareAndSwap(nil, &result{since, err})
				}
			}
		}()
	}
	sentBy := func(node string) int {
		mu.Lock()
		defer mu.Unlock()
		return len(sent[node])
	}
	await := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			if f := failed.Load(); f != nil {
				t.Fatalf("waiting for %s: command %d: %v", what, f.since, f.err)
			}
			if ctx.Err() != nil {
				t.Fatalf("waiting for %s: %v", what, ctx.Err())
			}
			time.Sleep(time.Millisecond)
		}
	}
	await("A to send", func() bool { return sentBy("A") >= 5 })
	aOwns.Store(false) // A releases the shard: not_owner
	await("retried not_owner from A", func() bool { return count("A/not_owner") >= 4 })
	if err := subA.Unsubscribe(); err != nil { // A let it go: no node answers
		t.Fatal(err)
	}
	if err := ncA.Flush(); err != nil {
		t.Fatal(err)
	}
	await("retried no responders", func() bool { return count("/not_owner") >= 4 })
	serve(ncB, "B", func() events.ShardView { // B took it and resumes: not_ready
		v := openBudget(0, 1)
		v.Ready = bReady.Load()
		return v
	})
	await("retried not_ready from B", func() bool { return count("B/not_ready") >= 4 })
	bReady.Store(true)
	await("B to send", func() bool { return sentBy("B") >= 20 })
	close(stop)
	wg.Wait()
	close(results)
	ok := map[int]bool{}
	for r := range results {
		if r.err != nil {
			t.Errorf("command %d: %v", r.since, r.err)
			continue
		}
		ok[r.since] = true
	}
	mu.Lock()
	defer mu.Unlock()
	once := map[int]string{}
	for node, list := range sent {
		for _, s := range list {
			if prev, dup := once[s]; dup {
				t.Errorf("command %d sent by %s and %s", s, prev, node)
			}
			once[s] = node
		}
	}
	if len(once) != len(ok) {
		t.Errorf("%d commands answered ok, %d sent by the nodes", len(ok), len(once))
	}
	for s := range ok {
		if once[s] == "" {
			t.Errorf("command %d answered ok but sent by no node", s)
		}
	}
	t.Logf("A sent %d, B sent %d; retried: A not_owner %d, no responders %d, B not_ready %d",
		len(sent["A"]), len(sent["B"]), count("A/not_owner"), count("/not_owner"), count("B/not_ready"))
}

// TestCommanderRateLimitedRetryOptIn: rate_limited is returned at once
// by default, with its retry-after; with RetryRateLimited the command is
// sent again after the retry-after, and returned at once when that would
// come after the context ends.
func TestCommanderRateLimitedRetryOptIn(t *testing.T) {
	f := newFixture(t)
	var calls atomic.Int64
	sub, err := events.ServeCommands(f.nc, "bot", 0, func(body []byte) events.CommandReply {
		if calls.Add(1)%2 == 1 { // every other command: the budget is full for 50 ms
			return events.CommandReply{Status: events.CodeRateLimited, Reason: "test", RetryAfterMS: 50}
		}
		return events.CommandReply{Status: events.CodeOK}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	d := map[string]any{"status": "idle"}
	plain, _ := NewCommander(f.nc, CommandConfig{App: "bot", Shards: 1})
	var ce *CommandError
	if err := plain.SendToShard(ctx, 0, OpPresenceUpdate, d); !errors.As(err, &ce) || ce.Code != events.CodeRateLimited || ce.RetryAfter != 50*time.Millisecond {
		t.Fatalf("default: %v", err)
	}
	calls.Store(0)
	opt, _ := NewCommander(f.nc, CommandConfig{App: "bot", Shards: 1, RetryRateLimited: true})
	start := time.Now()
	if err := opt.SendToShard(ctx, 0, OpPresenceUpdate, d); err != nil || calls.Load() != 2 || time.Since(start) < 50*time.Millisecond {
		t.Fatalf("opt-in: %v after %d attempts, %v", err, calls.Load(), time.Since(start))
	}
	calls.Store(0)
	short, scancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer scancel()
	// Returned at once, not after waiting for the context to end.
	if err := opt.SendToShard(short, 0, OpPresenceUpdate, d); !errors.As(err, &ce) || ce.Code != events.CodeRateLimited || calls.Load() != 1 ||
		errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("retry-after past the deadline: %v after %d attempts", err, calls.Load())
	}
}

// BenchmarkCommandRoundTrip is one SendToShard through a TCP loopback
// connection to the embedded server, answered by a node side that runs
// CheckCommand with an always-open budget (the budget is reset each time):
// the cost a worker pays per command, without Discord.
func BenchmarkCommandRoundTrip(b *testing.B) {
	srv, err := embedded.Start(embedded.ServerConfig{StoreDir: b.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Shutdown()
	node, err := nats.Connect(srv.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer node.Close()
	sub, err := events.ServeCommands(node, "bot", 0, func(body []byte) events.CommandReply {
		var log appliance.SendLog
		_, r := events.CheckCommand(body, events.ShardView{Shard: 0, TotalShards: 1, Owned: true, Ready: true,
			Log: &log, NowTSC: 1, CyclesPerMS: 1e6, HeartbeatMS: 41250})
		return r
	})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	node.Flush()
	worker, err := nats.Connect(srv.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer worker.Close()
	c, _ := NewCommander(worker, CommandConfig{App: "bot", Shards: 1})
	ctx := context.Background()
	d := map[string]any{"since": nil, "activities": []any{}, "status": "online", "afk": false}
	b.ResetTimer()
	for b.Loop() {
		if err := c.SendToShard(ctx, 0, OpPresenceUpdate, d); err != nil {
			b.Fatal(err)
		}
	}
}
