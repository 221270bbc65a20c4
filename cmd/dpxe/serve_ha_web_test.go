package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestFollowerDashboardActions: an operator logged in on a follower's
// dashboard drains and undrains a node there. The follower forwards the
// forms to the leader, which checks the session and CSRF token stored in
// the shared database and applies them; the leader's API then shows the
// node draining, and not after the undrain. Logging in stays local.
// Then checkForwardedFor: a check-in through the follower reaches the
// leader with the node's own address (authenticated forwarded-for).
func TestFollowerDashboardActions(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL and two dpxe serve replicas")
	}
	_, dsn := haDatabase(t)
	c := newHACluster(t, dsn, 25)
	c.start(0)
	c.start(1)
	lead, term := c.leader(10 * haLeaderLease)
	// The follower forwards once it has read the leader's row (its
	// term): wait for that rather than race its next campaign.
	for end := time.Now().Add(10 * haLeaderLease); ; time.Sleep(50 * time.Millisecond) {
		if h, ok := c.health(1 - lead); ok && h.Role == "follower" && h.Term == term {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("r%d does not follow term %d\n%s", 1-lead, term, c.logTail())
		}
	}
	urls := c.urls()
	leader, follower := urls[lead], urls[1-lead]
	if out, err := exec.Command(c.bin, "nodes", "--server", leader, "--token-file", c.tokenFile, "add", "ha-web.1").CombinedOutput(); err != nil {
		t.Fatalf("dpxe nodes add: %v\n%s", err, out)
	}
	tok, err := os.ReadFile(c.tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	admin := strings.TrimSpace(string(tok))

	jar, _ := cookiejar.New(nil)
	cl := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(method, path string, form url.Values) (int, string, string) {
		t.Helper()
		req, _ := http.NewRequest(method, follower+path, strings.NewReader(form.Encode()))
		if method == http.MethodPost {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Origin", follower)
		}
		resp, err := cl.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Location"), string(b)
	}
	csrfRE := regexp.MustCompile(`name="csrf" value="([^"]+)"`)
	csrfOf := func(body string) string {
		t.Helper()
		m := csrfRE.FindStringSubmatch(body)
		if m == nil {
			t.Fatalf("no CSRF token in the page:\n%s", body)
		}
		return m[1]
	}
	_, _, body := do("GET", "/login", nil)
	if code, loc, body := do("POST", "/login", url.Values{"csrf": {csrfOf(body)}, "secret": {admin}, "next": {"/"}}); code != http.StatusSeeOther {
		t.Fatalf("log in on the follower: %d %s\n%s", code, loc, body)
	}
	draining := func() bool {
		t.Helper()
		req, _ := http.NewRequest("GET", leader+"/v1/nodes/ha-web.1", nil)
		req.Header.Set("Authorization", "Bearer "+admin)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var n struct {
			Draining bool `json:"draining"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&n); err != nil || resp.StatusCode != 200 {
			t.Fatalf("GET /v1/nodes/ha-web.1 on the leader: %d %v", resp.StatusCode, err)
		}
		return n.Draining
	}
	for _, step := range []struct {
		path string
		want bool
	}{{"/nodes/ha-web.1/drain", true}, {"/nodes/ha-web.1/undrain", false}} {
		_, _, page := do("GET", "/nodes/ha-web.1", nil)
		code, loc, body := do("POST", step.path, url.Values{"csrf": {csrfOf(page)}, "strand": {"yes"}})
		if code != http.StatusSeeOther || !strings.HasPrefix(loc, "/nodes/ha-web.1?done=") {
			t.Fatalf("POST %s on the follower: %d %q\n%s\n%s", step.path, code, loc, body, c.logTail())
		}
		if got := draining(); got != step.want {
			t.Errorf("after POST %s on the follower the leader says draining=%v", step.path, got)
		}
	}
	// A forged form (no CSRF token) is refused by the leader too.
	if code, _, _ := do("POST", "/nodes/ha-web.1/drain", url.Values{"strand": {"yes"}}); code != http.StatusForbidden {
		t.Errorf("a drain without its CSRF token: %d, want 403", code)
	}
	if draining() {
		t.Error("a drain without its CSRF token drained the node")
	}
	checkForwardedFor(t, c, lead)
}
