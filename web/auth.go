package web

import (
	"context"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/discord-pxe/dpxe/fleet/store"
)

// Session and login parameters.
const (
	sessionCookie = "dpxe_session"
	loginCookie   = "dpxe_login" // CSRF token of the login form (double submit)
	sessionTTL    = 12 * time.Hour
	maxSessions   = 1000 // oldest sessions are dropped beyond this
	tokenBytes    = 32
)

// The login throttle (issue 24: one global list of failures let anyone
// lock every operator out). Failures are counted per client address
// (security.Source: the IP, an IPv6 /64), logins and one-time links
// apart. A client's first loginFreeFailures failures cost nothing; each
// later one makes it wait before its next attempt, loginBackoffBase after
// the first and twice as long after each further one, up to
// loginBackoffMax. A success, or loginForget without a failure, clears the
// record. The admin token and a live one-time link are 256 random bits
// compared in constant time: they are let through whatever the throttle
// says, so a throttled address (a shared NAT, an attacker spoofing
// nothing but its guesses) never locks out an operator who has them. The
// throttle protects the dashboard password, which a person chose, and the
// server's CPU (each password check is a PBKDF2 run).
const (
	loginFreeFailures = 5
	loginBackoffBase  = time.Second
	loginBackoffMax   = 15 * time.Minute
	loginForget       = time.Hour
	maxThrottled      = 4096 // client records kept; the stalest go first
)

// PasswordSetting is the settings key of the dashboard password hash,
// written by `dpxe admin passwd`.
const PasswordSetting = "dashboard_password"

// Password hashing: PBKDF2-HMAC-SHA256 with a random salt, stored as
// "pbkdf2-sha256$ITERATIONS$SALT$HASH" (base64url, no padding).
const (
	passwordIterations = 210_000 // a fraction of a second per login on a small server
	passwordSaltBytes  = 16
	passwordKeyBytes   = 32
	passwordScheme     = "pbkdf2-sha256"
	// MinPasswordLen is the shortest password `dpxe admin passwd` accepts.
	MinPasswordLen = 12
)

// Errors.
var (
	// ErrBadPassword is returned by CheckPassword for a wrong password.
	ErrBadPassword = errors.New("wrong password")
	// ErrPasswordFormat is returned for a malformed stored password hash.
	ErrPasswordFormat = errors.New("stored password hash is malformed")
)

// HashPassword returns the stored form of a dashboard password.
func HashPassword(pw string) (string, error) {
	if len(pw) < MinPasswordLen {
		return "", fmt.Errorf("password shorter than %d characters", MinPasswordLen)
	}
	salt := make([]byte, passwordSaltBytes)
	if _, err := rand.Read(salt); err != nil {
		return "", err
	}
	key, err := pbkdf2.Key(sha256.New, pw, salt, passwordIterations, passwordKeyBytes)
	if err != nil {
		return "", err
	}
	enc := base64.RawURLEncoding
	return fmt.Sprintf("%s$%d$%s$%s", passwordScheme, passwordIterations, enc.EncodeToString(salt), enc.EncodeToString(key)), nil
}

// CheckPassword compares pw with a stored hash in constant time.
func CheckPassword(stored, pw string) error {
	parts := strings.Split(stored, "$")
	if len(parts) != 4 || parts[0] != passwordScheme {
		return ErrPasswordFormat
	}
	iter, err := strconv.Atoi(parts[1])
	if err != nil || iter < 1 || iter > 10_000_000 {
		return ErrPasswordFormat
	}
	enc := base64.RawURLEncoding
	salt, err1 := enc.DecodeString(parts[2])
	want, err2 := enc.DecodeString(parts[3])
	if err1 != nil || err2 != nil || len(want) == 0 {
		return ErrPasswordFormat
	}
	got, err := pbkdf2.Key(sha256.New, pw, salt, iter, len(want))
	if err != nil {
		return err
	}
	if subtle.ConstantTimeCompare(got, want) != 1 {
		return ErrBadPassword
	}
	return nil
}

// SetPassword stores the dashboard password hash in st's settings table.
func SetPassword(ctx context.Context, st *store.Store, pw string) error {
	h, err := HashPassword(pw)
	if err != nil {
		return err
	}
	return st.SetSetting(ctx, PasswordSetting, h)
}

// ClearPassword removes the dashboard password; only the admin token logs
// in afterwards.
func ClearPassword(ctx context.Context, st *store.Store) error {
	return st.DeleteSetting(ctx, PasswordSetting)
}

// session is one logged-in browser.
type session struct {
	csrf    string
	expires time.Time
}

// sessions is the session table: in memory, or, when shared() says
// several controller replicas serve the dashboard (docs/ha.md), in the
// store, keyed by the SHA-256 of the cookie, so every replica knows a
// session and a log-out anywhere ends it everywhere. In memory, sessions
// do not survive a restart of `dpxe serve`: operators log in again.
type sessions struct {
	mu     sync.Mutex
	byID   map[string]*session
	st     *store.Store
	shared func() bool
	log    *slog.Logger
}

// sessionStoreTimeout bounds each stored-session query.
const sessionStoreTimeout = 2 * time.Second

func (s *sessions) stored() bool { return s.st != nil && s.shared != nil && s.shared() }

func sessionHash(id string) []byte {
	h := sha256.Sum256([]byte(id))
	return h[:]
}

// throttle is one table of failures per client (see loginFreeFailures).
// It is safe for concurrent use; the zero value is ready.
type throttle struct {
	mu      sync.Mutex
	clients map[string]*failures
}

type failures struct {
	n     int       // failures since the record was last cleared
	last  time.Time // the latest failure
	until time.Time // no attempt before this
}

// wait returns how long client must wait before its next attempt; 0
// means it may try now.
func (t *throttle) wait(client string, now time.Time) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	f := t.clients[client]
	if f == nil {
		return 0
	}
	if now.Sub(f.last) >= loginForget {
		delete(t.clients, client)
		return 0
	}
	if now.Before(f.until) {
		return f.until.Sub(now)
	}
	return 0
}

// backoff is the wait after a client's n-th failure.
func backoff(n int) time.Duration {
	if n <= loginFreeFailures {
		return 0
	}
	d := loginBackoffBase
	for i := loginFreeFailures + 1; i < n && d < loginBackoffMax; i++ {
		d *= 2
	}
	return min(d, loginBackoffMax)
}

// failed records a failure of client and returns the wait it now has.
func (t *throttle) failed(client string, now time.Time) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.clients == nil {
		t.clients = map[string]*failures{}
	}
	f := t.clients[client]
	if f != nil && now.Sub(f.last) >= loginForget {
		f = nil
	}
	if f == nil {
		if len(t.clients) >= maxThrottled {
			t.evictLocked(now)
		}
		f = &failures{}
		t.clients[client] = f
	}
	f.n++
	f.last = now
	f.until = now.Add(backoff(f.n))
	return backoff(f.n)
}

// evictLocked makes room: forgotten records, or else the stalest one.
func (t *throttle) evictLocked(now time.Time) {
	var stalest string
	for c, f := range t.clients {
		if now.Sub(f.last) >= loginForget {
			delete(t.clients, c)
		} else if stalest == "" || f.last.Before(t.clients[stalest].last) {
			stalest = c
		}
	}
	if len(t.clients) >= maxThrottled && stalest != "" {
		delete(t.clients, stalest)
	}
}

// succeeded clears client's record.
func (t *throttle) succeeded(client string) {
	t.mu.Lock()
	delete(t.clients, client)
	t.mu.Unlock()
}

// waitText says how long to wait, rounded up to a whole second.
func waitText(d time.Duration) string {
	s := (d + time.Second - 1) / time.Second
	if s <= 1 {
		return "a second"
	}
	if s < 120 {
		return fmt.Sprintf("%d seconds", s)
	}
	return fmt.Sprintf("%d minutes", (s+59)/60)
}

func newToken() string {
	b := make([]byte, tokenBytes)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// create starts a session and returns its ID.
func (s *sessions) create(now time.Time) (string, *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.byID) >= maxSessions {
		var oldest string
		var at time.Time
		for id, v := range s.byID {
			if oldest == "" || v.expires.Before(at) {
				oldest, at = id, v.expires
			}
		}
		delete(s.byID, oldest)
	}
	id := newToken()
	v := &session{csrf: newToken(), expires: now.Add(sessionTTL)}
	s.byID[id] = v
	if s.stored() {
		ctx, cancel := context.WithTimeout(context.Background(), sessionStoreTimeout)
		defer cancel()
		if err := s.st.CreateSession(ctx, sessionHash(id), v.csrf, v.expires); err != nil {
			// This replica still knows the session; the others do not.
			s.log.Error("storing a dashboard session failed", "err", err)
		}
	}
	return id, v
}

// get returns the live session with the given ID, or nil.
func (s *sessions) get(id string, now time.Time) *session {
	if s.stored() {
		return s.getStored(id, now)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.byID[id]
	if v == nil {
		return nil
	}
	if now.After(v.expires) {
		delete(s.byID, id)
		return nil
	}
	return v
}

func (s *sessions) remove(id string) {
	s.mu.Lock()
	delete(s.byID, id)
	s.mu.Unlock()
	if s.stored() {
		ctx, cancel := context.WithTimeout(context.Background(), sessionStoreTimeout)
		defer cancel()
		if err := s.st.DeleteSession(ctx, sessionHash(id)); err != nil {
			s.log.Error("removing a stored dashboard session failed", "err", err)
		}
	}
}

// getStored looks a session up in the store, every time: another replica
// may have ended it. A store error counts as no session.
func (s *sessions) getStored(id string, now time.Time) *session {
	if id == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), sessionStoreTimeout)
	defer cancel()
	csrf, expires, err := s.st.Session(ctx, sessionHash(id))
	if err != nil {
		if !errors.Is(err, store.ErrNotFound) {
			s.log.Error("reading a stored dashboard session failed", "err", err)
		}
		return nil
	}
	if now.After(expires) {
		return nil
	}
	return &session{csrf: csrf, expires: expires}
}

// sameToken compares two tokens in constant time; empty never matches.
func sameToken(a, b string) bool {
	return a != "" && b != "" && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// setCookie writes a cookie with the dashboard's attributes: HttpOnly,
// SameSite=Strict, Secure over TLS.
func setCookie(w http.ResponseWriter, r *http.Request, name, value string, maxAge time.Duration) {
	http.SetCookie(w, &http.Cookie{Name: name, Value: value, Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil, MaxAge: int(maxAge / time.Second)})
}

// isAdminToken reports, in constant time, whether secret is the admin
// token.
func (s *Server) isAdminToken(secret string) bool {
	h := sha256.Sum256([]byte(secret))
	return subtle.ConstantTimeCompare(h[:], s.cfg.AdminHash[:]) == 1 && secret != ""
}

// isPassword reports whether secret is the dashboard password (PBKDF2,
// constant-time comparison).
func (s *Server) isPassword(ctx context.Context, secret string) bool {
	if secret == "" {
		return false
	}
	stored, err := s.cfg.Store.Setting(ctx, PasswordSetting)
	if err != nil {
		if !errors.Is(err, store.ErrNotFound) {
			s.log.Error("reading dashboard password", "err", err)
		}
		return false
	}
	if err := CheckPassword(stored, secret); err != nil {
		if errors.Is(err, ErrPasswordFormat) {
			s.log.Error("dashboard password hash in the store is malformed; set it again with dpxe admin passwd")
		}
		return false
	}
	return true
}
