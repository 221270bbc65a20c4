package gatewayemu

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// memberChunk is GUILD_MEMBERS_CHUNK as the tests read it.
type memberChunk struct {
	GuildID string `json:"guild_id"`
	Members []struct {
		User struct {
			ID       string `json:"id"`
			Username string `json:"username"`
		} `json:"user"`
	} `json:"members"`
	ChunkIndex int               `json:"chunk_index"`
	ChunkCount int               `json:"chunk_count"`
	NotFound   []string          `json:"not_found"`
	Presences  []json.RawMessage `json:"presences"`
	Nonce      *string           `json:"nonce"`
}

// membersEmu starts an emulator with one guild of n members and a client
// identified with the GUILD_MEMBERS and GUILD_PRESENCES intents.
func membersEmu(t *testing.T, n int, now func() time.Time) (*Emulator, *wsClient, uint64) {
	t.Helper()
	o := fastOptions()
	o.Guilds = 1
	o.GuildMembers = n
	o.ApprovedIntents = IntentGuildMembers | IntentGuildPresences
	o.Now = now
	emu := startEmu(t, o)
	c := connect(t, emu)
	d := identifyPayload(emu, 0, 1)
	d["intents"] = IntentGuilds | IntentGuildMembers | IntentGuildPresences
	c.send(OpIdentify, d)
	c.expectDispatch("READY")
	c.expectDispatch("GUILD_CREATE")
	return emu, c, emu.Guilds()[0]
}

// chunks reads the GUILD_MEMBERS_CHUNKs of one answer and checks their
// indices run 0..chunk_count-1.
func (c *wsClient) chunks() []memberChunk {
	c.t.Helper()
	var out []memberChunk
	for i := 0; i < 10000; i++ {
		f := c.expectDispatch("GUILD_MEMBERS_CHUNK")
		var ch memberChunk
		if err := json.Unmarshal(f.D, &ch); err != nil {
			c.t.Fatal(err)
		}
		if ch.ChunkIndex != len(out) || len(ch.Members) > MembersPerChunk {
			c.t.Fatalf("chunk %d of %d with %d members after %d chunks", ch.ChunkIndex, ch.ChunkCount, len(ch.Members), len(out))
		}
		out = append(out, ch)
		if ch.ChunkIndex == ch.ChunkCount-1 {
			return out
		}
	}
	c.t.Fatal("no last chunk")
	return nil
}

// TestRequestGuildMembers checks the answers to valid op 8s against the
// guild's member list: every member once for query "" limit 0, username
// prefixes and the limit for a query, found and not_found for user_ids,
// presences when asked, the nonce echoed only up to 32 bytes.
func TestRequestGuildMembers(t *testing.T) {
	t.Parallel()
	const n = 2500
	emu, c, g := membersEmu(t, n, nil)
	o := emu.Options()
	gs := snowflake(g)
	all := func(want int, nonce string, chunks []memberChunk) {
		t.Helper()
		ids := map[string]bool{}
		for _, ch := range chunks {
			if ch.GuildID != gs || ch.ChunkCount != len(chunks) || ch.Nonce == nil || *ch.Nonce != nonce {
				t.Fatalf("chunk %+v", ch)
			}
			for _, m := range ch.Members {
				ids[m.User.ID] = true
			}
		}
		if len(ids) != want {
			t.Fatalf("%d distinct members, want %d", len(ids), want)
		}
	}
	c.send(OpRequestGuildMembers, map[string]any{"guild_id": gs, "query": "", "limit": 0, "nonce": "every"})
	all(n, "every", c.chunks())

	var oaks []string
	for i := range n {
		if _, name := o.memberUser(g, i); strings.HasPrefix(name, "oak") {
			oaks = append(oaks, name)
		}
	}
	if len(oaks) < 10 {
		t.Fatalf("only %d oaks among %d members", len(oaks), n)
	}
	c.send(OpRequestGuildMembers, map[string]any{"guild_id": gs, "query": "OAK", "limit": 7})
	ch := c.chunks()
	if len(ch) != 1 || len(ch[0].Members) != 7 || ch[0].Nonce != nil {
		t.Fatalf("query answer %+v", ch)
	}
	for k, m := range ch[0].Members {
		if m.User.Username != oaks[k] {
			t.Fatalf("query member %d is %q, want %q", k, m.User.Username, oaks[k])
		}
	}
	c.send(OpRequestGuildMembers, map[string]any{"guild_id": []string{gs}, "query": "zzz", "limit": 1})
	if ch := c.chunks(); len(ch) != 1 || len(ch[0].Members) != 0 || ch[0].ChunkCount != 1 {
		t.Fatalf("no-match answer %+v", ch)
	}

	id7, _ := o.memberUser(g, 7)
	bogus := (uint64(memberIDBase)+7)<<22 | 1 // member 7's timestamp, wrong low bits
	if id7 == bogus {
		bogus++
	}
	c.send(OpRequestGuildMembers, map[string]any{"guild_id": g, "user_ids": []string{snowflake(applicationID), snowflake(id7), snowflake(bogus)},
		"presences": true, "nonce": strings.Repeat("n", MaxMemberNonceBytes)})
	ch = c.chunks()
	if len(ch) != 1 || len(ch[0].Members) != 2 || ch[0].Members[1].User.ID != snowflake(id7) ||
		fmt.Sprint(ch[0].NotFound) != fmt.Sprint([]string{snowflake(bogus)}) || len(ch[0].Presences) != 2 ||
		ch[0].Nonce == nil || len(*ch[0].Nonce) != MaxMemberNonceBytes {
		t.Fatalf("user_ids answer %+v", ch)
	}
	c.send(OpRequestGuildMembers, map[string]any{"guild_id": gs, "user_ids": snowflake(authorID), "nonce": strings.Repeat("n", MaxMemberNonceBytes+1)})
	if ch := c.chunks(); len(ch[0].Members) != 1 || ch[0].Nonce != nil || ch[0].Presences != nil {
		t.Fatalf("single user_id with a long nonce: %+v", ch)
	}
	// Answers come in request order, a large one before a small one.
	c.send(OpRequestGuildMembers, map[string]any{"guild_id": gs, "query": "", "limit": 2000, "nonce": "big"})
	c.send(OpRequestGuildMembers, map[string]any{"guild_id": gs, "user_ids": snowflake(authorID), "nonce": "small"})
	if ch := c.chunks(); len(ch) != 2 || *ch[0].Nonce != "big" || *ch[1].Nonce != "big" {
		t.Fatalf("first answer %+v", ch)
	}
	if ch := c.chunks(); len(ch) != 1 || *ch[0].Nonce != "small" {
		t.Fatalf("second answer %+v", ch)
	}
	c.send(OpHeartbeat, c.lastS)
	c.expectOp(OpHeartbeatACK)
	noViolations(t, emu)
}

// TestRequestGuildMembersLimits checks the all-members limit (one per guild
// per window, answered with RATE_LIMITED and recorded), a guild of another
// shard (recorded, not answered) and GUILD_DELETE, with the connection kept
// open throughout.
func TestRequestGuildMembersLimits(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	emu, c, g := membersEmu(t, 5, clock.Now)
	gs := snowflake(g)
	everyone := map[string]any{"guild_id": gs, "query": "", "limit": 0, "nonce": "a"}
	c.send(OpRequestGuildMembers, everyone)
	c.chunks()
	clock.Advance(DefaultMemberRequestWindow - time.Second)
	c.send(OpRequestGuildMembers, everyone)
	f := c.expectDispatch("RATE_LIMITED")
	var rl struct {
		Opcode     int     `json:"opcode"`
		RetryAfter float64 `json:"retry_after"`
		Meta       struct {
			GuildID string `json:"guild_id"`
			Nonce   string `json:"nonce"`
		} `json:"meta"`
	}
	if err := json.Unmarshal(f.D, &rl); err != nil || rl.Opcode != OpRequestGuildMembers || rl.RetryAfter != 1 || rl.Meta.GuildID != gs || rl.Meta.Nonce != "a" {
		t.Fatalf("RATE_LIMITED %s (%v)", f.D, err)
	}
	// A query request is not under that limit.
	c.send(OpRequestGuildMembers, map[string]any{"guild_id": gs, "query": "", "limit": 3})
	if ch := c.chunks(); len(ch[0].Members) != 3 {
		t.Fatalf("limited query answered %+v", ch)
	}
	clock.Advance(time.Second)
	c.send(OpRequestGuildMembers, everyone)
	c.chunks()
	if k := violationKinds(emu); fmt.Sprint(k) != fmt.Sprint([]Kind{KindMembersRateLimited}) {
		t.Fatalf("violations %v", k)
	}

	other := outageGuilds(1, 0, 1)[0]
	c.send(OpRequestGuildMembers, map[string]any{"guild_id": snowflake(other), "user_ids": []string{"1"}})
	awaitState(t, emu, "members_wrong_guild", func(s State) bool { return len(s.Violations) == 2 })
	if v := emu.Violations()[1]; v.Kind != KindMembersWrongGuild || v.CloseCode != 0 {
		t.Fatalf("violation %+v", v)
	}

	if _, err := emu.Inject(Fault{Kind: FaultGuildDelete, Guild: gs, Unavailable: true}); err != nil {
		t.Fatal(err)
	}
	if f := c.expectDispatch("GUILD_DELETE"); string(f.D) != `{"id":"`+gs+`","unavailable":true}` {
		t.Fatalf("outage GUILD_DELETE %s", f.D)
	}
	c.send(OpRequestGuildMembers, map[string]any{"guild_id": gs, "user_ids": snowflake(authorID)})
	c.chunks() // still the shard's guild
	if _, err := emu.Inject(Fault{Kind: FaultGuildDelete, Guild: gs}); err != nil {
		t.Fatal(err)
	}
	if f := c.expectDispatch("GUILD_DELETE"); string(f.D) != `{"id":"`+gs+`"}` {
		t.Fatalf("removal GUILD_DELETE %s", f.D)
	}
	if _, err := emu.Inject(Fault{Kind: FaultGuildDelete, Guild: gs}); !errors.Is(err, ErrNoTarget) {
		t.Fatalf("second removal: %v", err)
	}
	if _, err := emu.Inject(Fault{Kind: FaultGuildDelete, Guild: "x"}); !errors.Is(err, ErrBadFault) {
		t.Fatalf("bad guild: %v", err)
	}
	c.send(OpRequestGuildMembers, map[string]any{"guild_id": gs, "user_ids": snowflake(authorID)})
	awaitState(t, emu, "members_wrong_guild after removal", func(s State) bool { return len(s.Violations) == 3 })
	c.send(OpHeartbeat, c.lastS)
	c.expectOp(OpHeartbeatACK)
}

// TestRequestGuildMembersInvalid checks that malformed op 8s close with
// 4001, are recorded as invalid_payload naming the field, and are counted
// as malformed frames (invalid_d).
func TestRequestGuildMembersInvalid(t *testing.T) {
	t.Parallel()
	ids := make([]string, MaxMemberUserIDs+1)
	for i := range ids {
		ids[i] = "1"
	}
	for _, tc := range []struct {
		name  string
		d     any
		field string
	}{
		{"no guild_id", map[string]any{"query": "", "limit": 0}, "guild_id"},
		{"guild_id not a snowflake", map[string]any{"guild_id": "abc", "query": "", "limit": 0}, "guild_id"},
		{"guild_id array of two", map[string]any{"guild_id": []string{"1", "2"}, "query": "", "limit": 0}, "guild_id"},
		{"neither query nor user_ids", map[string]any{"guild_id": "1"}, "query"},
		{"both", map[string]any{"guild_id": "1", "query": "", "limit": 0, "user_ids": "1"}, "user_ids"},
		{"query without limit", map[string]any{"guild_id": "1", "query": "a"}, "limit"},
		{"negative limit", map[string]any{"guild_id": "1", "query": "a", "limit": -1}, "limit"},
		{"too many user_ids", map[string]any{"guild_id": "1", "user_ids": ids}, "user_ids"},
		{"bad user id", map[string]any{"guild_id": "1", "user_ids": []any{"1", true}}, "user_ids[1]"},
		{"unknown field", map[string]any{"guild_id": "1", "query": "", "limit": 0, "guild_ids": []string{"1"}}, "guild_ids"},
		{"d not an object", "x", "cannot unmarshal"},
		{"all members without the intent", nil, "GUILD_MEMBERS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			emu := startEmu(t, fastOptions())
			c := connect(t, emu)
			r := c.identify(emu, 0, 1) // intents without GUILD_MEMBERS
			d := tc.d
			if d == nil {
				d = map[string]any{"guild_id": r.Guilds[0]["id"], "query": "", "limit": 0}
			}
			c.send(OpRequestGuildMembers, d)
			c.expectClose(CloseUnknownOpcode)
			v := emu.Violations()
			if len(v) != 1 || v[0].Kind != KindInvalidPayload || !strings.Contains(v[0].Detail, tc.field) {
				t.Fatalf("violations %+v, want invalid_payload naming %s", v, tc.field)
			}
			if m := emu.MalformedClientFrames(); m[FrameInvalidD] != 1 || len(m) != 1 {
				t.Fatalf("malformed frames %v", m)
			}
		})
	}
}

// FuzzParseMemberRequest feeds arbitrary op 8 `d`s to the parser: it never
// panics, every error wraps ErrInvalidPayload, and what it accepts keeps
// the documented shape.
func FuzzParseMemberRequest(f *testing.F) {
	for _, s := range []string{
		`{"guild_id":"1","query":"","limit":0}`,
		`{"guild_id":1,"user_ids":["2","3"],"nonce":"x","presences":true}`,
		`{"guild_id":"1","user_ids":"2"}`,
		`{"guild_id":"1","query":"a"}`, `{"guild_id":"0","query":"","limit":0}`,
		`{"guild_id":"18446744073709551616","query":"","limit":0}`,
		`{"guild_id":"1","user_ids":[]}`, `{"guild_id":["1"],"query":"","limit":0}`, `{"guild_id":[],"query":""}`, `{"guild_id":"1","user_ids":null,"query":null}`,
		`null`, `[]`, `{"guild_id":"1","query":"","limit":0} {}`,
	} {
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, b []byte, lenient bool) {
		r, err := parseMemberRequest(b, lenient)
		if err != nil {
			if !errors.Is(err, ErrInvalidPayload) {
				t.Fatalf("error %v is not ErrInvalidPayload", err)
			}
			return
		}
		switch {
		case r.Guild == 0:
			t.Fatal("accepted guild 0")
		case (r.Query == nil) == (len(r.UserIDs) == 0):
			t.Fatalf("query %v and %d user_ids", r.Query, len(r.UserIDs))
		case len(r.UserIDs) > MaxMemberUserIDs || r.Limit < 0:
			t.Fatalf("accepted %d user_ids, limit %d", len(r.UserIDs), r.Limit)
		case len(r.Nonce) > MaxMemberNonceBytes || !r.HasNonce && r.Nonce != "":
			t.Fatalf("nonce %q kept", r.Nonce)
		}
	})
}
