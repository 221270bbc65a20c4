package web

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/store"
)

// TestStoredSessionsShared: with several replicas (shared), a session
// created by one replica's dashboard is known to another's, a log-out on
// either ends it on both, and an expired one is refused; without (the
// in-memory table, as on a single controller) the other replica does not
// know it.
func TestStoredSessionsShared(t *testing.T) {
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "dpxe.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	shared := true
	mk := func() *sessions {
		return &sessions{byID: map[string]*session{}, st: st, shared: func() bool { return shared }, log: slog.New(slog.DiscardHandler)}
	}
	a, b := mk(), mk()
	now := time.Now()
	id, v := a.create(now)
	if got := b.get(id, now); got == nil || got.csrf != v.csrf {
		t.Fatalf("the other replica's view of the session: %+v", got)
	}
	if got := b.get(id, now.Add(sessionTTL+time.Minute)); got != nil {
		t.Fatal("an expired session was accepted")
	}
	if got := b.get("not-a-session", now); got != nil {
		t.Fatal("an unknown session was accepted")
	}
	b.remove(id)
	if got := a.get(id, now); got != nil {
		t.Fatal("a session logged out on the other replica still works here")
	}
	shared = false
	id, _ = a.create(now)
	if got := b.get(id, now); got != nil {
		t.Fatal("in memory, the other replica knows the session")
	}
	if got := a.get(id, now); got == nil {
		t.Fatal("in memory, the replica lost its own session")
	}
}
