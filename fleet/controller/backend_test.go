package controller

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"testing"

	"github.com/discord-pxe/dpxe/fleet/store"
	"github.com/discord-pxe/dpxe/fleet/store/pgtest"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver, for holdWrites
	_ "github.com/mattn/go-sqlite3"    // the "sqlite3" driver, for holdWrites
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

// holdWrites makes another connection hold the store's write lock, as
// another process would, until the returned function releases it: on
// SQLite a BEGIN IMMEDIATE transaction, on PostgreSQL a transaction that
// locks identify_buckets (where every grant's commit writes) EXCLUSIVE.
func (h *harness) holdWrites() (release func()) {
	h.t.Helper()
	ctx := context.Background()
	begin, lockStmt := `BEGIN IMMEDIATE`, ""
	if store.IsPostgresURL(h.path) {
		begin, lockStmt = `BEGIN`, `LOCK TABLE identify_buckets IN EXCLUSIVE MODE`
	}
	db, err := sql.Open(driverName(h.path), h.path)
	if err != nil {
		h.t.Fatal(err)
	}
	lock, err := db.Conn(ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	for _, stmt := range []string{begin, lockStmt} {
		if stmt == "" {
			continue
		}
		if _, err := lock.ExecContext(ctx, stmt); err != nil {
			h.t.Fatal(err)
		}
	}
	return func() {
		h.t.Helper()
		if _, err := lock.ExecContext(ctx, `ROLLBACK`); err != nil {
			h.t.Fatal(err)
		}
		lock.Close()
		db.Close()
	}
}

// driverName is the database/sql driver for a harness's store path.
func driverName(path string) string {
	if store.IsPostgresURL(path) {
		return "pgx"
	}
	return "sqlite3"
}

// failNodeUpdates installs a trigger that fails every update of the nodes
// table, until the returned function removes it.
func (h *harness) failNodeUpdates() (restore func()) {
	h.t.Helper()
	install := []string{`CREATE TRIGGER fail_writes BEFORE UPDATE ON nodes BEGIN SELECT RAISE(ABORT, 'injected failure'); END`}
	remove := []string{`DROP TRIGGER fail_writes`}
	if store.IsPostgresURL(h.path) {
		install = []string{
			`CREATE FUNCTION fail_writes() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'injected failure'; END $$`,
			`CREATE TRIGGER fail_writes BEFORE UPDATE ON nodes FOR EACH ROW EXECUTE FUNCTION fail_writes()`,
		}
		remove = []string{`DROP TRIGGER fail_writes ON nodes`, `DROP FUNCTION fail_writes()`}
	}
	for _, stmt := range install {
		if _, err := h.st.DB().Exec(stmt); err != nil {
			h.t.Fatal(err)
		}
	}
	return func() {
		h.t.Helper()
		for _, stmt := range remove {
			if _, err := h.st.DB().Exec(stmt); err != nil {
				h.t.Fatal(err)
			}
		}
	}
}
