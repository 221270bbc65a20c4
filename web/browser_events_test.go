package web

import (
	"context"
	"testing"
	"time"
)

// TestBrowserLiveEvents: the events page, open in headless Chromium and
// never reloaded, shows a drain done elsewhere as a new first row, with
// its time counted as "… ago" by the page script; the filter holds (a
// drain of another node does not appear).
func TestBrowserLiveEvents(t *testing.T) {
	ctx := newBrowser(t)
	f := newTestFleet(t, fleetOpts{total: 64, maxConc: 4, liveEvery: 100 * time.Millisecond})
	ids := []string{"node-a", "node-b", "node-c"}
	f.addNodes(32, ids...)
	f.settle(ids...)
	base := f.srv.URL

	logIn(t, ctx, base+"/events?node=node-c")
	waitJS(t, ctx, "node-c's events, live", `document.querySelector('#event-list table.events') && document.getElementById('live-status').textContent.includes('connected')`)
	evalJS[int](t, ctx, `window.__noReload = 5`)
	rowsBefore := evalJS[int](t, ctx, `document.querySelectorAll('#event-list tbody tr').length`)

	for _, id := range []string{"node-b", "node-c"} {
		if err := f.ctrl.SetDraining(context.Background(), id, true); err != nil {
			t.Fatal(err)
		}
	}
	const firstRow = `document.querySelector('#event-list tbody tr')`
	waitJS(t, ctx, "node-c's drain as the first row", firstRow+` && `+firstRow+`.querySelector('.kind').textContent === 'drain'`)
	if m := evalJS[int](t, ctx, `window.__noReload || 0`); m != 5 {
		t.Fatal("the events page reloaded; live updates should have changed it in place")
	}
	if n := evalJS[int](t, ctx, `document.querySelectorAll('#event-list tbody tr').length`); n != rowsBefore+1 {
		t.Fatalf("%d rows after node-c's drain, want %d (one more; node-b's drain is outside the filter)", n, rowsBefore+1)
	}
	if nodes := evalJS[string](t, ctx, `Array.from(document.querySelectorAll('#event-list tbody a')).map(a => a.textContent).join(' ')`); nodes == "" ||
		evalJS[bool](t, ctx, `document.querySelector('#event-list').textContent.includes('node-b')`) {
		t.Fatalf("rows of other nodes on node-c's events page: %q", nodes)
	}
	waitJS(t, ctx, "the new row's time counted by the script", firstRow+`.querySelector('time.ago').textContent.match(/ago$|just now/)`)
}
