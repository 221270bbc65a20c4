package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/discord-pxe/dpxe/fleet/events"
	"github.com/discord-pxe/dpxe/sdk/dpxe"
)

// emulatorCommands is the emulator's record of Gateway commands and
// connections, as the command test reads it.
type emulatorCommands struct {
	Commands []struct {
		Conn  uint64 `json:"conn"`
		Shard int    `json:"shard"`
		Op    int    `json:"op"`
	} `json:"commands"`
	Connections []struct {
		Conn              uint64 `json:"conn"`
		Shard             []int  `json:"shard"`
		Open              bool   `json:"open"`
		MaxEventsInWindow int    `json:"max_events_in_window"`
		SendLimit         int    `json:"send_limit"`
	} `json:"connections"`
	Violations []struct {
		Kind   string `json:"kind"`
		Detail string `json:"detail"`
	} `json:"violations"`
}

func readCommands(t *testing.T, l *Lab) emulatorCommands {
	t.Helper()
	var st emulatorCommands
	if err := mustGateway(t, l).do(context.Background(), "GET", "/debug/state", nil, &st); err != nil {
		t.Fatalf("emulator record: %v", err)
	}
	return st
}

// countOps counts the recorded commands of op on shard.
func (st emulatorCommands) countOps(shard, op int) int {
	n := 0
	for _, c := range st.Commands {
		if c.Shard == shard && c.Op == op {
			n++
		}
	}
	return n
}

// guildOfShard reads a GUILD_CREATE of shard from the stream and returns
// its guild ID.
func guildOfShard(t *testing.T, nc *nats.Conn, shard uint32) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var id string
	err := dpxe.Watch(ctx, nc, dpxe.WatchConfig{App: labEventsApp, Shard: &shard, Event: "GUILD_CREATE", FromStart: true},
		func(ev *dpxe.Event) error {
			var g struct {
				ID string `json:"id"`
			}
			if err := ev.Decode(&g); err != nil || g.ID == "" {
				return fmt.Errorf("GUILD_CREATE seq %d: %v", ev.Seq, err)
			}
			id = g.ID
			return errors.New("found")
		}, nil)
	if id == "" {
		t.Fatalf("no GUILD_CREATE of shard %d in the stream: %v", shard, err)
	}
	return id
}

// TestLabSimulatedCommands sends workers' commands through the simulated
// lab's NATS server with the SDK and raw requests: a presence update and
// a request for guild members reach the shards they name (the emulator
// records them on those shards' connections, and the members chunk comes
// back as an event of the right shard); op 2, a 10 MB command, a body
// over 4096 bytes, garbage JSON and a guild of another shard are refused
// with their codes and nothing of them reaches the emulator; a flood of
// presence updates on one shard gets rate_limited with a retry-after and
// the emulator never sees the shard's connection over the send limit.
func TestLabSimulatedCommands(t *testing.T) {
	cfg, log := testConfig(t, 2)
	cfg.Simulate = true
	l, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("start: %v\n%s", err, log.String())
	}
	defer func() {
		l.Stop()
		if t.Failed() {
			t.Logf("lab log:\n%s\nserve log:\n%s", log.String(), tail(filepath.Join(cfg.Var, "serve.log"), 40))
		}
	}()
	if l.NATSURL == "" {
		t.Fatal("the lab found no NATS server in serve's log")
	}
	waitUntil(t, 40*time.Second, "every shard READY", func() string {
		rep, err := l.Status(context.Background())
		if err != nil {
			return err.Error()
		}
		return allReady(rep, cfg.Shards)
	})
	nc, err := nats.Connect(l.NATSURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cmd, err := dpxe.NewCommander(nc, dpxe.CommandConfig{App: labEventsApp, Shards: uint32(cfg.Shards)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// A shard is READY at the controller a moment before its node
	// subscribed its command subject may answer; retry what is retryable.
	send := func(shard uint32, op int, d any) error {
		deadline := time.Now().Add(10 * time.Second)
		for {
			err := cmd.SendToShard(ctx, shard, op, d)
			var ce *dpxe.CommandError
			if err == nil || !errors.As(err, &ce) || ce.Code == events.CodeRateLimited || !ce.Retryable() || time.Now().After(deadline) {
				return err
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	// Presence on shard 2.
	before := readCommands(t, l)
	if err := send(2, dpxe.OpPresenceUpdate, map[string]any{"since": nil, "activities": []any{}, "status": "idle", "afk": false}); err != nil {
		t.Fatalf("presence update: %v", err)
	}
	// Request guild members of a guild of shard 1, routed by the SDK.
	guild := guildOfShard(t, nc, 1)
	var gid uint64
	fmt.Sscan(guild, &gid)
	if got := cmd.ShardOf(gid); got != 1 {
		t.Fatalf("the SDK routes guild %s to shard %d, its GUILD_CREATE came on shard 1", guild, got)
	}
	if err := cmd.SendCommand(ctx, gid, dpxe.OpRequestGuildMembers, map[string]any{"guild_id": guild, "query": "", "limit": 5, "nonce": "lab-test"}); err != nil {
		t.Fatalf("request guild members: %v", err)
	}
	waitUntil(t, 20*time.Second, "GUILD_MEMBERS_CHUNK with our nonce on shard 1", func() string {
		one := uint32(1)
		found := false
		wctx, wcancel := context.WithTimeout(ctx, 2*time.Second)
		defer wcancel()
		dpxe.Watch(wctx, nc, dpxe.WatchConfig{App: labEventsApp, Shard: &one, Event: "GUILD_MEMBERS_CHUNK", FromStart: true},
			func(ev *dpxe.Event) error {
				if strings.Contains(string(ev.Raw), `"lab-test"`) {
					found = true
					return errors.New("found")
				}
				return nil
			}, nil)
		if !found {
			return "not in the stream"
		}
		return ""
	})
	after := readCommands(t, l)
	if d := after.countOps(2, 3) - before.countOps(2, 3); d != 1 {
		t.Errorf("the emulator got %d presence updates on shard 2, want 1", d)
	}
	if d := after.countOps(1, 8) - before.countOps(1, 8); d != 1 {
		t.Errorf("the emulator got %d member requests on shard 1, want 1", d)
	}
	if len(after.Commands) != len(before.Commands)+2 {
		t.Errorf("the emulator got %d commands, want 2", len(after.Commands)-len(before.Commands))
	}

	// Bad input: refused with a reason, nothing forwarded.
	wantCode := func(what string, err error, code string) {
		t.Helper()
		var ce *dpxe.CommandError
		if !errors.As(err, &ce) || ce.Code != code || ce.Reason == "" {
			t.Errorf("%s: %v, want %s with a reason", what, err, code)
		}
	}
	other := guildOfShard(t, nc, 3)
	wantCode("SDK op 2", cmd.SendToShard(ctx, 0, 2, map[string]any{"token": "x"}), events.CodeBadOp)
	wantCode("SDK 10 MB", cmd.SendToShard(ctx, 0, 3, map[string]any{"status": strings.Repeat("x", 10<<20)}), events.CodeTooLarge)
	raw := func(shard uint32, body []byte) error {
		subj, _ := events.CommandSubject(labEventsApp, shard)
		m, err := nc.RequestWithContext(ctx, subj, body)
		if err != nil {
			return err
		}
		var r events.CommandReply
		if err := json.Unmarshal(m.Data, &r); err != nil {
			return err
		}
		if r.Node == "" || r.Shard != shard {
			t.Errorf("reply %s names no node or the wrong shard", m.Data)
		}
		return r.Err()
	}
	wantCode("raw op 2", raw(0, []byte(`{"op":2,"d":{"token":"x","intents":0,"properties":{}}}`)), events.CodeBadOp)
	wantCode("raw op 1", raw(0, []byte(`{"op":1,"d":{}}`)), events.CodeBadOp)
	wantCode("raw 5000 bytes", raw(0, []byte(`{"op":3,"d":{"status":"`+strings.Repeat("x", 5000)+`"}}`)), events.CodeTooLarge)
	wantCode("raw garbage", raw(0, []byte("\x00{op:3 d")), events.CodeBadJSON)
	wantCode("raw guild of shard 3 sent to shard 0", raw(0, []byte(`{"op":8,"d":{"guild_id":"`+other+`","query":"","limit":1}}`)), events.CodeWrongShard)
	if err := raw(0, make([]byte, 10<<20)); !errors.Is(err, nats.ErrMaxPayload) {
		t.Errorf("raw 10 MB: %v, want the server's max payload refusal", err)
	}
	bad := readCommands(t, l)
	if len(bad.Commands) != len(after.Commands) {
		t.Errorf("refused commands reached the emulator: %d recorded, %d before", len(bad.Commands), len(after.Commands))
	}

	// A flood on shard 3: sequential requests, far faster than the
	// budget refills.
	var ok, limited int
	for i := 0; i < 300; i++ {
		err := cmd.SendToShard(ctx, 3, dpxe.OpPresenceUpdate, map[string]any{"since": nil, "activities": []any{}, "status": "online", "afk": false})
		var ce *dpxe.CommandError
		switch {
		case err == nil:
			ok++
		case errors.As(err, &ce) && ce.Code == events.CodeRateLimited:
			limited++
			if ce.RetryAfter <= 0 || ce.RetryAfter > 10*time.Second {
				t.Errorf("rate_limited with retry after %v", ce.RetryAfter)
			}
		default:
			t.Fatalf("flood command %d: %v", i, err)
		}
	}
	final := readCommands(t, l)
	if limited == 0 || ok == 0 || ok > 120 {
		t.Errorf("flood: %d sent, %d rate_limited", ok, limited)
	}
	if d := final.countOps(3, 3) - bad.countOps(3, 3); d != ok {
		t.Errorf("flood: %d answered ok, the emulator got %d", ok, d)
	}
	for _, c := range final.Connections {
		if c.MaxEventsInWindow > c.SendLimit {
			t.Errorf("connection %d (shard %v): %d events in one window, limit %d", c.Conn, c.Shard, c.MaxEventsInWindow, c.SendLimit)
		}
	}
	for _, v := range final.Violations {
		t.Errorf("emulator violation %s: %s", v.Kind, v.Detail)
	}
	t.Logf("flood on shard 3: %d sent, %d rate_limited", ok, limited)
}

var pingbotOnce sync.Once

// pingbotBinary builds examples/pingbot beside the lab's other binaries.
func pingbotBinary(t *testing.T) string {
	t.Helper()
	binaries(t)
	path := filepath.Join(buildDir, "pingbot")
	var err error
	pingbotOnce.Do(func() {
		cmd := exec.Command("go", "build", "-o", path, "./examples/pingbot")
		cmd.Dir = repoRoot(t)
		if out, berr := cmd.CombinedOutput(); berr != nil {
			err = fmt.Errorf("go build ./examples/pingbot: %v\n%s", berr, out)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// TestLabSimulatedPingbot is `make run`'s bot path with simulated nodes:
// emulator messages (every third a "!ping") → simulated nodes → JetStream
// → pingbot (its own process) → the emulator's REST API. It waits for 15
// replies, then checks that every reply answers a ping the emulator sent,
// no ping got two, and the lab's table shows the counts.
func TestLabSimulatedPingbot(t *testing.T) {
	labPingbot(t, false)
}

// TestLabSimulatedPingbotAuth is the same with `dpxe serve --nats-auth`:
// each simulated shard publishes and answers commands over a connection
// as its node (node-<ID> with the password derived from serve's
// credentials file, as the check-in answer will carry it), pingbot reads
// as worker-pingbot; and an anonymous client is refused.
func TestLabSimulatedPingbotAuth(t *testing.T) {
	labPingbot(t, true)
}

func labPingbot(t *testing.T, auth bool) {
	cfg, log := testConfig(t, 2)
	cfg.NATSAuth = auth
	cfg.Simulate = true
	cfg.MessageRate = 5
	cfg.PingEvery = 3
	cfg.Pingbot = pingbotBinary(t)
	l, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("start: %v\n%s", err, log.String())
	}
	defer func() {
		l.Stop()
		if t.Failed() {
			t.Logf("lab log:\n%s\npingbot log:\n%s", log.String(), tail(filepath.Join(cfg.Var, "pingbot.log"), 40))
		}
	}()
	if !l.Pingbot {
		t.Fatal("the lab did not start pingbot")
	}
	checkEmulatorTLS(t, l) // pingbot posts its replies over https:// trusting the lab's CA
	if auth {
		if nc, err := nats.Connect(l.NATSURL, nats.MaxReconnects(0)); err == nil {
			nc.Close()
			t.Error("an anonymous client connected to serve --nats-auth")
		}
	}
	// Every ping older than 3 s (time enough for delivery and a reply)
	// has exactly one reply, and there are at least 15 of them; message
	// IDs are unique; every reply answers a ping.
	var rep Report
	waitUntil(t, 60*time.Second, "15 pings older than 3 s, each answered once", func() string {
		var st struct {
			REST struct {
				Messages []struct {
					Content string `json:"content"`
					ReplyTo string `json:"reply_to"`
				} `json:"messages"`
				Pings []struct {
					MessageID string    `json:"message_id"`
					Sent      time.Time `json:"sent"`
				} `json:"pings"`
			} `json:"rest"`
		}
		if err := mustGateway(t, l).do(context.Background(), "GET", "/debug/state", nil, &st); err != nil {
			return err.Error()
		}
		pinged := map[string]bool{}
		for _, p := range st.REST.Pings {
			if pinged[p.MessageID] {
				t.Fatalf("two pings with message ID %s", p.MessageID)
			}
			pinged[p.MessageID] = true
		}
		replies := map[string]int{}
		for _, m := range st.REST.Messages {
			replies[m.ReplyTo]++
			if m.Content != "pong" || !pinged[m.ReplyTo] {
				t.Fatalf("posted %q replying to %q, which is not a ping the emulator sent", m.Content, m.ReplyTo)
			}
			if replies[m.ReplyTo] > 1 {
				t.Fatalf("ping %s got %d replies", m.ReplyTo, replies[m.ReplyTo])
			}
		}
		old := 0
		for _, p := range st.REST.Pings {
			if time.Since(p.Sent) < 3*time.Second {
				continue
			}
			old++
			if replies[p.MessageID] != 1 {
				return fmt.Sprintf("ping %s sent %v ago has %d replies", p.MessageID, time.Since(p.Sent).Round(time.Millisecond), replies[p.MessageID])
			}
		}
		if old < 15 {
			return fmt.Sprintf("%d pings older than 3 s", old)
		}
		if rep, err = l.Status(context.Background()); err != nil {
			return err.Error()
		}
		return ""
	})
	var table strings.Builder
	rep.Print(&table)
	if !strings.Contains(table.String(), "pingbot: ") || !strings.Contains(table.String(), "replies posted") {
		t.Errorf("the table does not show pingbot:\n%s", table.String())
	}
	t.Logf("%d pings, %d replies\n%s", rep.Pings, rep.Replies, table.String())
}
