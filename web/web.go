// Package web is the fleet dashboard of `dpxe serve`: HTTP handlers that
// build view models (package web/view) from the controller and render them
// with the templ components in web/templates/. Pages work without JavaScript;
// a small embedded script adds live updates over server-sent events and
// lease countdowns.
//
// Operators log in with the admin token or the dashboard password (`dpxe
// admin passwd`); sessions are HttpOnly, SameSite=Strict cookies (Secure
// over TLS) and every state-changing form carries the session's CSRF token.
package web

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/a-h/templ"

	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/events"
	"github.com/discord-pxe/dpxe/fleet/security"
	"github.com/discord-pxe/dpxe/fleet/store"
	"github.com/discord-pxe/dpxe/web/templates"
	"github.com/discord-pxe/dpxe/web/view"
)

//go:embed static
var staticFS embed.FS

// Defaults of Config.
const (
	DefaultLiveEvery      = time.Second
	DefaultIdentifyWindow = 10 * time.Minute
	maxFormBytes          = 16 << 10
)

// Config configures the dashboard.
type Config struct {
	Controller *controller.Controller
	Store      *store.Store
	// AdminHash is the SHA-256 of the admin token; the token logs in.
	AdminHash [32]byte
	// Netboot supplies discovered nodes, DHCP leases and boot timelines;
	// nil shows those sections as "netboot not enabled".
	Netboot Netboot
	Log     *slog.Logger
	// Refusals counts and logs refused logins, links and forms,
	// rate-limited per client; nil makes one writing to Log. `dpxe serve`
	// passes the one its API uses.
	Refusals *security.Log
	Now      func() time.Time // default time.Now
	// LiveEvery is how often live pages are refreshed over server-sent
	// events (default DefaultLiveEvery).
	LiveEvery time.Duration
	// IdentifyWindow is the span of the Identify activity panel.
	IdentifyWindow time.Duration
	// Events reads the event stream's state for the fleet page (false:
	// serve delivers no events); nil leaves the panel out.
	Events func(ctx context.Context) (events.StreamState, bool)
}

// Server is the dashboard. Mount it with Register and run its live-update
// loop with Run.
type Server struct {
	cfg      Config
	log      *slog.Logger
	refusals *security.Log
	sess     sessions
	links    loginLinks
	hub      *hub
	// Failed logins and failed one-time links, per client, apart.
	loginFails, linkFails throttle
}

// New returns a dashboard for cfg.
func New(cfg Config) *Server {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.LiveEvery <= 0 {
		cfg.LiveEvery = DefaultLiveEvery
	}
	if cfg.IdentifyWindow <= 0 {
		cfg.IdentifyWindow = DefaultIdentifyWindow
	}
	if cfg.Refusals == nil {
		cfg.Refusals = security.New(cfg.Log)
	}
	s := &Server{cfg: cfg, log: cfg.Log, refusals: cfg.Refusals, sess: sessions{byID: map[string]*session{}, st: cfg.Store, log: cfg.Log}}
	if cfg.Controller != nil {
		s.sess.shared = func() bool { return cfg.Controller.Role().HA }
	}
	s.hub = newHub(s)
	return s
}

// Register mounts the dashboard on mux at "/". The API stays under /v1/.
func (s *Server) Register(mux *http.ServeMux) {
	sub, _ := fs.Sub(staticFS, "static")
	static := http.StripPrefix("/static/", http.FileServerFS(sub))
	mux.Handle("GET /static/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-cache")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		static.ServeHTTP(w, r)
	}))
	mux.HandleFunc("GET /login", s.loginForm)
	s.registerLoginLinks(mux)
	mux.HandleFunc("POST /login", s.login)
	mux.HandleFunc("POST /logout", s.authed(s.logout))
	mux.HandleFunc("GET /{$}", s.authed(s.fleet))
	mux.HandleFunc("GET /nodes", s.authed(s.nodes))
	mux.HandleFunc("GET /nodes/{id}", s.authed(s.node))
	mux.HandleFunc("GET /nodes/{id}/drain", s.authed(s.drainConfirm(true)))
	mux.HandleFunc("GET /nodes/{id}/undrain", s.authed(s.drainConfirm(false)))
	mux.HandleFunc("POST /nodes/{id}/drain", s.authed(s.drain(true)))
	mux.HandleFunc("POST /nodes/{id}/undrain", s.authed(s.drain(false)))
	mux.HandleFunc("GET /nodes/{id}/restart-fatal", s.authed(s.restartConfirm))
	mux.HandleFunc("POST /nodes/{id}/restart-fatal", s.authed(s.restartFatal))
	mux.HandleFunc("GET /guild", s.authed(s.guild))
	mux.HandleFunc("GET /latency", s.authed(s.latency))
	mux.HandleFunc("GET /events", s.authed(s.events))
	mux.HandleFunc("GET /discovered", s.authed(s.discovered))
	mux.HandleFunc("POST /discovered/{mac}/approve", s.authed(s.approve))
	mux.HandleFunc("POST /discovered/{mac}/ignore", s.authed(s.ignore))
	mux.HandleFunc("GET /live", s.authed(s.live))
}

// Run sends live updates to open pages until ctx ends; then it ends
// every live stream.
func (s *Server) Run(ctx context.Context) error {
	return s.hub.run(ctx, s.cfg.LiveEvery)
}

// CloseStreams ends every live-update stream and refuses new ones. Call it
// when the HTTP server begins a graceful shutdown, which would otherwise
// wait for open dashboards; pages fall back to reloading by hand.
func (s *Server) CloseStreams() { s.hub.close() }

type ctxKey struct{}

// sessionOf returns the request's session (set by authed).
func sessionOf(r *http.Request) *session {
	v, _ := r.Context().Value(ctxKey{}).(*session)
	return v
}

// authed requires a logged-in session; state-changing requests must also
// carry the session's CSRF token and, when the browser sends one, an
// Origin of this host.
func (s *Server) authed(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var sess *session
		if c, err := r.Cookie(sessionCookie); err == nil {
			sess = s.sess.get(c.Value, s.cfg.Now())
		}
		if sess == nil {
			if r.Method == http.MethodGet && r.URL.Path != "/live" {
				http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			s.problem(w, r, http.StatusUnauthorized, "Not logged in", "Your session ended. Log in again and retry.")
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
			if !sameOrigin(r) || !sameToken(r.PostFormValue("csrf"), sess.csrf) {
				s.refusals.Refused(security.CSRF, security.Source(r.RemoteAddr), "dashboard: CSRF check failed", "path", r.URL.Path)
				s.problem(w, r, http.StatusForbidden, "Request refused",
					"This form did not carry this session's CSRF token, so it may have been forged by another site. Reload the page and try again.")
				return
			}
		}
		h(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, sess)))
	}
}

// sameOrigin reports whether the request's Origin header, if any, names
// this host.
func sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	u, err := url.Parse(o)
	return err == nil && u.Host == r.Host
}

// page fills the common fields of a page for the request.
func (s *Server) page(r *http.Request, title, nav string) view.Page {
	p := view.Page{Title: title, Nav: nav, Now: s.cfg.Now().UnixMilli()}
	if role := s.cfg.Controller.Role(); role.HA {
		p.Role = fmt.Sprintf("%s, term %d", role.Name(), role.Term)
	}
	if sess := sessionOf(r); sess != nil {
		p.LoggedIn, p.CSRF = true, sess.csrf
	}
	p.Flash = flashText(r.URL.Query().Get("done"))
	return p
}

// flashText turns a ?done= code into its confirmation line.
func flashText(code string) string {
	kind, id, _ := strings.Cut(code, ":")
	switch kind {
	case "drain":
		return "Node " + id + " is draining: its shards move to other nodes."
	case "undrain":
		return "Node " + id + " takes shards again."
	case "restart":
		node, shards, _ := strings.Cut(id, ":")
		if shards == "" {
			return "Node " + node + " has no FATAL shard to restart."
		}
		what := "shard " + shards
		if strings.Contains(shards, ",") {
			what = "shards " + strings.ReplaceAll(shards, ",", ", ")
		}
		return "Node " + node + " is asked to start " + what + " again, with a fresh Identify, at its next check-in."
	case "approve":
		return "Approved " + id + "; it boots the shard kernel at its next network boot."
	case "ignore":
		return "Ignored " + id + "."
	}
	return ""
}

// render writes a component as a complete HTML response.
func (s *Server) render(w http.ResponseWriter, r *http.Request, status int, c templ.Component) {
	var buf bytes.Buffer
	if err := c.Render(r.Context(), &buf); err != nil {
		s.log.Error("dashboard: render", "path", r.URL.Path, "err", err)
		http.Error(w, "the page could not be rendered; see the server log", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Content-Security-Policy", "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// problem renders a readable error page.
func (s *Server) problem(w http.ResponseWriter, r *http.Request, status int, heading, detail string) {
	p := s.page(r, heading, "")
	s.render(w, r, status, templates.ProblemPage(view.Problem{Page: p, Status: status, Heading: heading, Detail: detail}))
}

// controllerProblem maps a controller error to a problem page.
func (s *Server) controllerProblem(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, controller.ErrUnknownNode):
		s.problem(w, r, http.StatusNotFound, "No such node", err.Error()+". It may have been removed; see the Nodes page.")
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		s.problem(w, r, http.StatusServiceUnavailable, "Request cancelled", "The request was cancelled before it finished; retry.")
	default:
		s.log.Error("dashboard: controller", "path", r.URL.Path, "err", err)
		s.problem(w, r, http.StatusServiceUnavailable, "The controller could not do that",
			"The change could not be stored: "+err.Error()+". Retry; if it persists, check the server log.")
	}
}

func (s *Server) loginForm(w http.ResponseWriter, r *http.Request) {
	tok := newToken()
	setCookie(w, r, loginCookie, tok, 30*time.Minute)
	p := s.page(r, "Log in", "")
	p.LoggedIn, p.CSRF = false, tok
	s.render(w, r, http.StatusOK, templates.LoginPage(view.Login{Page: p, Next: safeNext(r.URL.Query().Get("next"))}))
}

// safeNext keeps a post-login redirect on this site: it returns next if
// it is a clean path on this origin (with an optional query) and "/"
// otherwise. Clean means: it starts with one '/', every byte is visible
// ASCII (no control character, space or DEL: browsers drop tabs and
// newlines, so "/\t/evil.example" would be "//evil.example" to them), no
// backslash anywhere (browsers read it as '/'), no '#', and it parses as a
// path with no scheme, host, user or fragment.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || len(next) > 2048 {
		return "/"
	}
	for i := 0; i < len(next); i++ {
		if c := next[i]; c <= ' ' || c >= 0x7f || c == '\\' || c == '#' {
			return "/"
		}
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" || u.Fragment != "" ||
		!strings.HasPrefix(u.Path, "/") || strings.HasPrefix(u.Path, "//") {
		return "/"
	}
	return next
}

func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	now := s.cfg.Now()
	c, err := r.Cookie(loginCookie)
	if err != nil || !sameOrigin(r) || !sameToken(r.PostFormValue("csrf"), c.Value) {
		s.problem(w, r, http.StatusForbidden, "Login form expired",
			"The login form was stale or came from another site. Open the login page again.")
		return
	}
	next := safeNext(r.PostFormValue("next"))
	fail := func(status int, msg string) {
		tok := newToken()
		setCookie(w, r, loginCookie, tok, 30*time.Minute)
		p := s.page(r, "Log in", "")
		p.CSRF, p.Error = tok, msg
		s.render(w, r, status, templates.LoginPage(view.Login{Page: p, Next: next}))
	}
	client := security.Source(r.RemoteAddr)
	secret := r.PostFormValue("secret")
	// The admin token goes through whatever the throttle says (see
	// loginFreeFailures); the password only when the client may try.
	if !s.isAdminToken(secret) {
		if wait := s.loginFails.wait(client, now); wait > 0 {
			s.refusals.Refused(security.LoginThrottled, client, "dashboard: login refused, too many failures from this client",
				"retry_in", wait.Round(time.Second).String())
			w.Header().Set("Retry-After", fmt.Sprint(int((wait+time.Second-1)/time.Second)))
			fail(http.StatusTooManyRequests, "Too many failed logins from this address; wait "+waitText(wait)+" and try again.")
			return
		}
		if !s.isPassword(r.Context(), secret) {
			s.loginFails.failed(client, now)
			s.refusals.Refused(security.Login, client, "dashboard: login failed")
			fail(http.StatusUnauthorized, "That is neither the admin token nor the dashboard password.")
			return
		}
	}
	s.loginFails.succeeded(client)
	id, _ := s.sess.create(now)
	setCookie(w, r, sessionCookie, id, sessionTTL)
	setCookie(w, r, loginCookie, "", -1)
	s.log.Info("dashboard: operator logged in", "remote", r.RemoteAddr)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request) {
	if c, err := r.Cookie(sessionCookie); err == nil {
		s.sess.remove(c.Value)
	}
	setCookie(w, r, sessionCookie, "", -1)
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}
