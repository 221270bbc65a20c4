package web

import (
	"errors"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/web/view"
)

// TestEveryShardStateMapped: every state a node can report maps to a view
// state on purpose (a state added to appliance.ShardStates without a case
// in viewState fails here), each view state is reached by exactly the
// facts meant for it, and a state nobody knows is flagged.
func TestEveryShardStateMapped(t *testing.T) {
	want := map[appliance.ShardState]view.State{
		appliance.ShardAssigned: view.Held, appliance.ShardStarting: view.Starting, appliance.ShardReady: view.Ready,
		appliance.ShardBackoff: view.Backoff, appliance.ShardFatal: view.Fatal,
	}
	for _, s := range appliance.ShardStates {
		v, ok := viewState(s)
		if !ok {
			t.Errorf("shard state %s has no view state: add it to viewState", s)
			continue
		}
		if w, listed := want[s]; !listed || v != w {
			t.Errorf("shard state %s shows as %s, want %s", s, v.Name(), w.Name())
		}
	}
	if len(want) != len(appliance.ShardStates) {
		t.Errorf("this test lists %d states, appliance has %d", len(want), len(appliance.ShardStates))
	}
	if v, ok := viewState(""); !ok || v != view.Held {
		t.Errorf("no per-shard status shows as %s (%v), want ASSIGNED", v.Name(), ok)
	}
	if _, ok := viewState("ZOMBIE"); ok {
		t.Error("an unknown state counts as mapped")
	}
	for _, tc := range []struct {
		f    controller.ShardFact
		want view.State
	}{
		{controller.NewShardFact(false, ""), view.Pending},
		{controller.NewShardFact(false, appliance.ShardReady), view.Pending},
		{controller.NewShardFact(true, ""), view.Held},
		{controller.NewShardFact(true, appliance.ShardFatal), view.Fatal},
	} {
		if got := stateOfFact(tc.f); got != tc.want {
			t.Errorf("fact %+v shows as %s, want %s", tc.f, got.Name(), tc.want.Name())
		}
	}
}

func TestMapBlockSize(t *testing.T) {
	for _, tc := range []struct{ total, want uint32 }{
		{1, 1}, {2048, 1}, {4096, 1}, {4097, 2}, {8192, 2}, {16384, 4}, {131072, 32},
	} {
		if got := mapBlockSize(tc.total); got != tc.want {
			t.Errorf("mapBlockSize(%d) = %d, want %d", tc.total, got, tc.want)
		}
	}
}

// ready is the fact of a held shard reported READY.
var ready = controller.NewShardFact(true, appliance.ShardReady)

// mapOf makes a shard map of total shards with the given groups, every
// grouped shard held and READY, the rest unowned, then applies overrides.
func mapOf(total uint32, groups []controller.ShardGroup, set map[uint32]controller.ShardFact) controller.ShardMapView {
	m := controller.ShardMapView{Total: total, Groups: groups, Shards: make([]controller.ShardFact, total)}
	for _, g := range groups {
		for s := g.Start; s < g.Start+g.Count; s++ {
			m.Shards[s] = ready
		}
	}
	for s, f := range set {
		m.Shards[s] = f
	}
	return m
}

func TestBuildShardMap(t *testing.T) {
	now := time.Now()
	t.Run("one cell per shard with gaps", func(t *testing.T) {
		m := BuildShardMap(mapOf(10, []controller.ShardGroup{{NodeID: "b", Start: 2, Count: 3}, {NodeID: "a", Start: 5, Count: 2, Draining: true}},
			map[uint32]controller.ShardFact{3: {Held: false}}), now)
		if m.BlockSize != 1 {
			t.Fatalf("block size %d", m.BlockSize)
		}
		var got []string
		for _, g := range m.Groups {
			var b strings.Builder
			for _, c := range g.Cells {
				b.WriteString(c.Letter())
			}
			got = append(got, g.NodeID+":"+b.String())
		}
		want := []string{":UU", "b:RPR", "a:RR", ":UUU"}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("groups %v, want %v", got, want)
		}
		if !m.Groups[2].Draining || m.Groups[1].Href != "/nodes/b" || m.Groups[1].End != 4 || m.Groups[1].Range != "2-4" {
			t.Fatalf("group fields: %+v", m.Groups[1:3])
		}
		if m.Counts[view.Ready] != 4 || m.Counts[view.Pending] != 1 || m.Counts[view.Unowned] != 5 {
			t.Fatalf("counts %v", m.Counts)
		}
	})
	t.Run("131072 shards aggregate to the worst state per block", func(t *testing.T) {
		const total = 131072
		var groups []controller.ShardGroup
		per := uint32(128)
		for i := uint32(0); i < 1000; i++ {
			groups = append(groups, controller.ShardGroup{NodeID: "n" + string(rune('a'+i%26)), Start: i * per, Count: per})
		}
		m := BuildShardMap(mapOf(total, groups, map[uint32]controller.ShardFact{
			33: controller.NewShardFact(true, appliance.ShardStarting), 40: controller.NewShardFact(true, appliance.ShardFatal),
			41: controller.NewShardFact(true, appliance.ShardBackoff)}), now)
		if m.BlockSize != 32 {
			t.Fatalf("block size %d", m.BlockSize)
		}
		cells := 0
		for _, g := range m.Groups {
			cells += len(g.Cells)
		}
		if cells > MaxMapCells+len(m.Groups) {
			t.Fatalf("%d cells for %d groups", cells, len(m.Groups))
		}
		// Shards 32..63 form block 1 of the first group: FATAL wins.
		if g := m.Groups[0]; g.Cells[0] != view.Ready || g.Cells[1] != view.Fatal || g.Counts[view.Starting] != 1 {
			t.Fatalf("first group cells %v counts %v", g.Cells, g.Counts)
		}
		last := m.Groups[len(m.Groups)-1]
		if last.NodeID != "" || last.Start != 128000 || last.End != total-1 || last.Counts[view.Unowned] != 3072 {
			t.Fatalf("unowned tail %+v", last.Counts)
		}
		sum := 0
		for _, n := range m.Counts {
			sum += n
		}
		if sum != total {
			t.Fatalf("counts add up to %d", sum)
		}
	})
}

// The confirmation words the controller's preview: every move with its
// range, and the counts as the controller gave them (the policy itself is
// tested in fleet/controller, TestDrainPreviewIsThePlan).
func TestBuildDrainConfirm(t *testing.T) {
	p := controller.DrainPreview{NodeID: "a", Live: true, RangeStart: 0, RangeCount: 8, Leaving: 8, Moved: 16, Strands: 8,
		Moves: []controller.ShardMove{{From: "a", To: "b", Start: 0, Count: 8}, {From: "b", To: "", Start: 8, Count: 8}}}
	moves, leaving, strands, all := BuildDrainConfirm(p)
	want := []view.Move{{From: "a", To: "b", Range: "0-7", Count: 8}, {From: "b", To: "", Range: "8-15", Count: 8}}
	if !slices.Equal(moves, want) || leaving != 8 || strands != 8 || all != 16 {
		t.Fatalf("moves %+v leaving %d strands %d all %d", moves, leaving, strands, all)
	}
}

func TestSortRows(t *testing.T) {
	now := time.Now()
	rows := []view.NodeRow{
		{ID: "b", Pending: 2, Lease: view.Countdown{Deadline: now.Add(time.Second)}, Capacity: 8},
		{ID: "a", Pending: 2, Lease: view.Countdown{Deadline: now.Add(time.Minute)}, Capacity: 16},
		{ID: "c", Pending: 0, Capacity: 4},
	}
	for _, tc := range []struct {
		key  string
		desc bool
		want string
	}{
		{"id", false, "abc"}, {"id", true, "cba"}, {"pending", true, "abc"}, {"pending", false, "cab"},
		{"lease", false, "cba"}, {"capacity", true, "abc"},
	} {
		sortRows(rows, tc.key, tc.desc)
		var got string
		for _, r := range rows {
			got += r.ID
		}
		if got != tc.want {
			t.Errorf("sort %s desc=%v: %s, want %s", tc.key, tc.desc, got, tc.want)
		}
	}
	cols := BuildColumns("lease", false, true)
	for _, c := range cols {
		if c.Key == "lease" && (c.Sort != "ascending" || c.Href != "/nodes?sort=lease&dir=desc") {
			t.Errorf("active column %+v", c)
		}
		if c.Key == "id" && c.Sort != "none" {
			t.Errorf("inactive column %+v", c)
		}
	}
}

func TestBuildIdentify(t *testing.T) {
	now := time.Now()
	acts := make([]controller.BucketActivity, 64)
	acts[0].Granted, acts[5].Refused, acts[63].Granted = 4, 2, 1
	acts[63].LastGrant = now.Add(-3 * time.Second)
	v := BuildIdentify(acts, 10*time.Minute, now)
	if len(v.Bars) != maxBucketRows || v.Bars[0].Label != "0-3" || v.Bars[15].Label != "60-63" {
		t.Fatalf("bars %+v", v.Bars)
	}
	if v.Granted != 5 || v.Refused != 2 || v.Bars[0].Width != 100 || v.Bars[1].Width != 50 || v.Bars[15].LastGrant.Text() != "3 s ago" || v.Bars[2].LastGrant.Text() != "never" {
		t.Fatalf("identify %+v", v)
	}
	v = BuildIdentify(acts[:3], 5*time.Minute, now)
	if len(v.Bars) != 3 || v.Bars[1].Label != "1" || v.Minutes != 5 {
		t.Fatalf("few buckets %+v", v.Bars)
	}
}

func TestPasswords(t *testing.T) {
	h, err := HashPassword("a long enough secret")
	if err != nil {
		t.Fatal(err)
	}
	h2, _ := HashPassword("a long enough secret")
	if h == h2 || !strings.HasPrefix(h, "pbkdf2-sha256$") {
		t.Fatalf("hashes %q %q: want salted pbkdf2", h, h2)
	}
	if err := CheckPassword(h, "a long enough secret"); err != nil {
		t.Fatal(err)
	}
	if err := CheckPassword(h, "a long enough secreT"); !errors.Is(err, ErrBadPassword) {
		t.Fatalf("wrong password: %v", err)
	}
	for _, bad := range []string{"", "md5$1$x$y", "pbkdf2-sha256$0$AA$AA", "pbkdf2-sha256$10$!!$AA"} {
		if err := CheckPassword(bad, "x"); !errors.Is(err, ErrPasswordFormat) {
			t.Errorf("CheckPassword(%q): %v", bad, err)
		}
	}
	if _, err := HashPassword("short"); err == nil {
		t.Fatal("short password accepted")
	}
}

func TestSafeNextAndTopics(t *testing.T) {
	for in, want := range map[string]string{"/nodes": "/nodes", "": "/", "//evil.example": "/", "https://evil.example": "/", "/\\evil": "/"} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
	for q, ok := range map[string]bool{"topic=fleet": true, "topic=nodes&sort=lease": true, "topic=node&id=a": true, "topic=node": false, "topic=x": false} {
		vals, _ := urlValues(q)
		if _, got := topicKey(vals); got != ok {
			t.Errorf("topicKey(%s) ok=%v", q, got)
		}
	}
	if suggestName("52-54-00-AB-CD-EF") != "node-abcdef" {
		t.Error(suggestName("52-54-00-AB-CD-EF"))
	}
}

func TestSpanAndCountdown(t *testing.T) {
	now := time.Now()
	for d, want := range map[time.Duration]string{500 * time.Millisecond: "500 ms", 23 * time.Second: "23 s",
		5 * time.Minute: "5 min", 3*time.Hour + 5*time.Minute: "3 h 5 min", 50 * time.Hour: "2 d 2 h"} {
		if got := view.Span(d); got != want {
			t.Errorf("Span(%v) = %q, want %q", d, got, want)
		}
	}
	if view.Ago(now, time.Time{}) != "never" || (view.Countdown{Deadline: now.Add(-time.Second), Now: now}).Text() != "expired" {
		t.Error("never/expired")
	}
}

func urlValues(q string) (map[string][]string, error) { return url.ParseQuery(q) }

func TestPageOf(t *testing.T) {
	rows := make([]view.NodeRow, NodesPerPage*2+7)
	for _, tc := range []struct {
		q              string
		n, pages, size int
	}{
		{"", 1, 3, NodesPerPage}, {"page=2", 2, 3, NodesPerPage}, {"page=3", 3, 3, 7}, {"page=99", 3, 3, 7}, {"page=x", 1, 3, NodesPerPage},
	} {
		q, _ := url.ParseQuery(tc.q)
		got, n, pages := pageOf(rows, q)
		if n != tc.n || pages != tc.pages || len(got) != tc.size {
			t.Errorf("pageOf(%q) = %d rows, page %d of %d; want %d, %d of %d", tc.q, len(got), n, pages, tc.size, tc.n, tc.pages)
		}
	}
	if got, n, pages := pageOf(nil, url.Values{}); len(got) != 0 || n != 1 || pages != 1 {
		t.Errorf("empty: %d rows, page %d of %d", len(got), n, pages)
	}
}
