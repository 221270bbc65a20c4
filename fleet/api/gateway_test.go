package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// syncBuffer is a bytes.Buffer safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// strictCheckin posts a check-in and decodes the answer the way a strict
// client does: unknown fields are errors, and the answer must keep the
// invariants nodes rely on (appliance.CheckinResponse.Validate). It
// returns the raw body too.
func strictCheckin(t *testing.T, url, cred, body string) (int, appliance.CheckinResponse, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/v1/checkin", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+cred)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out appliance.CheckinResponse
	if resp.StatusCode == 200 {
		if out, err = appliance.ParseCheckinResponse(raw); err != nil {
			t.Fatalf("strict decode of %s: %v", raw, err)
		}
	}
	return resp.StatusCode, out, string(raw)
}

func TestAPIGatewaySettingsAndResumeHandoff(t *testing.T) {
	const tok = "MTA5.gateway-bot.TOKEN_secret-1"
	var logs syncBuffer
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "d.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	log := slogTo(&logs)
	ctrl, err := controller.New(ctx, st, controller.Config{TotalShards: 4, RebalanceEvery: -1}, time.Now, log)
	if err != nil {
		t.Fatal(err)
	}
	if err := ctrl.SetGateway(controller.GatewaySettings{URL: "ws://127.0.0.1:9000", Token: tok, Intents: 513}); err != nil {
		t.Fatal(err)
	}
	credA, _ := ctrl.AddNode(ctx, "a")
	credB, _ := ctrl.AddNode(ctx, "b")
	mux := http.NewServeMux()
	New(ctrl, HashToken("admintoken"), log).Register(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()

	code, ra, raw := strictCheckin(t, srv.URL, credA, `{"node_id":"a","capacity":4}`)
	if code != 200 || ra.GatewayURL != "ws://127.0.0.1:9000/?v=10&encoding=json" || ra.BotToken != tok || ra.Intents != 513 || len(ra.Resume) != 0 {
		t.Fatalf("a: %d %s", code, raw)
	}
	// Flat and escape-free for the kernel's JSON reader.
	if !strings.Contains(raw, `"gateway_url":"ws://127.0.0.1:9000/?v=10&encoding=json"`) || strings.Contains(raw, `\u`) {
		t.Fatalf("escaped answer: %s", raw)
	}
	if err := ctrl.SetDraining(ctx, "a", true); err != nil {
		t.Fatal(err)
	}
	_, rb, _ := strictCheckin(t, srv.URL, credB, `{"node_id":"b","capacity":4}`)
	if len(rb.Pending) != 4 || len(rb.Resume) != 0 {
		t.Fatalf("b before the release: %+v", rb)
	}
	gen := rb.Generation

	// Session fields are validated like every other field.
	for body, field := range map[string]string{
		`{"node_id":"a","capacity":4,"shards":[{"id":0,"state":"ASSIGNED","session_id":"x y","resume_url":"ws://h/"}]}`:        "shards[0].session_id",
		`{"node_id":"a","capacity":4,"shards":[{"id":0,"state":"ASSIGNED","session_id":"x","resume_url":"WSS://h/"}]}`:         "shards[0].resume_url",
		`{"node_id":"a","capacity":4,"shards":[{"id":0,"state":"ASSIGNED","session_id":"x"}]}`:                                 "shards[0].resume_url",
		`{"node_id":"a","capacity":4,"shards":[{"id":0,"state":"ASSIGNED","session_id":"x","resume_url":"ws://h/","sess":1}]}`: "sess",
	} {
		var e errorBody
		req, _ := http.NewRequest("POST", srv.URL+"/v1/checkin", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+credA)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != 400 || e.Field != field {
			t.Errorf("%s: %d %+v, want 400 naming %s", body, resp.StatusCode, e, field)
		}
	}

	// a's release check-in: it applied gen (nothing assigned), closed its
	// four shards with 4200 and reports them. The statuses are for shards
	// it no longer owns; they are accepted.
	rel := `{"node_id":"a","capacity":4,"generation":` + jsonUint(gen) + `,"shards":[
	 {"id":0,"state":"ASSIGNED","seq_valid":true,"close_code":4200,"session_id":"0f3c9a8b7e6d5c4b3a29181716151413","seq":41,"resume_url":"ws://127.0.0.1:9000/resume"},
	 {"id":1,"state":"ASSIGNED","seq_valid":true,"close_code":4200,"session_id":"s-1","seq":7,"resume_url":"ws://127.0.0.1:9000/resume?v=10&encoding=json"},
	 {"id":2,"state":"ASSIGNED","seq_valid":false,"close_code":4200,"session_id":"s-2","resume_url":"ws://127.0.0.1:9000/resume"},
	 {"id":3,"state":"FATAL","close_code":4004}]}`
	code, ra, raw = strictCheckin(t, srv.URL, credA, rel)
	if code != 200 || len(ra.Assigned) != 0 || len(ra.Resume) != 0 {
		t.Fatalf("a's release: %d %s", code, raw)
	}
	_, rb, raw = strictCheckin(t, srv.URL, credB, `{"node_id":"b","capacity":4,"generation":`+jsonUint(gen)+`}`)
	want := []appliance.ResumeState{
		{ShardID: 0, SessionID: "0f3c9a8b7e6d5c4b3a29181716151413", Seq: 41, ResumeURL: "ws://127.0.0.1:9000/resume?v=10&encoding=json"},
		{ShardID: 1, SessionID: "s-1", Seq: 7, ResumeURL: "ws://127.0.0.1:9000/resume?v=10&encoding=json"},
	}
	if len(rb.Pending) != 0 || !reflect.DeepEqual(rb.Resume, want) {
		t.Fatalf("b after the release: %s", raw)
	}
	if !strings.Contains(raw, `"resume":[{"shard_id":0,"session_id":"0f3c9a8b7e6d5c4b3a29181716151413","seq":41,"resume_url":"ws://127.0.0.1:9000/resume?v=10&encoding=json"},`) {
		t.Fatalf("resume shape: %s", raw)
	}
	// b resumed shard 0 (READY) and is resuming shard 1: only 1 is left.
	_, rb, _ = strictCheckin(t, srv.URL, credB, `{"node_id":"b","capacity":4,"generation":`+jsonUint(gen)+`,"ready_shards":1,"starting_shards":1,"shards":[
	 {"id":0,"state":"READY","seq_valid":true,"session_id":"0f3c9a8b7e6d5c4b3a29181716151413","seq":45,"resume_url":"ws://127.0.0.1:9000/resume"},
	 {"id":1,"state":"STARTING","seq_valid":true,"session_id":"s-1","seq":7,"resume_url":"ws://127.0.0.1:9000/resume"}]}`)
	if len(rb.Resume) != 1 || rb.Resume[0].ShardID != 1 {
		t.Fatalf("b's hand-offs after progress: %+v", rb.Resume)
	}

	// The operator's view: where things come from, never the token.
	req, _ := http.NewRequest("GET", srv.URL+"/v1/gateway", nil)
	req.Header.Set("Authorization", "Bearer admintoken")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var gv controller.GatewayView
	if err := json.Unmarshal(body, &gv); err != nil || resp.StatusCode != 200 || !gv.TokenSet || gv.URLSource != "operator" || gv.Handoffs != 1 || gv.Intents != 513 {
		t.Fatalf("GET /v1/gateway: %d %s", resp.StatusCode, body)
	}
	if strings.Contains(string(body), tok) {
		t.Fatalf("token in GET /v1/gateway: %s", body)
	}
	req, _ = http.NewRequest("GET", srv.URL+"/v1/gateway", nil)
	req.Header.Set("Authorization", "Bearer "+credA)
	if resp, err = http.DefaultClient.Do(req); err != nil || resp.StatusCode != 401 {
		t.Fatalf("node credential on /v1/gateway: %v %v", resp.StatusCode, err)
	}
	resp.Body.Close()

	if err := ctrl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), tok) || strings.Contains(logs.String(), "TOKEN_secret") {
		t.Fatalf("the bot token reached the log:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "resume hand-off recorded") {
		t.Fatalf("hand-offs not logged:\n%s", logs.String())
	}
}

func jsonUint(v uint64) string {
	b, _ := json.Marshal(v)
	return string(b)
}
