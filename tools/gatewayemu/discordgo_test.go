package gatewayemu

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bwmarrin/discordgo"
	"github.com/gorilla/websocket"
)

// discordgoEndpoints serialises tests that repoint discordgo's package-level
// endpoint variables.
var discordgoEndpoints sync.Mutex

// TestDiscordgoAgainstEmulator runs bwmarrin/discordgo v0.29.0, unchanged,
// against the emulator. Only configuration is touched: the REST endpoint
// variables (discordgo builds them from https://discord.com/api/v9/ at init),
// its HTTP client and its WebSocket dialer (to trust the emulator's CA).
func TestDiscordgoAgainstEmulator(t *testing.T) {
	for _, useTLS := range []bool{true, false} {
		name := map[bool]string{true: "wss", false: "ws"}[useTLS]
		t.Run(name, func(t *testing.T) { runDiscordgo(t, useTLS) })
	}
}

func runDiscordgo(t *testing.T, useTLS bool) {
	o := Options{
		Token:          "discordgo-token",
		Shards:         2,
		MaxConcurrency: 1,
		Guilds:         6,
		// discordgo declares a zombie after 5 intervals without an ACK:
		// 400 ms keeps that at 2 s on a starved machine.
		HeartbeatInterval:   400 * time.Millisecond,
		HeartbeatGrace:      2 * time.Second, // other test packages share the 2 cores
		IdentifyWindow:      50 * time.Millisecond,
		IdentifyRejectDelay: 10 * time.Millisecond,
		ReconnectGrace:      5 * time.Second,
		TLS:                 useTLS,
	}
	emu := startEmu(t, o)

	discordgoEndpoints.Lock()
	defer discordgoEndpoints.Unlock()
	oldGW, oldBot := discordgo.EndpointGateway, discordgo.EndpointGatewayBot
	discordgo.EndpointGateway = emu.APIBase(9) + "gateway"
	discordgo.EndpointGatewayBot = emu.APIBase(9) + "gateway/bot"
	defer func() { discordgo.EndpointGateway, discordgo.EndpointGatewayBot = oldGW, oldBot }()

	dg, err := discordgo.New("Bot " + o.Token)
	if err != nil {
		t.Fatal(err)
	}
	dg.LogLevel = discordgo.LogError
	dg.Client = emu.HTTPClient()
	dg.Dialer = &websocket.Dialer{TLSClientConfig: emu.ClientTLSConfig(), HandshakeTimeout: 10 * time.Second}

	// Shard plan from /gateway/bot, as a sharded bot does.
	gb, err := dg.GatewayBot()
	if err != nil {
		t.Fatalf("GatewayBot: %v", err)
	}
	if gb.Shards != 2 || gb.SessionStartLimit.MaxConcurrency != 1 || gb.SessionStartLimit.Remaining != 1000 ||
		gb.URL != emu.URL()+"/" {
		t.Fatalf("GatewayBot %+v", gb)
	}
	dg.ShardID, dg.ShardCount = 0, gb.Shards

	var (
		mu       sync.Mutex
		readies  []string
		guilds   = map[string]int{}
		resumed  int
		messages []string
	)
	changed := make(chan struct{}, 100)
	poke := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	dg.AddHandler(func(_ *discordgo.Session, r *discordgo.Ready) {
		mu.Lock()
		readies = append(readies, r.SessionID)
		mu.Unlock()
		poke()
	})
	dg.AddHandler(func(_ *discordgo.Session, g *discordgo.GuildCreate) {
		mu.Lock()
		guilds[g.ID]++
		mu.Unlock()
		poke()
	})
	dg.AddHandler(func(_ *discordgo.Session, _ *discordgo.Resumed) {
		mu.Lock()
		resumed++
		mu.Unlock()
		poke()
	})
	dg.AddHandler(func(_ *discordgo.Session, m *discordgo.MessageCreate) {
		mu.Lock()
		messages = append(messages, m.Content)
		mu.Unlock()
		poke()
	})
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.NewTimer(testTimeout)
		defer deadline.Stop()
		for {
			mu.Lock()
			ok := cond()
			mu.Unlock()
			if ok {
				return
			}
			select {
			case <-changed:
			case <-deadline.C:
				t.Fatalf("discordgo: timed out waiting for %s", what)
			}
		}
	}

	opened := time.Now()
	if err := dg.Open(); err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer func() { dg.ShouldReconnectOnError = false; dg.Close() }()
	want := emu.GuildsForShard(0, 2)
	waitFor("READY and GUILD_CREATEs", func() bool { return len(readies) == 1 && len(guilds) == len(want) })
	for _, g := range want {
		if guilds[snowflake(g)] != 1 {
			t.Fatalf("guild %d created %d times", g, guilds[snowflake(g)])
		}
	}

	// Several heartbeat intervals, every one ACKed.
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if err := emu.Await(ctx, func(s State) bool { return s.Counters.Heartbeats >= 4 }); err != nil {
		t.Fatal(err)
	}
	if st := emu.State(); st.Counters.HeartbeatACKs != st.Counters.Heartbeats {
		t.Fatalf("heartbeats %d, ACKs %d", st.Counters.Heartbeats, st.Counters.HeartbeatACKs)
	}
	dg.RLock() // discordgo writes LastHeartbeatAck under its lock
	lastAck := dg.LastHeartbeatAck
	dg.RUnlock()
	if !lastAck.After(opened) {
		t.Fatalf("discordgo saw no ACK since Open: last ACK %v", lastAck)
	}

	// op 7: discordgo closes with 1012 and resumes; the message raised
	// meanwhile is replayed before RESUMED.
	first := readies[0]
	if n, err := emu.Inject(Fault{Kind: FaultReconnect, Shard: intp(0)}); n != 1 || err != nil {
		t.Fatal(n, err)
	}
	if _, err := emu.Inject(Fault{Kind: FaultDispatch, Shard: intp(0), Event: "MESSAGE_CREATE",
		Data: []byte(`{"id":"5","channel_id":"6","content":"while reconnecting","author":{"id":"7","username":"x"}}`)}); err != nil {
		t.Fatal(err)
	}
	waitFor("RESUMED and the replayed message", func() bool {
		return resumed == 1 && len(messages) == 1 && messages[0] == "while reconnecting"
	})
	st := emu.State()
	if st.Counters.Resumes != 1 || st.Counters.ReplayedDispatches != 1 || len(readies) != 1 {
		t.Fatalf("after op 7: counters %+v readies %d", st.Counters, len(readies))
	}
	if s := emu.Sessions(); len(s) != 1 || s[0].ID != first || s[0].State != SessionConnected {
		t.Fatalf("after op 7: sessions %+v", s)
	}

	// op 9 false: discordgo re-Identifies (on the same connection) and gets
	// a new session.
	if n, err := emu.Inject(Fault{Kind: FaultInvalidSession, Shard: intp(0), Resumable: false}); n != 1 || err != nil {
		t.Fatal(n, err)
	}
	waitFor("a second READY", func() bool { return len(readies) == 2 })
	if readies[1] == first {
		t.Fatal("re-Identify reused the old session")
	}
	if s := emu.Sessions(); len(s) != 1 || s[0].ID != readies[1] {
		t.Fatalf("after op 9: sessions %+v", s)
	}

	// discordgo v0.29.0 predates resume_gateway_url: it resumes on the main
	// URL. That is the only thing the record holds against it.
	for _, v := range emu.Violations() {
		if v.Kind != KindResumeWrongURL {
			t.Errorf("violation %+v", v)
		}
	}
	if n := len(emu.ViolationsOf(KindResumeWrongURL)); n != 1 {
		t.Errorf("%d resume_wrong_url violations, want 1", n)
	}

	// Close 1000 ends the session for good. (discordgo's heartbeat goroutine
	// can race Close and start a reconnect loop; switch that off first.)
	dg.ShouldReconnectOnError = false
	if err := dg.Close(); err != nil {
		t.Fatal(err)
	}
	if err := emu.Await(ctx, func(s State) bool { return len(s.Shards) == 0 }); err != nil {
		t.Fatalf("session after Close: %v (%+v)", err, emu.Sessions())
	}
	if ids := emu.Identifies(); len(ids) != 2 || ids[0].Outcome != IdentifyAccepted || ids[1].Outcome != IdentifyAccepted ||
		!strings.HasPrefix(emu.URL(), map[bool]string{true: "wss", false: "ws:"}[useTLS]) {
		t.Fatalf("identifies %+v", ids)
	}
}

// TestDiscordgoLargeFragmented runs discordgo, unchanged, against the
// shapes of a real bot's Gateway: every message fragmented, READY with
// 3,000 unavailable guilds, a 2 MiB first GUILD_CREATE, and Request Guild
// Members answered in three GUILD_MEMBERS_CHUNKs. discordgo does not speak
// compress=zlib-stream (it asks for Identify compress:true, one zlib stream
// per message), so that path is checked by the raw client in
// TestLargeMessagesOnTheWire.
func TestDiscordgoLargeFragmented(t *testing.T) {
	o := Options{
		Token:                  "discordgo-token",
		Guilds:                 2,
		GuildMembers:           2500,
		ApprovedIntents:        IntentGuildMembers,
		ReadyUnavailableGuilds: 3000,
		GuildCreateBytes:       []int{2 << 20},
		FragmentFrames:         8,
		Seed:                   3,
		// discordgo gives up after 5 intervals without an ACK, and an ACK
		// waits behind megabytes on the same stream: 1.5 s keeps that
		// above 7 s under the race detector on a shared machine.
		HeartbeatInterval: 1500 * time.Millisecond,
		HeartbeatGrace:    3 * time.Second,
		IdentifyWindow:    50 * time.Millisecond,
	}
	emu := startEmu(t, o)
	discordgoEndpoints.Lock()
	defer discordgoEndpoints.Unlock()
	oldGW, oldBot := discordgo.EndpointGateway, discordgo.EndpointGatewayBot
	discordgo.EndpointGateway = emu.APIBase(9) + "gateway"
	discordgo.EndpointGatewayBot = emu.APIBase(9) + "gateway/bot"
	defer func() { discordgo.EndpointGateway, discordgo.EndpointGatewayBot = oldGW, oldBot }()

	dg, err := discordgo.New("Bot " + o.Token)
	if err != nil {
		t.Fatal(err)
	}
	dg.LogLevel = discordgo.LogError
	dg.Client = emu.HTTPClient()
	dg.Identify.Intents = discordgo.IntentsGuilds | discordgo.IntentsGuildMembers
	var (
		mu      sync.Mutex
		unavail int
		sizes   = map[string]int{}
		members = map[string]bool{}
		chunks  int
	)
	changed := make(chan struct{}, 100)
	poke := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	dg.AddHandler(func(_ *discordgo.Session, r *discordgo.Ready) {
		mu.Lock()
		unavail = len(r.Guilds)
		mu.Unlock()
		poke()
	})
	dg.AddHandler(func(_ *discordgo.Session, g *discordgo.GuildCreate) {
		mu.Lock()
		sizes[g.ID] = len(g.Members) + len(g.Channels) + len(g.Threads)
		mu.Unlock()
		poke()
	})
	dg.AddHandler(func(_ *discordgo.Session, c *discordgo.GuildMembersChunk) {
		mu.Lock()
		if c.Nonce == "dg" {
			chunks++
			for _, m := range c.Members {
				members[m.User.ID] = true
			}
		}
		mu.Unlock()
		poke()
	})
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.NewTimer(testTimeout)
		defer deadline.Stop()
		for {
			mu.Lock()
			ok := cond()
			mu.Unlock()
			if ok {
				return
			}
			select {
			case <-changed:
			case <-deadline.C:
				t.Fatalf("discordgo: timed out waiting for %s", what)
			}
		}
	}
	if err := dg.Open(); err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer func() { dg.ShouldReconnectOnError = false; dg.Close() }()
	waitFor("READY and both GUILD_CREATEs", func() bool { return unavail == 2+3000 && len(sizes) == 2 })
	first := snowflake(emu.Guilds()[0])
	if sizes[first] < 5000 {
		t.Fatalf("the 2 MiB GUILD_CREATE held %d objects", sizes[first])
	}
	if err := dg.RequestGuildMembers(first, "", 0, "dg", false); err != nil {
		t.Fatal(err)
	}
	waitFor("three member chunks", func() bool { return chunks == 3 })
	if len(members) != 2500 {
		t.Fatalf("%d distinct members in the chunks", len(members))
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if err := emu.Await(ctx, func(s State) bool { return s.Counters.HeartbeatACKs >= 1 }); err != nil {
		t.Fatal(err)
	}
	noViolations(t, emu)
	if st := emu.ConnStats(); len(st) != 1 || st[0].Frames <= 2*st[0].Messages {
		t.Fatalf("record %+v: messages were not fragmented", st)
	}
}
