package web

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/security"
)

// syncBuffer is a bytes.Buffer safe for a logger and a test to share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestLiveStreamCaps performs the two stream findings of issue 24: one
// session opening every live stream it can, and a stream for a node that
// does not exist. The session gets maxSessionStreams and then 429 while
// another session still gets streams; the bogus node's stream is refused
// at once (404) and writes no warning per period.
func TestLiveStreamCaps(t *testing.T) {
	var logs syncBuffer
	f := seeded(t, nil)
	f.web.log = slog.New(slog.NewTextHandler(&logs, nil))
	hog := f.client()
	f.login(hog, testToken)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	open := func(c *http.Client, q string) int {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, "GET", f.srv.URL+"/live?"+q, nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp.StatusCode
	}
	for i := 0; i < maxSessionStreams; i++ {
		if code := open(hog, "topic=fleet"); code != http.StatusOK {
			t.Fatalf("stream %d of the session: %d", i+1, code)
		}
	}
	if code := open(hog, "topic=nodes&sort=id"); code != http.StatusTooManyRequests {
		t.Fatalf("stream %d of one session: %d, want 429", maxSessionStreams+1, code)
	}
	other := f.client()
	f.login(other, testToken)
	if code := open(other, "topic=fleet"); code != http.StatusOK {
		t.Fatalf("another session's stream: %d", code)
	}
	if n := f.web.refusals.Count(security.LiveStreams); n != 1 {
		t.Fatalf("live_streams refusals %d, want 1", n)
	}

	// A bogus node: refused once, nothing rendered for it afterwards.
	if code := open(other, "topic=node&id=no-such-node"); code != http.StatusNotFound {
		t.Fatalf("stream for a bogus node: %d, want 404", code)
	}
	f.web.hub.publish(ctx)
	f.web.hub.publish(ctx)
	if strings.Contains(logs.String(), "no-such-node") {
		t.Fatalf("the bogus node's stream is being rendered:\n%s", logs.String())
	}

	// A topic that fails to render (its node went away) warns once, not
	// every period.
	sub, done, err := f.web.hub.subscribe("node\x00gone-node", "sid")
	if err != nil || sub == nil {
		t.Fatal(err)
	}
	defer done()
	for i := 0; i < 5; i++ {
		f.web.hub.publish(ctx)
	}
	if n := strings.Count(logs.String(), "live update failed"); n != 1 {
		t.Fatalf("%d warnings for a failing topic over 5 periods, want 1:\n%s", n, logs.String())
	}
}

// TestEventsPageShowsEnrollmentRefusals: the security event of a refused
// re-enrollment (issue 24) is a kind the events page knows, filters on
// and shows.
func TestEventsPageShowsEnrollmentRefusals(t *testing.T) {
	f := seeded(t, nil)
	ctx := context.Background()
	// node-a is live in the seeded fleet: a script fetch must not enroll it.
	if _, err := f.ctrl.Enroll(ctx, "node-a", "10.0.0.66", time.Minute); err == nil {
		t.Fatal("a live node was enrolled")
	}
	if err := f.ctrl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	c := f.client()
	f.login(c, testToken)
	code, page := get(t, c, f.srv.URL+"/events?kind=enrollment_refused")
	if code != http.StatusOK || !strings.Contains(page, `<option value="enrollment_refused" selected>`) ||
		!strings.Contains(page, "10.0.0.66") || strings.Contains(page, "Unknown event kind") {
		t.Fatalf("events page: %d\n%.2000s", code, page)
	}
}
