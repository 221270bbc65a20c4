package web

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/discord-pxe/dpxe/appliance"
)

// identifyOverflow lists the rows of the Identify activity table whose
// Granted cell (the bar and its number) runs past its own content box or
// into the Refused cell's text: "" when none does. It measures rendered
// boxes, so it sees what a reader sees whatever the CSS does.
const identifyOverflow = `(() => {
	const out = [];
	const contents = el => { const r = document.createRange(); r.selectNodeContents(el); return r.getBoundingClientRect(); };
	for (const tr of document.querySelectorAll('#identify tbody tr')) {
		const granted = tr.cells[1], refused = tr.cells[2];
		const g = contents(granted), r = contents(refused), cell = granted.getBoundingClientRect();
		const inner = cell.right - parseFloat(getComputedStyle(granted).paddingRight);
		if (g.right > inner + 0.5 || g.right > r.left - 1) {
			out.push('bucket ' + tr.cells[0].textContent + ': Granted content ends at x=' + g.right.toFixed(1) +
				', the cell content box at ' + inner.toFixed(1) + ', Refused text starts at ' + r.left.toFixed(1));
		}
	}
	return out.join('\n');
})()`

// badgeCovers lists the page content under the live-updates status, in
// the viewport as it is scrolled now: every visible element in main that
// draws text or has no children (a map cell, a bar) and whose box meets
// the status's box. "" when the status covers nothing (or is absent).
const badgeCovers = `(() => {
	const badge = document.getElementById('live-status');
	if (!badge) return '';
	const b = badge.getBoundingClientRect();
	if (b.width === 0 || b.height === 0) return '';
	const out = [];
	for (const el of document.querySelectorAll('main *')) {
		const leaf = el.children.length === 0 || Array.from(el.childNodes).some(n => n.nodeType === 3 && n.textContent.trim() !== '');
		if (!leaf) continue;
		const r = el.getBoundingClientRect();
		if (r.width === 0 || r.height === 0) continue;
		if (r.right <= b.left || r.left >= b.right || r.bottom <= b.top || r.top >= b.bottom) continue;
		out.push(el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') + (el.className ? '.' + el.className : '') +
			' "' + el.textContent.trim().slice(0, 30) + '"');
		if (out.length === 5) break;
	}
	return out.join('\n');
})()`

// TestBrowserLayout measures, in headless Chromium, the two overlaps a
// look at make run showed: the Identify activity table's Granted bar and
// number running into the Refused column, and the floating "Live updates"
// status covering page content. It checks the fleet page (with Identify
// grants and refusals in several buckets) at desktop and phone width, at
// the top and at the bottom of the page, and the node and events pages.
func TestBrowserLayout(t *testing.T) {
	ctx := newBrowser(t)
	f, ids := browserFleet(t, 4)
	grantIdentifies(t, f, 3)
	base := f.srv.URL
	out := artifactDir(t)

	logIn(t, ctx, base+"/")
	waitJS(t, ctx, "the Identify table", `document.querySelector('#identify tbody tr')`)
	waitJS(t, ctx, "live connection", `document.getElementById('live-status').textContent.includes('connected')`)
	if rows := evalJS[int](t, ctx, `document.querySelectorAll('#identify tbody tr').length`); rows != 4 {
		t.Fatalf("Identify table has %d rows, want one per bucket (4)", rows)
	}

	for _, width := range []int{1280, 390} {
		steps(t, ctx, fmt.Sprintf("width %d", width), chromedp.EmulateViewport(int64(width), 900), chromedp.Navigate(base+"/"))
		waitJS(t, ctx, "the fleet page", `document.querySelector('#identify tbody tr') && document.getElementById('live-status').textContent.includes('connected')`)
		if w := evalJS[int](t, ctx, `document.documentElement.scrollWidth`); w > width {
			t.Errorf("at width %d the fleet page is %d px wide (scrolls sideways)", width, w)
		}
		if bad := evalJS[string](t, ctx, identifyOverflow); bad != "" {
			screenshot(t, ctx, filepath.Join(out, fmt.Sprintf("layout-identify-%d.png", width)))
			t.Errorf("at width %d the Identify table's Granted column runs into Refused:\n%s", width, bad)
		}
		for _, at := range []string{"top", "bottom"} {
			if at == "bottom" {
				evalJS[int](t, ctx, `(window.scrollTo(0, document.documentElement.scrollHeight), window.scrollY)`)
			}
			if bad := evalJS[string](t, ctx, badgeCovers); bad != "" {
				screenshot(t, ctx, filepath.Join(out, fmt.Sprintf("layout-badge-%d-%s.png", width, at)))
				t.Errorf("at width %d, scrolled to the %s, the live-updates status covers:\n%s", width, at, bad)
			}
		}
	}
	for _, path := range []string{"/nodes/" + ids[0], "/nodes", "/events"} {
		steps(t, ctx, path, chromedp.EmulateViewport(1280, 900), chromedp.Navigate(base+path))
		waitJS(t, ctx, "the page", `document.querySelector('main h1')`)
		for _, scroll := range []string{`0`, `document.documentElement.scrollHeight`} {
			evalJS[int](t, ctx, `(window.scrollTo(0, `+scroll+`), window.scrollY)`)
			if bad := evalJS[string](t, ctx, badgeCovers); bad != "" {
				t.Errorf("on %s the live-updates status covers:\n%s", path, bad)
			}
		}
	}
}

// grantIdentifies has each of the fleet's Identify buckets granted n
// times, waiting out each refusal for as long as the controller asks
// (its retry_after_ms), so the Identify panel shows grants and
// refusals in every bucket.
func grantIdentifies(t *testing.T, f *testFleet, n int) {
	t.Helper()
	ctx := context.Background()
	mc := f.ctrl.Config().MaxConcurrency
	owner := func(s uint32) string {
		for _, v := range f.ctrl.Nodes() {
			if v.Live && s >= v.RangeStart && s-v.RangeStart < v.RangeCount {
				return v.ID
			}
		}
		t.Fatalf("shard %d has no owner", s)
		return ""
	}
	deadline := time.Now().Add(browserWait)
	for b := uint32(0); b < mc; b++ {
		for granted := 0; granted < n; {
			if time.Now().After(deadline) {
				t.Fatalf("bucket %d: %d of %d grants before the deadline", b, granted, n)
			}
			s := b + mc*uint32(granted) // a shard of bucket b
			resp, err := f.ctrl.Identify(ctx, appliance.IdentifyRequest{NodeID: owner(s), ShardID: s})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Granted {
				granted++
				// Claim again at once: refused, the bucket is busy.
				if again, err := f.ctrl.Identify(ctx, appliance.IdentifyRequest{NodeID: owner(s), ShardID: s}); err != nil || again.Granted {
					t.Fatalf("bucket %d: a second claim within the window: %+v, %v", b, again, err)
				}
				continue
			}
			<-time.After(time.Duration(resp.RetryAfterMS) * time.Millisecond)
		}
	}
	if err := f.ctrl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}
