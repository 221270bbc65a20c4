package api

import (
	"reflect"
	"strings"
	"testing"

	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/store"
)

func TestAPIRestartFatal(t *testing.T) {
	s := newTestServer(t, controller.Config{TotalShards: 4, RebalanceEvery: -1})
	cred := s.addNode("n1")
	s.addNode("idle")
	const path = "/v1/nodes/n1/restart-fatal"
	for _, tok := range []string{"", cred, "wrong"} {
		if code, body := s.raw("POST", path, tok, ""); code != 401 || !strings.Contains(body, ErrUnauthorized.Error()) {
			t.Errorf("token %q: %d %s", tok, code, body)
		}
	}
	if code, body := s.raw("POST", "/v1/nodes/ghost/restart-fatal", s.admin, ""); code != 404 || !strings.Contains(body, `"error":"node ghost: unknown node"`) {
		t.Errorf("unknown node: %d %s", code, body)
	}
	if code, body := s.raw("POST", "/v1/nodes/idle/restart-fatal", s.admin, ""); code != 409 ||
		body != `{"error":"node idle: node is not live (no valid lease): it runs no shard to restart"}`+"\n" {
		t.Errorf("node that is not live: %d %s", code, body)
	}
	if code, _ := s.raw("GET", path, s.admin, ""); code != 405 {
		t.Errorf("GET: %d", code)
	}

	_, r, _ := strictCheckin(t, s.url, cred, `{"node_id":"n1","capacity":4}`)
	gen := jsonUint(r.Generation)
	fatal := `{"node_id":"n1","capacity":4,"generation":` + gen + `,"ready_shards":3,"fatal_shards":1,"shards":[
	 {"id":0,"state":"READY"},{"id":1,"state":"READY"},{"id":2,"state":"READY"},
	 {"id":3,"state":"FATAL","close_code":4004,"last_error":"gateway: close 4004"}]}`
	if code, r, raw := strictCheckin(t, s.url, cred, fatal); code != 200 || r.RestartShards != nil || strings.Contains(raw, "restart_shards") {
		t.Fatalf("check-in before any request: %d %s", code, raw)
	}

	// Bad bodies: 400 naming the field, nothing recorded.
	for body, field := range map[string]string{
		`{"shards":[3],"x":1}`: `"field":"x"`,
		`{"shards":"3"}`:       `"field":"shards"`,
		`{"shards":[-3]}`:      `"field":"shards"`,
		`{"shards":[3]`:        `"error":"request: truncated JSON"`,
		`[3]`:                  `"error":"request: body is not a JSON object"`,
		`{"shards":[]}`:        `"field":"shards"`,
		`{"shards":[3,3]}`:     `"field":"shards[1]"`,
		`{"shards":[3,4]}`:     `"field":"shards[1]"`,
	} {
		if code, got := s.raw("POST", path, s.admin, body); code != 400 || !strings.Contains(got, field) {
			t.Errorf("body %s: %d %s, want 400 with %s", body, code, got, field)
		}
	}
	// A shard that is not FATAL there: 409 naming it.
	if code, got := s.raw("POST", path, s.admin, `{"shards":[3,1]}`); code != 409 ||
		got != `{"error":"shard 1 is not FATAL on node n1: it is READY","field":"shards[1]"}`+"\n" {
		t.Errorf("READY shard: %d %s", code, got)
	}
	var d controller.NodeDetail
	if s.call("GET", "/v1/nodes/n1", s.admin, "", &d); d.RestartShards != nil {
		t.Fatalf("refused requests recorded: %v", d.RestartShards)
	}

	// Every FATAL shard, then the same one by name: one request.
	for _, body := range []string{"", " \n", `{}`, `{"shards":null}`, `{"shards":[3]}`} {
		if code, got := s.raw("POST", path, s.admin, body); code != 200 || got != `{"node_id":"n1","restart_shards":[3]}`+"\n" {
			t.Errorf("body %q: %d %s", body, code, got)
		}
	}
	if s.call("GET", "/v1/nodes/n1", s.admin, "", &d); !reflect.DeepEqual(d.RestartShards, []uint32{3}) {
		t.Fatalf("node detail restart_shards %v", d.RestartShards)
	}
	var ev struct{ Events []store.Event }
	if s.call("GET", "/v1/events?kind=restart_requested", s.admin, "", &ev); len(ev.Events) != 1 ||
		ev.Events[0].NodeID != "n1" || ev.Events[0].ShardID == nil || *ev.Events[0].ShardID != 3 {
		t.Fatalf("restart_requested events: %+v", ev.Events)
	}

	// The node's answers carry it while 3 stays FATAL, in the strict wire form.
	for i := 0; i < 2; i++ {
		code, r, raw := strictCheckin(t, s.url, cred, fatal)
		if code != 200 || !reflect.DeepEqual(r.RestartShards, []uint32{3}) || !strings.HasSuffix(raw, `,"restart_shards":[3]}`+"\n") {
			t.Fatalf("check-in %d while 3 is FATAL: %d %s", i, code, raw)
		}
	}
	starting := strings.Replace(fatal, `"state":"FATAL"`, `"state":"STARTING"`, 1)
	starting = strings.Replace(starting, `"fatal_shards":1`, `"starting_shards":1`, 1)
	if code, r, raw := strictCheckin(t, s.url, cred, starting); code != 200 || r.RestartShards != nil {
		t.Fatalf("check-in reporting 3 STARTING: %d %s", code, raw)
	}
	if s.call("GET", "/v1/events?kind=shard_restarted", s.admin, "", &ev); len(ev.Events) != 1 || *ev.Events[0].ShardID != 3 {
		t.Fatalf("shard_restarted events: %+v", ev.Events)
	}
	// Nothing FATAL is not an error.
	if code, got := s.raw("POST", path, s.admin, ""); code != 200 || got != `{"node_id":"n1","restart_shards":[]}`+"\n" {
		t.Errorf("nothing FATAL: %d %s", code, got)
	}
}
