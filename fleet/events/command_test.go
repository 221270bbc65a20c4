package events

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/discord-pxe/dpxe/appliance"
)

// readyView is a shard 1 of 4 with an empty send log, heartbeating at
// Discord's 41.25 s, clock in nanoseconds.
func readyView() ShardView {
	return ShardView{Shard: 1, TotalShards: 4, Owned: true, Ready: true, Log: &appliance.SendLog{},
		NowTSC: 1e12, CyclesPerMS: 1e6, HeartbeatMS: 41250}
}

// guildOn returns a guild ID that routes to shard of total.
func guildOn(shard, total uint32) string {
	for g := uint64(1) << 22; ; g += 1 << 22 {
		if appliance.ShardForGuild(g, total) == shard {
			b, _ := json.Marshal(g)
			return string(b)
		}
	}
}

// TestCheckCommandRule walks the rule's codes in order, one body each.
func TestCheckCommandRule(t *testing.T) {
	on1, on2 := guildOn(1, 4), guildOn(2, 4)
	big := `{"op":3,"d":{"status":"` + strings.Repeat("x", MaxCommandBytes) + `"}}`
	cases := []struct {
		name, body, code string
		mod              func(*ShardView)
	}{
		{"presence", `{"op":3,"d":{"since":null,"activities":[],"status":"online","afk":false}}`, CodeOK, nil},
		{"presence, d first, spaces", ` { "d" : {} , "op" : 3 } `, CodeOK, nil},
		{"voice state", `{"op":4,"d":{"guild_id":"` + on1 + `","channel_id":null,"self_mute":false,"self_deaf":false}}`, CodeOK, nil},
		{"request members", `{"op":8,"d":{"guild_id":"` + on1 + `","query":"","limit":0}}`, CodeOK, nil},
		{"not owner first", `{"op":2,"d":{}}`, CodeNotOwner, func(v *ShardView) { v.Owned = false }},
		{"too large", big, CodeTooLarge, nil},
		{"garbage", `{"op":3,"d":{`, CodeBadJSON, nil},
		{"not an object", `[3,{}]`, CodeBadJSON, nil},
		{"two ops", `{"op":3,"op":2,"d":{}}`, CodeBadJSON, nil},
		{"two d", `{"op":3,"d":{},"d":{}}`, CodeBadJSON, nil},
		{"extra member", `{"op":3,"d":{},"s":null}`, CodeBadJSON, nil},
		{"no op", `{"d":{}}`, CodeBadJSON, nil},
		{"no d", `{"op":3}`, CodeBadJSON, nil},
		{"op as string", `{"op":"3","d":{}}`, CodeBadJSON, nil},
		{"op fraction", `{"op":3.0,"d":{}}`, CodeBadJSON, nil},
		{"op negative", `{"op":-3,"d":{}}`, CodeBadJSON, nil},
		{"op leading zero", `{"op":03,"d":{}}`, CodeBadJSON, nil},
		{"d not object", `{"op":3,"d":null}`, CodeBadJSON, nil},
		{"identify", `{"op":2,"d":{"token":"x"}}`, CodeBadOp, nil},
		{"resume", `{"op":6,"d":{}}`, CodeBadOp, nil},
		{"heartbeat", `{"op":1,"d":{}}`, CodeBadOp, nil},
		{"unknown op", `{"op":999,"d":{}}`, CodeBadOp, nil},
		{"members, other shard", `{"op":8,"d":{"guild_id":"` + on2 + `"}}`, CodeWrongShard, nil},
		{"members, no guild", `{"op":8,"d":{"query":""}}`, CodeWrongShard, nil},
		{"voice, guild a number", `{"op":4,"d":{"guild_id":` + on1 + `}}`, CodeWrongShard, nil},
		{"members, guild not a snowflake", `{"op":8,"d":{"guild_id":"12a"}}`, CodeWrongShard, nil},
		{"not ready", `{"op":3,"d":{}}`, CodeNotReady, func(v *ShardView) { v.Ready = false }},
		{"no connection", `{"op":3,"d":{}}`, CodeNotReady, func(v *ShardView) { v.Log = nil }},
		{"before hello", `{"op":3,"d":{}}`, CodeRateLimited, func(v *ShardView) { v.HeartbeatMS = 0 }},
	}
	for _, tc := range cases {
		v := readyView()
		if tc.mod != nil {
			tc.mod(&v)
		}
		cmd, r := CheckCommand([]byte(tc.body), v)
		if r.Status != tc.code {
			t.Errorf("%s: %s (%s), want %s", tc.name, r.Status, r.Reason, tc.code)
			continue
		}
		if r.Shard != 1 {
			t.Errorf("%s: reply names shard %d", tc.name, r.Shard)
		}
		if tc.code == CodeOK {
			if string(cmd.Frame) != tc.body || r.Err() != nil {
				t.Errorf("%s: frame %q err %v", tc.name, cmd.Frame, r.Err())
			}
			continue
		}
		if cmd.Frame != nil || r.Reason == "" {
			t.Errorf("%s: refused with frame %q, reason %q", tc.name, cmd.Frame, r.Reason)
		}
		var ce *CommandError
		if err := r.Err(); !errors.As(err, &ce) || ce.Code != tc.code || !errors.Is(err, ErrCommandRefused) {
			t.Errorf("%s: Err() = %v", tc.name, err)
		}
	}
}

// TestCheckCommandBudget floods a connection with commands, noting each
// one sent and a heartbeat every 41.25 s, for 10 minutes of simulated
// time at one command attempt per 100 ms: no 60 s window ever holds more
// than 120 events, every heartbeat is sent, commands are sent again after
// each refusal's retry-after, and a refusal's retry-after is exactly when
// the next one is allowed.
func TestCheckCommandBudget(t *testing.T) {
	v := readyView()
	const ms = uint64(1e6)
	var sent []uint64 // every event's time
	v.NowTSC = 0
	nextBeat := uint64(0)
	body := []byte(`{"op":3,"d":{}}`)
	var okCmds, refused int
	var retryAt uint64
	for now := uint64(0); now < 600_000*ms; now += 100 * ms {
		for nextBeat <= now {
			v.Log.Note(nextBeat)
			sent = append(sent, nextBeat)
			nextBeat += 41250 * ms
		}
		v.NowTSC = now
		_, r := CheckCommand(body, v)
		switch r.Status {
		case CodeOK:
			if retryAt != 0 && now < retryAt {
				t.Fatalf("at %d ms: allowed before the retry-after (%d ms)", now/ms, retryAt/ms)
			}
			retryAt = 0
			v.Log.Note(now)
			sent = append(sent, now)
			okCmds++
		case CodeRateLimited:
			refused++
			if r.RetryAfterMS == 0 || r.RetryAfterMS > 60000 {
				t.Fatalf("at %d ms: retry after %d ms", now/ms, r.RetryAfterMS)
			}
			if retryAt == 0 {
				retryAt = now + r.RetryAfterMS*ms
			}
		default:
			t.Fatalf("at %d ms: %s %s", now/ms, r.Status, r.Reason)
		}
	}
	worst := 0
	for i := range sent {
		n := 0
		for j := i; j < len(sent) && sent[j]-sent[i] < 60000*ms; j++ {
			n++
		}
		worst = max(worst, n)
	}
	if worst > appliance.SendLimitEvents {
		t.Errorf("a 60 s window holds %d events, over %d", worst, appliance.SendLimitEvents)
	}
	// 10 minutes hold 10 windows of 115 commands (120 minus 4 kept for
	// heartbeats, minus the one being sent), less what heartbeats took.
	if okCmds < 1000 || refused == 0 {
		t.Errorf("%d commands sent, %d refused: the budget is not used or not enforced", okCmds, refused)
	}
	t.Logf("%d commands sent, %d refused, worst window %d events", okCmds, refused, worst)
}

// FuzzCheckCommand: any body gets a known code without a panic; an
// accepted one is the body unchanged, within the size limit, an object
// whose op is 3, 4 or 8 and whose guild (ops 4 and 8) routes to the
// shard.
func FuzzCheckCommand(f *testing.F) {
	for _, s := range []string{`{"op":3,"d":{}}`, `{"op":8,"d":{"guild_id":"` + guildOn(1, 4) + `"}}`,
		`{"op":2,"d":{}}`, `{"op":3,"op":3,"d":{}}`, `{"op":03,"d":{}}`, `{"op":4,"d":{"guild_id":"1"}}`, `[]`, `{`, ``} {
		f.Add([]byte(s), true)
	}
	codes := map[string]bool{CodeOK: true, CodeNotOwner: true, CodeTooLarge: true, CodeBadJSON: true,
		CodeBadOp: true, CodeWrongShard: true, CodeNotReady: true, CodeRateLimited: true}
	f.Fuzz(func(t *testing.T, body []byte, ready bool) {
		v := readyView()
		v.Ready = ready
		cmd, r := CheckCommand(body, v)
		if !codes[r.Status] {
			t.Fatalf("unknown code %q", r.Status)
		}
		if r.Status != CodeOK {
			if cmd.Frame != nil || r.Reason == "" {
				t.Fatalf("%s with frame %q reason %q", r.Status, cmd.Frame, r.Reason)
			}
			return
		}
		if string(cmd.Frame) != string(body) || len(body) > MaxCommandBytes {
			t.Fatalf("accepted %d bytes, frame %q", len(body), cmd.Frame)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(body, &m); err != nil || len(m) != 2 {
			t.Fatalf("accepted %q: %v, %d members", body, err, len(m))
		}
		var op int
		if err := json.Unmarshal(m["op"], &op); err != nil || (op != 3 && op != 4 && op != 8) || op != cmd.Op {
			t.Fatalf("accepted op %s (%d)", m["op"], cmd.Op)
		}
		if op != 3 {
			var d struct {
				GuildID string `json:"guild_id"`
			}
			if err := json.Unmarshal(m["d"], &d); err != nil {
				t.Fatal(err)
			}
			g, err := appliance.ParseGuildID(d.GuildID)
			if err != nil || appliance.ShardForGuild(g, 4) != 1 {
				t.Fatalf("accepted guild %q for shard 1 of 4", d.GuildID)
			}
		}
	})
}
