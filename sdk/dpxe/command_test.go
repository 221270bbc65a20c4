package dpxe

import (
	"context"
	"errors"
	"sync"
	"testing"

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
	c3, _ := NewCommander(f.nc, CommandConfig{App: "other", Shards: 1})
	if err := c3.SendToShard(ctx, 0, OpPresenceUpdate, map[string]any{}); !errors.As(err, &ce) || ce.Code != events.CodeNotOwner || !ce.Retryable() {
		t.Errorf("no node serves the shard: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got[0]) != 1 || len(got[1]) != 1 || got[1][0] != `{"op":8,"d":{"guild_id":"12582912","limit":1,"query":""}}` {
		t.Errorf("the node sides got %v", got)
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
