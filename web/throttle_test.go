package web

import (
	"context"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/security"
)

// clientFrom is f.client() whose connections come from the loopback
// address ip (127.0.0.0/8 is all loopback on Linux), so one test has
// several client addresses.
func (f *testFleet) clientFrom(ip string) *http.Client {
	jar, _ := cookiejar.New(nil)
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	return &http.Client{Jar: jar, Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// tryLogin submits the login form once from c and returns the status and
// the Retry-After header.
func (f *testFleet) tryLogin(c *http.Client, secret string) (int, string) {
	f.t.Helper()
	_, page := get(f.t, c, f.srv.URL+"/login")
	resp, err := c.PostForm(f.srv.URL+"/login", url.Values{"csrf": {csrfOf(f.t, page)}, "secret": {secret}})
	if err != nil {
		f.t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Retry-After")
}

// TestLoginThrottlePerClient performs the lock-out of issue 24: one
// client guessing the password. It is throttled with back-off; another
// client's correct password still logs in; the admin token logs in even
// from the throttled client; its correct password waits out the back-off
// (no PBKDF2 run while throttled).
func TestLoginThrottlePerClient(t *testing.T) {
	f := newTestFleet(t, fleetOpts{total: 16, maxConc: 1})
	const pw = "correct horse battery"
	if err := SetPassword(context.Background(), f.store, pw); err != nil {
		t.Fatal(err)
	}
	guesser := f.clientFrom("127.0.0.2")
	for i := 1; i <= loginFreeFailures; i++ {
		if code, _ := f.tryLogin(guesser, "wrong"); code != http.StatusUnauthorized {
			t.Fatalf("guess %d: %d, want 401", i, code)
		}
	}
	if code, _ := f.tryLogin(guesser, "wrong"); code != http.StatusUnauthorized {
		t.Fatalf("guess %d: %d, want 401 (it starts the back-off)", loginFreeFailures+1, code)
	}
	code, retry := f.tryLogin(guesser, "wrong")
	if code != http.StatusTooManyRequests || retry == "" {
		t.Fatalf("throttled guess: %d Retry-After %q, want 429 with Retry-After", code, retry)
	}
	if code, _ := f.tryLogin(guesser, pw); code != http.StatusTooManyRequests {
		t.Fatalf("the right password from the throttled client: %d, want 429 until the back-off ends", code)
	}
	// Other clients are not affected.
	if code, _ := f.tryLogin(f.clientFrom("127.0.0.3"), pw); code != http.StatusSeeOther {
		t.Fatalf("another client's correct password: %d, want 303", code)
	}
	// The admin token goes through, even from the throttled client.
	if code, _ := f.tryLogin(guesser, testToken); code != http.StatusSeeOther {
		t.Fatalf("the admin token from a throttled client: %d, want 303", code)
	}
	c := f.web.refusals.Counts()
	if c[security.Login] != loginFreeFailures+1 || c[security.LoginThrottled] != 2 {
		t.Fatalf("refusal counts %v", c)
	}
}

// TestLinkFailuresApartFromLogins: bad one-time links throttle that
// client's links, not its logins, and a live link works from it.
func TestLinkFailuresApartFromLogins(t *testing.T) {
	f := newTestFleet(t, fleetOpts{total: 16, maxConc: 1})
	c := f.clientFrom("127.0.0.4")
	for i := 0; i < loginFreeFailures+1; i++ {
		if code, _ := get(t, c, f.srv.URL+LoginLinkPrefix+"guess"); code != http.StatusForbidden {
			t.Fatalf("bad link %d: %d, want 403", i, code)
		}
	}
	if code, _ := get(t, c, f.srv.URL+LoginLinkPrefix+"guess"); code != http.StatusTooManyRequests {
		t.Fatalf("bad link after the free ones: %d, want 429", code)
	}
	if code, _ := f.tryLogin(c, "wrong"); code != http.StatusUnauthorized {
		t.Fatalf("login after bad links: %d, want 401 (links are counted apart)", code)
	}
	_, path := issueLink(t, f, testToken)
	if code, body := get(t, f.clientFrom("127.0.0.4"), f.srv.URL+path); code != http.StatusOK || !strings.Contains(body, "url=/") {
		t.Fatalf("a live link from the throttled client: %d", code)
	}
}

// TestThrottleBackoff: the first failures are free, then each doubles the
// wait up to the cap; success clears the record, and so does an hour
// without failures; the table stays bounded.
func TestThrottleBackoff(t *testing.T) {
	var th throttle
	now := time.Unix(1_700_000_000, 0)
	for i := 1; i <= loginFreeFailures; i++ {
		if d := th.failed("a", now); d != 0 || th.wait("a", now) != 0 {
			t.Fatalf("failure %d: wait %s", i, d)
		}
	}
	want := loginBackoffBase
	for i := loginFreeFailures + 1; i < loginFreeFailures+20; i++ {
		if d := th.failed("a", now); d != want {
			t.Fatalf("failure %d: wait %s, want %s", i, d, want)
		}
		if th.wait("a", now.Add(want-time.Millisecond)) == 0 || th.wait("a", now.Add(want)) != 0 {
			t.Fatalf("failure %d: the wait does not end at %s", i, want)
		}
		if th.wait("b", now) != 0 {
			t.Fatal("another client waits")
		}
		want = min(want*2, loginBackoffMax)
	}
	th.succeeded("a")
	if th.wait("a", now) != 0 || th.failed("a", now) != 0 {
		t.Fatal("success did not clear the record")
	}
	for i := 0; i < loginFreeFailures+3; i++ {
		th.failed("c", now)
	}
	if th.wait("c", now.Add(loginForget)) != 0 || th.failed("c", now.Add(loginForget)) != 0 {
		t.Fatal("a record outlived loginForget")
	}
	for i := 0; i < 2*maxThrottled; i++ {
		th.failed(net.IPv4(10, byte(i>>16), byte(i>>8), byte(i)).String(), now)
	}
	if len(th.clients) > maxThrottled {
		t.Fatalf("%d records kept, bound %d", len(th.clients), maxThrottled)
	}
}

// TestSafeNextRejectsUnclean: the post-login redirect accepts only a clean
// same-origin path (issue 24: "/\t/host" became "//host" in browsers).
func TestSafeNextRejectsUnclean(t *testing.T) {
	for in, want := range map[string]string{
		"/nodes":                  "/nodes",
		"/nodes?sort=lease&dir=d": "/nodes?sort=lease&dir=d",
		"/nodes/rack1-07":         "/nodes/rack1-07",
		"/\t/evil.example/":       "/",
		"/\n/evil.example/":       "/",
		"/\r\n/evil.example":      "/",
		"/ /evil.example":         "/",
		"/\x00":                   "/",
		"/\x7f":                   "/",
		"/\\evil.example":         "/",
		"/a\\b":                   "/",
		"//evil.example":          "/",
		"/%2F/evil.example":       "/", // decodes to "//evil.example": refused too
		"https://evil.example/":   "/",
		"javascript:alert(1)":     "/",
		"/nodes#frag":             "/",
		"/é":                      "/",
		"":                        "/",
	} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
	// Over HTTP: the probe's "next=/\t/host" login lands on "/".
	f := newTestFleet(t, fleetOpts{total: 16, maxConc: 1})
	c := f.client()
	_, page := get(t, c, f.srv.URL+"/login?next="+url.QueryEscape("/\t/evil.example/"))
	if strings.Contains(page, "evil.example") {
		t.Fatalf("the login form carries the unclean next:\n%.400s", page)
	}
	code, loc, _ := post(t, c, f.srv.URL+"/login", url.Values{"csrf": {csrfOf(t, page)}, "secret": {testToken},
		"next": {"/\t/evil.example/"}})
	if code != http.StatusSeeOther || loc != "/" {
		t.Fatalf("login with next=/\\t/evil.example/: %d Location %q, want 303 to /", code, loc)
	}
}
