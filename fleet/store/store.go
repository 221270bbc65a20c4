// Package store is the fleet's inventory, in SQLite or PostgreSQL: nodes and their hashed
// credentials, the shard plan and generation, per-node lease state, the
// Identify history and session budget, per-shard status, the audit log,
// the dashboard's settings and the netboot services' tables
// (NetbootInventory). It is the only package that writes SQL: the others
// call its methods.
//
// SQLite, the default, runs in WAL mode with foreign keys on, a busy
// timeout and synchronous=NORMAL; writes that a safety argument depends on
// are committed with synchronous=FULL (see Batch.Durable). PostgreSQL
// (postgres.go) commits every transaction durably, at its default
// synchronous_commit. The schema is an
// ordered list of numbered migrations in migrations.go; later features
// append to it.
//
// A *Store is safe for concurrent use. Several processes may open the same
// file (the CLI adds nodes while `dpxe serve` runs).
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mattn/go-sqlite3" // registers the "sqlite3" driver
)

// busyTimeout is how long a connection waits for another writer's lock.
const busyTimeout = 5 * time.Second

// maxOpenConns bounds the connection pool; WAL gives readers their own
// snapshot and writers queue on the busy timeout.
const maxOpenConns = 4

// Errors.
var (
	// ErrNotFound is returned when a looked-up row does not exist.
	ErrNotFound = errors.New("store: not found")
	// ErrExists is returned when a node ID is already in the inventory.
	ErrExists = errors.New("store: already exists")
	// ErrNewerSchema is returned when the file was written by a newer dpxe.
	ErrNewerSchema = errors.New("store: database schema is newer than this program")
)

// Store is an open inventory database.
type Store struct {
	db        *sql.DB
	dialect   dialect
	path      string
	maxEvents int              // audit-log bound, MaxEvents except in tests
	rebound   sync.Map         // query text with ? → the dialect's text, for postgres
	dbClock   func() time.Time // tests only (SetDBClock); nil: the server's clock
}

// dialect is the SQL flavour of a store's database.
type dialect uint8

const (
	dialectSQLite dialect = iota
	dialectPostgres
)

// q returns query, written with ? placeholders, in the store's dialect:
// PostgreSQL numbers its placeholders $1, $2... A ? inside a quoted
// literal is left alone.
func (s *Store) q(query string) string {
	if s.dialect == dialectSQLite {
		return query
	}
	if v, ok := s.rebound.Load(query); ok {
		return v.(string)
	}
	var b strings.Builder
	n, quoted := 0, false
	for _, r := range query {
		switch {
		case r == '\'':
			quoted = !quoted
		case r == '?' && !quoted:
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	s.rebound.Store(query, b.String())
	return b.String()
}

// exec, query and queryRow run one statement written with ? placeholders.
func (s *Store) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return s.db.ExecContext(ctx, s.q(query), args...)
}

func (s *Store) query(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return s.db.QueryContext(ctx, s.q(query), args...)
}

func (s *Store) queryRow(ctx context.Context, query string, args ...any) *sql.Row {
	return s.db.QueryRowContext(ctx, s.q(query), args...)
}

// txn is a transaction whose statements are written with ? placeholders.
type txn struct {
	*sql.Tx
	s *Store
}

func (s *Store) begin(ctx context.Context) (*txn, error) {
	t, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	return &txn{t, s}, nil
}

func (t *txn) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return t.ExecContext(ctx, t.s.q(query), args...)
}

func (t *txn) prepare(ctx context.Context, query string) (*sql.Stmt, error) {
	return t.PrepareContext(ctx, t.s.q(query))
}

// b2i stores a flag as the integer 0 or 1: flags are INTEGER columns on
// every backend.
func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// fileMode is the mode of the database and its -wal and -shm files: they
// hold credential and token hashes and the boot timelines, for this user
// only. SQLite gives the -wal and -shm files the mode of the database file.
const fileMode = 0o600

// Open opens (creating if needed) the database at path, with its parent
// directory (mode 0700 when created), and applies pending migrations. The
// database file is created with mode 0600, whatever the umask; an existing
// file, or its -wal and -shm files, readable by group or others (dpxe
// before 0600) is narrowed to 0600.
//
// A path that is a postgres:// or postgresql:// URL (IsPostgresURL) opens
// that PostgreSQL database instead, with the same schema and methods.
func Open(ctx context.Context, path string) (*Store, error) {
	if IsPostgresURL(path) {
		return openPostgres(ctx, path)
	}
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("store: %w", err)
		}
	}
	if err := privateFiles(path); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	q := url.Values{}
	q.Set("_journal_mode", "WAL")
	q.Set("_foreign_keys", "1")
	q.Set("_busy_timeout", fmt.Sprint(busyTimeout.Milliseconds()))
	q.Set("_synchronous", "NORMAL")
	q.Set("_txlock", "immediate")
	db, err := sql.Open("sqlite3", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	db.SetMaxOpenConns(maxOpenConns)
	db.SetMaxIdleConns(maxOpenConns)
	s := &Store{db: db, dialect: dialectSQLite, path: path, maxEvents: MaxEvents}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: %s: %w", path, err)
	}
	return s, nil
}

// privateFiles creates the database file with fileMode if it is missing,
// before SQLite would create it with 0644, and narrows the mode of an
// existing database, -wal and -shm file to fileMode.
func privateFiles(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, fileMode)
	if err != nil {
		return err
	}
	f.Close()
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&^fileMode != 0 {
			if err := os.Chmod(p, fi.Mode().Perm()&fileMode); err != nil {
				return err
			}
		}
	}
	return nil
}

// Close checkpoints the WAL into the main file (SQLite) and closes the
// database.
func (s *Store) Close() error {
	if s.dialect == dialectSQLite {
		_, _ = s.db.Exec("PRAGMA wal_checkpoint(TRUNCATE)")
	}
	return s.db.Close()
}

// DB returns the underlying handle. It is for tests that inject faults
// (triggers, held locks) and inspect rows; every other package goes
// through the store's methods (TestOnlyStoreWritesSQL).
func (s *Store) DB() *sql.DB { return s.db }

// Path returns the database file name, or for PostgreSQL its URL without
// the password.
func (s *Store) Path() string { return s.path }

// ms converts t to Unix milliseconds; the zero time is 0.
func ms(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// fromMS converts Unix milliseconds to a time; 0 is the zero time.
func fromMS(v int64) time.Time {
	if v == 0 {
		return time.Time{}
	}
	return time.UnixMilli(v).UTC()
}

// Setting returns the value of a settings key, or ErrNotFound.
func (s *Store) Setting(ctx context.Context, key string) (string, error) {
	var v string
	err := s.queryRow(ctx, `SELECT value FROM settings WHERE key = ?`, key).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return "", ErrNotFound
	}
	return v, err
}

// SetSetting stores a settings key.
func (s *Store) SetSetting(ctx context.Context, key, value string) error {
	_, err := s.exec(ctx, `INSERT INTO settings(key, value) VALUES(?, ?)
		ON CONFLICT(key) DO UPDATE SET value = excluded.value`, key, value)
	return err
}

// InitSetting stores value under key unless the key has a value already,
// and returns the stored value: of several processes that call it at once,
// all get the value of the one whose insert committed first.
func (s *Store) InitSetting(ctx context.Context, key, value string) (string, error) {
	if _, err := s.exec(ctx, `INSERT INTO settings(key, value) VALUES(?, ?)
		ON CONFLICT(key) DO NOTHING`, key, value); err != nil {
		return "", err
	}
	return s.Setting(ctx, key)
}

// DeleteSetting removes a settings key; a missing key is not an error.
func (s *Store) DeleteSetting(ctx context.Context, key string) error {
	_, err := s.exec(ctx, `DELETE FROM settings WHERE key = ?`, key)
	return err
}

// constraint is a kind of integrity constraint a statement can violate.
type constraint uint8

const (
	unique     constraint = iota // a UNIQUE or PRIMARY KEY constraint
	foreignKey                   // a REFERENCES constraint
)

// isConstraint reports whether err is the database refusing a statement
// for violating a constraint of kind c.
func isConstraint(err error, c constraint) bool {
	if err == nil {
		return false
	}
	var se sqlite3.Error
	if errors.As(err, &se) {
		switch c {
		case unique:
			return se.ExtendedCode == sqlite3.ErrConstraintUnique || se.ExtendedCode == sqlite3.ErrConstraintPrimaryKey
		case foreignKey:
			return se.ExtendedCode == sqlite3.ErrConstraintForeignKey
		}
	}
	return isPostgresConstraint(err, c)
}
