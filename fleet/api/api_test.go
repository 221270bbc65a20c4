package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/netboot/fleetinv"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// testServer is the API on a real loopback socket over a real SQLite file.
type testServer struct {
	t     *testing.T
	url   string
	admin string
	ctrl  *controller.Controller
	st    *store.Store
}

func newTestServer(t *testing.T, cfg controller.Config) *testServer {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(dir, "dpxe.db"))
	if err != nil {
		t.Fatal(err)
	}
	ctrl, err := controller.New(ctx, st, cfg, time.Now, nil)
	if err != nil {
		t.Fatal(err)
	}
	tokFile := filepath.Join(dir, "admin.token")
	hash, created, err := LoadOrCreateAdminToken(ctx, st, tokFile, false)
	if err != nil || !created {
		t.Fatalf("admin token: %v %v", created, err)
	}
	fi, _ := os.Stat(tokFile)
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file mode %v", fi.Mode())
	}
	if h2, created2, _ := LoadOrCreateAdminToken(ctx, st, tokFile, false); created2 || h2 != hash {
		t.Fatal("second start made a new admin token")
	}
	other := filepath.Join(dir, "rotated.token")
	if h3, created3, _ := LoadOrCreateAdminToken(ctx, st, other, true); !created3 || h3 == hash {
		t.Fatal("rotation kept the old admin token")
	}
	hash, _, _ = LoadOrCreateAdminToken(ctx, st, tokFile, true)
	tok, _ := os.ReadFile(tokFile)
	mux := http.NewServeMux()
	api := New(ctrl, hash, nil)
	api.Register(mux)
	api.RegisterNetboot(mux, fleetinv.New(st.Netboot(), ctrl))
	srv := httptest.NewServer(mux)
	t.Cleanup(func() { srv.Close(); st.Close() })
	return &testServer{t: t, url: srv.URL, admin: strings.TrimSpace(string(tok)), ctrl: ctrl, st: st}
}

// call sends a request and decodes the JSON answer into out (if not nil).
func (s *testServer) call(method, path, token, body string, out any) int {
	s.t.Helper()
	code, data := s.raw(method, path, token, body)
	if out != nil {
		if err := json.Unmarshal([]byte(data), out); err != nil {
			s.t.Fatalf("%s %s: %d %q: %v", method, path, code, data, err)
		}
	}
	return code
}

// raw sends a request and returns the status and the body as sent.
func (s *testServer) raw(method, path, token, body string) (int, string) {
	s.t.Helper()
	req, _ := http.NewRequest(method, s.url+path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (s *testServer) addNode(id string) string {
	s.t.Helper()
	var out AddNodeResponse
	if code := s.call("POST", "/v1/nodes", s.admin, `{"node_id":"`+id+`"}`, &out); code != 201 {
		s.t.Fatalf("add node: %d", code)
	}
	if err := appliance.ValidateCredential(out.Credential); err != nil || out.NodeID != id {
		s.t.Fatalf("add node answer %+v: %v", out, err)
	}
	return out.Credential
}

func TestAPICheckinIdentifyAndErrors(t *testing.T) {
	s := newTestServer(t, controller.Config{TotalShards: 8, RebalanceEvery: -1, IdentifyWindow: time.Millisecond})
	cred := s.addNode("n1")
	var e errorBody
	if code := s.call("POST", "/v1/nodes", s.admin, `{"node_id":"n1"}`, &e); code != 409 || e.Field != "node_id" {
		t.Fatalf("duplicate add: %d %+v", code, e)
	}
	if code := s.call("POST", "/v1/nodes", s.admin, `{"node_id":"a b"}`, &e); code != 400 || e.Field != "node_id" {
		t.Fatalf("bad node ID: %d %+v", code, e)
	}

	var r appliance.CheckinResponse
	if code := s.call("POST", "/v1/checkin", cred, `{"node_id":"n1","capacity":8}`, &r); code != 200 || r.RangeCount != 8 || r.Generation != 1 {
		t.Fatalf("checkin: %d %+v", code, r)
	}
	bad := []struct {
		body, token string
		code        int
		field       string
	}{
		{`{"node_id":"n1","capacity":0}`, cred, 400, "capacity"},
		{`{"node_id":"n1","capacity":8,"bogus":true}`, cred, 400, "bogus"},
		{`{"node_id":"n1","capacity":8,"shards":[{"id":8,"state":"READY"}]}`, cred, 400, "shards[0].id"},
		{`{"node_id":"n1","capacity":8,"shards":[{"id":1,"state":"DANCING"}]}`, cred, 400, "shards[0].state"},
		{`{"node_id":"n1",`, cred, 400, ""},
		{`{"node_id":"n1","capacity":8}`, "", 401, ""},
		{`{"node_id":"n1","capacity":8}`, s.admin, 401, ""},
		{`{"node_id":"ghost","capacity":8}`, cred, 401, ""},
		{`{"node_id":"n1","capacity":8,"shards":[` + strings.Repeat(" ", appliance.MaxCheckinBody) + `]}`, cred, 413, ""},
	}
	for _, c := range bad {
		e = errorBody{}
		code := s.call("POST", "/v1/checkin", c.token, c.body, &e)
		if code != c.code || e.Field != c.field || e.Error == "" {
			t.Errorf("checkin %.60s: %d %+v, want %d field %q", c.body, code, e, c.code, c.field)
		}
	}
	if code := s.call("GET", "/v1/checkin", cred, "", nil); code != 405 {
		t.Errorf("GET checkin: %d", code)
	}

	// Identify: the first claim waits out the window every restart starts with.
	var ir appliance.IdentifyResponse
	deadline := time.Now().Add(5 * time.Second)
	for !ir.Granted && time.Now().Before(deadline) {
		if code := s.call("POST", "/v1/identify", cred, `{"node_id":"n1","shard_id":0}`, &ir); code != 200 {
			t.Fatalf("identify: %d", code)
		}
	}
	if !ir.Granted || ir.Bucket != 0 {
		t.Fatalf("identify never granted: %+v", ir)
	}
	if code := s.call("POST", "/v1/identify", cred, `{"node_id":"n1","shard_id":-1}`, &e); code != 400 || e.Field != "shard_id" {
		t.Fatalf("identify bad shard: %d %+v", code, e)
	}
	if code := s.call("POST", "/v1/identify", "", `{"node_id":"n1","shard_id":1}`, nil); code != 401 {
		t.Fatalf("identify without credential: %d", code)
	}
}

func TestAPIOperatorEndpoints(t *testing.T) {
	s := newTestServer(t, controller.Config{TotalShards: 4, RebalanceEvery: -1})
	cred := s.addNode("n1")
	for _, p := range []string{"/v1/nodes", "/v1/plan", "/v1/events", "/v1/budget", "/v1/route?guild_id=1", "/v1/nodes/n1"} {
		if code := s.call("GET", p, "", "", nil); code != 401 {
			t.Errorf("GET %s without token: %d", p, code)
		}
		if code := s.call("GET", p, cred, "", nil); code != 401 {
			t.Errorf("GET %s with a node credential: %d", p, code)
		}
	}
	st := `{"node_id":"n1","capacity":4,"ready_shards":1,"shards":[{"id":2,"state":"READY","seq_valid":true,"heartbeat_acks":4}]}`
	if code := s.call("POST", "/v1/checkin", cred, st, nil); code != 200 {
		t.Fatalf("checkin %d", code)
	}
	var d controller.NodeDetail
	if code := s.call("GET", "/v1/nodes/n1", s.admin, "", &d); code != 200 || !d.Live || len(d.Shards) != 1 || d.Shards[0].HeartbeatAcks != 4 {
		t.Fatalf("node detail %d %+v", code, d)
	}
	if code := s.call("GET", "/v1/nodes/zz", s.admin, "", nil); code != 404 {
		t.Fatalf("unknown node %d", code)
	}
	var rv controller.RouteView
	// guild (3<<22)|5 lands on shard 3.
	if code := s.call("GET", "/v1/route?guild_id=12582917", s.admin, "", &rv); code != 200 || rv.ShardID != 3 || rv.NodeID != "n1" || rv.Address != "127.0.0.1" {
		t.Fatalf("route %d %+v", code, rv)
	}
	for _, g := range []string{"-1", "18446744073709551616", "12a", "", "+5"} {
		var e errorBody
		if code := s.call("GET", "/v1/route?guild_id="+g, s.admin, "", &e); code != 400 || e.Field != "guild_id" {
			t.Errorf("route %q: %d %+v", g, code, e)
		}
	}
	// Draining the only node leaves its shards with no owner: the preview
	// says so, and the drain is refused (409, with the preview) unless
	// forced.
	var pv controller.DrainPreview
	if code := s.call("GET", "/v1/nodes/n1/drain", s.admin, "", &pv); code != 200 || pv.Strands != 4 || pv.Leaving != 4 ||
		len(pv.Moves) != 1 || pv.Moves[0] != (controller.ShardMove{From: "n1", To: "", Start: 0, Count: 4}) {
		t.Fatalf("drain preview %d %+v", code, pv)
	}
	var refusal DrainRefusal
	if code := s.call("POST", "/v1/nodes/n1/drain", s.admin, "", &refusal); code != 409 || refusal.Preview.Strands != 4 || !strings.Contains(refusal.Error, "4 shards would have no owner") {
		t.Fatalf("unforced drain of the only node: %d %+v", code, refusal)
	}
	if code := s.call("POST", "/v1/nodes/n1/drain?force=maybe", s.admin, "", nil); code != 400 {
		t.Fatalf("force=maybe: %d", code)
	}
	var v DrainResponse
	if code := s.call("POST", "/v1/nodes/n1/drain?force=true", s.admin, "", &v); code != 200 || !v.Draining || v.Preview == nil || v.Preview.Strands != 4 {
		t.Fatalf("forced drain %d %+v", code, v)
	}
	var p controller.PlanView
	if s.call("GET", "/v1/plan", s.admin, "", &p); p.Assigned != 0 || p.Generation != 2 {
		t.Fatalf("plan after draining the only node: %+v", p)
	}
	// The drained node still holds its shards until it acknowledges.
	if code := s.call("GET", "/v1/route?guild_id=12582917", s.admin, "", &rv); code != 200 {
		t.Fatalf("route while draining %d", code)
	}
	if code := s.call("POST", "/v1/checkin", cred, `{"node_id":"n1","capacity":4,"generation":2}`, nil); code != 200 {
		t.Fatal(code)
	}
	if code := s.call("GET", "/v1/route?guild_id=12582917", s.admin, "", &rv); code != 404 || rv.ShardID != 3 {
		t.Fatalf("route after release %d %+v", code, rv)
	}
	v = DrainResponse{}
	if code := s.call("POST", "/v1/nodes/n1/undrain", s.admin, "", &v); code != 200 || v.Draining || v.Preview != nil {
		t.Fatalf("undrain %d %+v", code, v)
	}
	var ev struct{ Events []store.Event }
	if code := s.call("GET", "/v1/events?kind=drain", s.admin, "", &ev); code != 200 || len(ev.Events) != 1 || ev.Events[0].NodeID != "n1" {
		t.Fatalf("events %d %+v", code, ev)
	}
	if code := s.call("GET", "/v1/events?limit=0", s.admin, "", nil); code != 400 {
		t.Fatalf("events limit 0: %d", code)
	}
	var b controller.Budget
	if code := s.call("PUT", "/v1/budget", s.admin, `{"total":1000,"remaining":900,"reset_after":60000}`, &b); code != 200 || b.Remaining != 900 {
		t.Fatalf("set budget %d %+v", code, b)
	}
	if code := s.call("PUT", "/v1/budget", s.admin, `{"total":1000,"remaining":1900,"reset_after":60000}`, nil); code != 400 {
		t.Fatalf("bad budget %d", code)
	}
	if code := s.call("PUT", "/v1/budget", s.admin, `{"total":1000,"extra":1}`, nil); code != 400 {
		t.Fatalf("budget unknown field %d", code)
	}
	var rot AddNodeResponse
	if code := s.call("POST", "/v1/nodes/n1/credential", s.admin, "", &rot); code != 200 || rot.Credential == "" || rot.Credential == cred {
		t.Fatalf("rotate %d %+v", code, rot)
	}
	if code := s.call("POST", "/v1/checkin", cred, `{"node_id":"n1","capacity":4}`, nil); code != 401 {
		t.Fatalf("old credential after rotation: %d", code)
	}
	if code := s.call("POST", "/v1/checkin", rot.Credential, `{"node_id":"n1","capacity":4}`, nil); code != 200 {
		t.Fatalf("new credential: %d", code)
	}
	if code := s.call("POST", "/v1/nodes/zz/credential", s.admin, "", nil); code != 404 {
		t.Fatalf("rotate unknown: %d", code)
	}
	var nodes struct{ Nodes []controller.NodeView }
	if code := s.call("GET", "/v1/nodes", s.admin, "", &nodes); code != 200 || len(nodes.Nodes) != 1 {
		t.Fatalf("nodes %d %+v", code, nodes)
	}
}

func TestNoCredentialInLogs(t *testing.T) {
	var logs bytes.Buffer
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "d.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	log := slogTo(&logs)
	ctrl, _ := controller.New(ctx, st, controller.Config{}, time.Now, log)
	cred, _ := ctrl.AddNode(ctx, "n1")
	mux := http.NewServeMux()
	New(ctrl, HashToken("admintoken"), log).Register(mux)
	for _, tok := range []string{cred, cred + "x", "admintoken"} {
		req := httptest.NewRequest("POST", "/v1/checkin", strings.NewReader(`{"node_id":"n1","capacity":1}`))
		req.Header.Set("Authorization", "Bearer "+tok)
		mux.ServeHTTP(httptest.NewRecorder(), req)
		req = httptest.NewRequest("GET", "/v1/nodes", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		mux.ServeHTTP(httptest.NewRecorder(), req)
	}
	if strings.Contains(logs.String(), cred) || strings.Contains(logs.String(), "admintoken") {
		t.Fatalf("a secret reached the log:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "refused") {
		t.Fatalf("refusals were not logged:\n%s", logs.String())
	}
}
