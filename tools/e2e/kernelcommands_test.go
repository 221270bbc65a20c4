package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/events"
	"github.com/discord-pxe/dpxe/sdk/dpxe"
	"github.com/discord-pxe/dpxe/tools/gatewayemu"
	"github.com/nats-io/nats.go"
)

// TestKernelCommands: a QEMU node runs shards 0 and 1 of 2 with broker
// access from `dpxe serve --nats-auth`; a worker (plain nats.go, worker
// credentials) sends Gateway commands as requests to
// dpxe.bot.commands.1:
//   - a presence update (op 3) and a Request Guild Members (op 8) for a
//     guild that routes to shard 1: both answered ok by the node, and the
//     emulator records them arriving on shard 1's session (and nothing on
//     shard 0's);
//   - an Identify (op 2): answered bad_op, and nothing reaches the
//     emulator;
//   - a flood of 200 presence updates as fast as the replies come: some
//     answered rate_limited with a retry-after; the emulator records
//     exactly the ones answered ok, no 60 s window of the connection holds
//     more than 120 of its events (commands and heartbeats), and the
//     emulator saw no violation (no 4008, no late heartbeat), on the same
//     session throughout.
func TestKernelCommands(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const subnet = "10.143.0"
	l := newGWLab(t, ctx, subnet, gatewayemu.Options{HeartbeatInterval: 2 * time.Second, Shards: 2, MaxConcurrency: 2,
		MessagesPerSecond: 5}, "--total-shards", "2", "--lease", "30s", "--nats-auth", "--nats-listen", subnet+".1:4222")
	node := l.boot("cmd-node", "virtio-net-pci", 2)
	if node.serial.waitFor(regexp.MustCompile(`nats: connected to`), 120*time.Second) == nil {
		t.Fatal("the node did not connect to the broker")
	}
	l.allSessionsAt(5, 90*time.Second)
	nc, _, _ := l.connectWorker(subnet)
	subj, err := events.CommandSubject("bot", 1)
	if err != nil {
		t.Fatal(err)
	}
	request := func(body string) events.CommandReply {
		t.Helper()
		m, err := nc.Request(subj, []byte(body), 10*time.Second)
		if err != nil {
			t.Fatalf("request %s: %v", body, err)
		}
		var r events.CommandReply
		if err := json.Unmarshal(m.Data, &r); err != nil {
			t.Fatalf("reply %q: %v", m.Data, err)
		}
		if r.Shard != 1 || r.Node != "cmd-node" {
			t.Fatalf("reply %s names shard %d node %q", m.Data, r.Shard, r.Node)
		}
		return r
	}
	shardCmds := func(shard int) (n int) {
		for _, c := range l.emu.Commands() {
			if c.Shard == shard {
				n++
			}
		}
		return n
	}
	sessions := l.emu.Sessions()

	// The node subscribes once its shard runs: until then no responders.
	// The probe is a heartbeat, which the node refuses (bad_op) and never
	// sends: a probe that was sent could reach the emulator after the count
	// below, or after its request timed out here.
	const presence = `{"op":3,"d":{"since":null,"activities":[],"status":"online","afk":false}}`
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		m, err := nc.Request(subj, []byte(`{"op":1,"d":{}}`), 5*time.Second)
		if err == nil {
			var r events.CommandReply
			if err := json.Unmarshal(m.Data, &r); err != nil || r.Status != events.CodeBadOp {
				t.Fatalf("probe (op 1): reply %q, want %s", m.Data, events.CodeBadOp)
			}
			break
		}
		if !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, nats.ErrTimeout) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no node answers %s: %v", subj, err)
		}
	}
	before := shardCmds(1)
	if before != 0 {
		t.Fatalf("the emulator recorded %d commands on shard 1 before the first was sent", before)
	}
	if r := request(presence); r.Status != events.CodeOK {
		t.Fatalf("presence update: %+v", r)
	}
	guilds := l.emu.GuildsForShard(1, 2)
	if len(guilds) == 0 {
		t.Fatal("the emulator has no guild on shard 1")
	}
	members := `{"op":8,"d":{"guild_id":"` + strconv.FormatUint(guilds[0], 10) + `","query":"a","limit":5}}`
	if r := request(members); r.Status != events.CodeOK {
		t.Fatalf("request guild members: %+v", r)
	}
	awaitCmds := func(want int, what string) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); shardCmds(1) < want; time.Sleep(200 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the emulator recorded %d commands on shard 1, want %d", what, shardCmds(1), want)
			}
		}
	}
	awaitCmds(before+2, "presence and members")
	var ops []int
	for _, c := range l.emu.Commands() {
		if c.Shard == 1 {
			ops = append(ops, c.Op)
		}
	}
	if n := len(ops); n < 2 || ops[n-2] != 3 || ops[n-1] != 8 {
		t.Fatalf("shard 1's commands in the emulator: ops %v, want ... 3, 8", ops)
	}

	identifies := len(l.emu.Identifies())
	if r := request(`{"op":2,"d":{"token":"x","intents":0,"properties":{}}}`); r.Status != events.CodeBadOp {
		t.Fatalf("identify: %+v", r)
	}
	// The flood; its first request also shows that nothing of the Identify
	// arrived (the emulator records in arrival order).
	ok, limited := 0, 0
	for i := 0; i < 200; i++ {
		switch r := request(presence); r.Status {
		case events.CodeOK:
			ok++
		case events.CodeRateLimited:
			limited++
			if r.RetryAfterMS == 0 {
				t.Errorf("rate_limited without retry_after_ms: %+v", r)
			}
		default:
			t.Fatalf("flood command %d: %+v", i, r)
		}
	}
	t.Logf("flood: %d ok, %d rate_limited", ok, limited)
	if limited == 0 {
		t.Error("200 commands and none refused rate_limited")
	}
	awaitCmds(before+2+ok, "flood")
	if n := shardCmds(1); n != before+2+ok {
		t.Errorf("the emulator recorded %d commands on shard 1, the node answered %d ok", n, before+2+ok)
	}
	if n := shardCmds(0); n != 0 {
		t.Errorf("shard 0 got %d commands", n)
	}
	if n := len(l.emu.Identifies()); n != identifies {
		t.Errorf("a worker's Identify reached the emulator (%d Identifies, %d before)", n, identifies)
	}

	// Every event of each connection (commands and heartbeats, as the
	// emulator received them) in a 60 s window: at most 120.
	times := map[uint64][]time.Time{}
	for _, c := range l.emu.Commands() {
		times[c.Conn] = append(times[c.Conn], c.Received)
	}
	for _, h := range l.emu.Heartbeats() {
		times[h.Conn] = append(times[h.Conn], h.Received)
	}
	worst := 0
	for _, ts := range times {
		sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
		for i, j := 0, 0; j < len(ts); j++ {
			for ts[j].Sub(ts[i]) >= 60*time.Second {
				i++
			}
			worst = max(worst, j-i+1)
		}
	}
	t.Logf("the busiest 60 s of a connection held %d events", worst)
	if worst > 120 {
		t.Errorf("a connection sent %d events in 60 s", worst)
	}
	if v := l.emu.Violations(); len(v) != 0 {
		t.Errorf("emulator violations: %s", violationReport(v))
	}
	after := l.emu.Sessions()
	for i := range sessions {
		if i >= len(after) || after[i].ID != sessions[i].ID {
			t.Errorf("sessions changed: %+v then %+v", sessions, after)
			break
		}
	}
}

// commandTo sends body to app "bot"'s command subject of shard as a
// request and decodes the reply; err is the request's (no responders,
// timeout).
func commandTo(t *testing.T, nc *nats.Conn, shard uint32, body string) (events.CommandReply, error) {
	t.Helper()
	subj, err := events.CommandSubject("bot", shard)
	if err != nil {
		t.Fatal(err)
	}
	m, err := nc.Request(subj, []byte(body), 5*time.Second)
	if err != nil {
		return events.CommandReply{}, err
	}
	var r events.CommandReply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		t.Fatalf("reply %q: %v", m.Data, err)
	}
	if r.Shard != shard {
		t.Fatalf("a command for shard %d answered for shard %d: %s", shard, r.Shard, m.Data)
	}
	return r, nil
}

// TestKernelCommandsHandOver: node cmd-a runs shards 0 and 1 of 2 and
// answers commands for both; a second node, cmd-b, boots, the controller
// gives it one shard and cmd-a releases it (the broker's permission sweep
// also drops cmd-a's connection, which comes back with its one shard).
// Within a deadline, every shard's commands are answered ok again, the
// moved shard's by cmd-b and the other's by cmd-a: the subscriptions
// follow the grant, the release and the reconnect. No answer for the moved
// shard comes from cmd-a after that, except not_owner.
//
// Throughout the move a worker sends a presence update to each shard every
// second through the SDK's Commander (its retry of not_owner, no responders
// and not_ready on, rate_limited retried too): every one of them ends ok,
// the moved shard's after several refusals the SDK sent again (the move's
// window), and several after the move answered by cmd-b.
func TestKernelCommandsHandOver(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const subnet = "10.144.0"
	const presence = `{"op":3,"d":{"since":null,"activities":[],"status":"online","afk":false}}`
	l := newGWLab(t, ctx, subnet, gatewayemu.Options{HeartbeatInterval: 2 * time.Second, Shards: 2, MaxConcurrency: 2,
		MessagesPerSecond: 5}, "--total-shards", "2", "--lease", "30s", "--nats-auth", "--nats-listen", subnet+".1:4222")
	a := l.boot("cmd-a", "virtio-net-pci", 2)
	if a.serial.waitFor(regexp.MustCompile(`nats: connected to`), 120*time.Second) == nil {
		t.Fatal("cmd-a did not connect to the broker")
	}
	l.allSessionsAt(5, 90*time.Second)
	nc, _, _ := l.connectWorker(subnet)
	owners := func() map[uint32]string {
		got := map[uint32]string{}
		for shard := uint32(0); shard < 2; shard++ {
			if r, err := commandTo(t, nc, shard, presence); err == nil && r.Status == events.CodeOK {
				got[shard] = r.Node
			}
		}
		return got
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		if o := owners(); o[0] == "cmd-a" && o[1] == "cmd-a" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cmd-a does not answer both shards: %v", owners())
		}
	}
	// The SDK's workers, one a shard, from before the move to after it.
	var mu sync.Mutex
	retried := map[uint32]map[string]int{0: {}, 1: {}} // shard -> node/code -> refusals sent again
	var sentOK [2]atomic.Int64
	var failed atomic.Pointer[error]
	cmd, err := dpxe.NewCommander(nc, dpxe.CommandConfig{App: "bot", Shards: 2, RetryRateLimited: true, OnRetry: func(err error) {
		var ce *dpxe.CommandError
		if errors.As(err, &ce) {
			mu.Lock()
			retried[ce.Shard][ce.Node+"/"+ce.Code]++
			mu.Unlock()
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for shard := uint32(0); shard < 2; shard++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(time.Second) // the pace: inside the send budget with the probes below
			defer tick.Stop()
			for {
				cctx, ccancel := context.WithTimeout(ctx, 90*time.Second)
				err := cmd.SendToShard(cctx, shard, dpxe.OpPresenceUpdate,
					map[string]any{"since": nil, "activities": []any{}, "status": "online", "afk": false})
				ccancel()
				if err != nil {
					err = fmt.Errorf("SDK command for shard %d: %w", shard, err)
					failed.CompareAndSwap(nil, &err)
					return
				}
				sentOK[shard].Add(1)
				select {
				case <-stop:
					return
				case <-tick.C:
				}
			}
		}()
	}
	stopSDK := func() {
		close(stop)
		wg.Wait()
		if e := failed.Load(); e != nil {
			t.Fatal(*e)
		}
	}
	b := l.boot("cmd-b", "virtio-net-pci", 2)
	if b.serial.waitFor(regexp.MustCompile(`nats: connected to`), 120*time.Second) == nil {
		t.Fatal("cmd-b did not connect to the broker")
	}
	if a.serial.waitFor(regexp.MustCompile(`released`), 90*time.Second) == nil {
		t.Fatal("cmd-a released no shard")
	}
	var o map[uint32]string
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(time.Second) {
		o = owners()
		if (o[0] == "cmd-a" && o[1] == "cmd-b") || (o[0] == "cmd-b" && o[1] == "cmd-a") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the shards' commands are not answered by cmd-a and cmd-b: %v", o)
		}
	}
	moved := uint32(0)
	if o[1] == "cmd-b" {
		moved = 1
	}
	t.Logf("shard %d moved to cmd-b; answered ok by %v", moved, o)
	// The SDK's worker of the moved shard goes on past the move.
	after := sentOK[moved].Load()
	for deadline := time.Now().Add(60 * time.Second); sentOK[moved].Load() < after+3; time.Sleep(100 * time.Millisecond) {
		if e := failed.Load(); e != nil {
			t.Fatal(*e)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the SDK's commands for shard %d: %d ok, none more after the move", moved, after)
		}
	}
	stopSDK()
	mu.Lock()
	t.Logf("SDK: %d and %d commands ok for shards 0 and 1; refusals sent again: %v", sentOK[0].Load(), sentOK[1].Load(), retried)
	n := 0
	for key, k := range retried[moved] {
		if key != "/"+events.CodeRateLimited && !strings.HasSuffix(key, "/"+events.CodeRateLimited) {
			n += k
		}
	}
	mu.Unlock()
	if n == 0 {
		t.Errorf("no SDK command for shard %d was refused during the move (not_owner, no responders, not_ready): the move's window was not crossed", moved)
	}
	for i := 0; i < 10; i++ {
		r, err := commandTo(t, nc, moved, presence)
		if err != nil {
			t.Fatalf("shard %d after the move: %v", moved, err)
		}
		if r.Node != "cmd-b" && r.Status != events.CodeNotOwner {
			t.Fatalf("shard %d after the move answered by %s: %+v", moved, r.Node, r)
		}
	}
	if v := l.emu.ViolationsOf(gatewayemu.KindRateLimited, gatewayemu.KindAlreadyAuthenticated); len(v) != 0 {
		t.Errorf("emulator violations: %s", violationReport(v))
	}
	t.Logf("cmd-a nats lines:\n%s", grepLines(a.serial.String(), "nats: "))
}
