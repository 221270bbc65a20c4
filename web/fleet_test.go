package web

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/api"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/events"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// testToken is the admin token of test fleets.
const testToken = "test-admin-token-0123456789"

// testFleet is a real store and controller with nodes that check in
// through the controller, and the dashboard and API on one loopback server.
type testFleet struct {
	t     testing.TB
	store *store.Store
	ctrl  *controller.Controller
	web   *Server
	srv   *httptest.Server

	mu    sync.Mutex
	gens  map[string]uint64   // last generation each node received
	runs  map[string][]uint32 // shards each node runs: its last answer's assigned minus pending
	caps  map[string]int
	state map[string]appliance.ShardState // state nodes report for their shards (default READY)
}

// testLease is the test fleet's node lease: longer than a whole browser
// session (browserSession), so no step waits on it.
const testLease = 10 * time.Minute

type fleetOpts struct {
	total, maxConc uint32
	liveEvery      time.Duration
	netboot        Netboot
	// netbootFor, when set, makes the Netboot from the fleet's store and
	// controller (for fleetinv.Inventory).
	netbootFor func(*store.Store, *controller.Controller) Netboot
	// events is the dashboard's Config.Events.
	events func(context.Context) (events.StreamState, bool)
}

func newTestFleet(t testing.TB, o fleetOpts) *testFleet {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, t.TempDir()+"/dpxe.db")
	if err != nil {
		t.Fatal(err)
	}
	// The nodes check in only when a test step says so (settle), so their
	// lease must outlast the longest stretch between two steps on a loaded
	// machine: no test here waits for a lease to lapse.
	ctrl, err := controller.New(ctx, st, controller.Config{TotalShards: o.total, MaxConcurrency: o.maxConc,
		Lease: testLease, RebalanceEvery: -1, IdentifyWindow: 50 * time.Millisecond}, time.Now, nil)
	if err != nil {
		t.Fatal(err)
	}
	hash := sha256.Sum256([]byte(testToken))
	if o.netbootFor != nil {
		o.netboot = o.netbootFor(st, ctrl)
	}
	w := New(Config{Controller: ctrl, Store: st, AdminHash: hash, Netboot: o.netboot, LiveEvery: o.liveEvery, Events: o.events})
	mux := http.NewServeMux()
	api.New(ctrl, hash, nil).Register(mux)
	w.Register(mux)
	f := &testFleet{t: t, store: st, ctrl: ctrl, web: w, srv: httptest.NewServer(mux),
		gens: map[string]uint64{}, runs: map[string][]uint32{}, caps: map[string]int{}, state: map[string]appliance.ShardState{}}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{}, 2)
	go func() { _ = ctrl.Run(runCtx, 100*time.Millisecond); done <- struct{}{} }()
	go func() { _ = w.Run(runCtx); done <- struct{}{} }()
	t.Cleanup(func() {
		cancel() // ends the live streams too, which Close would wait for
		<-done
		<-done
		f.srv.CloseClientConnections()
		f.srv.Close()
		st.Close()
	})
	return f
}

// addNodes creates nodes with the given capacity.
func (f *testFleet) addNodes(capacity int, ids ...string) {
	f.t.Helper()
	for _, id := range ids {
		if _, err := f.ctrl.AddNode(context.Background(), id); err != nil {
			f.t.Fatal(err)
		}
		f.mu.Lock()
		f.caps[id] = capacity
		f.mu.Unlock()
	}
}

// checkin checks a node in, acknowledging the last generation it got and
// reporting its held shards in their configured state; it returns the
// number of pending shards.
func (f *testFleet) checkin(id string) int {
	f.t.Helper()
	f.mu.Lock()
	gen, capacity, held := f.gens[id], f.caps[id], f.runs[id]
	f.mu.Unlock()
	req := &appliance.CheckinRequest{NodeID: id, Capacity: capacity, Generation: gen}
	// Report the shards of the previous answer: the ones it runs.
	for _, s := range held {
		st := f.stateOf(s)
		req.Shards = append(req.Shards, appliance.ShardStatus{ID: s, State: st, SeqValid: st == appliance.ShardReady,
			HeartbeatAcks: 3, Reconnects: 0})
		switch st {
		case appliance.ShardReady:
			req.ReadyShards++
		case appliance.ShardStarting:
			req.StartingShards++
		case appliance.ShardBackoff:
			req.BackoffShards++
		case appliance.ShardFatal:
			req.FatalShards++
		}
	}
	resp, err := f.ctrl.Checkin(context.Background(), req, "127.0.0."+fmt.Sprint(1+len(id)%200))
	if err != nil {
		f.t.Fatalf("checkin %s: %v", id, err)
	}
	if err := resp.Validate(); err != nil {
		f.t.Fatalf("checkin %s: answer: %v", id, err)
	}
	// Restart requests are taken up as the kernel does: a listed shard
	// reported FATAL starts again, here READY from the next check-in on.
	f.mu.Lock()
	for _, s := range resp.RestartShards {
		if f.state[fmt.Sprint(s)] == appliance.ShardFatal {
			delete(f.state, fmt.Sprint(s))
		}
	}
	f.mu.Unlock()
	pending := map[uint32]bool{}
	for _, s := range resp.Pending {
		pending[s] = true
	}
	var runs []uint32
	for _, s := range resp.Assigned {
		if !pending[s] {
			runs = append(runs, s)
		}
	}
	f.mu.Lock()
	f.gens[id] = resp.Generation
	f.runs[id] = runs
	f.mu.Unlock()
	return len(resp.Pending)
}

func (f *testFleet) stateOf(s uint32) appliance.ShardState {
	f.mu.Lock()
	defer f.mu.Unlock()
	if st, ok := f.state[fmt.Sprint(s)]; ok {
		return st
	}
	return appliance.ShardReady
}

// settle checks every given node in until none has pending shards and
// every node acknowledged the current generation (bounded rounds).
func (f *testFleet) settle(ids ...string) {
	f.t.Helper()
	for round := 0; round < 20; round++ {
		pending := 0
		for _, id := range ids {
			pending += f.checkin(id)
		}
		// A second pass reports the status of shards granted in the first.
		gen := f.ctrl.Plan().Generation
		acked := true
		for _, id := range ids {
			f.mu.Lock()
			acked = acked && f.gens[id] == gen
			f.mu.Unlock()
		}
		if pending == 0 && acked {
			for _, id := range ids {
				f.checkin(id)
			}
			return
		}
	}
	f.t.Fatalf("fleet did not settle in 20 rounds: plan %+v", f.ctrl.Plan())
}

// client is an HTTP client with a cookie jar that does not follow
// redirects.
func (f *testFleet) client() *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrfOf extracts the CSRF token of the first form in an HTML page.
func csrfOf(t testing.TB, html string) string {
	t.Helper()
	m := csrfRE.FindStringSubmatch(html)
	if m == nil {
		t.Fatalf("no CSRF field in page:\n%.400s", html)
	}
	return m[1]
}

// get fetches a path and returns status and body.
func get(t testing.TB, c *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// post submits a form and returns status, Location and body.
func post(t testing.TB, c *http.Client, u string, form url.Values) (int, string, string) {
	t.Helper()
	resp, err := c.PostForm(u, form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Location"), string(b)
}

// login logs c in with secret and returns the session's CSRF token.
func (f *testFleet) login(c *http.Client, secret string) string {
	f.t.Helper()
	_, page := get(f.t, c, f.srv.URL+"/login")
	code, loc, body := post(f.t, c, f.srv.URL+"/login", url.Values{"csrf": {csrfOf(f.t, page)}, "secret": {secret}, "next": {"/nodes"}})
	if code != http.StatusSeeOther || loc != "/nodes" {
		f.t.Fatalf("login: %d %q\n%.500s", code, loc, body)
	}
	_, page = get(f.t, c, f.srv.URL+"/")
	if !strings.Contains(page, "Log out") {
		f.t.Fatalf("not logged in after login:\n%.500s", page)
	}
	return csrfOf(f.t, page)
}
