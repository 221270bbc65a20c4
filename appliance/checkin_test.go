package appliance

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseCheckinRequest(t *testing.T) {
	ok := `{"node_id":"compaq-01","capacity":16,"ready_shards":8,"starting_shards":2,"backoff_shards":1,"fatal_shards":0}`
	got, err := ParseCheckinRequest([]byte(ok))
	if err != nil {
		t.Fatalf("seed example: %v", err)
	}
	if got.NodeID != "compaq-01" || got.Capacity != 16 || got.ReadyShards != 8 || got.StartingShards != 2 || got.BackoffShards != 1 {
		t.Fatalf("seed example decoded as %+v", got)
	}
	full := `{"node_id":"n.1_a","capacity":4,"generation":7,"shards":[
	 {"id":0,"state":"READY","seq_valid":true,"heartbeat_acks":10,"heartbeat_misses":1,"reconnects":2,"last_error":"tls: alert 40","close_code":4000},
	 {"id":131071,"state":"FATAL","close_code":4014},
	 {"id":7,"state":"READY","ping_ms":12.345,"ping_avg_ms":10.5,"ping_max_ms":4294967.295,"ack_slow":true}]}`
	got, err = ParseCheckinRequest([]byte(full))
	if err != nil {
		t.Fatalf("full example: %v", err)
	}
	if got.Generation != 7 || len(got.Shards) != 3 || got.Shards[0].LastError != "tls: alert 40" || got.Shards[1].State != ShardFatal {
		t.Fatalf("full example decoded as %+v", got)
	}
	if p := got.Shards[2]; p.PingMS != 12.345 || p.PingAvgMS != 10.5 || p.PingMaxMS != MaxPingMS || !p.AckSlow {
		t.Fatalf("pings decoded as %+v", p)
	}

	// The broker connection, at its longest.
	broker := `{"node_id":"a","capacity":1,"nats":{"state":"down","connects":18446744073709551615,"drops":18446744073709551615,"refused":0}}`
	if got, err = ParseCheckinRequest([]byte(broker)); err != nil || got.NATS == nil || *got.NATS != (BrokerStatus{State: BrokerDown, Connects: 1<<64 - 1, Drops: 1<<64 - 1}) {
		t.Fatalf("broker status: %+v, %v", got.NATS, err)
	}

	// A node that rebooted with a smaller capacity reports what its last
	// answer had it run: accepted, so the controller can shrink its plan.
	over := `{"node_id":"a","capacity":4,"starting_shards":16}`
	if _, err := ParseCheckinRequest([]byte(over)); err != nil {
		t.Fatalf("counts over the capacity refused: %v", err)
	}

	bad := []struct {
		name, body, field string
	}{
		{"not object", `[1]`, ""},
		{"empty", ``, ""},
		{"truncated", `{"node_id":"a"`, ""},
		{"trailing", `{"node_id":"a","capacity":1} {}`, ""},
		{"unknown field", `{"node_id":"a","capacity":1,"extra":1}`, "extra"},
		{"no node", `{"capacity":1}`, "node_id"},
		{"bad node char", `{"node_id":"a b","capacity":1}`, "node_id"},
		{"long node", `{"node_id":"` + strings.Repeat("a", 65) + `","capacity":1}`, "node_id"},
		{"node not string", `{"node_id":5,"capacity":1}`, "node_id"},
		{"capacity 0", `{"node_id":"a","capacity":0}`, "capacity"},
		{"capacity 129", `{"node_id":"a","capacity":129}`, "capacity"},
		{"capacity float", `{"node_id":"a","capacity":1.5}`, "capacity"},
		{"capacity string", `{"node_id":"a","capacity":"1"}`, "capacity"},
		{"negative ready", `{"node_id":"a","capacity":1,"ready_shards":-1}`, "ready_shards"},
		{"fatal 129", `{"node_id":"a","capacity":128,"fatal_shards":129}`, "fatal_shards"},
		{"sum over 128", `{"node_id":"a","capacity":2,"ready_shards":100,"backoff_shards":29}`, "ready_shards"},
		{"negative generation", `{"node_id":"a","capacity":1,"generation":-1}`, "generation"},
		{"shard state", `{"node_id":"a","capacity":1,"shards":[{"id":1,"state":"RUNNING"}]}`, "shards[0].state"},
		{"shard id range", `{"node_id":"a","capacity":1,"shards":[{"id":131072,"state":"READY"}]}`, "shards[0].id"},
		{"shard dup", `{"node_id":"a","capacity":2,"shards":[{"id":1,"state":"READY"},{"id":1,"state":"READY"}]}`, "shards[1].id"},
		{"shard unknown", `{"node_id":"a","capacity":1,"shards":[{"id":1,"state":"READY","x":1}]}`, "x"},
		{"close code", `{"node_id":"a","capacity":1,"shards":[{"id":1,"state":"READY","close_code":999}]}`, "shards[0].close_code"},
		{"last error ctl", `{"node_id":"a","capacity":1,"shards":[{"id":1,"state":"READY","last_error":"a\nb"}]}`, "shards[0].last_error"},
		{"last error long", `{"node_id":"a","capacity":1,"shards":[{"id":1,"state":"READY","last_error":"` + strings.Repeat("e", 201) + `"}]}`, "shards[0].last_error"},
		{"session without url", `{"node_id":"a","capacity":1,"shards":[{"id":1,"state":"READY","session_id":"abc"}]}`, "shards[0].resume_url"},
		{"url without session", `{"node_id":"a","capacity":1,"shards":[{"id":1,"state":"READY","resume_url":"ws://h/"}]}`, "shards[0].session_id"},
		{"session quote", `{"node_id":"a","capacity":1,"shards":[{"id":1,"state":"READY","session_id":"a\"b","resume_url":"ws://h/"}]}`, "shards[0].session_id"},
		{"session backslash", `{"node_id":"a","capacity":1,"shards":[{"id":1,"state":"READY","session_id":"a\\b","resume_url":"ws://h/"}]}`, "shards[0].session_id"},
		{"session space", `{"node_id":"a","capacity":1,"shards":[{"id":1,"state":"READY","session_id":"a b","resume_url":"ws://h/"}]}`, "shards[0].session_id"},
		{"session long", `{"node_id":"a","capacity":1,"shards":[{"id":1,"state":"READY","session_id":"` + strings.Repeat("s", 65) + `","resume_url":"ws://h/"}]}`, "shards[0].session_id"},
		{"session non-ascii", `{"node_id":"a","capacity":1,"shards":[{"id":1,"state":"READY","session_id":"caf\u00e9","resume_url":"ws://h/"}]}`, "shards[0].session_id"},
		{"seq negative", `{"node_id":"a","capacity":1,"shards":[{"id":1,"state":"READY","seq":-1}]}`, "seq"},
		{"seq over 32 bits", `{"node_id":"a","capacity":1,"shards":[{"id":1,"state":"READY","seq":4294967296}]}`, "seq"},
		{"resume WSS", `{"node_id":"a","capacity":1,"shards":[{"id":1,"state":"READY","session_id":"s","resume_url":"WSS://gateway.discord.gg"}]}`, "shards[0].resume_url"},
		{"resume http", `{"node_id":"a","capacity":1,"shards":[{"id":1,"state":"READY","session_id":"s","resume_url":"http://h/"}]}`, "shards[0].resume_url"},
		{"ping negative", `{"node_id":"a","capacity":1,"shards":[{"id":1,"state":"READY","ping_ms":-0.001}]}`, "shards[0].ping_ms"},
		{"ping over 32 bits of µs", `{"node_id":"a","capacity":1,"shards":[{"id":1,"state":"READY","ping_avg_ms":4294967.296}]}`, "shards[0].ping_avg_ms"},
		{"ping max huge", `{"node_id":"a","capacity":1,"shards":[{"id":1,"state":"READY","ping_max_ms":1e300}]}`, "shards[0].ping_max_ms"},
		{"ping string", `{"node_id":"a","capacity":1,"shards":[{"id":1,"state":"READY","ping_ms":"1"}]}`, "ping_ms"},
		{"ack_slow number", `{"node_id":"a","capacity":1,"shards":[{"id":1,"state":"READY","ack_slow":1}]}`, "ack_slow"},
		{"nats state", `{"node_id":"a","capacity":1,"nats":{"state":"UP","connects":1,"drops":0,"refused":0}}`, "nats.state"},
		{"nats no state", `{"node_id":"a","capacity":1,"nats":{"connects":1,"drops":0,"refused":0}}`, "nats.state"},
		{"nats unknown", `{"node_id":"a","capacity":1,"nats":{"state":"up","connects":1,"drops":0,"refused":0,"pool":3}}`, "pool"},
		{"nats negative", `{"node_id":"a","capacity":1,"nats":{"state":"up","connects":-1,"drops":0,"refused":0}}`, "connects"},
		{"resume long", `{"node_id":"a","capacity":1,"shards":[{"id":1,"state":"READY","session_id":"s","resume_url":"ws://h/` + strings.Repeat("p", MaxDialURLLen-6) + `"}]}`, "shards[0].resume_url"},
	}
	for _, c := range bad {
		_, err := ParseCheckinRequest([]byte(c.body))
		var fe *FieldError
		if !errors.As(err, &fe) {
			t.Errorf("%s: error %v is not a *FieldError", c.name, err)
			continue
		}
		if !strings.HasSuffix(fe.Field, c.field) || (c.field == "" && fe.Field != "") {
			t.Errorf("%s: field %q, want %q (%v)", c.name, fe.Field, c.field, err)
		}
	}

	// 128 live statuses and 128 released sessions fit; one more does not.
	tooMany := CheckinRequest{NodeID: "a", Capacity: 128}
	for i := 0; i < 2*MaxShardsPerNode; i++ {
		st := ShardStatus{ID: uint32(i), State: ShardReady}
		if i >= MaxShardsPerNode {
			st = ShardStatus{ID: uint32(i), State: ShardAssigned, SeqValid: true, SessionID: "s", ResumeURL: "ws://h/" + strings.Repeat("p", MaxDialURLLen-7)}
		}
		tooMany.Shards = append(tooMany.Shards, st)
	}
	body, _ := json.Marshal(tooMany)
	if _, err := ParseCheckinRequest(body); err != nil {
		t.Errorf("256 shard entries with %d-byte resume URLs: %v", MaxDialURLLen, err)
	}
	tooMany.Shards = append(tooMany.Shards, ShardStatus{ID: 2 * MaxShardsPerNode, State: ShardReady})
	body, _ = json.Marshal(tooMany)
	if _, err := ParseCheckinRequest(body); err == nil || !strings.HasPrefix(err.Error(), "shards:") {
		t.Errorf("257 shard entries: %v", err)
	}
	withSession := `{"node_id":"a","capacity":2,"generation":9,"shards":[
	 {"id":3,"state":"ASSIGNED","seq_valid":true,"close_code":4200,"session_id":"9b2c0e6f1d6a4c7e8f0a1b2c3d4e5f60","seq":4294967295,"resume_url":"ws://10.0.0.9:9000/resume"}]}`
	got, err = ParseCheckinRequest([]byte(withSession))
	if err != nil {
		t.Fatalf("session fields: %v", err)
	}
	if s := got.Shards[0]; s.SessionID != "9b2c0e6f1d6a4c7e8f0a1b2c3d4e5f60" || s.Seq != 4294967295 || s.ResumeURL != "ws://10.0.0.9:9000/resume" {
		t.Fatalf("session fields decoded as %+v", s)
	}
	huge := `{"node_id":"a","capacity":1,"shards":[` + strings.Repeat(" ", MaxCheckinBody) + `]}`
	if _, err := ParseCheckinRequest([]byte(huge)); !errors.Is(err, ErrBodyTooLarge) {
		t.Errorf("huge body: %v", err)
	}
}

func TestParseIdentifyRequest(t *testing.T) {
	r, err := ParseIdentifyRequest([]byte(`{"node_id":"n1","shard_id":5}`))
	if err != nil || r.NodeID != "n1" || r.ShardID != 5 {
		t.Fatalf("got %+v, %v", r, err)
	}
	for body, field := range map[string]string{
		`{"node_id":"n1","shard_id":-5}`:     "shard_id",
		`{"node_id":"n1","shard_id":131072}`: "shard_id",
		`{"node_id":"","shard_id":1}`:        "node_id",
		`{"node_id":"n1","shard":1}`:         "shard",
	} {
		_, err := ParseIdentifyRequest([]byte(body))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != field {
			t.Errorf("%s: got %v, want field %s", body, err, field)
		}
	}
}

func TestIdentifyBucket(t *testing.T) {
	cases := []struct{ shard, mc, want uint32 }{
		{0, 1, 0}, {5, 1, 0}, {5, 0, 0}, {17, 16, 1}, {31, 16, 15}, {32, 16, 0},
	}
	for _, c := range cases {
		if got := IdentifyBucket(c.shard, c.mc); got != c.want {
			t.Errorf("IdentifyBucket(%d,%d) = %d, want %d", c.shard, c.mc, got, c.want)
		}
	}
}

// FuzzParseCheckinRequest checks that the decoder never panics, that every
// rejection is a *FieldError or ErrBodyTooLarge, and that every accepted
// request satisfies the documented bounds and survives a round trip.
func FuzzParseCheckinRequest(f *testing.F) {
	f.Add([]byte(`{"node_id":"compaq-01","capacity":16,"ready_shards":8,"starting_shards":2,"backoff_shards":1,"fatal_shards":0}`))
	f.Add([]byte(`{"node_id":"a","capacity":1,"generation":3,"shards":[{"id":1,"state":"READY","close_code":4014}]}`))
	f.Add([]byte(`{"node_id":"a","capacity":1,"x":1}`))
	f.Add([]byte(`{"node_id":"a","capacity":1,"generation":4,"shards":[{"id":2,"state":"ASSIGNED","seq_valid":true,"session_id":"abc","seq":77,"resume_url":"ws://gw.local:9000/resume?x=1"}]}`))
	f.Add([]byte(`{"node_id":"a","capacity":1,"shards":[{"id":2,"state":"READY","session_id":"a","resume_url":"wss://h"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := ParseCheckinRequest(data)
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) && !errors.Is(err, ErrBodyTooLarge) {
				t.Fatalf("error %T %v is neither *FieldError nor ErrBodyTooLarge", err, err)
			}
			return
		}
		if ValidateNodeID(r.NodeID) != nil || r.Capacity < 1 || r.Capacity > MaxShardsPerNode {
			t.Fatalf("accepted out-of-bounds request %+v", r)
		}
		if s := r.ReadyShards + r.StartingShards + r.BackoffShards + r.FatalShards; s > r.Capacity {
			t.Fatalf("accepted health sum %d > capacity %d", s, r.Capacity)
		}
		again, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := ParseCheckinRequest(again)
		if err != nil {
			t.Fatalf("round trip of %s: %v", again, err)
		}
		if len(r2.Shards) != len(r.Shards) || r2.NodeID != r.NodeID || r2.Generation != r.Generation {
			t.Fatalf("round trip changed %+v into %+v", r, r2)
		}
		for i, s := range r.Shards {
			if s != r2.Shards[i] {
				t.Fatalf("round trip changed shard %+v into %+v", s, r2.Shards[i])
			}
			if s.SessionID == "" && s.ResumeURL == "" {
				continue
			}
			if ValidateSessionID(s.SessionID) != nil || ValidateGatewayURL(s.ResumeURL) != nil {
				t.Fatalf("accepted session fields %q %q", s.SessionID, s.ResumeURL)
			}
			if _, err := GatewayDialURL(s.ResumeURL); err != nil {
				t.Fatalf("accepted resume_url %q has no dial URL: %v", s.ResumeURL, err)
			}
		}
	})
}

func TestValidateGatewayURL(t *testing.T) {
	good := map[string]string{
		"ws://127.0.0.1:9000":                          "ws://127.0.0.1:9000/?v=10&encoding=json",
		"ws://127.0.0.1:9000/":                         "ws://127.0.0.1:9000/?v=10&encoding=json",
		"ws://gw.example-1.local/resume":               "ws://gw.example-1.local/resume?v=10&encoding=json",
		"ws://h:1/a/b?v=9&encoding=etf&compress=x":     "ws://h:1/a/b?v=10&encoding=json",
		"ws://h?v=10":                                  "ws://h/?v=10&encoding=json",
		"ws://h:65535/p%20q~!$&'()*+,;=:@":             "ws://h:65535/p%20q~!$&'()*+,;=:@?v=10&encoding=json",
		"ws://h/?v=10&encoding=json":                   "ws://h/?v=10&encoding=json",
		"ws://" + strings.Repeat("a", 194):             "ws://" + strings.Repeat("a", 194) + "/?v=10&encoding=json",
		"ws://10.0.0.9:9000/resume?v=10&encoding=json": "ws://10.0.0.9:9000/resume?v=10&encoding=json",
	}
	for in, want := range good {
		if err := ValidateGatewayURL(in); err != nil {
			t.Errorf("ValidateGatewayURL(%q): %v", in, err)
			continue
		}
		got, err := GatewayDialURL(in)
		if err != nil || got != want {
			t.Errorf("GatewayDialURL(%q) = %q, %v; want %q", in, got, err, want)
		}
		if again, err := GatewayDialURL(got); err != nil || again != got {
			t.Errorf("GatewayDialURL not idempotent on %q: %q, %v", got, again, err)
		}
	}
	bad := []string{
		"", "ws://", "ws:///x", "ws://:80", "ws://h:", "ws://h:0", "ws://h:65536", "ws://h:123456", "ws://h:8a",
		"WS://h", "http://h", "ws:/h", "ws://user@h", "ws://[::1]:80", "ws://h/#frag", "ws://h/a b", "ws://h/\"",
		"ws://h/\\", "ws://h/\x7f", "ws://h_x", "ws://" + strings.Repeat("a", 196),
		"ws://h/" + strings.Repeat("p", 194),
	}
	for _, in := range bad {
		if err := ValidateGatewayURL(in); err == nil {
			t.Errorf("ValidateGatewayURL(%q) accepted", in)
		}
		if _, err := GatewayDialURL(in); err == nil {
			t.Errorf("GatewayDialURL(%q) accepted", in)
		}
	}
	// Valid as reported, but one byte too long once the path "/" is added.
	if _, err := GatewayDialURL("ws://" + strings.Repeat("a", 195)); err == nil {
		t.Error("GatewayDialURL accepted a 201-byte base")
	}
	// wss:// (lower case) is a TLS Gateway the kernel dials; the scheme
	// in upper case is not the grammar's.
	if err := ValidateGatewayURL("wss://gateway.discord.gg"); err != nil {
		t.Errorf("ValidateGatewayURL(wss://gateway.discord.gg) = %v", err)
	}
	if d, err := GatewayDialURL("wss://gateway.discord.gg"); err != nil || d != "wss://gateway.discord.gg/?"+GatewayQuery {
		t.Errorf("GatewayDialURL(wss://gateway.discord.gg) = %q, %v", d, err)
	}
	if err := ValidateGatewayURL("WSS://gateway.discord.gg/?v=10"); err == nil {
		t.Error("ValidateGatewayURL accepted WSS://")
	}
}

func TestValidateSessionID(t *testing.T) {
	for _, ok := range []string{"a", "9b2c0e6f1d6a4c7e8f0a1b2c3d4e5f60", strings.Repeat("~", 64), "!#$%&'()*+,-./:;<=>?@[]^_`{|}"} {
		if err := ValidateSessionID(ok); err != nil {
			t.Errorf("ValidateSessionID(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", strings.Repeat("a", 65), "a b", `a"b`, `a\b`, "a\x00", "caf\xc3\xa9", "a\x7f"} {
		if err := ValidateSessionID(bad); err == nil {
			t.Errorf("ValidateSessionID(%q) accepted", bad)
		}
	}
}

// TestCheckinResponseJSON pins the response's wire names and that the
// Gateway fields are left out when absent (the kernel's JSON reader sees
// the same document as before).
func TestCheckinResponseJSON(t *testing.T) {
	bare, _ := json.Marshal(CheckinResponse{Assigned: []uint32{}, Pending: []uint32{}})
	for _, k := range []string{"gateway_url", "bot_token", "intents", "resume", "restart_shards"} {
		if strings.Contains(string(bare), k) {
			t.Errorf("empty %s not left out: %s", k, bare)
		}
	}
	full, _ := json.Marshal(CheckinResponse{Assigned: []uint32{4}, Pending: []uint32{}, GatewayURL: "ws://h/?v=10&encoding=json",
		BotToken: "tok", Intents: 513, Resume: []ResumeState{{ShardID: 4, SessionID: "s1", Seq: 7, ResumeURL: "ws://h/resume?v=10&encoding=json"}}})
	want := `"gateway_url":"ws://h/?v=10\u0026encoding=json","bot_token":"tok","intents":513,"resume":[{"shard_id":4,"session_id":"s1","seq":7,"resume_url":"ws://h/resume?v=10\u0026encoding=json"}]}`
	if !strings.HasSuffix(string(full), want) {
		t.Errorf("response JSON\n%s\nwant suffix\n%s", full, want)
	}
	restart, _ := json.Marshal(CheckinResponse{Assigned: []uint32{3, 4}, Pending: []uint32{}, RestartShards: []uint32{3, 4}})
	if want := `"next_checkin_ms":0,"restart_shards":[3,4]}`; !strings.HasSuffix(string(restart), want) {
		t.Errorf("response JSON\n%s\nwant suffix\n%s", restart, want)
	}
}

// goodResponse is a check-in answer with every field set, as the
// controller writes it.
const goodResponse = `{"generation":4,"total_shards":64,"assigned":[16,17,18,19,20,21,22,23],
 "range_start":16,"range_count":8,"pending":[22,23],"lease_seconds":30,"max_concurrency":1,"next_checkin_ms":1000,
 "gateway_url":"ws://10.0.0.9:9000/?v=10&encoding=json","bot_token":"MTA5.x","intents":513,
 "resume":[{"shard_id":16,"session_id":"9b2c0e6f","seq":1337,"resume_url":"ws://10.0.0.9:9000/resume?v=10&encoding=json"}],
 "restart_shards":[17,20]}`

func TestParseCheckinResponse(t *testing.T) {
	r, err := ParseCheckinResponse([]byte(goodResponse))
	if err != nil {
		t.Fatalf("good answer: %v", err)
	}
	if !reflect.DeepEqual(r.RestartShards, []uint32{17, 20}) || len(r.Resume) != 1 || !reflect.DeepEqual(r.Pending, []uint32{22, 23}) {
		t.Fatalf("decoded as %+v", r)
	}
	again, _ := json.Marshal(r)
	if r2, err := ParseCheckinResponse(again); err != nil || !reflect.DeepEqual(r, r2) {
		t.Fatalf("round trip of %s: %+v, %v", again, r2, err)
	}
	empty := `{"generation":1,"total_shards":4,"assigned":[],"range_start":0,"range_count":0,"pending":[],"lease_seconds":30,"max_concurrency":1,"next_checkin_ms":10000}`
	if _, err := ParseCheckinResponse([]byte(empty)); err != nil {
		t.Fatalf("empty assignment: %v", err)
	}

	// Each case replaces one part of goodResponse.
	bad := []struct {
		name, from, to, field string
	}{
		{"unknown field", `"restart_shards"`, `"restart":[1],"restart_shards"`, "restart"},
		{"restart not array", `"restart_shards":[17,20]`, `"restart_shards":17`, "restart_shards"},
		{"restart negative", `"restart_shards":[17,20]`, `"restart_shards":[-1]`, "restart_shards"},
		{"restart descending", `"restart_shards":[17,20]`, `"restart_shards":[20,17]`, "restart_shards[1]"},
		{"restart duplicate", `"restart_shards":[17,20]`, `"restart_shards":[17,17]`, "restart_shards[1]"},
		{"restart below assigned", `"restart_shards":[17,20]`, `"restart_shards":[15]`, "restart_shards[0]"},
		{"restart above assigned", `"restart_shards":[17,20]`, `"restart_shards":[17,24]`, "restart_shards[1]"},
		{"pending outside", `"pending":[22,23]`, `"pending":[22,30]`, "pending[1]"},
		{"pending duplicate", `"pending":[22,23]`, `"pending":[22,22]`, "pending[1]"},
		{"assigned gap", `[16,17,18,19,20,21,22,23]`, `[16,17,18,19,20,21,22,24]`, "assigned[7]"},
		{"assigned short", `"range_count":8`, `"range_count":9`, "assigned"},
		{"range past total", `"total_shards":64`, `"total_shards":20`, "range_count"},
		{"total zero", `"total_shards":64`, `"total_shards":0`, "total_shards"},
		{"lease zero", `"lease_seconds":30`, `"lease_seconds":0`, "lease_seconds"},
		{"resume pending", `"shard_id":16`, `"shard_id":22`, "resume[0].shard_id"},
		{"resume outside", `"shard_id":16`, `"shard_id":2`, "resume[0].shard_id"},
		{"resume url not dial", `"resume_url":"ws://10.0.0.9:9000/resume?v=10&encoding=json"`, `"resume_url":"ws://10.0.0.9:9000/resume"`, "resume[0].resume_url"},
		{"gateway WSS", `"gateway_url":"ws://10.0.0.9:9000/?v=10&encoding=json"`, `"gateway_url":"WSS://gateway.discord.gg/?v=10&encoding=json"`, "gateway_url"},
		{"trailing", `"restart_shards":[17,20]}`, `"restart_shards":[17,20]} {}`, ""},
	}
	for _, c := range bad {
		if !strings.Contains(goodResponse, c.from) {
			t.Fatalf("%s: %q not in the good answer", c.name, c.from)
		}
		_, err := ParseCheckinResponse([]byte(strings.Replace(goodResponse, c.from, c.to, 1)))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%s: got %v, want a *FieldError for %q", c.name, err, c.field)
		}
	}
	// A second resume entry for the same shard.
	dup := strings.Replace(goodResponse, `}],`, `},{"shard_id":16,"session_id":"s","seq":1,"resume_url":"ws://h/?v=10&encoding=json"}],`, 1)
	var fe *FieldError
	if _, err := ParseCheckinResponse([]byte(dup)); !errors.As(err, &fe) || fe.Field != "resume[1].shard_id" {
		t.Errorf("duplicate resume entry: %v", err)
	}
}

// FuzzGatewayDialURL checks that every URL GatewayDialURL returns obeys
// the grammar, fits MaxDialURLLen, carries the Gateway query and maps to
// itself.
func FuzzGatewayDialURL(f *testing.F) {
	for _, s := range []string{"ws://127.0.0.1:9000", "ws://h/resume?x=1", "wss://gateway.discord.gg", "ws://h:0", "ws://a@b/", "ws://h/#f"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, u string) {
		d, err := GatewayDialURL(u)
		if err != nil {
			return
		}
		if len(d) > MaxDialURLLen || !strings.HasSuffix(d, "?"+GatewayQuery) || validateGatewayURL(d, MaxDialURLLen) != nil {
			t.Fatalf("GatewayDialURL(%q) = %q", u, d)
		}
		if again, err := GatewayDialURL(d); err != nil || again != d {
			t.Fatalf("not idempotent: %q -> %q, %v", d, again, err)
		}
		if ValidateGatewayURL(u) == nil && len(u) <= MaxGatewayURLLen-1 && !strings.Contains(u, "?") && strings.Count(u, "/") == 2 {
			if d != u+"/?"+GatewayQuery {
				t.Fatalf("%q -> %q", u, d)
			}
		}
	})
}

// FuzzParseCheckinResponse checks that the strict decoder never panics,
// that every rejection is a *FieldError or ErrBodyTooLarge, and that every
// accepted answer keeps the invariants nodes rely on (restart_shards and
// pending ascending within assigned, resume entries startable) and
// survives a round trip unchanged.
func FuzzParseCheckinResponse(f *testing.F) {
	f.Add([]byte(goodResponse))
	f.Add([]byte(`{"generation":1,"total_shards":4,"assigned":[0,1],"range_start":0,"range_count":2,"pending":[],"lease_seconds":30,"max_concurrency":1,"next_checkin_ms":10000,"restart_shards":[1]}`))
	f.Add([]byte(`{"generation":1,"total_shards":4,"assigned":[0,1],"range_start":0,"range_count":2,"pending":[],"lease_seconds":30,"max_concurrency":1,"restart_shards":[1,1]}`))
	f.Add([]byte(`{"generation":1,"total_shards":4,"assigned":[2,3],"range_start":2,"range_count":2,"pending":[3],"lease_seconds":1,"max_concurrency":2,"restart_shards":[0],"x":1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := ParseCheckinResponse(data)
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) && !errors.Is(err, ErrBodyTooLarge) {
				t.Fatalf("error %T %v is neither *FieldError nor ErrBodyTooLarge", err, err)
			}
			return
		}
		assigned := map[uint32]bool{}
		for _, s := range r.Assigned {
			if s >= r.TotalShards || assigned[s] {
				t.Fatalf("accepted assigned %v with total %d", r.Assigned, r.TotalShards)
			}
			assigned[s] = true
		}
		pending := map[uint32]bool{}
		for i, s := range r.Pending {
			if !assigned[s] || i > 0 && s <= r.Pending[i-1] {
				t.Fatalf("accepted pending %v with assigned %v", r.Pending, r.Assigned)
			}
			pending[s] = true
		}
		for i, s := range r.RestartShards {
			if !assigned[s] || i > 0 && s <= r.RestartShards[i-1] {
				t.Fatalf("accepted restart_shards %v with assigned %v", r.RestartShards, r.Assigned)
			}
		}
		for _, rs := range r.Resume {
			if !assigned[rs.ShardID] || pending[rs.ShardID] || ValidateSessionID(rs.SessionID) != nil {
				t.Fatalf("accepted resume entry %+v", rs)
			}
		}
		again, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := ParseCheckinResponse(again)
		if err != nil {
			t.Fatalf("round trip of %s: %v", again, err)
		}
		if third, _ := json.Marshal(r2); !bytes.Equal(third, again) || !slices.Equal(r.RestartShards, r2.RestartShards) ||
			!slices.Equal(r.Pending, r2.Pending) || !slices.Equal(r.Assigned, r2.Assigned) || len(r.Resume) != len(r2.Resume) {
			t.Fatalf("round trip changed %+v into %+v", r, r2)
		}
	})
}

func TestGrantValidity(t *testing.T) {
	if g := GrantUseWithin(5250 * time.Millisecond); g != 250*time.Millisecond {
		t.Errorf("GrantUseWithin(5.25 s) = %v, want 250 ms", g)
	}
	if g := GrantUseWithin(100 * time.Millisecond); g != 100*time.Millisecond/21 {
		t.Errorf("GrantUseWithin(100 ms) = %v", g)
	}
	if g := GrantUseWithin(time.Millisecond); g != time.Millisecond {
		t.Errorf("GrantUseWithin(1 ms) = %v, want at least 1 ms", g)
	}
	for _, c := range []struct {
		elapsed time.Duration
		ms      uint32
		ok      bool
	}{
		{0, 250, true}, {250 * time.Millisecond, 250, true}, {251 * time.Millisecond, 250, false},
		{240 * time.Millisecond, 0, true}, {260 * time.Millisecond, 0, false}, // 0: the 250 ms default
		{-time.Millisecond, 250, false}, // a clock that ran backwards proves nothing
		{5 * time.Second, 1000, false}, {999 * time.Millisecond, 1000, true},
	} {
		if got := GrantUsable(c.elapsed, c.ms); got != c.ok {
			t.Errorf("GrantUsable(%v, %d) = %v, want %v", c.elapsed, c.ms, got, c.ok)
		}
	}
}
