package templates

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/a-h/templ"

	"github.com/discord-pxe/dpxe/web/view"
)

func render(t *testing.T, c templ.Component) string {
	t.Helper()
	var b bytes.Buffer
	if err := c.Render(context.Background(), &b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestComponents renders components from table-driven view models and
// checks what the HTML must and must not contain.
func TestComponents(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	page := view.Page{Title: "T", Nav: "nodes", CSRF: "tok123", LoggedIn: true, Now: now.UnixMilli()}
	cases := []struct {
		name  string
		comp  templ.Component
		has   []string
		hasnt []string
	}{
		{"state badge has letter and name", StateBadge(view.Fatal),
			[]string{`class="badge s-f"`, `>F</abbr>`, "FATAL"}, nil},
		{"countdown live", LeaseCountdown(view.Countdown{Deadline: now.Add(23 * time.Second), Now: now}),
			[]string{`class="countdown"`, "in 23 s", `datetime="2026-11-29T12:00:23.000Z"`}, []string{"urgent"}},
		{"countdown urgent", LeaseCountdown(view.Countdown{Deadline: now.Add(4 * time.Second), Now: now}),
			[]string{`class="countdown urgent"`, "in 4 s"}, nil},
		{"countdown none", LeaseCountdown(view.Countdown{Now: now}), []string{"no lease"}, []string{"datetime"}},
		{"layout logged in", Layout(page), []string{`<html lang="en">`, `aria-current="page">Nodes</a>`,
			`name="csrf" value="tok123"`, "Log out", `data-now="`}, []string{"live-status"}},
		{"layout logged out", Layout(view.Page{Title: "Log in"}), []string{"<title>Log in · dpxe</title>"}, []string{"<nav", "Log out"}},
		{"layout live", Layout(view.Page{Title: "x", Live: "/live?topic=fleet"}), []string{`data-live="/live?topic=fleet"`, `id="live-status"`, `aria-live="polite"`}, nil},
		{"layout messages", Layout(view.Page{Flash: "done it", Error: "broke <it>"}),
			[]string{`role="status">done it`, `role="alert">broke &lt;it&gt;`}, []string{"<it>"}},
		{"totals without netboot", TotalsPanel(view.Totals{NodesLive: 3, Ready: 10, Pending: 2, Unowned: 4, Generation: 9}),
			[]string{`id="totals"`, "n/a", `id="generation">9<`, "<dt><abbr title=\"PENDING\">P</abbr> Pending</dt><dd>2</dd>"}, []string{"href=\"/discovered\""}},
		{"totals with discovered", TotalsPanel(view.Totals{Discovered: 5, DiscoveredKnown: true, Rebalancing: true, GraceUntil: "2026-11-29 12:00:30Z"}),
			[]string{`<a href="/discovered">5</a>`, "awaits the next rebalance", "no shard moves before 2026-11-29 12:00:30Z"}, []string{"n/a"}},
		{"budget low", BudgetPanel(view.Budget{Total: 1000, Remaining: 10, Reserve: 10, Percent: 1, Low: true, ResetIn: "3 h 2 min"}),
			[]string{`class="meter low"`, `aria-valuenow="10"`, "width:1%", "Identify claims are refused"}, nil},
		{"budget fine", BudgetPanel(view.Budget{Total: 1000, Remaining: 900, Percent: 90}), []string{`class="meter"`}, []string{"refused"}},
		{"identify bars", IdentifyPanel(view.Identify{Minutes: 10, MaxConcurrency: 2, Granted: 3, Bars: []view.BucketBar{{Label: "0", Granted: 3, Width: 100, LastGrant: view.Moment{At: now.Add(-2 * time.Second), Now: now}}, {Label: "1"}}}),
			[]string{"last 10 min", `<th scope="row">0</th>`, "width:100%", "never", `<time class="ago" datetime="2026-11-29T11:59:58.000Z">2 s ago</time>`}, []string{"No Identify claims"}},
		{"identify quiet", IdentifyPanel(view.Identify{Minutes: 10, MaxConcurrency: 2, Bars: []view.BucketBar{{Label: "0"}, {Label: "1"}}}),
			[]string{"No Identify claims in this window"}, []string{"<table"}},
		{"stable moment and countdown", NodeTableRow(view.NodeRow{ID: "n1", Status: "live", LastCheckin: view.Moment{At: now, Stable: true},
			Lease: view.Countdown{Deadline: now.Add(30 * time.Second), Now: now, Stable: true}}, false),
			[]string{`<tr id="n-n1">`, ">at 12:00:00Z</time>", ">until 12:00:30Z</time>"}, []string{" ago<", "in 30 s"}},
		{"shard map single cells", ShardMapPanel(view.ShardMap{Total: 4, BlockSize: 1, Groups: []view.MapGroup{
			{NodeID: "n1", Href: "/nodes/n1", Start: 0, End: 2, Range: "0-2", Cells: []view.State{view.Ready, view.Pending, view.Fatal}, Counts: counts(view.Ready, view.Pending, view.Fatal)},
			{Start: 3, End: 3, Range: "3", Cells: []view.State{view.Unowned}, Counts: counts(view.Unowned)}}}),
			[]string{`data-block="1"`, "one cell each", `<a href="/nodes/n1">n1</a>`, `<span class="range">0-2</span>`, `No owner <span class="range">3</span>`,
				`<i class=s-r>R</i><i class=s-p>P</i><i class=s-f>F</i>`, "No owner", `<i class=s-u>U</i>`, `id="g0"`, `id="map-head"`,
				`data-start="3"`, "PENDING", `aria-hidden="true"`},
			[]string{"per cell"}},
		{"shard map aggregated", ShardMapPanel(view.ShardMap{Total: 131072, BlockSize: 32}),
			[]string{"131072 shards, 32 per cell", `data-block="32"`}, nil},
		{"draining group", MapGroup(view.MapGroup{NodeID: "n2", Start: 8, End: 8, Draining: true, Cells: []view.State{view.Held}, Counts: counts(view.Held)}, false),
			[]string{`id="g8"`, `class="group draining"`, `<span class="tag">draining</span>`, `<i class=s-a>A</i>`, `<span class="s-a">1 A</span>`}, nil},
		{"compact tile all ready", MapGroup(view.MapGroup{NodeID: "n3", Href: "/nodes/n3", Start: 64, End: 127, Range: "64-127", Cells: []view.State{view.Ready, view.Ready}, Counts: [view.NumStates]int{view.Ready: 64}}, true),
			[]string{`id="g64"`, `class="tile"`, `title="64-127"`, `<a href="/nodes/n3">n3</a>`}, []string{"<h3>", `class="sum"`}},
		{"compact tile with trouble", MapGroup(view.MapGroup{NodeID: "n3", Start: 0, End: 63, Cells: []view.State{view.Fatal, view.Ready}, Counts: [view.NumStates]int{view.Ready: 60, view.Fatal: 4}}, true),
			[]string{`<span class="s-f">4 F</span>`}, []string{"60 R"}},
		{"node row", NodeTableRow(view.NodeRow{ID: "n<1>", Href: "/nodes/n%3C1%3E", Address: "10.0.0.9", MAC: "52-54-00-00-00-09", Capacity: 64, Range: "0-63",
			Ready: 60, Pending: 4, Status: "draining", Draining: true, Lease: view.Countdown{Deadline: now.Add(time.Minute), Now: now}, LastCheckin: view.Moment{At: now.Add(-3 * time.Second), Now: now}}, false),
			[]string{`<th scope="row"><a href="/nodes/n%3C1%3E">n&lt;1&gt;</a></th>`, "10.0.0.9", `<td class="n warn">4</td>`,
				"in 1 min", `tag-draining">draining`}, []string{"n<1>", "52-54-00-00-00-09"}},
		{"node row with netboot", NodeTableRow(view.NodeRow{ID: "n1", IP: "10.0.0.7", Address: "10.0.0.9", MAC: "52-54-00-00-00-09", Firmware: "uefi", BootStage: "checkin", Status: "live"}, true),
			[]string{"<td>52-54-00-00-00-09</td>", "<td>10.0.0.7</td>", "<td>uefi</td>", "<td>checkin</td>"}, []string{"10.0.0.9"}},
		{"simulated node row", NodeTableRow(view.NodeRow{ID: "sim-2", Href: "/nodes/sim-2", Status: "live"}, false),
			[]string{`<a href="/nodes/sim-2">sim-2</a>`, `class="tag tag-sim"`, ">simulated</span>"}, nil},
		{"simulated map group", MapGroup(view.MapGroup{NodeID: "sim-1", Href: "/nodes/sim-1", Start: 0, End: 0, Cells: []view.State{view.Ready}, Counts: counts(view.Ready)}, false),
			[]string{`<a href="/nodes/sim-1">sim-1</a>`, ">simulated</span>"}, nil},
		{"simulated node page", NodePage(view.Node{Page: page, Row: view.NodeRow{ID: "sim-3"}}),
			[]string{"Node sim-3", ">simulated</span>"}, nil},
		{"real node has no badge", NodePage(view.Node{Page: page, Row: view.NodeRow{ID: "lab-3"}}),
			[]string{"Node lab-3"}, []string{"tag-sim"}},
		{"login link page", LoginLinkPage(view.Page{Title: "Logged in", Refresh: "/"}),
			[]string{`<meta http-equiv="refresh" content="0;url=/">`, `<a href="/" id="continue">`}, []string{"Log out"}},
		{"empty fleet", EmptyFleet(), []string{"No nodes yet: here is how to boot one", "dpxe nodes add"}, nil},
		{"drain confirm", DrainConfirmPage(view.DrainConfirm{Page: page, NodeID: "n1", Drain: true, Range: "0-9", Count: 10, Leaving: 10, AllMoved: 10,
			Moves: []view.Move{{From: "n1", To: "n2", Range: "0-4", Count: 5}, {From: "n1", To: "n3", Range: "5-9", Count: 5}}}),
			[]string{"Drain n1?", `<td>0-4</td><td>5</td><td>n1</td><td><strong>n2</strong></td>`, "<strong>n3</strong>", `action="/nodes/n1/drain"`,
				`name="csrf" value="tok123"`, "stays pending", "never runs twice", "resumes on the new node"}, []string{"no owner", `name="strand"`, "Identify again"}},
		{"drain confirm strands", DrainConfirmPage(view.DrainConfirm{Page: page, NodeID: "n1", Drain: true, Range: "0-9", Count: 10, Leaving: 10, Strands: 10,
			Moves: []view.Move{{From: "n1", To: "", Range: "0-9", Count: 10}}, Refused: "Not drained: 10 shards would have no owner."}),
			[]string{"10 shards would have no owner:", `<strong>no owner</strong>`, `name="strand" value="yes"`, "required", `id="drain-refused"`}, nil},
		{"undrain confirm", DrainConfirmPage(view.DrainConfirm{Page: page, NodeID: "n1"}),
			[]string{"Undrain n1?", `action="/nodes/n1/undrain"`}, []string{"/drain\""}},
		{"node page offers restart", NodePage(view.Node{Page: page, Row: view.NodeRow{ID: "n1"}, Restartable: 2}),
			[]string{`<div id="node-actions" class="actions">`, `action="/nodes/n1/restart-fatal"`, `id="restart-fatal">Restart FATAL shards…</button>`, `id="drain"`}, nil},
		{"node page without FATAL shards", NodePage(view.Node{Page: page, Row: view.NodeRow{ID: "n1", Draining: true}}),
			[]string{`id="undrain"`}, []string{"restart-fatal"}},
		{"restart confirm", RestartConfirmPage(view.RestartConfirm{Page: page, NodeID: "n1", Live: true, Requested: 1, Shards: []view.ShardRow{
			{ID: 3, State: view.Fatal, CloseCode: 4004, CloseText: "authentication failed (fatal)", LastError: "gateway: close 4004", RestartRequested: true},
			{ID: 5, State: view.Fatal, CloseCode: 4014, CloseText: "disallowed intents (fatal)"}}}),
			[]string{"Restart the FATAL shards of n1?", "<strong>#3</strong> closed with 4004 authentication failed (fatal), last error: gateway: close 4004 <span",
				`<span class="tag tag-restart">restart requested</span>`, "<strong>#5</strong> closed with 4014", `action="/nodes/n1/restart-fatal"`,
				`name="csrf" value="tok123"`, `id="confirm">Restart 2 FATAL shards</button>`, "A restart of 1 shard of these is already requested",
				"session start from the daily budget", "forgets it"}, nil},
		{"restart confirm one", RestartConfirmPage(view.RestartConfirm{Page: page, NodeID: "n1", Live: true, Shards: []view.ShardRow{{ID: 3, State: view.Fatal}}}),
			[]string{`id="confirm">Restart 1 FATAL shard</button>`}, []string{"closed with", "already requested", "restart requested"}},
		{"restart confirm nothing", RestartConfirmPage(view.RestartConfirm{Page: page, NodeID: "n1", Live: true}),
			[]string{"reports no FATAL shard", `href="/nodes/n1"`}, []string{`id="confirm"`, "<form method=\"post\" action=\"/nodes"}},
		{"restart confirm not live", RestartConfirmPage(view.RestartConfirm{Page: page, NodeID: "n1", Shards: []view.ShardRow{{ID: 3, State: view.Fatal}}}),
			[]string{"n1 is not live"}, []string{`id="confirm"`}},
		{"boot off", BootPanel(view.Boot{Reason: "Netboot is not enabled."}), []string{"Netboot is not enabled."}, []string{"Boot timeline"}},
		{"boot timeline", BootPanel(view.Boot{Enabled: true, MAC: "52-54-00-00-00-01", LeaseIP: "10.0.0.5", LeaseEnd: "in 40 min",
			Steps: []view.BootStep{{At: "t1", Stage: "dhcp_offer"}, {At: "t2", Stage: "kernel_partial", Failed: true}}}),
			[]string{"52-54-00-00-00-01", "10.0.0.5, ends in 40 min", `<li class="failed">`, "failed here"}, nil},
		{"shard card", ShardCard(view.ShardRow{ID: 7, State: view.Backoff, Acks: 5, Misses: 1, Reconnects: 2, CloseCode: 4009, CloseText: "session timed out", LastError: "tls: reset"}),
			[]string{`class="shard s-b"`, "#7", "invalid", "4009 session timed out", "tls: reset"}, []string{"restart requested"}},
		{"shard card with delivery", ShardCard(view.ShardRow{ID: 9, State: view.Ready, Delivery: &view.ShardDelivery{Published: "1,234", AckedSeq: "1,230",
			InFlight: "4", Lost: "2", HasLost: true, Skipped: "0", Lag: "4", Lagging: true}}),
			[]string{`<div class="ev"><dt>Published</dt><dd>1,234</dd></div>`, `<dt>Acked seq</dt><dd>1,230</dd>`, `<dt>Lag</dt><dd class="warn">4</dd>`,
				`<dt>In flight</dt><dd>4</dd>`, `<dt>Lost</dt><dd class="bad">2</dd>`}, []string{"Skipped"}},
		{"shard card with delivery, no lag known", ShardCard(view.ShardRow{ID: 9, State: view.Ready, Delivery: &view.ShardDelivery{Published: "0", AckedSeq: "0",
			InFlight: "0", Lost: "0", Skipped: "12"}}),
			[]string{`<dt>Acked seq</dt><dd>0</dd>`, `<dt>Lost</dt><dd>0</dd>`, `<dt>Skipped</dt><dd>12</dd>`}, []string{"Lag", `class="bad"`}},
		{"shard card without delivery", ShardCard(view.ShardRow{ID: 9, State: view.Ready}), []string{"#9"}, []string{"Published", "Acked seq", "In flight", "Lost"}},
		{"node delivery", NodeDelivery(&view.NodeDelivery{Published: "12,000", InFlight: "3", Lost: "0", Skipped: "5", Rate: "12.5", Window: "10 s"}, nil),
			[]string{`<h3 id="delivery-h">Event delivery</h3>`, `id="node-delivery"`, "12.5 events/s <span class=\"muted\">over 10 s</span>",
				"<dt>Published</dt><dd>12,000</dd>", "<dt>Lost (oversize or no room)</dt><dd>0</dd>", "counts both together"}, []string{"next check-in"}},
		{"node delivery, rate unknown", NodeDelivery(&view.NodeDelivery{Published: "12", InFlight: "0", Lost: "1", HasLost: true, Skipped: "0"}, nil),
			[]string{"known after the next check-in", `<dd class="bad">1</dd>`}, []string{"events/s"}},
		{"node delivery off", NodeDelivery(nil, nil), nil, []string{"Event delivery", "<dl"}},
		{"broker down, nothing published", NodeDelivery(nil, &view.Broker{State: "down", Connects: "3", Drops: "3", Refused: "1"}),
			[]string{`id="node-broker"`, `<span class="tag tag-expired">down</span>`, "3 connects, 3 drops, 1 refused", "permission refusals"}, []string{"Publish rate", "Summed over"}},
		{"broker up", NodeDelivery(&view.NodeDelivery{InFlight: "0"}, &view.Broker{State: "up", Up: true, Connects: "1", Drops: "0", Refused: "0"}),
			[]string{`<span class="tag tag-live">up</span>`, "Publish rate"}, []string{"tag-expired"}},
		{"node row, broker down", NodeTableRow(view.NodeRow{ID: "n1", Status: "live", Broker: &view.Broker{State: "down"}}, false),
			[]string{`<span class="tag tag-expired">broker down</span></td>`}, []string{"<br"}},
		{"node row, broker up", NodeTableRow(view.NodeRow{ID: "n1", Status: "live", Broker: &view.Broker{State: "up", Up: true}}, false), nil, []string{"broker"}},
		{"node row with delivery", NodeTableRow(view.NodeRow{ID: "n1", Status: "live", Delivery: &view.NodeDelivery{Rate: "1,250", InFlight: "7"}}, false),
			[]string{"1,250", "<small>7 in flight</small>"}, nil},
		{"node row with delivery, nothing in flight, rate unknown", NodeTableRow(view.NodeRow{ID: "n1", Status: "live", Delivery: &view.NodeDelivery{InFlight: "0"}}, false),
			[]string{`<span class="muted">new</span>`}, []string{"in flight"}},
		{"node row without delivery", NodeTableRow(view.NodeRow{ID: "n1", Status: "live"}, false), nil, []string{"in flight", ">new<"}},
		{"shard card restart requested", ShardCard(view.ShardRow{ID: 3, State: view.Fatal, RestartRequested: true}),
			[]string{`class="shard s-f"`, `<span class="tag tag-restart">restart requested</span>`}, nil},
		{"discovered disabled", DiscoveredPage(view.Discovered{Page: page, Reason: "Netboot is not enabled here.",
			Rows: []view.DiscoveredRow{{MAC: "52-54-00-00-00-02", Suggested: "node-000002"}}}),
			[]string{"Netboot is not enabled here.", "disabled", `for="name-52-54-00-00-00-02"`}, nil},
		{"discovered enabled", DiscoveredPage(view.Discovered{Page: page, Enabled: true,
			Rows: []view.DiscoveredRow{{MAC: "52-54-00-00-00-02", Suggested: "node-000002"}}}),
			[]string{`action="/discovered/52-54-00-00-00-02/approve"`, `value="node-000002"`, `action="/discovered/52-54-00-00-00-02/ignore"`}, []string{"disabled"}},
		{"discovered empty", DiscoveredPage(view.Discovered{Page: page, Enabled: true}), []string{"No unknown machine has asked to boot"}, nil},
		{"route no owner", RouteResult(view.Route{GuildID: "1", Shard: 0, Total: 16}), []string{"no live node holds this shard"}, nil},
		{"events filter", EventsPage(view.Events{Page: page, Kind: "drain", Kinds: []string{"drain", "undrain"}, Nodes: []string{"n1"},
			Rows: []view.EventRow{{ID: 3, At: "t", Kind: "drain", NodeID: "n1"}}, Older: "/events?before=3"}),
			[]string{`<option value="drain" selected>`, `<label for="f-node">Node</label>`, `href="/nodes/n1"`, `href="/events?before=3"`,
				`<div id="event-list">`, `<tr id="ev-3">`}, nil},
		{"event list, live part", EventList(view.Events{Rows: []view.EventRow{{ID: 7, At: "2026-11-29 12:00:00Z", Kind: "drain",
			When: view.Moment{At: now, Now: now.Add(time.Minute), Stable: true}}}}),
			[]string{`<div id="event-list">`, `<time datetime="2026-11-29T12:00:00.000Z">2026-11-29 12:00:00Z</time>`,
				`<time class="ago" datetime="2026-11-29T12:00:00.000Z">at 12:00:00Z</time>`}, []string{" ago<", "Older events", "<form"}},
		{"event list, page", EventList(view.Events{Rows: []view.EventRow{{ID: 7, At: "2026-11-29 12:00:00Z", Kind: "drain",
			When: view.Moment{At: now, Now: now.Add(time.Minute)}}}}),
			[]string{">1 min ago</time>"}, nil},
		{"event list empty", EventList(view.Events{Node: "n9"}), []string{`<div id="event-list"><p class="muted">No events match.</p></div>`}, []string{"<table"}},
		{"login", LoginPage(view.Login{Page: view.Page{Title: "Log in", CSRF: "lc"}, Next: "/nodes"}),
			[]string{`<label for="secret">`, `type="password"`, `name="next" value="/nodes"`, `value="lc"`}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			html := render(t, tc.comp)
			for _, h := range tc.has {
				if !strings.Contains(html, h) {
					t.Errorf("missing %q in\n%s", h, html)
				}
			}
			for _, h := range tc.hasnt {
				if strings.Contains(html, h) {
					t.Errorf("unexpected %q in\n%s", h, html)
				}
			}
		})
	}
}

func counts(states ...view.State) (c [view.NumStates]int) {
	for _, s := range states {
		c[s]++
	}
	return c
}

// TestCellsMatchesStates checks the fast cell writer against the state
// table for every state.
func TestCellsMatchesStates(t *testing.T) {
	var all []view.State
	var want strings.Builder
	for s := view.State(0); s < view.NumStates; s++ {
		all = append(all, s)
		want.WriteString(`<i class=` + s.Class() + `>` + s.Letter() + `</i>`)
	}
	if got := render(t, Cells(all)); got != want.String() {
		t.Fatalf("Cells:\n got %s\nwant %s", got, want.String())
	}
}

func TestNodeShardsStatusLine(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	html := render(t, NodeShards(view.Node{StatusAt: view.Moment{At: now.Add(-time.Second), Now: now},
		Shards: []view.ShardRow{{ID: 1, State: view.Ready}}, Counts: [view.NumStates]int{view.Ready: 1}}))
	if !strings.Contains(html, `Status reported <time class="ago" datetime="2026-11-29T11:59:59.000Z">1 s ago</time>`) {
		t.Fatalf("status line:\n%s", html)
	}
	html = render(t, NodeShards(view.Node{Shards: []view.ShardRow{{ID: 1, State: view.Held}}}))
	if !strings.Contains(html, "reports counts only") {
		t.Fatalf("no per-shard status:\n%s", html)
	}
}
