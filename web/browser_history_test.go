package web

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/history"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// TestBrowserHistoryWithoutJavaScript: in headless Chromium with
// JavaScript turned off from the start, an operator logs in and sees the
// fleet page's two history charts drawn (the SVG and its paths have a
// size), labelled by their title and description, the latency panel with
// its numbers, and opens the hourly table; the node page shows each
// shard's ping and the latency map draws a cell per shard. Screenshots go
// to $DPXE_ARTIFACTS; DPXE_UPDATE_SCREENSHOTS=1 copies the history panel
// to docs/screenshots/history.png.
func TestBrowserHistoryWithoutJavaScript(t *testing.T) {
	ctx := newBrowser(t)
	f := newTestFleet(t, fleetOpts{total: 256, maxConc: 4})
	ids := []string{"node-a", "node-b"}
	f.addNodes(128, ids...)
	f.mu.Lock()
	f.state["200"] = appliance.ShardFatal
	f.mu.Unlock()
	f.settle(ids...)
	f.reportPings("node-a", func(s uint32) float64 { return 30 + float64(s%40) })
	f.reportPings("node-b", func(s uint32) float64 { return 180 + float64(s%200) })
	// A day of minutes: steady, with an hour of trouble six hours ago.
	bctx := context.Background()
	now := time.Now()
	for m := 24*60 - 1; m >= 1; m-- {
		h := store.HistorySample{At: now.Add(-time.Duration(m) * time.Minute), Ready: 255, Fatal: 1, PingCount: 255,
			PingP50: 90, PingP90: 240, PingP99: 360, PingMax: 380}
		if m > 6*60 && m < 7*60 {
			h.Ready, h.Backoff, h.PingP99 = 192, 63, 1800
		}
		if err := f.store.AddHistory(bctx, h); err != nil {
			t.Fatal(err)
		}
	}
	if err := (&history.Sampler{Stats: f.ctrl.FleetStats, Store: f.store}).Once(bctx); err != nil {
		t.Fatal(err)
	}
	base := f.srv.URL
	out := artifactDir(t)

	steps(t, ctx, "turning JavaScript off", chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := cdp.Call(ctx, tg, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: true})
		return err
	}), chromedp.Navigate(base+"/"))
	waitJS(t, ctx, "the login form", byID("secret"))
	steps(t, ctx, "log in", chromedp.SendKeys(chromedp.ID("secret"), testToken), chromedp.Submit(chromedp.ID("secret")))
	waitJS(t, ctx, "the nodes page", byID("live-status"))
	steps(t, ctx, "the fleet page", chromedp.Navigate(base+"/"))
	waitJS(t, ctx, "the history panel", byID("history"))
	if text := evalJS[string](t, ctx, `document.getElementById('live-status').textContent`); !strings.Contains(text, "need JavaScript") {
		t.Fatalf("the page script ran although JavaScript is off: %q", text)
	}
	for _, id := range []string{"chart-states", "chart-ping"} {
		sel := `document.querySelector('#` + id + ` svg')`
		if w := evalJS[float64](t, ctx, sel+`.getBoundingClientRect().width`); w < 400 {
			t.Errorf("%s is %v px wide", id, w)
		}
		if h := evalJS[float64](t, ctx, sel+`.getBoundingClientRect().height`); h < 80 {
			t.Errorf("%s is %v px high", id, h)
		}
		// Every path is drawn with a size, none empty.
		if n := evalJS[int](t, ctx, `[...`+sel+`.querySelectorAll('path')].filter(p => { const b = p.getBBox(); return b.width > 100 && b.height >= 0 }).length`); n < 2 {
			t.Errorf("%s has %d drawn paths", id, n)
		}
		label := evalJS[string](t, ctx, `(() => { const s = `+sel+`; return s.getAttribute('aria-labelledby').split(' ').map(i => document.getElementById(i).textContent).join(' | ') })()`)
		if !strings.Contains(label, "Highest p99 1.80 s") && !strings.Contains(label, "Worst minute") {
			t.Errorf("%s is labelled %q", id, label)
		}
	}
	if v := evalJS[string](t, ctx, `document.querySelector('#latency dl').innerText`); !strings.Contains(v, "p50") || !strings.Contains(v, " ms") {
		t.Errorf("latency panel: %q", v)
	}
	// The table fallback opens without a script.
	if open := evalJS[bool](t, ctx, `document.getElementById('history-table').open`); open {
		t.Fatal("the hourly table starts open")
	}
	steps(t, ctx, "open the hourly table", chromedp.Click(chromedp.CSS("#history-table summary")))
	waitJS(t, ctx, "the hourly table open", `document.getElementById('history-table').open && document.querySelector('#history-table tbody tr').getBoundingClientRect().height > 0`)
	if n := evalJS[int](t, ctx, `document.querySelectorAll('#history-table tbody tr').length`); n < 23 {
		t.Errorf("the hourly table has %d rows", n)
	}
	steps(t, ctx, "scroll to the history", chromedp.ScrollIntoView(chromedp.ID("history")))
	shot := filepath.Join(out, "history.png")
	sctx, cancel := context.WithTimeout(ctx, browserWait)
	png, err := chromedp.Run(sctx, chromedp.Screenshot(chromedp.ID("history")))
	cancel()
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	if os.Getenv("DPXE_UPDATE_SCREENSHOTS") == "1" {
		if err := os.WriteFile("../docs/screenshots/history.png", png, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	steps(t, ctx, "the node page", chromedp.Navigate(base+"/nodes/node-b"))
	waitJS(t, ctx, "the node's latency", byID("node-latency"))
	if n := evalJS[int](t, ctx, `[...document.querySelectorAll('#node-shards .shard .lat')].filter(e => /\d+ ms/.test(e.textContent) && e.title.endsWith(' ms')).length`); n != 127 {
		t.Errorf("%d shard cards show a ping, want 127 (one of 128 is FATAL)", n)
	}
	steps(t, ctx, "the latency map", chromedp.Navigate(base+"/latency"))
	waitJS(t, ctx, "the latency map", byID("latency-map"))
	if n := evalJS[int](t, ctx, `document.querySelectorAll('#latency-map .lcells i[title]').length`); n != 256 {
		t.Errorf("latency map has %d cells with a title, want 256", n)
	}
	if w := evalJS[float64](t, ctx, `document.querySelector('#latency-map .lcells i').getBoundingClientRect().width`); w < 8 {
		t.Errorf("latency cells are %v px wide", w)
	}
	screenshot(t, ctx, filepath.Join(out, "latency.png"))
}
