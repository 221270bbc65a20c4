package web

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"
)

// issueLink asks for a one-time login link with the given bearer token and
// returns the status and the link's path.
func issueLink(t *testing.T, f *testFleet, bearer string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", f.srv.URL+"/v1/dashboard/login-links", nil)
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Path      string    `json:"path"`
		ExpiresAt time.Time `json:"expires_at"`
	}
	json.NewDecoder(resp.Body).Decode(&out)
	if resp.StatusCode == http.StatusCreated {
		if d := time.Until(out.ExpiresAt); d < LoginLinkTTL-time.Minute || d > LoginLinkTTL {
			t.Errorf("link expires in %v, want about %v", d, LoginLinkTTL)
		}
		if resp.Header.Get("Cache-Control") != "no-store" {
			t.Errorf("link answer is cacheable: %q", resp.Header.Get("Cache-Control"))
		}
	}
	return resp.StatusCode, out.Path
}

func TestLoginLink(t *testing.T) {
	f := newTestFleet(t, fleetOpts{total: 16, maxConc: 1})
	var logs bytes.Buffer
	f.web.log = slog.New(slog.NewTextHandler(&logs, nil))

	// Only the admin token gets a link.
	if code, _ := issueLink(t, f, ""); code != http.StatusUnauthorized {
		t.Fatalf("link without a token: %d, want 401", code)
	}
	if code, _ := issueLink(t, f, "not-the-token"); code != http.StatusUnauthorized {
		t.Fatalf("link with a wrong token: %d, want 401", code)
	}
	code, path := issueLink(t, f, testToken)
	if code != http.StatusCreated || !strings.HasPrefix(path, LoginLinkPrefix) {
		t.Fatalf("issue: %d %q", code, path)
	}
	tok := strings.TrimPrefix(path, LoginLinkPrefix)
	if len(tok) != 43 { // 256 bits, base64url without padding
		t.Fatalf("token %d characters, want 43", len(tok))
	}

	// A HEAD (a link checker) does not use it up.
	c := f.client()
	if resp, err := c.Head(f.srv.URL + path); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("HEAD: %v %v", resp, err)
	}
	// The link logs the browser in with the ordinary session cookie and
	// moves on to the fleet page.
	code, body := get(t, c, f.srv.URL+path)
	if code != http.StatusOK || !strings.Contains(body, `http-equiv="refresh" content="0;url=/"`) {
		t.Fatalf("link: %d\n%.600s", code, body)
	}
	if code, page := get(t, c, f.srv.URL+"/"); code != http.StatusOK || !strings.Contains(page, "Log out") {
		t.Fatalf("not logged in after the link: %d\n%.300s", code, page)
	}
	// Once only: a second browser with the same link gets nothing.
	c2 := f.client()
	if code, body := get(t, c2, f.srv.URL+path); code != http.StatusForbidden || !strings.Contains(body, "does not work") {
		t.Fatalf("second use: %d\n%.300s", code, body)
	}
	if code, _ := get(t, c2, f.srv.URL+"/"); code != http.StatusSeeOther {
		t.Fatalf("second browser logged in: %d", code)
	}
	if strings.Contains(logs.String(), tok) {
		t.Fatalf("the token is in the log:\n%s", logs.String())
	}

	// (Expiry is checked on the table itself below: the server's clock is
	// not swapped under running handlers.)

	// Guessing counts toward this client's link throttle (see
	// TestLinkFailuresApartFromLogins); a good link still works.
	_, good := issueLink(t, f, testToken)
	for i := 0; i < loginFreeFailures+2; i++ {
		get(t, f.client(), f.srv.URL+LoginLinkPrefix+"guess"+string(rune('a'+i)))
	}
	if code, _ := get(t, f.client(), f.srv.URL+LoginLinkPrefix+"guessz"); code != http.StatusTooManyRequests {
		t.Fatalf("after %d bad links: %d, want 429", loginFreeFailures+2, code)
	}
	if code, _ := get(t, f.client(), f.srv.URL+good); code != http.StatusOK {
		t.Fatalf("a live link from a throttled client: %d, want 200", code)
	}
}

func TestLoginLinkTable(t *testing.T) {
	var tab loginLinks
	now := time.Now()
	var toks []string
	for i := 0; i < maxLoginLinks+2; i++ {
		tok, _ := tab.issue(now)
		toks = append(toks, tok)
	}
	// The two oldest were dropped to keep the table bounded.
	if tab.use(toks[0], now) || tab.use(toks[1], now) {
		t.Error("a link beyond the table's bound still works")
	}
	if !tab.use(toks[2], now) || tab.use(toks[2], now) {
		t.Error("a live link must work exactly once")
	}
	if tab.use("", now) {
		t.Error("the empty token works")
	}
	if tab.use(toks[3], now.Add(LoginLinkTTL)) {
		t.Error("a link works at its expiry")
	}
}
