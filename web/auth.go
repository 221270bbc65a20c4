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
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/discord-pxe/dpxe/fleet/store"
)

// Session and login parameters.
const (
	sessionCookie   = "dpxe_session"
	loginCookie     = "dpxe_login" // CSRF token of the login form (double submit)
	sessionTTL      = 12 * time.Hour
	maxSessions     = 1000 // oldest sessions are dropped beyond this
	loginFailWindow = time.Minute
	loginFailMax    = 10 // failed logins per window before refusing for the rest of it
	tokenBytes      = 32
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
	_, err := st.DB().ExecContext(ctx, `DELETE FROM settings WHERE key = ?`, PasswordSetting)
	return err
}

// session is one logged-in browser.
type session struct {
	csrf    string
	expires time.Time
}

// sessions is the in-memory session table. Sessions do not survive a
// restart of `dpxe serve`: operators log in again.
type sessions struct {
	mu    sync.Mutex
	byID  map[string]*session
	fails []time.Time // recent failed logins
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
	return id, v
}

// get returns the live session with the given ID, or nil.
func (s *sessions) get(id string, now time.Time) *session {
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
}

// throttled reports whether too many logins failed recently.
func (s *sessions) throttled(now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	kept := s.fails[:0]
	for _, t := range s.fails {
		if now.Sub(t) < loginFailWindow {
			kept = append(kept, t)
		}
	}
	s.fails = kept
	return len(s.fails) >= loginFailMax
}

func (s *sessions) failed(now time.Time) {
	s.mu.Lock()
	s.fails = append(s.fails, now)
	s.mu.Unlock()
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

// checkSecret accepts the admin token or the dashboard password.
func (s *Server) checkSecret(ctx context.Context, secret string) bool {
	if secret == "" {
		return false
	}
	h := sha256.Sum256([]byte(secret))
	if subtle.ConstantTimeCompare(h[:], s.cfg.AdminHash[:]) == 1 {
		return true
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
