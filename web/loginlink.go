package web

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/discord-pxe/dpxe/fleet/api"
	"github.com/discord-pxe/dpxe/fleet/security"
	"github.com/discord-pxe/dpxe/web/templates"
)

// One-time login links. An operator who holds the admin token asks for a
// link (POST /v1/dashboard/login-links, or `dpxe login-link`; `make run`
// prints one) and opens it in a browser, which is then logged in as if it
// had typed the token: the same session cookie, the same 12 hours.
//
//   - The link carries 256 random bits, base64url. Only their SHA-256 is
//     kept, in memory: a restart of `dpxe serve` voids every link.
//   - A link works once and for LoginLinkTTL. A used, expired or unknown
//     link counts toward the client's link throttle (apart from its
//     logins); a live link works whatever the throttle says.
//   - Lookups compare the hash with every live link in constant time.
//   - The token is never logged, and the page that sets the cookie sends
//     no Referer to other sites and loads nothing from them.
//   - HEAD requests (link checkers) do not use a link up.
const (
	// LoginLinkTTL is how long a one-time login link stays valid.
	LoginLinkTTL = 10 * time.Minute
	// maxLoginLinks bounds the links outstanding at once; the oldest go.
	maxLoginLinks = 32
	// LoginLinkPrefix is the path of a link, followed by its token.
	LoginLinkPrefix = "/login/once/"
)

type loginLink struct {
	hash    [sha256.Size]byte
	expires time.Time
}

// loginLinks is the table of outstanding links.
type loginLinks struct {
	mu    sync.Mutex
	links []loginLink
}

// issue returns a new link token valid until the returned time.
func (t *loginLinks) issue(now time.Time) (string, time.Time) {
	tok := newToken()
	exp := now.Add(LoginLinkTTL)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pruneLocked(now)
	if len(t.links) >= maxLoginLinks {
		t.links = t.links[1:]
	}
	t.links = append(t.links, loginLink{hash: sha256.Sum256([]byte(tok)), expires: exp})
	return tok, exp
}

// use consumes a link token: true once for a live token, false after.
func (t *loginLinks) use(tok string, now time.Time) bool {
	if tok == "" {
		return false
	}
	h := sha256.Sum256([]byte(tok))
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pruneLocked(now)
	found := -1
	for i := range t.links { // every entry, constant time each
		if subtle.ConstantTimeCompare(h[:], t.links[i].hash[:]) == 1 {
			found = i
		}
	}
	if found < 0 {
		return false
	}
	t.links = append(t.links[:found], t.links[found+1:]...)
	return true
}

func (t *loginLinks) pruneLocked(now time.Time) {
	kept := t.links[:0]
	for _, l := range t.links {
		if now.Before(l.expires) {
			kept = append(kept, l)
		}
	}
	t.links = kept
}

// registerLoginLinks mounts the issuing endpoint (admin token) and the
// link itself.
func (s *Server) registerLoginLinks(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/dashboard/login-links", api.AdminOnly(s.cfg.AdminHash, s.refusals, s.issueLoginLink))
	mux.HandleFunc("GET "+LoginLinkPrefix+"{token}", s.useLoginLink)
}

// issueLoginLink answers {"path": "/login/once/TOKEN", "expires_at": ...}.
func (s *Server) issueLoginLink(w http.ResponseWriter, r *http.Request) {
	tok, exp := s.links.issue(s.cfg.Now())
	w.Header().Set("Cache-Control", "no-store")
	api.WriteJSON(w, http.StatusCreated, map[string]any{"path": LoginLinkPrefix + tok, "expires_at": exp.UTC()})
	s.log.Info("dashboard: one-time login link issued", "expires", exp.UTC().Format(time.RFC3339))
}

// useLoginLink logs the browser in with a link and sends it on to the
// fleet page.
func (s *Server) useLoginLink(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodHead {
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusOK)
		return
	}
	now := s.cfg.Now()
	client := security.Source(r.RemoteAddr)
	// A live link is let through whatever the throttle says (see
	// loginFreeFailures); failures count per client, apart from logins.
	if !s.links.use(r.PathValue("token"), now) {
		if wait := s.linkFails.wait(client, now); wait > 0 {
			s.refusals.Refused(security.LoginThrottled, client, "dashboard: login link refused, too many failures from this client",
				"retry_in", wait.Round(time.Second).String())
			w.Header().Set("Retry-After", fmt.Sprint(int((wait+time.Second-1)/time.Second)))
			s.problem(w, r, http.StatusTooManyRequests, "Too many failed login links",
				"Too many login links from this address did not work; wait "+waitText(wait)+" and open the link again.")
			return
		}
		s.linkFails.failed(client, now)
		s.refusals.Refused(security.LoginLink, client, "dashboard: one-time login link refused (used, expired or unknown)")
		s.problem(w, r, http.StatusForbidden, "This login link does not work",
			"It was used already, it expired (links last 10 minutes), or dpxe serve restarted since it was made. "+
				"Get a new one with dpxe login-link, or log in with the admin token.")
		return
	}
	s.linkFails.succeeded(client)
	id, _ := s.sess.create(now)
	setCookie(w, r, sessionCookie, id, sessionTTL)
	s.log.Info("dashboard: operator logged in with a one-time link", "remote", r.RemoteAddr)
	// A page, not a redirect: the move to "/" is then a navigation from
	// this site, so the SameSite=Strict cookie goes with it even when the
	// link was opened from another site.
	p := s.page(r, "Logged in", "")
	p.Refresh = "/"
	s.render(w, r, http.StatusOK, templates.LoginLinkPage(p))
}
