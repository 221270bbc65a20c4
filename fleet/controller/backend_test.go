package controller

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/discord-pxe/dpxe/fleet/store"
	"github.com/discord-pxe/dpxe/fleet/store/pgtest"
)

// storeBackendEnv picks the store the controller's tests run on: unset or
// "sqlite" for a SQLite file (the default), "postgres" for a fresh
// database on a PostgreSQL server the test binary starts (pgtest):
//
//	DPXE_TEST_STORE=postgres go test ./fleet/controller/
const storeBackendEnv = "DPXE_TEST_STORE"

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

// newStorePath returns a new, empty database for a test harness: a SQLite
// file, or with DPXE_TEST_STORE=postgres a PostgreSQL URL.
func newStorePath(t *testing.T) string {
	t.Helper()
	switch b := os.Getenv(storeBackendEnv); b {
	case "", "sqlite":
		return filepath.Join(t.TempDir(), "dpxe.db")
	case "postgres":
		return pgtest.DB(t)
	default:
		t.Fatalf("%s=%q: want sqlite or postgres", storeBackendEnv, b)
		return ""
	}
}

// sqliteOnly skips a test that injects a fault through SQLite itself (a
// trigger, a held write lock) when the harness runs on PostgreSQL.
func (h *harness) sqliteOnly(why string) {
	h.t.Helper()
	if store.IsPostgresURL(h.path) {
		h.t.Skipf("SQLite-only fault injection on the PostgreSQL run: %s", why)
	}
}
