package appliance

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
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
	 {"id":131071,"state":"FATAL","close_code":4014}]}`
	got, err = ParseCheckinRequest([]byte(full))
	if err != nil {
		t.Fatalf("full example: %v", err)
	}
	if got.Generation != 7 || len(got.Shards) != 2 || got.Shards[0].LastError != "tls: alert 40" || got.Shards[1].State != ShardFatal {
		t.Fatalf("full example decoded as %+v", got)
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
		{"sum over capacity", `{"node_id":"a","capacity":2,"ready_shards":2,"backoff_shards":1}`, "ready_shards"},
		{"negative generation", `{"node_id":"a","capacity":1,"generation":-1}`, "generation"},
		{"shard state", `{"node_id":"a","capacity":1,"shards":[{"id":1,"state":"RUNNING"}]}`, "shards[0].state"},
		{"shard id range", `{"node_id":"a","capacity":1,"shards":[{"id":131072,"state":"READY"}]}`, "shards[0].id"},
		{"shard dup", `{"node_id":"a","capacity":2,"shards":[{"id":1,"state":"READY"},{"id":1,"state":"READY"}]}`, "shards[1].id"},
		{"shard unknown", `{"node_id":"a","capacity":1,"shards":[{"id":1,"state":"READY","x":1}]}`, "x"},
		{"close code", `{"node_id":"a","capacity":1,"shards":[{"id":1,"state":"READY","close_code":999}]}`, "shards[0].close_code"},
		{"last error ctl", `{"node_id":"a","capacity":1,"shards":[{"id":1,"state":"READY","last_error":"a\nb"}]}`, "shards[0].last_error"},
		{"last error long", `{"node_id":"a","capacity":1,"shards":[{"id":1,"state":"READY","last_error":"` + strings.Repeat("e", 201) + `"}]}`, "shards[0].last_error"},
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

	tooMany := CheckinRequest{NodeID: "a", Capacity: 128}
	for i := 0; i < 129; i++ {
		tooMany.Shards = append(tooMany.Shards, ShardStatus{ID: uint32(i), State: ShardReady})
	}
	body, _ := json.Marshal(tooMany)
	if _, err := ParseCheckinRequest(body); err == nil || !strings.HasPrefix(err.Error(), "shards:") {
		t.Errorf("129 shard entries: %v", err)
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
	})
}
