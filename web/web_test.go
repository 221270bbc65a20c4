package web

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
)

// seeded returns a fleet of three live nodes sharing 64 shards.
func seeded(t *testing.T, nb Netboot) *testFleet {
	t.Helper()
	f := newTestFleet(t, fleetOpts{total: 64, maxConc: 4, liveEvery: 50 * time.Millisecond, netboot: nb})
	f.addNodes(32, "node-a", "node-b", "node-c")
	f.settle("node-a", "node-b", "node-c")
	return f
}

func TestLoginRequired(t *testing.T) {
	f := newTestFleet(t, fleetOpts{total: 16, maxConc: 1})
	c := f.client()
	for _, tc := range []struct {
		method, path string
		status       int
		location     string
	}{
		{"GET", "/", http.StatusSeeOther, "/login?next=%2F"},
		{"GET", "/nodes?sort=id", http.StatusSeeOther, "/login?next=%2Fnodes%3Fsort%3Did"},
		{"GET", "/live?topic=fleet", http.StatusUnauthorized, ""},
		{"POST", "/nodes/x/drain", http.StatusUnauthorized, ""},
		{"GET", "/nodes/x/restart-fatal", http.StatusSeeOther, "/login?next=%2Fnodes%2Fx%2Frestart-fatal"},
		{"POST", "/nodes/x/restart-fatal", http.StatusUnauthorized, ""},
	} {
		req, _ := http.NewRequest(tc.method, f.srv.URL+tc.path, nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.status || resp.Header.Get("Location") != tc.location {
			t.Errorf("%s %s: %d %q, want %d %q", tc.method, tc.path, resp.StatusCode, resp.Header.Get("Location"), tc.status, tc.location)
		}
	}
	// The API keeps its own bearer-token authentication.
	if code, _ := get(t, c, f.srv.URL+"/v1/plan"); code != http.StatusUnauthorized {
		t.Errorf("GET /v1/plan without token: %d", code)
	}
}

func TestLoginSecrets(t *testing.T) {
	f := newTestFleet(t, fleetOpts{total: 16, maxConc: 1})
	// Wrong secret: a readable error, no session.
	c := f.client()
	_, page := get(t, c, f.srv.URL+"/login")
	code, _, body := post(t, c, f.srv.URL+"/login", url.Values{"csrf": {csrfOf(t, page)}, "secret": {"nope"}})
	if code != http.StatusUnauthorized || !strings.Contains(body, "neither the admin token nor the dashboard password") {
		t.Fatalf("wrong secret: %d\n%.300s", code, body)
	}
	// The admin token logs in; cookies are HttpOnly and SameSite=Strict.
	c = f.client()
	_, page = get(t, c, f.srv.URL+"/login")
	resp, err := c.PostForm(f.srv.URL+"/login", url.Values{"csrf": {csrfOf(t, page)}, "secret": {testToken}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var session *http.Cookie
	for _, ck := range resp.Cookies() {
		if ck.Name == sessionCookie {
			session = ck
		}
	}
	if session == nil || !session.HttpOnly || session.SameSite != http.SameSiteStrictMode || session.Secure {
		t.Fatalf("session cookie %+v: want HttpOnly, SameSite=Strict, not Secure over plain HTTP", session)
	}
	// A password set with `dpxe admin passwd` logs in too.
	if err := SetPassword(context.Background(), f.store, "correct horse battery"); err != nil {
		t.Fatal(err)
	}
	f.login(f.client(), "correct horse battery")
	if err := ClearPassword(context.Background(), f.store); err != nil {
		t.Fatal(err)
	}
	c = f.client()
	_, page = get(t, c, f.srv.URL+"/login")
	if code, _, _ := post(t, c, f.srv.URL+"/login", url.Values{"csrf": {csrfOf(t, page)}, "secret": {"correct horse battery"}}); code != http.StatusUnauthorized {
		t.Fatalf("cleared password still logs in: %d", code)
	}
	// The login form itself needs its CSRF cookie.
	if code, _, _ := post(t, f.client(), f.srv.URL+"/login", url.Values{"csrf": {"x"}, "secret": {testToken}}); code != http.StatusForbidden {
		t.Fatalf("login without the form's cookie: %d, want 403", code)
	}
}

func TestSecureCookieOverTLS(t *testing.T) {
	r := httptest.NewRequest("GET", "https://dpxe.test/", nil)
	r.TLS = &tls.ConnectionState{}
	w := httptest.NewRecorder()
	setCookie(w, r, sessionCookie, "v", time.Hour)
	if h := w.Header().Get("Set-Cookie"); !strings.Contains(h, "Secure") || !strings.Contains(h, "HttpOnly") || !strings.Contains(h, "SameSite=Strict") {
		t.Fatalf("Set-Cookie over TLS: %q", h)
	}
}

// TestPagesWithoutJavaScript drives every page as a browser with
// JavaScript off would: plain GETs and form POSTs.
func TestPagesWithoutJavaScript(t *testing.T) {
	f := seeded(t, nil)
	c := f.client()
	csrf := f.login(c, testToken)
	gid := uint64(175928847299117063) // (gid>>22) % 64
	want := appliance.ShardForGuild(gid, 64)
	route, err := f.ctrl.Route(gid)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path   string
		status int
		has    []string
	}{
		{"/", 200, []string{`id="shardmap"`, "node-a", "node-b", "node-c", "Plan generation", "Session-start budget", "Identify activity"}},
		{"/nodes", 200, []string{"<table", `aria-sort="ascending"`, `href="/nodes/node-b"`, `class="countdown"`}},
		{"/nodes?sort=pending&dir=desc", 200, []string{`aria-sort="descending"`}},
		{"/nodes/node-a", 200, []string{"Node node-a", `id="drain"`, "Netboot is not enabled", "node_first_seen", `class="shard s-r"`}},
		{"/guild?guild_id=" + url.QueryEscape("175928847299117063"), 200, []string{`id="route-shard">` + itoaU(want), route.NodeID}},
		{"/guild?guild_id=12ab", 400, []string{"not an unsigned decimal number"}},
		{"/events?node=node-b", 200, []string{"node_first_seen", `<option value="node-b" selected>`}},
		{"/events?kind=nonsense", 200, []string{"Unknown event kind"}},
		{"/discovered", 200, []string{"Netboot is not enabled"}},
		{"/nodes/nope", 404, []string{"No such node"}},
	} {
		code, body := get(t, c, f.srv.URL+tc.path)
		if code != tc.status {
			t.Errorf("GET %s: %d, want %d", tc.path, code, tc.status)
		}
		for _, h := range tc.has {
			if !strings.Contains(body, h) {
				t.Errorf("GET %s: missing %q", tc.path, h)
			}
		}
	}

	// Drain: a confirmation that says what moves from where to where (the
	// controller's preview), then the POST.
	_, body := get(t, c, f.srv.URL+"/nodes/node-b/drain")
	if !strings.Contains(body, `id="drain-moves"`) || !strings.Contains(body, "<td>node-b</td>") ||
		!strings.Contains(body, "<strong>node-a</strong>") || !strings.Contains(body, "<strong>node-c</strong>") ||
		strings.Contains(body, `id="strand"`) || strings.Contains(body, "Identify again") {
		t.Fatalf("drain confirmation does not say where shards go:\n%s", body)
	}
	code, loc, _ := post(t, c, f.srv.URL+"/nodes/node-b/drain", url.Values{"csrf": {csrf}})
	if code != http.StatusSeeOther || !strings.HasPrefix(loc, "/nodes/node-b?done=") {
		t.Fatalf("drain POST: %d %q", code, loc)
	}
	if d, _ := f.ctrl.Node(context.Background(), "node-b"); !d.Draining {
		t.Fatal("node-b not draining after the form POST")
	}
	_, body = get(t, c, f.srv.URL+loc)
	if !strings.Contains(body, "is draining") || !strings.Contains(body, `id="undrain"`) {
		t.Fatalf("node page after drain lacks the confirmation or the Undrain button")
	}
	// With node-b draining, node-c alone (capacity 32) cannot hold 64
	// shards: draining node-a too says how many would have no owner, needs
	// the explicit box, and without it changes nothing.
	_, body = get(t, c, f.srv.URL+"/nodes/node-a/drain")
	if !strings.Contains(body, `id="drain-strands"`) || !strings.Contains(body, "32 shards would have no owner") ||
		!strings.Contains(body, `name="strand"`) || !strings.Contains(body, "<strong>no owner</strong>") {
		t.Fatalf("stranding drain confirmation does not warn:\n%s", body)
	}
	code, _, body = post(t, c, f.srv.URL+"/nodes/node-a/drain", url.Values{"csrf": {csrf}})
	if d, _ := f.ctrl.Node(context.Background(), "node-a"); code != http.StatusConflict || d.Draining || !strings.Contains(body, `id="drain-refused"`) {
		t.Fatalf("stranding drain without the box: %d, draining %v\n%s", code, d.Draining, body)
	}
	code, _, _ = post(t, c, f.srv.URL+"/nodes/node-a/drain", url.Values{"csrf": {csrf}, "strand": {"yes"}})
	if d, _ := f.ctrl.Node(context.Background(), "node-a"); code != http.StatusSeeOther || !d.Draining {
		t.Fatalf("stranding drain with the box: %d, draining %v", code, d.Draining)
	}
	post(t, c, f.srv.URL+"/nodes/node-a/undrain", url.Values{"csrf": {csrf}})
	code, _, _ = post(t, c, f.srv.URL+"/nodes/node-b/undrain", url.Values{"csrf": {csrf}})
	if d, _ := f.ctrl.Node(context.Background(), "node-b"); code != http.StatusSeeOther || d.Draining {
		t.Fatalf("undrain POST: %d, draining %v", code, d.Draining)
	}
}

func itoaU(v uint32) string { return strconv.FormatUint(uint64(v), 10) }

func TestCSRFRejectsForgedPosts(t *testing.T) {
	f := seeded(t, nil)
	c := f.client()
	csrf := f.login(c, testToken)
	for _, tc := range []struct {
		name   string
		form   url.Values
		origin string
	}{
		{"no token", url.Values{}, ""},
		{"wrong token", url.Values{"csrf": {"forged"}}, ""},
		{"other site", url.Values{"csrf": {csrf}}, "http://evil.example"},
	} {
		req, _ := http.NewRequest("POST", f.srv.URL+"/nodes/node-a/drain", strings.NewReader(tc.form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if tc.origin != "" {
			req.Header.Set("Origin", tc.origin)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s: %d, want 403", tc.name, resp.StatusCode)
		}
		if d, _ := f.ctrl.Node(context.Background(), "node-a"); d.Draining {
			t.Fatalf("%s: node-a was drained by a forged POST", tc.name)
		}
	}
}

// readEvent reads the next "update" event of an SSE stream.
func readEvent(t *testing.T, sc *bufio.Scanner) map[string]string {
	t.Helper()
	var data string
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "data: ") {
			data = line[len("data: "):]
		}
		if line == "" && data != "" {
			var msg struct {
				Now   int64             `json:"now"`
				Parts map[string]string `json:"parts"`
			}
			if err := json.Unmarshal([]byte(data), &msg); err != nil {
				t.Fatalf("event data: %v", err)
			}
			if msg.Now == 0 {
				t.Fatal("event without the server's clock")
			}
			return msg.Parts
		}
	}
	t.Fatalf("stream ended: %v", sc.Err())
	return nil
}

func TestLiveUpdates(t *testing.T) {
	f := seeded(t, nil)
	c := f.client()
	f.login(c, testToken)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", f.srv.URL+"/live?topic=fleet", nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 8<<20)
	parts := readEvent(t, sc)
	for _, id := range []string{"totals", "budget", "identify", "shardmap"} {
		if !strings.Contains(parts[id], `id="`+id+`"`) {
			t.Fatalf("first event lacks part %s: %v", id, keys(parts))
		}
	}
	// A shard of node-a goes FATAL: the next event carries the new map.
	f.mu.Lock()
	f.state["0"] = appliance.ShardFatal
	f.mu.Unlock()
	f.checkin("node-a")
	for i := 0; i < 50; i++ {
		parts = readEvent(t, sc)
		// Only node-a's group (shards 0..) and the map head change; the
		// layout holds, so the whole map is not re-sent.
		if g, ok := parts["g0"]; ok && strings.Contains(g, `<i class=s-f>F</i>`) {
			if _, ok := parts["shardmap"]; ok {
				t.Fatal("whole shard map re-sent though its layout did not change")
			}
			if _, ok := parts["budget"]; ok {
				t.Fatal("unchanged part re-sent")
			}
			if !strings.Contains(parts["map-head"], "FATAL") {
				t.Fatal("legend counts not updated with the group")
			}
			// Logging out ends the stream at its next update.
			_, page := get(t, c, f.srv.URL+"/")
			if code, _, _ := post(t, c, f.srv.URL+"/logout", url.Values{"csrf": {csrfOf(t, page)}}); code != http.StatusSeeOther {
				t.Fatalf("logout: %d", code)
			}
			f.mu.Lock()
			f.state["0"] = appliance.ShardReady
			f.mu.Unlock()
			f.checkin("node-a")
			for sc.Scan() {
			}
			if ctx.Err() != nil {
				t.Fatal("the stream outlived its session: it ran until the test's deadline")
			}
			if code, _ := get(t, c, f.srv.URL+"/nodes"); code != http.StatusSeeOther {
				t.Fatalf("after logout /nodes answers %d, want a redirect to the login", code)
			}
			return
		}
	}
	t.Fatal("no shard-map update showed the FATAL shard")
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestLiveBadTopic(t *testing.T) {
	f := newTestFleet(t, fleetOpts{total: 16, maxConc: 1})
	c := f.client()
	f.login(c, testToken)
	if code, _ := get(t, c, f.srv.URL+"/live?topic=nope"); code != http.StatusBadRequest {
		t.Fatalf("bad topic: %d", code)
	}
}

// fakeNetboot records approvals and ignores.
type fakeNetboot struct {
	mu       sync.Mutex
	disc     []DiscoveredNode
	approved map[string]string
	ignored  []string
}

func (n *fakeNetboot) Discovered(context.Context) ([]DiscoveredNode, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]DiscoveredNode(nil), n.disc...), nil
}

func (n *fakeNetboot) Summaries(context.Context) (map[string]BootSummary, error) {
	return map[string]BootSummary{"node-a": {MAC: "52-54-00-00-00-0a", IP: "10.9.0.10", Firmware: "bios", LastStage: "checkin"}}, nil
}

func (n *fakeNetboot) Boot(_ context.Context, id string) (BootRecord, error) {
	if id != "node-a" {
		return BootRecord{}, ErrNoBootRecord
	}
	return BootRecord{BootSummary: BootSummary{MAC: "52-54-00-00-00-0a", Firmware: "bios"}, LeaseIP: "10.9.0.10",
		LeaseEnd: time.Now().Add(time.Hour), Steps: []BootStep{{At: time.Now(), Stage: "dhcp_offer", Detail: "10.9.0.10"},
			{At: time.Now(), Stage: "kernel_partial", Detail: "connection reset", Failed: true}}}, nil
}

func (n *fakeNetboot) Approve(_ context.Context, mac, id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.approved[mac] = id
	return nil
}

func (n *fakeNetboot) Ignore(_ context.Context, mac string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.ignored = append(n.ignored, mac)
	return nil
}

func TestNetbootSections(t *testing.T) {
	nb := &fakeNetboot{approved: map[string]string{}, disc: []DiscoveredNode{{MAC: "52-54-00-ab-cd-ef", Firmware: "uefi",
		IP: "10.9.0.44", FirstSeen: time.Now().Add(-time.Minute), LastSeen: time.Now()}}}
	f := seeded(t, nb)
	c := f.client()
	csrf := f.login(c, testToken)
	_, body := get(t, c, f.srv.URL+"/discovered")
	if !strings.Contains(body, "52-54-00-ab-cd-ef") || !strings.Contains(body, `value="node-abcdef"`) || strings.Contains(body, "disabled") {
		t.Fatalf("discovered page:\n%s", body)
	}
	code, _, _ := post(t, c, f.srv.URL+"/discovered/52-54-00-ab-cd-ef/approve", url.Values{"csrf": {csrf}, "name": {"rack1-07"}})
	if code != http.StatusSeeOther || nb.approved["52-54-00-ab-cd-ef"] != "rack1-07" {
		t.Fatalf("approve: %d %v", code, nb.approved)
	}
	code, _, body = post(t, c, f.srv.URL+"/discovered/52-54-00-ab-cd-ef/approve", url.Values{"csrf": {csrf}, "name": {"bad name!"}})
	if code != http.StatusBadRequest || !strings.Contains(body, "Invalid node name") {
		t.Fatalf("approve with a bad name: %d", code)
	}
	code, _, _ = post(t, c, f.srv.URL+"/discovered/52-54-00-ab-cd-ef/ignore", url.Values{"csrf": {csrf}})
	if code != http.StatusSeeOther || len(nb.ignored) != 1 {
		t.Fatalf("ignore: %d %v", code, nb.ignored)
	}
	_, body = get(t, c, f.srv.URL+"/nodes/node-a")
	for _, h := range []string{"52-54-00-00-00-0a", "10.9.0.10, ends in", "kernel_partial", "failed here"} {
		if !strings.Contains(body, h) {
			t.Errorf("node page lacks %q", h)
		}
	}
	_, body = get(t, c, f.srv.URL+"/nodes/node-b")
	if !strings.Contains(body, "has not booted over the network") {
		t.Error("node page without a boot record lacks its explanation")
	}
	_, body = get(t, c, f.srv.URL+"/nodes")
	if !strings.Contains(body, "52-54-00-00-00-0a") || !strings.Contains(body, "10.9.0.10") {
		t.Error("nodes table lacks netboot columns")
	}
	_, body = get(t, c, f.srv.URL+"/")
	if !strings.Contains(body, `<a href="/discovered">1</a>`) {
		t.Error("fleet totals lack the discovered count")
	}
}

// TestCloseStreams checks that shutting the dashboard down ends open
// streams at once (a graceful HTTP shutdown waits for them otherwise).
func TestCloseStreams(t *testing.T) {
	f := seeded(t, nil)
	c := f.client()
	f.login(c, testToken)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", f.srv.URL+"/live?topic=node&id=node-a", nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 8<<20)
	if parts := readEvent(t, sc); !strings.Contains(parts["node-shards"], `id="node-shards"`) {
		t.Fatalf("node topic parts: %v", keys(parts))
	}
	f.web.CloseStreams()
	for sc.Scan() {
	}
	if ctx.Err() != nil {
		t.Fatal("the stream stayed open after CloseStreams")
	}
	if code, _ := get(t, c, f.srv.URL+"/live?topic=fleet"); code != http.StatusServiceUnavailable {
		t.Fatalf("new stream after CloseStreams: %d, want 503", code)
	}
}

// TestLiveNodeRows checks that the nodes table's live updates carry only
// the rows that changed, with absolute times that do not change by
// themselves every second.
func TestLiveNodeRows(t *testing.T) {
	f := seeded(t, nil)
	c := f.client()
	f.login(c, testToken)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", f.srv.URL+"/live?topic=nodes&sort=id", nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 8<<20)
	first := readEvent(t, sc)
	if !strings.Contains(first["node-rows"], `<tr id="n-node-b">`) || !strings.Contains(first["node-rows"], ">until ") {
		t.Fatalf("first event: %v", first["node-rows"])
	}
	f.mu.Lock()
	f.state["0"] = appliance.ShardBackoff
	f.mu.Unlock()
	f.checkin("node-a")
	parts := readEvent(t, sc)
	if _, ok := parts["n-node-a"]; !ok || len(parts) != 1 {
		t.Fatalf("after node-a checked in: parts %v, want only n-node-a", keys(parts))
	}
	if !strings.Contains(parts["n-node-a"], `<td class="n warn">1</td>`) {
		t.Fatalf("node-a's row lacks its BACKOFF count:\n%s", parts["n-node-a"])
	}
}
