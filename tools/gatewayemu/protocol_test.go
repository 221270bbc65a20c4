package gatewayemu

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestGatewayBotREST(t *testing.T) {
	t.Parallel()
	o := fastOptions()
	o.Shards, o.MaxConcurrency, o.SessionStarts = 16, 16, 50
	emu := startEmu(t, o)
	hc := emu.HTTPClient()
	get := func(path, auth string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, emu.HTTPURL()+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return resp.StatusCode, m
	}
	cases := []struct {
		name, path, auth string
		status           int
	}{
		{"v10 bot", "/api/v10/gateway/bot", "Bot " + emu.Token(), 200},
		{"v9 bot", "/api/v9/gateway/bot", "Bot " + emu.Token(), 200},
		{"trailing slash", "/api/v10/gateway/bot/", "Bot " + emu.Token(), 200},
		{"no auth", "/api/v10/gateway/bot", "", 401},
		{"wrong token", "/api/v10/gateway/bot", "Bot nope", 401},
		{"missing Bot prefix", "/api/v10/gateway/bot", emu.Token(), 401},
		{"bearer", "/api/v10/gateway/bot", "Bearer " + emu.Token(), 401},
		{"gateway without auth", "/api/v10/gateway", "", 200},
		{"v8 unknown", "/api/v8/gateway/bot", "Bot " + emu.Token(), 404},
		{"other route", "/api/v10/users/@me", "Bot " + emu.Token(), 404},
	}
	for _, tc := range cases {
		status, body := get(tc.path, tc.auth)
		if status != tc.status {
			t.Errorf("%s: status %d, want %d (%v)", tc.name, status, tc.status, body)
			continue
		}
		if status == 401 && body["message"] != "401: Unauthorized" {
			t.Errorf("%s: body %v", tc.name, body)
		}
		if status == 200 && body["url"] != emu.URL() {
			t.Errorf("%s: url %v, want %s", tc.name, body["url"], emu.URL())
		}
	}
	_, body := get("/api/v10/gateway/bot", "Bot "+emu.Token())
	if body["shards"] != 16.0 {
		t.Errorf("shards %v", body["shards"])
	}
	ssl := body["session_start_limit"].(map[string]any)
	if ssl["total"] != 50.0 || ssl["remaining"] != 50.0 || ssl["max_concurrency"] != 16.0 {
		t.Errorf("session_start_limit %v", ssl)
	}
	if ra := ssl["reset_after"].(float64); ra <= 0 || ra > float64(DefaultBudgetPeriod.Milliseconds()) {
		t.Errorf("reset_after %v", ra)
	}
	// An Identify costs one start.
	c := connect(t, emu)
	c.identify(emu, 0, 16)
	_, body = get("/api/v10/gateway/bot", "Bot "+emu.Token())
	if got := body["session_start_limit"].(map[string]any)["remaining"]; got != 49.0 {
		t.Errorf("remaining after one Identify = %v, want 49", got)
	}
}

func TestHelloAndVersion(t *testing.T) {
	t.Parallel()
	o := fastOptions()
	o.HeartbeatInterval = 1234 * time.Millisecond
	emu := startEmu(t, o)
	for _, v := range []string{"9", "10"} {
		c := dial(t, emu, "/?v="+v+"&encoding=json")
		f := c.expectOp(OpHello)
		var h struct {
			HeartbeatInterval int64 `json:"heartbeat_interval"`
		}
		json.Unmarshal(f.D, &h)
		if h.HeartbeatInterval != 1234 || f.S != nil || f.T != nil {
			t.Errorf("v=%s hello %v", v, f)
		}
		r := c.identify(emu, 0, 1)
		if strconv.Itoa(r.V) != v {
			t.Errorf("READY v=%d on a v=%s connection", r.V, v)
		}
		c.ws.Close(1000, "done")
		awaitState(t, emu, "session ended by close 1000", func(s State) bool { return len(s.Shards) == 0 })
	}
	noViolations(t, emu)

	refusals := []struct {
		query string
		code  int
		kind  Kind
	}{
		{"/?v=8&encoding=json", CloseInvalidAPIVersion, KindInvalidAPIVersion},
		{"/?encoding=json", CloseInvalidAPIVersion, KindInvalidAPIVersion},
		{"/?v=ten", CloseInvalidAPIVersion, KindInvalidAPIVersion},
		{"/?v=10&encoding=etf", CloseUnsupported, ""},
		{"/?v=10&encoding=xml", CloseUnsupported, ""},
		{"/?v=10&encoding=json&compress=zstd-stream", CloseUnsupported, ""},
	}
	for _, r := range refusals {
		before := len(emu.Violations())
		c := dial(t, emu, r.query)
		c.expectClose(r.code)
		vs := emu.Violations()[before:]
		if r.kind == "" && len(vs) != 0 || r.kind != "" && (len(vs) != 1 || vs[0].Kind != r.kind) {
			t.Errorf("%s: violations %+v, want %q", r.query, vs, r.kind)
		}
	}
}

func TestZlibStream(t *testing.T) {
	t.Parallel()
	emu := startEmu(t, fastOptions())
	c := dial(t, emu, "/?v=10&encoding=json&compress=zlib-stream")
	c.expectOp(OpHello)
	r := c.identify(emu, 0, 1)
	if r.SessionID == "" {
		t.Fatal("no session over zlib-stream")
	}
	c.send(OpHeartbeat, c.lastS)
	c.expectOp(OpHeartbeatACK)
	noViolations(t, emu)
}

func TestIdentifyCompressTrue(t *testing.T) {
	t.Parallel()
	emu := startEmu(t, fastOptions())
	c := connect(t, emu)
	d := identifyPayload(emu, 0, 1)
	d["compress"] = true
	c.send(OpIdentify, d)
	// read() inflates binary frames; check the raw type on the next one too.
	c.expectDispatch("READY")
	if _, err := emu.Inject(Fault{Kind: FaultDispatch, Event: "TEST_EVENT"}); err != nil {
		t.Fatal(err)
	}
	for {
		f := c.next()
		if f.T != nil && *f.T == "TEST_EVENT" {
			break
		}
	}
	noViolations(t, emu)
}

func TestIdentifyValidation(t *testing.T) {
	t.Parallel()
	o := fastOptions()
	o.GuildIDs = make([]uint64, 2600) // 2600 guilds: one shard would exceed 2500
	for i := range o.GuildIDs {
		o.GuildIDs[i] = uint64(i+1) << 22 // alternating timestamps: 1300 per shard of 2
	}
	o.ApprovedIntents = IntentGuildMembers
	emu := startEmu(t, o)
	base := func() map[string]any { return identifyPayload(emu, 0, 2) }
	with := func(k string, v any) map[string]any { d := base(); d[k] = v; return d }
	without := func(k string) map[string]any { d := base(); delete(d, k); return d }
	cases := []struct {
		name string
		d    any
		code int
		kind Kind
	}{
		{"bad token", with("token", "nope"), CloseAuthenticationFailed, KindAuthenticationFailed},
		{"Bot-prefixed token ok", with("token", "Bot "+emu.Token()), 0, ""},
		{"shard id == num", with("shard", []int{2, 2}), CloseInvalidShard, KindInvalidShard},
		{"negative shard", with("shard", []int{-1, 2}), CloseInvalidShard, KindInvalidShard},
		{"zero shards", with("shard", []int{0, 0}), CloseInvalidShard, KindInvalidShard},
		{"one-element shard", with("shard", []int{0}), CloseInvalidShard, KindInvalidShard},
		{"sharding required", without("shard"), CloseShardingRequired, KindShardingRequired},
		{"unassigned intent bit", with("intents", 1<<17|1), CloseInvalidIntents, KindInvalidIntents},
		{"negative intents", with("intents", -1), CloseInvalidIntents, KindInvalidIntents},
		{"missing intents", without("intents"), CloseInvalidIntents, KindInvalidIntents},
		{"message content not approved", with("intents", IntentMessageContent|1), CloseDisallowedIntents, KindDisallowedIntents},
		{"presences not approved", with("intents", IntentGuildPresences), CloseDisallowedIntents, KindDisallowedIntents},
		{"approved privileged ok", with("intents", IntentGuildMembers|1), 0, ""},
		{"unknown field", with("intent", 1), CloseUnknownOpcode, KindInvalidPayload},
		{"missing token", without("token"), CloseUnknownOpcode, KindInvalidPayload},
		{"missing properties", without("properties"), CloseUnknownOpcode, KindInvalidPayload},
		{"properties legacy $os ok", with("properties", map[string]string{"$os": "x", "$browser": "y", "$device": "z", "$referer": ""}), 0, ""},
		{"large_threshold 10", with("large_threshold", 10), CloseUnknownOpcode, KindInvalidPayload},
		{"large_threshold 250 ok", with("large_threshold", 250), 0, ""},
		{"token wrong type", with("token", 5), CloseUnknownOpcode, KindInvalidPayload},
		{"d null", nil, CloseUnknownOpcode, KindInvalidPayload},
		{"d is a string", "identify", CloseUnknownOpcode, KindInvalidPayload},
		{"presence not an object", with("presence", 3), CloseUnknownOpcode, KindInvalidPayload},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := len(emu.Violations())
			c := connect(t, emu)
			c.send(OpIdentify, tc.d)
			if tc.code == 0 {
				c.expectDispatch("READY")
				c.ws.CloseNow()
			} else {
				c.expectClose(tc.code)
			}
			vs := emu.ViolationsOf(tc.kind)
			got := emu.Violations()[before:]
			if tc.kind == "" {
				for _, v := range got {
					if v.Kind != KindDuplicateSession {
						t.Fatalf("unexpected violation %+v", v)
					}
				}
				return
			}
			if len(vs) == 0 || len(got) == 0 || got[len(got)-1].Kind != tc.kind || got[len(got)-1].CloseCode != tc.code {
				t.Fatalf("violations %+v, want %s/%d", got, tc.kind, tc.code)
			}
		})
	}
	// Large-bot mode: num_shards must be a multiple.
	o2 := fastOptions()
	o2.ShardMultiple = 16
	emu2 := startEmu(t, o2)
	c := connect(t, emu2)
	c.send(OpIdentify, identifyPayload(emu2, 0, 20))
	c.expectClose(CloseInvalidShard)
	c = connect(t, emu2)
	c.identify(emu2, 0, 32)
}

func TestUnknownFieldsLenient(t *testing.T) {
	t.Parallel()
	o := fastOptions()
	o.AllowUnknownFields = true
	emu := startEmu(t, o)
	c := connect(t, emu)
	d := identifyPayload(emu, 0, 1)
	d["guild_subscriptions"] = true
	c.send(OpIdentify, d)
	c.expectDispatch("READY")
	noViolations(t, emu)
}

func TestReadyAndGuildRouting(t *testing.T) {
	t.Parallel()
	o := fastOptions()
	o.Guilds = 30
	emu := startEmu(t, o)
	const num = 3
	total := 0
	for id := 0; id < num; id++ {
		c := connect(t, emu)
		c.send(OpIdentify, identifyPayload(emu, id, num))
		f := c.expectDispatch("READY")
		if *f.S != 1 {
			t.Errorf("READY s=%d, want 1", *f.S)
		}
		var r ready
		json.Unmarshal(f.D, &r)
		if r.V != 10 || r.SessionID == "" || r.ResumeGatewayURL != emu.ResumeURL() ||
			len(r.Shard) != 2 || r.Shard[0] != id || r.Shard[1] != num ||
			r.User["bot"] != true || r.Application["id"] == nil {
			t.Fatalf("READY %s", f.D)
		}
		want := map[string]bool{}
		for _, g := range emu.GuildsForShard(id, num) {
			want[strconv.FormatUint(g, 10)] = true
		}
		for _, g := range r.Guilds {
			gid, _ := strconv.ParseUint(g["id"].(string), 10, 64)
			if g["unavailable"] != true || ShardForGuild(gid, num) != id || !want[g["id"].(string)] {
				t.Fatalf("shard %d got guild %v", id, g)
			}
		}
		if len(r.Guilds) != len(want) || len(want) == 0 {
			t.Fatalf("shard %d: %d guilds, want %d", id, len(r.Guilds), len(want))
		}
		total += len(r.Guilds)
		for i := range r.Guilds {
			f := c.expectDispatch("GUILD_CREATE")
			if *f.S != int64(i+2) {
				t.Fatalf("GUILD_CREATE s=%d, want %d", *f.S, i+2)
			}
			var g struct {
				ID       string `json:"id"`
				Channels []any  `json:"channels"`
			}
			json.Unmarshal(f.D, &g)
			if !want[g.ID] || len(g.Channels) == 0 {
				t.Fatalf("GUILD_CREATE %s", f.D)
			}
		}
	}
	if total != 30 {
		t.Fatalf("guilds over all shards = %d, want 30", total)
	}
	noViolations(t, emu)
}

func TestSyntheticMessages(t *testing.T) {
	t.Parallel()
	o := fastOptions()
	o.MessagesPerSecond = 200
	o.Guilds = 2
	emu := startEmu(t, o)
	c := connect(t, emu)
	c.identify(emu, 0, 1)
	prev := c.lastS
	for i := 0; i < 5; i++ {
		f := c.expectDispatch("MESSAGE_CREATE")
		if *f.S != prev+1 {
			t.Fatalf("MESSAGE_CREATE s=%d after %d", *f.S, prev)
		}
		prev = *f.S
		var m struct {
			GuildID   string `json:"guild_id"`
			ChannelID string `json:"channel_id"`
			Content   string `json:"content"`
		}
		json.Unmarshal(f.D, &m)
		if m.GuildID == "" || m.ChannelID == "" || m.Content == "" {
			t.Fatalf("MESSAGE_CREATE %s", f.D)
		}
	}
}

func TestHeartbeat(t *testing.T) {
	t.Parallel()
	emu := startEmu(t, fastOptions())
	c := connect(t, emu)
	c.send(OpHeartbeat, nil) // allowed before Identify
	c.expectOp(OpHeartbeatACK)
	c.identify(emu, 0, 1)
	for i := 0; i < 3; i++ {
		c.send(OpHeartbeat, c.lastS)
		if f := c.expectOp(OpHeartbeatACK); f.S != nil || f.T != nil {
			t.Fatalf("ACK %v", f)
		}
	}
	st := emu.State()
	if st.Counters.Heartbeats != 4 || st.Counters.HeartbeatACKs != 4 {
		t.Fatalf("counters %+v", st.Counters)
	}
	if s := emu.Sessions(); len(s) != 1 || s[0].Heartbeats != 4 || s[0].LastHeartbeat == nil {
		t.Fatalf("sessions %+v", s)
	}
	c.sendRaw(`{"op":1,"d":"x"}`)
	c.expectClose(CloseUnknownOpcode)
}

// TestHeartbeatRecordAckDelay: with AckDelay the ACK of each heartbeat is
// held as asked (the connection is read on meanwhile), and with
// RecordHeartbeats each heartbeat's arrival and ACK are kept.
func TestHeartbeatRecordAckDelay(t *testing.T) {
	t.Parallel()
	o := fastOptions()
	o.RecordHeartbeats = true
	o.AckDelay = func(shard, n int) time.Duration { return time.Duration(n*40) * time.Millisecond }
	emu := startEmu(t, o)
	c := connect(t, emu)
	c.identify(emu, 0, 1)
	for i := 1; i <= 3; i++ {
		sent := time.Now()
		c.send(OpHeartbeat, c.lastS)
		c.expectOp(OpHeartbeatACK)
		if took, want := time.Since(sent), time.Duration(i*40)*time.Millisecond; took < want {
			t.Errorf("heartbeat %d: ACK after %v, held for %v", i, took, want)
		}
	}
	beats := emu.Heartbeats()
	// The last ACK's time is noted once its write returned, which may be
	// just after the client read it.
	for deadline := time.Now().Add(testTimeout); len(beats) == 3 && beats[2].Acked.IsZero() && time.Now().Before(deadline); beats = emu.Heartbeats() {
		time.Sleep(time.Millisecond)
	}
	if len(beats) != 3 {
		t.Fatalf("%d heartbeat records, want 3: %+v", len(beats), beats)
	}
	for i, b := range beats {
		held := b.Acked.Sub(b.Received)
		if b.Shard != 0 || b.N != i+1 || held < time.Duration(b.N*40)*time.Millisecond || held > time.Duration(b.N*40)*time.Millisecond+time.Second {
			t.Errorf("record %d: %+v (held %v)", i, b, held)
		}
	}
	noViolations(t, emu)
}

func TestServerHeartbeatRequest(t *testing.T) {
	t.Parallel()
	o := fastOptions()
	o.HeartbeatInterval = 30 * time.Second
	o.HeartbeatGrace = 2 * time.Second // the client must answer op 1 within this
	emu := startEmu(t, o)
	c := connect(t, emu)
	c.identify(emu, 0, 1)
	if n, err := emu.Inject(Fault{Kind: FaultHeartbeatRequest, Shard: intp(0)}); n != 1 || err != nil {
		t.Fatal(n, err)
	}
	c.expectOp(OpHeartbeat)
	c.send(OpHeartbeat, c.lastS)
	c.expectOp(OpHeartbeatACK)
	noViolations(t, emu)
	// Ignoring a request is a missed heartbeat, long before the interval.
	emu.Inject(Fault{Kind: FaultHeartbeatRequest, Shard: intp(0)})
	c.expectOp(OpHeartbeat)
	c.expectClose(CloseSessionTimedOut)
	if k := violationKinds(emu); len(k) != 1 || k[0] != KindMissedHeartbeat {
		t.Fatalf("violations %v", k)
	}
}

func TestMissedHeartbeat(t *testing.T) {
	t.Parallel()
	o := fastOptions()
	o.HeartbeatInterval = 200 * time.Millisecond
	o.HeartbeatGrace = 50 * time.Millisecond
	emu := startEmu(t, o)
	c := connect(t, emu)
	r := c.identify(emu, 0, 1)
	start := time.Now()
	c.expectClose(CloseSessionTimedOut)
	if el := time.Since(start); el < 150*time.Millisecond {
		t.Fatalf("closed after %v, before interval+grace", el)
	}
	vs := emu.Violations()
	if len(vs) != 1 || vs[0].Kind != KindMissedHeartbeat || vs[0].Session != r.SessionID || *vs[0].Shard != [2]int{0, 1} {
		t.Fatalf("violations %+v", vs)
	}
	// 4009: the session is over.
	awaitState(t, emu, "session ended", func(s State) bool { return len(s.Shards) == 0 })
}

func TestFramingErrors(t *testing.T) {
	t.Parallel()
	big := fmt.Sprintf(`{"op":1,"d":null,"pad":"%s"}`, strings.Repeat("x", MaxPayloadBytes))
	exact := `{"op":1,"d":null,"pad":"` + strings.Repeat("x", MaxPayloadBytes-len(`{"op":1,"d":null,"pad":""}`)) + `"}`
	cases := []struct {
		name     string
		identify bool
		send     func(c *wsClient)
		code     int
		kind     Kind
	}{
		{"oversize before identify", false, func(c *wsClient) { c.sendRaw(big) }, CloseDecodeError, KindOversizePayload},
		{"oversize after identify", true, func(c *wsClient) { c.sendRaw(big) }, CloseDecodeError, KindOversizePayload},
		{"exactly 4096 is fine", false, func(c *wsClient) { c.sendRaw(exact); c.expectOp(OpHeartbeatACK); c.ws.CloseNow() }, 0, ""},
		{"not json", false, func(c *wsClient) { c.sendRaw("hello") }, CloseDecodeError, KindDecodeError},
		{"no op", false, func(c *wsClient) { c.sendRaw(`{"d":null}`) }, CloseDecodeError, KindDecodeError},
		{"json array", false, func(c *wsClient) { c.sendRaw(`[1,2]`) }, CloseDecodeError, KindDecodeError},
		{"binary frame", false, func(c *wsClient) { c.ws.Write(t.Context(), 2, []byte(`{"op":1,"d":null}`)) }, CloseDecodeError, KindDecodeError},
		{"unknown op 5", true, func(c *wsClient) { c.send(5, nil) }, CloseUnknownOpcode, KindUnknownOpcode},
		{"client op 0", true, func(c *wsClient) { c.send(0, nil) }, CloseUnknownOpcode, KindUnknownOpcode},
		{"client op 11", true, func(c *wsClient) { c.send(11, nil) }, CloseUnknownOpcode, KindUnknownOpcode},
		{"presence before identify", false, func(c *wsClient) { c.send(OpPresenceUpdate, map[string]any{"status": "online"}) }, CloseNotAuthenticated, KindNotAuthenticated},
		{"request members before identify", false, func(c *wsClient) { c.send(OpRequestGuildMembers, map[string]any{"guild_id": "1"}) }, CloseNotAuthenticated, KindNotAuthenticated},
		{"presence after identify ok", true, func(c *wsClient) {
			c.send(OpPresenceUpdate, map[string]any{"status": "online", "since": nil, "activities": []any{}, "afk": false})
			c.send(OpHeartbeat, c.lastS)
			c.expectOp(OpHeartbeatACK)
			c.ws.CloseNow()
		}, 0, ""},
		{"second identify", true, func(c *wsClient) { c.send(OpIdentify, identifyPayload(c.emu, 0, 1)) }, CloseAlreadyAuthenticated, KindAlreadyAuthenticated},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			emu := startEmu(t, fastOptions())
			before := len(emu.Violations())
			c := connect(t, emu)
			if tc.identify {
				c.identify(emu, 0, 1)
			}
			tc.send(c)
			if tc.code != 0 {
				c.expectClose(tc.code)
			}
			var got []Violation
			for _, v := range emu.Violations()[before:] {
				if v.Kind != KindDuplicateSession {
					got = append(got, v)
				}
			}
			if tc.kind == "" && len(got) != 0 || tc.kind != "" && (len(got) != 1 || got[0].Kind != tc.kind || got[0].CloseCode != tc.code) {
				t.Fatalf("violations %+v, want %q", got, tc.kind)
			}
		})
	}
}

func TestSendRateLimit(t *testing.T) {
	t.Parallel()
	o := fastOptions()
	o.SendWindow = DefaultSendWindow
	emu := startEmu(t, o)
	c := connect(t, emu)
	c.identify(emu, 0, 1)
	// 120 events (the Identify was one) are fine; the 121st closes with 4008.
	for i := 0; i < SendLimitEvents-1; i++ {
		c.send(OpHeartbeat, c.lastS)
		c.expectOp(OpHeartbeatACK)
	}
	noViolations(t, emu)
	c.send(OpHeartbeat, c.lastS)
	c.expectClose(CloseRateLimited)
	if k := violationKinds(emu); len(k) != 1 || k[0] != KindRateLimited {
		t.Fatalf("violations %v", k)
	}
	// 4008 keeps the session resumable.
	s := emu.Sessions()
	if len(s) != 1 || s[0].State != SessionDetached {
		t.Fatalf("sessions %+v", s)
	}
}

func TestSendWindowSlides(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	o := fastOptions()
	o.Now = clock.Now
	o.SendLimit = 3
	o.SendWindow = time.Minute
	emu := startEmu(t, o)
	c := connect(t, emu)
	for i := 0; i < 3; i++ {
		c.send(OpHeartbeat, nil)
		c.expectOp(OpHeartbeatACK)
	}
	clock.Advance(time.Minute)
	for i := 0; i < 3; i++ {
		c.send(OpHeartbeat, nil)
		c.expectOp(OpHeartbeatACK)
	}
	clock.Advance(59 * time.Second)
	c.send(OpHeartbeat, nil)
	c.expectClose(CloseRateLimited)
}

func TestOptionsValidation(t *testing.T) {
	t.Parallel()
	bad := []Options{
		{Shards: -1},
		{MaxConcurrency: -2},
		{IdentifyWindow: -time.Second},
		{HeartbeatInterval: time.Microsecond},
		{Guilds: -1},
		{MessagesPerSecond: -1},
		{ApprovedIntents: IntentGuilds},
		{SessionStarts: -5},
		{ShardMultiple: -1},
	}
	for _, o := range bad {
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
	e, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	got := e.Options()
	if got.HeartbeatInterval != DefaultHeartbeatInterval || got.IdentifyWindow != 5*time.Second ||
		got.SessionStarts != 1000 || got.MaxConcurrency != 1 || got.SendLimit != 120 {
		t.Fatalf("defaults %+v", got)
	}
	if got.SendWindow != time.Minute {
		t.Fatalf("send window %v", got.SendWindow)
	}
	// A shortened heartbeat interval shrinks the send window by the same ratio.
	e, _ = New(Options{HeartbeatInterval: 4125 * time.Millisecond})
	if w := e.Options().SendWindow; w != 6*time.Second {
		t.Fatalf("scaled send window %v, want 6s", w)
	}
}

// TestLateHeartbeatTimer: a heartbeat timer that fires long after its
// deadline (this process starved of CPU) rechecks once before it records
// missed_heartbeat, so a heartbeat the reader had not yet had the CPU to
// read still counts; without one, the violation says how late the timer
// was, and the counters keep the worst lateness.
func TestLateHeartbeatTimer(t *testing.T) {
	t.Parallel()
	o := fastOptions()
	o.HeartbeatInterval = 30 * time.Second
	o.HeartbeatGrace = 2 * time.Second
	emu := startEmu(t, o)
	connOf := func() *conn {
		emu.mu.Lock()
		defer emu.mu.Unlock()
		for c := range emu.conns {
			if c.shard != nil && !c.closing.Load() {
				return c
			}
		}
		return nil
	}
	fireLate := func(c *conn, late time.Duration) {
		c.hbDeadline.Store(time.Now().Add(-late).UnixNano())
		c.heartbeatMissed() // as the timer would, late
	}

	// A heartbeat read during the recheck: no violation.
	c := connect(t, emu)
	c.identify(emu, 0, 1)
	fireLate(connOf(), 500*time.Millisecond)
	c.send(OpHeartbeat, c.lastS)
	c.expectOp(OpHeartbeatACK)
	time.Sleep(2 * timerLateRecheck) // the recheck runs and finds the new deadline
	noViolations(t, emu)

	// No heartbeat: the recheck records it, with the timer's lateness.
	fireLate(connOf(), 500*time.Millisecond)
	c.expectClose(CloseSessionTimedOut)
	vs := emu.Violations()
	if len(vs) != 1 || vs[0].Kind != KindMissedHeartbeat || vs[0].TimerLateMS < 500 {
		t.Fatalf("violations %+v, want one missed_heartbeat with timer_late_ms >= 500", vs)
	}
	if got := emu.State().Counters.MaxTimerLateMS; got < 500 {
		t.Fatalf("max_timer_late_ms %d, want >= 500", got)
	}
}
