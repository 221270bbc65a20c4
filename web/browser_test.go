package web

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	"github.com/discord-pxe/dpxe/appliance"
)

// chromiumPath is Debian's chromium, which tools/scripts/deps.sh installs.
const chromiumPath = "/usr/bin/chromium"

// browserWait bounds every step and every wait for the page to reach a
// state; browserSession bounds the whole browser test.
const (
	browserWait    = 20 * time.Second
	browserSession = 2 * time.Minute
)

// steps runs browser actions in order with a deadline. The tab must have
// run once (a deadline on the first run would bound the tab's life).
func steps(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, browserWait)
	defer cancel()
	if err := chromedp.Do(sctx, actions...); err != nil {
		tctx, cancel2 := context.WithTimeout(ctx, 5*time.Second)
		defer cancel2()
		text, _ := chromedp.Run(tctx, chromedp.Evaluate[string](`document.body ? document.body.innerText.slice(0, 1500) : ""`))
		t.Fatalf("%s: %v\npage text:\n%s", what, err, text)
	}
}

// newBrowser starts headless Chromium with a fresh profile and no
// background networking, and returns a context for its first tab.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	path := chromiumPath
	if _, err := os.Stat(path); err != nil {
		p, lerr := exec.LookPath("chromium")
		if lerr != nil {
			t.Skipf("chromium not installed (%s missing; tools/scripts/deps.sh test installs it): browser tests skipped", chromiumPath)
		}
		path = p
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-default-apps", true),
		chromedp.Flag("metrics-recording-only", true),
		chromedp.Flag("safebrowsing-disable-auto-update", true),
		chromedp.Flag("password-store", "basic"),
	}
	// The whole browser session is bounded, so a hang cannot eat the
	// suite's time; each step below has its own, shorter deadline.
	parent, cancelAll := context.WithTimeout(context.Background(), browserSession)
	actx, cancelAlloc := chromedp.NewExecAllocator(parent, opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc(); cancelAll() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("starting chromium: %v", err)
	}
	return ctx
}

// artifactDir is where screenshots go: $DPXE_ARTIFACTS or a temp dir.
func artifactDir(t *testing.T) string {
	if d := os.Getenv("DPXE_ARTIFACTS"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	return t.TempDir()
}

// waitJS polls a JavaScript predicate until it is truthy on a fully
// loaded page. Each evaluation has its own short deadline and errors are
// retried, so the poll survives navigations (a query bound to a page that
// is being replaced can otherwise wait forever).
func waitJS(t *testing.T, ctx context.Context, what, expr string) {
	t.Helper()
	deadline := time.Now().Add(browserWait)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var lastErr error
	for time.Now().Before(deadline) {
		ectx, cancel := context.WithTimeout(ctx, 2*time.Second)
		ok, err := chromedp.Run(ectx, chromedp.Evaluate[bool](`document.readyState === 'complete' && !!(`+expr+`)`))
		cancel()
		if err == nil && ok {
			return
		}
		if ctx.Err() != nil {
			break
		}
		lastErr = err
		<-tick.C
	}
	tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	text, _ := chromedp.Run(tctx, chromedp.Evaluate[string](`document.body ? document.body.innerText.slice(0, 1500) : ""`))
	t.Fatalf("waiting for %s (%s): not true after %v (last error %v)\npage text:\n%s", what, expr, browserWait, lastErr, text)
}

// byID is a predicate that the element with the id exists.
func byID(id string) string { return `document.getElementById('` + id + `')` }

func evalJS[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	ectx, cancel := context.WithTimeout(ctx, browserWait)
	defer cancel()
	v, err := chromedp.Run(ectx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluating %s: %v", expr, err)
	}
	return v
}

// browserFleet is the browser tests' fleet: 20 nodes of capacity 128
// (node-00…node-19) over 2,048 shards, settled, live updates every 100 ms.
func browserFleet(t *testing.T, maxConc uint32) (*testFleet, []string) {
	t.Helper()
	f := newTestFleet(t, fleetOpts{total: 2048, maxConc: maxConc, liveEvery: 100 * time.Millisecond})
	var ids []string
	for i := 0; i < 20; i++ {
		ids = append(ids, fmt.Sprintf("node-%02d", i))
	}
	f.addNodes(128, ids...)
	f.settle(ids...)
	return f, ids
}

// logIn opens url in the tab, which sends it to the login page, and logs
// in with the admin token; the login page then sends it on to url.
func logIn(t *testing.T, ctx context.Context, url string) {
	t.Helper()
	steps(t, ctx, "opening "+url, chromedp.Navigate(url))
	waitJS(t, ctx, "the login form", byID("secret"))
	steps(t, ctx, "log in", chromedp.SendKeys(chromedp.ID("secret"), testToken), chromedp.Submit(chromedp.ID("secret")))
}

func screenshot(t *testing.T, ctx context.Context, file string) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, browserWait)
	defer cancel()
	png, err := chromedp.Run(sctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", file, err)
	}
	if err := os.WriteFile(file, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", file, len(png))
}

// TestBrowser drives the dashboard in headless Chromium against a real
// store and controller whose nodes check in through the controller: log
// in, see the nodes, drain one in a second tab while the fleet page in the
// first watches its shards go pending and move without reloading,
// undrain, look up a guild, and see forged POSTs refused.
func TestBrowser(t *testing.T) {
	ctx := newBrowser(t)
	const total = 2048
	f, ids := browserFleet(t, 16)
	// A few shards in trouble, so the map shows every state.
	f.mu.Lock()
	f.state["5"], f.state["6"], f.state["300"] = appliance.ShardBackoff, appliance.ShardStarting, appliance.ShardFatal
	f.mu.Unlock()
	f.settle(ids...)
	base := f.srv.URL
	out := artifactDir(t)

	// Log in; the login page sends us on to the fleet.
	logIn(t, ctx, base+"/")
	waitJS(t, ctx, "the fleet page", byID("shardmap"))
	if n := evalJS[int](t, ctx, `document.querySelectorAll('#shardmap .group[data-node^="node-"]').length`); n != len(ids) {
		t.Fatalf("shard map shows %d node groups, want %d", n, len(ids))
	}
	if n := evalJS[int](t, ctx, `document.querySelectorAll('#shardmap .cells i').length`); n != total {
		t.Fatalf("shard map has %d cells, want one per shard (%d)", n, total)
	}
	waitJS(t, ctx, "live connection", `document.getElementById('live-status').textContent.includes('connected')`)
	screenshot(t, ctx, filepath.Join(out, "fleet.png"))
	if os.Getenv("DPXE_UPDATE_SCREENSHOTS") == "1" {
		png, _ := os.ReadFile(filepath.Join(out, "fleet.png"))
		if err := os.WriteFile("../docs/screenshots/fleet.png", png, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// The fleet tab keeps a marker that a reload would lose.
	evalJS[int](t, ctx, `window.__noReload = 7`)
	victim := ids[1]
	shardsOf := func(node string) string {
		return fmt.Sprintf(`(document.querySelector('#shardmap .group[data-node="%s"] .cells') || {children: []}).children.length`, node)
	}
	before := evalJS[int](t, ctx, shardsOf(victim))
	if before == 0 {
		t.Fatalf("%s has no cells before the drain", victim)
	}

	// Drain in a second tab, through the confirmation.
	tab2, cancel2 := chromedp.NewContext(ctx)
	defer cancel2()
	if err := chromedp.Do(tab2); err != nil { // opens the tab, without a deadline
		t.Fatal(err)
	}
	link := `a[href="/nodes/` + victim + `"]`
	steps(t, tab2, "nodes page", chromedp.Navigate(base+"/nodes"))
	waitJS(t, tab2, "the nodes table", `document.querySelector('`+link+`')`)
	steps(t, tab2, "following the node link", chromedp.Click(chromedp.CSS(link)))
	waitJS(t, tab2, "the node page", byID("drain"))
	screenshot(t, tab2, filepath.Join(out, "node.png"))
	if os.Getenv("DPXE_UPDATE_SCREENSHOTS") == "1" {
		png, _ := os.ReadFile(filepath.Join(out, "node.png"))
		if err := os.WriteFile("../docs/screenshots/node.png", png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	steps(t, tab2, "drain button", chromedp.Click(chromedp.ID("drain")))
	waitJS(t, tab2, "the drain confirmation", byID("confirm"))
	screenshot(t, tab2, filepath.Join(out, "drain-confirm.png"))
	confirm := evalJS[string](t, tab2, `document.querySelector('main').innerText`)
	moves := evalJS[string](t, tab2, `(document.getElementById('drain-moves') || {innerText: ''}).innerText`)
	if !strings.Contains(moves, victim) || !strings.Contains(moves, ids[0]) || !strings.Contains(confirm, "pending") ||
		!strings.Contains(confirm, "resumes") || evalJS[bool](t, tab2, `!!document.getElementById('strand')`) {
		t.Fatalf("drain confirmation does not say what moves where:\n%s", confirm)
	}
	steps(t, tab2, "confirming the drain", chromedp.Click(chromedp.ID("confirm")))
	waitJS(t, tab2, "the node page after the drain", byID("undrain"))
	if d, _ := f.ctrl.Node(context.Background(), victim); !d.Draining {
		t.Fatalf("%s not draining after the browser confirmed", victim)
	}

	// The fleet tab, without reloading: the victim's range is gone and its
	// shards show as pending on their new owners until it releases them.
	waitJS(t, ctx, "pending shards after the drain", `document.querySelectorAll('#shardmap .cells i.s-p').length > 0`)
	if n := evalJS[int](t, ctx, shardsOf(victim)); n != 0 {
		t.Fatalf("%s still has %d cells in the map after the drain", victim, n)
	}
	// The victim checks in with the new generation (releasing its shards),
	// then the new owners take them.
	f.settle(ids...)
	waitJS(t, ctx, "the hand-off to finish", `document.querySelectorAll('#shardmap .cells i.s-p').length === 0`)
	if m := evalJS[int](t, ctx, `window.__noReload || 0`); m != 7 {
		t.Fatal("the fleet page reloaded; live updates should have changed it in place")
	}

	// Undrain: the victim gets a range again.
	steps(t, tab2, "undrain button", chromedp.Click(chromedp.ID("undrain")))
	waitJS(t, tab2, "the undrain confirmation", byID("confirm"))
	steps(t, tab2, "confirming the undrain", chromedp.Click(chromedp.ID("confirm")))
	waitJS(t, tab2, "the node page after the undrain", byID("drain"))
	f.settle(ids...)
	waitJS(t, ctx, "the victim's shards back", shardsOf(victim)+` > 0 && document.querySelectorAll('#shardmap .cells i.s-p').length === 0`)

	// With JavaScript off the same forms drain and undrain (no live
	// updates, no countdowns: plain pages).
	tab3, cancel3 := chromedp.NewContext(ctx)
	defer cancel3()
	if err := chromedp.Do(tab3); err != nil {
		t.Fatal(err)
	}
	noJS := ids[3]
	steps(t, tab3, "turning JavaScript off", chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := cdp.Call(ctx, tg, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: true})
		return err
	}), chromedp.Navigate(base+"/nodes/"+noJS))
	waitJS(t, tab3, "the node page without JavaScript", byID("drain"))
	if text := evalJS[string](t, tab3, `document.getElementById('live-status').textContent`); !strings.Contains(text, "need JavaScript") {
		t.Fatalf("the page script ran although JavaScript is off: %q", text)
	}
	steps(t, tab3, "drain without JavaScript", chromedp.Click(chromedp.ID("drain")))
	waitJS(t, tab3, "the confirmation without JavaScript", byID("confirm"))
	steps(t, tab3, "confirm without JavaScript", chromedp.Click(chromedp.ID("confirm")))
	waitJS(t, tab3, "the drained node without JavaScript", byID("undrain"))
	if d, _ := f.ctrl.Node(context.Background(), noJS); !d.Draining {
		t.Fatalf("%s not draining after the JavaScript-free form", noJS)
	}
	steps(t, tab3, "undrain without JavaScript", chromedp.Click(chromedp.ID("undrain")))
	waitJS(t, tab3, "the undrain confirmation without JavaScript", byID("confirm"))
	steps(t, tab3, "confirm undrain without JavaScript", chromedp.Click(chromedp.ID("confirm")))
	waitJS(t, tab3, "the undrained node without JavaScript", byID("drain"))
	if d, _ := f.ctrl.Node(context.Background(), noJS); d.Draining {
		t.Fatalf("%s still draining after the JavaScript-free undrain", noJS)
	}
	cancel3()
	f.settle(ids...)

	// Guild lookup gives the same answer as the route endpoint.
	const guild = "81384788765712384"
	gid, _ := appliance.ParseGuildID(guild)
	route, err := f.ctrl.Route(gid)
	if err != nil {
		t.Fatal(err)
	}
	steps(t, tab2, "guild page", chromedp.Navigate(base+"/guild"))
	waitJS(t, tab2, "the guild form", byID("guild_id"))
	steps(t, tab2, "guild lookup", chromedp.SendKeys(chromedp.ID("guild_id"), guild), chromedp.Submit(chromedp.ID("guild_id")))
	waitJS(t, tab2, "the route answer", byID("route"))
	screenshot(t, tab2, filepath.Join(out, "guild.png"))
	shardText := evalJS[string](t, tab2, `document.getElementById('route-shard').innerText`)
	nodeText := evalJS[string](t, tab2, `document.getElementById('route-node').innerText`)
	if !strings.HasPrefix(shardText, fmt.Sprint(route.ShardID)+" ") || nodeText != route.NodeID {
		t.Fatalf("guild lookup shows shard %q node %q, route says %d %s", shardText, nodeText, route.ShardID, route.NodeID)
	}

	// The audit log shows the drain and undrain done from the browser.
	steps(t, tab2, "events page", chromedp.Navigate(base+"/events?node="+victim))
	waitJS(t, tab2, "the events table", `document.querySelector('table.events')`)
	if kinds := evalJS[string](t, tab2, `document.querySelector('table.events tbody').innerText`); !strings.Contains(kinds, "undrain") || !strings.Contains(kinds, "drain") {
		t.Fatalf("events of %s lack the drain and undrain:\n%s", victim, kinds)
	}
	screenshot(t, tab2, filepath.Join(out, "events.png"))

	// Restart FATAL shards: shard 300 has been FATAL since the start. Its
	// node's page offers the control, the confirmation names the shard,
	// and after the confirmed POST the shard's card says the restart is
	// requested until the node takes it up; then, without a reload, the
	// note and the control go.
	fatalNode := ""
	for _, n := range f.ctrl.Nodes() {
		if n.Live && n.RangeStart <= 300 && 300 < n.RangeStart+n.RangeCount {
			fatalNode = n.ID
		}
	}
	steps(t, tab2, "the node page with a FATAL shard", chromedp.Navigate(base+"/nodes/"+fatalNode))
	waitJS(t, tab2, "the restart control", byID("restart-fatal"))
	if label := evalJS[string](t, tab2, `document.getElementById('restart-fatal').textContent`); label != "Restart FATAL shards…" {
		t.Fatalf("restart control labelled %q", label)
	}
	steps(t, tab2, "restart button", chromedp.Click(chromedp.ID("restart-fatal")))
	waitJS(t, tab2, "the restart confirmation", byID("restart-list"))
	if list := evalJS[string](t, tab2, `document.getElementById('restart-list').innerText`); !strings.Contains(list, "#300") {
		t.Fatalf("restart confirmation does not name shard 300:\n%s", list)
	}
	screenshot(t, tab2, filepath.Join(out, "restart-confirm.png"))
	steps(t, tab2, "confirming the restart", chromedp.Click(chromedp.ID("confirm")))
	const cardNote = `Array.from(document.querySelectorAll('#node-shards li.shard')).some(li => li.querySelector('.sid').textContent === '#300' && li.textContent.includes('restart requested'))`
	waitJS(t, tab2, "the restart request on shard 300's card", cardNote)
	if d, _ := f.ctrl.Node(context.Background(), fatalNode); len(d.RestartShards) != 1 || d.RestartShards[0] != 300 {
		t.Fatalf("%s's restart requests after the confirmation: %v", fatalNode, d.RestartShards)
	}
	screenshot(t, tab2, filepath.Join(out, "restart-requested.png"))
	evalJS[int](t, tab2, `window.__noReload = 9`)
	f.settle(ids...) // the node takes the request up: shard 300 READY
	waitJS(t, tab2, "the restart taken up", `!document.getElementById('restart-fatal') && !(`+cardNote+`)`)
	if m := evalJS[int](t, tab2, `window.__noReload || 0`); m != 9 {
		t.Fatal("the node page reloaded; live updates should have changed it in place")
	}

	// Live updates keep what the operator is using: with the Drain button of
	// a node focused, updates change the part it sits in (one of the node's
	// shards goes FATAL and back, so the Restart control comes and goes
	// beside it), and the focused element stays the same DOM node, still in
	// the page, still focused; Enter then opens the drain confirmation.
	focusNode := ids[4]
	var focusShard uint32
	for _, n := range f.ctrl.Nodes() {
		if n.ID == focusNode {
			focusShard = n.RangeStart
		}
	}
	steps(t, tab2, "the node page to focus", chromedp.Navigate(base+"/nodes/"+focusNode))
	waitJS(t, tab2, "the node page's live connection", `document.getElementById('drain') && document.getElementById('live-status').textContent.includes('connected')`)
	if ok := evalJS[bool](t, tab2, `(() => { const b = document.getElementById('drain'); b.focus(); window.__focused = b; return document.activeElement === b })()`); !ok {
		t.Fatal("could not focus the Drain button")
	}
	const stillFocused = `window.__focused.isConnected && document.activeElement === window.__focused && document.getElementById('drain') === window.__focused`
	for i, st := range []appliance.ShardState{appliance.ShardFatal, appliance.ShardReady, appliance.ShardFatal, appliance.ShardReady} {
		before := evalJS[int](t, tab2, `Number(document.body.dataset.updates || 0)`)
		f.mu.Lock()
		f.state[fmt.Sprint(focusShard)] = st
		f.mu.Unlock()
		f.settle(ids...)
		control := `!!document.getElementById('restart-fatal') === ` + fmt.Sprint(st == appliance.ShardFatal)
		waitJS(t, tab2, fmt.Sprintf("update %d of the focused page (shard %d %v)", i+1, focusShard, st),
			`Number(document.body.dataset.updates || 0) > `+fmt.Sprint(before)+` && `+control)
		if !evalJS[bool](t, tab2, stillFocused) {
			t.Fatalf("after live update %d the focused Drain button was replaced or lost focus (active element: %s)", i+1,
				evalJS[string](t, tab2, `document.activeElement ? document.activeElement.outerHTML.slice(0, 200) : "none"`))
		}
	}
	steps(t, tab2, "Enter on the focused Drain button", chromedp.KeyEvent("\r"))
	waitJS(t, tab2, "the drain confirmation opened from the keyboard", byID("confirm"))
	if d, _ := f.ctrl.Node(context.Background(), focusNode); d.Draining {
		t.Fatalf("%s drained without its confirmation", focusNode)
	}

	// Forged POSTs: a same-origin script without the token, and a form on
	// another origin that submits itself to the drain endpoint.
	fctx, cancelF := context.WithTimeout(tab2, browserWait)
	defer cancelF()
	for _, action := range []string{"drain", "restart-fatal"} {
		status, err := chromedp.Run(fctx, chromedp.Evaluate[int](`fetch('/nodes/`+ids[2]+`/`+action+`', {method: 'POST', body: new URLSearchParams({csrf: 'forged'})}).then(r => r.status)`,
			chromedp.EvalAwaitPromise))
		if err != nil || status != http.StatusForbidden {
			t.Fatalf("forged same-origin POST to %s: status %d, %v; want 403", action, status, err)
		}
	}
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<!doctype html><form id="f" method="post" action="%s/nodes/%s/drain"><input name="csrf" value="guess"></form><script>document.getElementById('f').submit()</script>`, base, ids[2])
	}))
	defer evil.Close()
	steps(t, tab2, "opening the forging page", chromedp.Navigate(evil.URL))
	waitJS(t, tab2, "the forged form's answer", `location.href.startsWith('`+base+`')`)
	text := evalJS[string](t, tab2, `document.body.innerText`)
	if !strings.Contains(text, "Request refused") && !strings.Contains(text, "Not logged in") {
		t.Fatalf("forged cross-origin form was not refused:\n%.500s", text)
	}
	if d, _ := f.ctrl.Node(context.Background(), ids[2]); d.Draining {
		t.Fatal("a forged POST drained a node")
	}

	// Phone width: the nodes table scrolls inside its box, the page does not.
	steps(t, tab2, "phone width", chromedp.EmulateViewport(390, 844), chromedp.Navigate(base+"/nodes"))
	waitJS(t, tab2, "the nodes table", `document.querySelector('table.nodes')`)
	if w := evalJS[int](t, tab2, `document.documentElement.scrollWidth`); w > 400 {
		t.Errorf("nodes page is %d px wide at phone width 390", w)
	}
	screenshot(t, tab2, filepath.Join(out, "nodes-phone.png"))
	for name, path := range map[string]string{"fleet": "/", "node": "/nodes/" + victim, "events": "/events", "guild": "/guild?guild_id=" + guild} {
		steps(t, tab2, "phone width "+path, chromedp.Navigate(base+path))
		waitJS(t, tab2, "the page at phone width", `document.querySelector('main h1')`)
		if w := evalJS[int](t, tab2, `document.documentElement.scrollWidth`); w > 400 {
			t.Errorf("%s is %d px wide at phone width 390", path, w)
		}
		screenshot(t, tab2, filepath.Join(out, name+"-phone.png"))
	}
}
