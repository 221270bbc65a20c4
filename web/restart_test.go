package web

import (
	"context"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"testing"

	"github.com/discord-pxe/dpxe/appliance"
)

// TestRestartFatalForm drives "Restart FATAL shards…" as a browser with
// JavaScript off would: the control shows only on a node with a FATAL
// shard, leads to a confirmation, and only the confirmation's POST with
// the session's CSRF token records the request; the card says so until
// the node takes the request up.
func TestRestartFatalForm(t *testing.T) {
	f := seeded(t, nil)
	f.addNodes(8, "node-z") // never checks in
	c := f.client()
	csrf := f.login(c, testToken)
	ctx := context.Background()
	f.mu.Lock()
	f.state["1"] = appliance.ShardFatal
	f.mu.Unlock()
	f.checkin("node-a")

	_, page := get(t, c, f.srv.URL+"/nodes/node-a")
	if !strings.Contains(page, `id="restart-fatal"`) || !strings.Contains(page, "Restart FATAL shards…") || strings.Contains(page, "restart requested") {
		t.Fatalf("node-a's page with FATAL shard 1 lacks the control, or shows a request:\n%s", page)
	}
	if _, page := get(t, c, f.srv.URL+"/nodes/node-b"); strings.Contains(page, `id="restart-fatal"`) {
		t.Fatal("node-b has no FATAL shard but offers the restart")
	}
	// Live updates carry the control too (the page's actions are a part).
	r, err := f.web.renderTopic(ctx, "node\x00node-a")
	if err != nil || !strings.Contains(string(r.coarse["node-actions"]), `id=\"restart-fatal\"`) {
		t.Fatalf("live node-actions part: %v %s", err, r.coarse["node-actions"])
	}

	code, confirm := get(t, c, f.srv.URL+"/nodes/node-a/restart-fatal")
	if code != 200 || !strings.Contains(confirm, `<strong>#1</strong>`) || !strings.Contains(confirm, `id="confirm"`) ||
		!strings.Contains(confirm, `action="/nodes/node-a/restart-fatal"`) || !strings.Contains(confirm, "Restart 1 FATAL shard<") {
		t.Fatalf("confirmation: %d\n%s", code, confirm)
	}
	// Forged POSTs are refused and record nothing.
	for _, form := range []url.Values{{}, {"csrf": {"forged"}}} {
		if code, _, _ := post(t, c, f.srv.URL+"/nodes/node-a/restart-fatal", form); code != http.StatusForbidden {
			t.Errorf("POST with csrf %q: %d, want 403", form.Get("csrf"), code)
		}
	}
	req, _ := http.NewRequest("POST", f.srv.URL+"/nodes/node-a/restart-fatal", strings.NewReader(url.Values{"csrf": {csrf}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "http://evil.example")
	if resp, err := c.Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("cross-origin POST: %v %v", resp, err)
	}
	if d, _ := f.ctrl.Node(ctx, "node-a"); d.RestartShards != nil {
		t.Fatalf("a refused POST recorded %v", d.RestartShards)
	}

	code, loc, _ := post(t, c, f.srv.URL+"/nodes/node-a/restart-fatal", url.Values{"csrf": {csrf}})
	if code != http.StatusSeeOther || loc != "/nodes/node-a?done="+url.QueryEscape("restart:node-a:1") {
		t.Fatalf("restart POST: %d %q", code, loc)
	}
	if d, _ := f.ctrl.Node(ctx, "node-a"); !reflect.DeepEqual(d.RestartShards, []uint32{1}) {
		t.Fatalf("requests after the POST: %v", d.RestartShards)
	}
	_, page = get(t, c, f.srv.URL+loc)
	if !strings.Contains(page, "Node node-a is asked to start shard 1 again") || strings.Count(page, "restart requested") != 1 {
		t.Fatalf("node page after the POST lacks the confirmation or the card's note:\n%s", page)
	}
	if _, confirm = get(t, c, f.srv.URL+"/nodes/node-a/restart-fatal"); !strings.Contains(confirm, "A restart of 1 shard of these is already requested") {
		t.Fatalf("second confirmation does not say the restart is pending:\n%s", confirm)
	}

	// The node takes the request up (the test fleet acts as the kernel):
	// the note and the control go, and the audit log has both events.
	f.checkin("node-a")
	f.checkin("node-a")
	if d, _ := f.ctrl.Node(ctx, "node-a"); d.RestartShards != nil {
		t.Fatalf("requests after the node reported shard 1 READY: %v", d.RestartShards)
	}
	_, page = get(t, c, f.srv.URL+"/nodes/node-a")
	if strings.Contains(page, "restart requested") || strings.Contains(page, `id="restart-fatal"`) {
		t.Fatal("node page still shows the request or the control after the restart")
	}
	if err := f.ctrl.Flush(ctx); err != nil { // the events page reads the store as written
		t.Fatal(err)
	}
	for _, kind := range []string{"restart_requested", "shard_restarted"} {
		if _, ev := get(t, c, f.srv.URL+"/events?node=node-a&kind="+kind); strings.Contains(ev, "Unknown event kind") || !strings.Contains(ev, `class="kind k-`+kind+`">`+kind+`</span></td><td><a href="/nodes/node-a">node-a</a></td><td>1</td>`) {
			t.Errorf("events page for %s:\n%s", kind, ev[strings.Index(ev, "<table"):])
		}
	}

	// Nothing FATAL: nothing to confirm, and a POST says so.
	if _, confirm = get(t, c, f.srv.URL+"/nodes/node-b/restart-fatal"); strings.Contains(confirm, `id="confirm"`) || !strings.Contains(confirm, "nothing to restart") {
		t.Fatalf("confirmation for node-b:\n%s", confirm)
	}
	code, loc, _ = post(t, c, f.srv.URL+"/nodes/node-b/restart-fatal", url.Values{"csrf": {csrf}})
	if _, page = get(t, c, f.srv.URL+loc); code != http.StatusSeeOther || !strings.Contains(page, "Node node-b has no FATAL shard to restart.") {
		t.Fatalf("POST for node-b: %d %q", code, loc)
	}
	// A node that is not live, and one that does not exist.
	if _, confirm = get(t, c, f.srv.URL+"/nodes/node-z/restart-fatal"); strings.Contains(confirm, `id="confirm"`) || !strings.Contains(confirm, "is not live") {
		t.Fatalf("confirmation for node-z:\n%s", confirm)
	}
	if code, _, body := post(t, c, f.srv.URL+"/nodes/node-z/restart-fatal", url.Values{"csrf": {csrf}}); code != http.StatusConflict || !strings.Contains(body, "is not live") {
		t.Fatalf("POST for node-z: %d\n%s", code, body)
	}
	if code, _, body := post(t, c, f.srv.URL+"/nodes/nope/restart-fatal", url.Values{"csrf": {csrf}}); code != http.StatusNotFound || !strings.Contains(body, "No such node") {
		t.Fatalf("POST for an unknown node: %d\n%s", code, body)
	}
}
