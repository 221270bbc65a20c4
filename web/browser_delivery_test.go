package web

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	"github.com/discord-pxe/dpxe/appliance"
)

// reportDelivery checks a settled node in once more, reporting each shard
// it runs READY with a resumable session and the event delivery figures
// fig(shard) sets, and the broker connection broker, as a publishing
// kernel node does (its seq is the hand-over sequence,
// appliance.HandoverSeq).
func (f *testFleet) reportDelivery(id string, broker *appliance.BrokerStatus, fig func(s uint32, st *appliance.ShardStatus)) {
	f.t.Helper()
	f.mu.Lock()
	req := &appliance.CheckinRequest{NodeID: id, Capacity: f.caps[id], Generation: f.gens[id], NATS: broker}
	runs := f.runs[id]
	f.mu.Unlock()
	for _, s := range runs {
		st := appliance.ShardStatus{ID: s, State: appliance.ShardReady, SeqValid: true, HeartbeatAcks: 3,
			SessionID: "0123456789abcdef0123456789abcdef", ResumeURL: "ws://127.0.0.1:9/?v=10&encoding=json"}
		if fig != nil {
			fig(s, &st)
		}
		req.Shards = append(req.Shards, st)
		req.ReadyShards++
	}
	if _, err := f.ctrl.Checkin(context.Background(), req, "127.0.0.1"); err != nil {
		f.t.Fatalf("checkin %s: %v", id, err)
	}
}

// cardFacts is a JavaScript expression giving each shard card's facts as
// {"#3": {"Published": "1,100", ...}, ...}.
const cardFacts = `JSON.stringify(Object.fromEntries(Array.from(document.querySelectorAll('#node-shards li.shard')).map(li =>
	[li.querySelector('.sid').textContent, Object.fromEntries(Array.from(li.querySelectorAll('dl > div')).map(d =>
		[d.querySelector('dt').textContent.trim(), d.querySelector('dd').textContent.trim()]))])))`

func readCards(t *testing.T, ctx context.Context) map[string]map[string]string {
	t.Helper()
	var cards map[string]map[string]string
	if err := json.Unmarshal([]byte(evalJS[string](t, ctx, cardFacts)), &cards); err != nil {
		t.Fatal(err)
	}
	return cards
}

// TestBrowserNodeDelivery: in headless Chromium, a node whose check-ins
// carry event delivery figures shows them per shard (published,
// acknowledged sequence, lag, in flight, lost, skipped) and summed with
// its publish rate, and the nodes table shows its rate and what is in
// flight; a node reporting none shows nothing of delivery. A new check-in
// changes the open node page without a reload. The node page shows the
// same with JavaScript off.
func TestBrowserNodeDelivery(t *testing.T) {
	ctx := newBrowser(t)
	f := newTestFleet(t, fleetOpts{total: 8, maxConc: 1, liveEvery: 100 * time.Millisecond})
	f.addNodes(4, "node-a", "node-b")
	f.settle("node-a", "node-b")
	f.mu.Lock()
	runsA := append([]uint32(nil), f.runs["node-a"]...)
	f.mu.Unlock()
	if len(runsA) != 4 {
		t.Fatalf("node-a runs %v, want 4 shards", runsA)
	}
	first := runsA[0]
	// Shard k of node-a (k = s - first): acknowledged up to 500+k, k
	// dispatches in flight after it; the last one also lost 2 dispatches
	// after its last acknowledged one and skipped 30.
	figures := func(extra uint32, inFlight0 uint32) func(uint32, *appliance.ShardStatus) {
		return func(s uint32, st *appliance.ShardStatus) {
			k := s - first
			st.EventsPublished = 1000 + 100*k + extra
			st.EventsAckedSeq = 500 + k
			st.EventsInFlight = k
			if k == 0 {
				st.EventsInFlight = inFlight0
			}
			st.Seq = appliance.HandoverSeq(st.EventsAckedSeq+st.EventsInFlight, st.EventsInFlight > 0, st.EventsAckedSeq+1)
			if k == 3 {
				st.EventsLost, st.EventsSkipped = 2, 30
				st.Seq = appliance.HandoverSeq(st.EventsAckedSeq+st.EventsInFlight+2, true, st.EventsAckedSeq+3)
			}
		}
	}
	up := &appliance.BrokerStatus{State: appliance.BrokerUp, Connects: 2, Drops: 1}
	// node-b has broker access but its connection is down and it has
	// published nothing: its broker state, and no delivery figures.
	down := &appliance.BrokerStatus{State: appliance.BrokerDown, Connects: 0, Drops: 5, Refused: 1}
	f.reportDelivery("node-a", up, figures(0, 0))
	f.reportDelivery("node-b", down, nil)
	// The rate is measured over the time between two check-ins (real
	// time here): let some pass, so it is a number of milliseconds.
	time.Sleep(20 * time.Millisecond)
	f.reportDelivery("node-a", up, figures(50, 0)) // 200 more published: a rate
	da, err := f.ctrl.Node(context.Background(), "node-a")
	if err != nil || da.Delivery == nil || da.Delivery.RateWindowMS == 0 {
		t.Fatalf("node-a's delivery after two reports: %+v, %v", da.Delivery, err)
	}
	rate := eventRate(da.Delivery.PublishRate)
	base := f.srv.URL
	out := artifactDir(t)

	logIn(t, ctx, base+"/nodes/node-a")
	waitJS(t, ctx, "node-a's delivery summary", byID("node-delivery")+` && document.getElementById('live-status').textContent.includes('connected')`)
	cards := readCards(t, ctx)
	for k := uint32(0); k < 4; k++ {
		card := cards["#"+utoa(first+k)]
		want := map[string]string{"Published": groupDigits(uint64(1050 + 100*k)), "Acked seq": utoa(500 + k),
			"In flight": utoa(k), "Lag": utoa(k), "Lost": "0"}
		if k == 3 {
			want["Lost"], want["Skipped"], want["Lag"] = "2", "30", "5"
		}
		for key, v := range want {
			if card[key] != v {
				t.Errorf("shard %d's card: %s %q, want %q (card %v)", first+k, key, card[key], v, card)
			}
		}
		if _, ok := card["Skipped"]; ok != (k == 3) {
			t.Errorf("shard %d's card: Skipped shown %v, want %v", first+k, ok, k == 3)
		}
	}
	summary := evalJS[string](t, ctx, `document.getElementById('node-delivery').innerText`)
	for _, want := range []string{rate + " events/s", "4,800", "Lost (oversize or no room)", "Broker connection\nup 2 connects, 1 drops, 0 refused"} {
		if !strings.Contains(summary, want) {
			t.Errorf("node-a's delivery summary lacks %q:\n%s", want, summary)
		}
	}
	screenshot(t, ctx, filepath.Join(out, "node-delivery.png"))

	// Live: a check-in with 7 in flight on the first shard changes the
	// open page in place.
	evalJS[int](t, ctx, `window.__noReload = 3`)
	f.reportDelivery("node-a", up, figures(60, 7))
	waitJS(t, ctx, "the first shard's new in-flight count", `JSON.parse(`+cardFacts+`)['#`+utoa(first)+`']['In flight'] === '7'`)
	if card := readCards(t, ctx)["#"+utoa(first)]; card["Lag"] != "7" {
		t.Errorf("after the update, the first shard's lag is %q, want 7", card["Lag"])
	}
	if m := evalJS[int](t, ctx, `window.__noReload || 0`); m != 3 {
		t.Fatal("the node page reloaded; live updates should have changed it in place")
	}

	// A node that reports no delivery figures shows none, only its
	// broker connection, down.
	steps(t, ctx, "node-b's page", chromedp.Navigate(base+"/nodes/node-b"))
	waitJS(t, ctx, "node-b's shards", `document.querySelectorAll('#node-shards li.shard').length === 4`)
	if evalJS[bool](t, ctx, `!!document.getElementById('node-shards').textContent.match(/Acked seq|Publish rate|In flight|Lost/)`) {
		t.Errorf("node-b reports no delivery but its page shows some:\n%s", evalJS[string](t, ctx, `document.getElementById('node-shards').innerText`))
	}
	if got := evalJS[string](t, ctx, `(document.getElementById('node-broker') || {innerText: 'none'}).innerText.replace(/\s+/g, ' ').trim()`); got != "Broker connection down 0 connects, 5 drops, 1 refused" {
		t.Errorf("node-b's broker connection: %q", got)
	}

	// The nodes table: node-a's rate and what it has in flight; nothing for node-b.
	steps(t, ctx, "the nodes page", chromedp.Navigate(base+"/nodes"))
	waitJS(t, ctx, "the nodes table", byID("n-node-a"))
	cell := func(id string) string {
		return evalJS[string](t, ctx, `(() => { const i = Array.from(document.querySelectorAll('table.nodes thead th')).findIndex(th => th.textContent.trim() === 'Events/s');
			return i < 0 ? 'no Events/s column' : document.getElementById('n-`+id+`').children[i].innerText.replace(/\s+/g, ' ').trim() })()`)
	}
	da, _ = f.ctrl.Node(context.Background(), "node-a")
	if got, want := cell("node-a"), eventRate(da.Delivery.PublishRate)+" 13 in flight"; got != want {
		t.Errorf("node-a's Events/s cell %q, want %q", got, want)
	}
	if got := cell("node-b"); got != "broker down" {
		t.Errorf("node-b's Events/s cell %q, want only \"broker down\"", got)
	}
	screenshot(t, ctx, filepath.Join(out, "nodes-delivery.png"))

	// JavaScript off: the same figures in the server's HTML.
	tab, cancel := chromedp.NewContext(ctx)
	defer cancel()
	if err := chromedp.Do(tab); err != nil {
		t.Fatal(err)
	}
	steps(t, tab, "node-a without JavaScript", chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := cdp.Call(ctx, tg, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: true})
		return err
	}), chromedp.Navigate(base+"/nodes/node-a"))
	waitJS(t, tab, "node-a's delivery without JavaScript", byID("node-delivery"))
	if text := evalJS[string](t, tab, `document.getElementById('live-status').textContent`); !strings.Contains(text, "need JavaScript") {
		t.Fatalf("the page script ran although JavaScript is off: %q", text)
	}
	if card := readCards(t, tab)["#"+utoa(first+3)]; card["Lag"] != "5" || card["Lost"] != "2" || card["Skipped"] != "30" {
		t.Errorf("without JavaScript shard %d's card is %v", first+3, card)
	}
}

func utoa(v uint32) string { return strconv.FormatUint(uint64(v), 10) }
