package web

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/controller"
)

// TestLiveEvents: the newest page of the events page is live, through the
// same /live stream as the other pages. Its filter is the topic: a drain
// of node-c reaches the stream of "drain events of node-c" as a new
// event-list part, and a drain of node-b, outside the filter, never shows
// there. An older page is not live; a live stream with an unknown kind is
// refused.
func TestLiveEvents(t *testing.T) {
	f := seeded(t, nil)
	c := f.client()
	f.login(c, testToken)

	_, page := get(t, c, f.srv.URL+"/events?node=node-c&kind=drain")
	const liveURL = "/live?kind=drain&amp;node=node-c&amp;topic=events"
	if !strings.Contains(page, `data-live="`+liveURL+`"`) || !strings.Contains(page, `<div id="event-list">`) {
		t.Fatalf("the events page is not live on its filter (want data-live=%q):\n%.1500s", liveURL, page)
	}
	if _, older := get(t, c, f.srv.URL+"/events?before=5"); strings.Contains(older, `data-live="/live`) {
		t.Fatal("a page of older events subscribes to live updates; nothing new lands there")
	}
	if code, _ := get(t, c, f.srv.URL+"/live?topic=events&kind=nonsense"); code != http.StatusBadRequest {
		t.Fatalf("live events of an unknown kind: %d, want 400", code)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", f.srv.URL+strings.ReplaceAll(liveURL, "&amp;", "&"), nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("live events stream: %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 8<<20)
	if first := readEvent(t, sc)["event-list"]; !strings.Contains(first, "No events match.") {
		t.Fatalf("first event-list part, before any drain: %q", first)
	}

	// Outside the filter first, then inside it: the part that arrives
	// names node-c's drain and nothing of node-b.
	for _, id := range []string{"node-b", "node-c"} {
		if err := f.ctrl.SetDraining(ctx, id, true); err != nil {
			t.Fatal(err)
		}
	}
	for {
		parts := readEvent(t, sc)
		list, ok := parts["event-list"]
		if !ok {
			continue
		}
		if strings.Contains(list, "node-b") {
			t.Fatalf("a drain of node-b reached the stream of node-c's drains:\n%s", list)
		}
		if strings.Contains(list, `href="/nodes/node-c"`) && strings.Contains(list, ">"+controller.EventDrain+"</span>") {
			// Times in a live part are absolute (the script shows them
			// relative), so the part changes only when the log does.
			if strings.Contains(list, " ago</time>") || !strings.Contains(list, `<time class="ago"`) {
				t.Fatalf("live event row without an absolute time:\n%s", list)
			}
			return
		}
	}
}
