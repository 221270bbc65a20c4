package store

import (
	"context"
	"fmt"
	"time"
)

// migration is one numbered schema change. Versions are 1, 2, 3... in list
// order; a migration, once released, is never edited.
type migration struct {
	version int
	name    string
	sql     string
}

// migrations is the schema history. To change the schema, append one entry
// with the next version number; Open applies every entry newer than the
// file's version, each in its own transaction.
var migrations = []migration{
	{1, "controller inventory", schemaV1},
	{2, "netboot inventory", schemaV2},
	{3, "netboot enrollments", schemaV3},
	{4, "fleet history", schemaV4},
	{5, "controller replicas", schemaHA},
	{6, "shared DHCP leases", schemaLeases},
	{7, "shard sessions for crash resume", schemaSessions},
	{8, "node leases committed before the answer", schemaNodeLeases},
	{9, "replicas' node-facing URLs", schemaReplicaNodeURLs},
	{10, "replicas' TLS key pins", schemaReplicaTLSPin},
}

// schemaV4 is the dashboard's 24-hour fleet history (history.go): one row
// per minute with the shard counts by state and the ping percentiles of
// that minute, at most HistoryMinutes rows (AddHistory prunes in the same
// transaction). minute is the minute's start in Unix milliseconds; pings
// are whole microseconds, so the table needs no floating-point type.
const schemaV4 = `
CREATE TABLE fleet_history (
	minute      INTEGER PRIMARY KEY,
	ready       INTEGER NOT NULL,
	starting    INTEGER NOT NULL,
	assigned    INTEGER NOT NULL,
	pending     INTEGER NOT NULL,
	backoff     INTEGER NOT NULL,
	fatal       INTEGER NOT NULL,
	unowned     INTEGER NOT NULL,
	ping_count  INTEGER NOT NULL,
	ping_p50_us INTEGER NOT NULL,
	ping_p90_us INTEGER NOT NULL,
	ping_p99_us INTEGER NOT NULL,
	ping_max_us INTEGER NOT NULL
);
`

// schemaV3 holds the pending network enrollment of each node (issue 24):
// the hash of the credential an approved machine's boot script carried,
// the address the script went to, and until when the first check-in may
// redeem it. A row is deleted when redeemed; the node's cred_hash is then
// the enrollment's.
const schemaV3 = `
CREATE TABLE enrollments (
	node_id   TEXT PRIMARY KEY REFERENCES nodes(id) ON DELETE CASCADE,
	cred_hash BLOB NOT NULL,
	address   TEXT NOT NULL,
	issued_at INTEGER NOT NULL,
	expires   INTEGER NOT NULL
);
`

// schemaV2 holds the netboot services' tables (netboot.go): discovered and
// approved MACs, boot timelines and DHCP leases. Until the store owned
// them it was the statement list inventory.Migrations joined by ";\n";
// the text is unchanged. Times are Unix milliseconds.
const schemaV2 = `CREATE TABLE netboot_nodes (
		mac        TEXT PRIMARY KEY,            -- MACKey form, 52-54-00-12-34-56
		state      TEXT NOT NULL CHECK (state IN ('discovered','approved','retired')),
		node_id    TEXT UNIQUE,                 -- set on approval
		credential TEXT,                        -- set on approval
		firmware   TEXT NOT NULL DEFAULT 'unknown',
		ip         TEXT NOT NULL DEFAULT '',
		first_seen INTEGER NOT NULL,            -- unix milliseconds
		last_seen  INTEGER NOT NULL
	);
CREATE TABLE netboot_events (
		id     INTEGER PRIMARY KEY AUTOINCREMENT,
		mac    TEXT NOT NULL,
		stage  TEXT NOT NULL,
		detail TEXT NOT NULL DEFAULT '',
		at     INTEGER NOT NULL                 -- unix milliseconds
	);
CREATE INDEX netboot_events_mac ON netboot_events (mac, id);
CREATE TABLE netboot_leases (
		ip       TEXT PRIMARY KEY,
		mac      TEXT NOT NULL DEFAULT '',      -- '' for a declined address
		expiry   INTEGER NOT NULL,              -- unix milliseconds
		declined INTEGER NOT NULL DEFAULT 0
	);`

// schemaV1 is the controller's inventory. Times are Unix milliseconds, 0
// meaning never.
const schemaV1 = `
CREATE TABLE settings (
	key   TEXT PRIMARY KEY,
	value TEXT NOT NULL
);
CREATE TABLE nodes (
	id               TEXT PRIMARY KEY,
	cred_hash        BLOB NOT NULL,
	created_at       INTEGER NOT NULL,
	draining         INTEGER NOT NULL DEFAULT 0,
	capacity         INTEGER NOT NULL DEFAULT 0,
	first_seen       INTEGER NOT NULL DEFAULT 0,
	last_seen        INTEGER NOT NULL DEFAULT 0,
	lease_deadline   INTEGER NOT NULL DEFAULT 0,
	live             INTEGER NOT NULL DEFAULT 0,
	acked_generation INTEGER NOT NULL DEFAULT 0,
	held             TEXT NOT NULL DEFAULT '',
	address          TEXT NOT NULL DEFAULT '',
	ready_shards     INTEGER NOT NULL DEFAULT 0,
	starting_shards  INTEGER NOT NULL DEFAULT 0,
	backoff_shards   INTEGER NOT NULL DEFAULT 0,
	fatal_shards     INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE plan (
	id              INTEGER PRIMARY KEY CHECK (id = 1),
	generation      INTEGER NOT NULL,
	total_shards    INTEGER NOT NULL,
	ranges          TEXT NOT NULL,
	changed_at      INTEGER NOT NULL
);
CREATE TABLE shard_status (
	shard_id         INTEGER PRIMARY KEY,
	node_id          TEXT NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
	state            TEXT NOT NULL,
	seq_valid        INTEGER NOT NULL,
	heartbeat_acks   INTEGER NOT NULL,
	heartbeat_misses INTEGER NOT NULL,
	reconnects       INTEGER NOT NULL,
	last_error       TEXT NOT NULL,
	close_code       INTEGER NOT NULL,
	updated_at       INTEGER NOT NULL
);
CREATE INDEX shard_status_node ON shard_status(node_id);
CREATE TABLE identify_buckets (
	bucket     INTEGER PRIMARY KEY,
	granted_at INTEGER NOT NULL,
	shard_id   INTEGER NOT NULL,
	node_id    TEXT NOT NULL
);
CREATE TABLE session_budget (
	id        INTEGER PRIMARY KEY CHECK (id = 1),
	total     INTEGER NOT NULL,
	remaining INTEGER NOT NULL,
	reset_at  INTEGER NOT NULL
);
CREATE TABLE events (
	id       INTEGER PRIMARY KEY AUTOINCREMENT,
	at       INTEGER NOT NULL,
	kind     TEXT NOT NULL,
	node_id  TEXT NOT NULL DEFAULT '',
	shard_id INTEGER,
	detail   TEXT NOT NULL DEFAULT ''
);
CREATE INDEX events_kind ON events(kind, id);
`

// migrate applies the migrations newer than the file's recorded version.
func (s *Store) migrate(ctx context.Context) error {
	if s.dialect == dialectPostgres {
		unlock, err := s.lockMigrations(ctx)
		if err != nil {
			return err
		}
		defer unlock()
	}
	if _, err := s.db.ExecContext(ctx, s.ddl(`CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INTEGER PRIMARY KEY,
		name       TEXT NOT NULL,
		applied_at INTEGER NOT NULL)`)); err != nil {
		return fmt.Errorf("schema_migrations: %w", err)
	}
	have, err := s.SchemaVersion(ctx)
	if err != nil {
		return err
	}
	if latest := migrations[len(migrations)-1].version; have > latest {
		return fmt.Errorf("%w: file at version %d, program knows %d", ErrNewerSchema, have, latest)
	}
	for i, m := range migrations {
		if m.version != i+1 {
			return fmt.Errorf("migration %q has version %d, want %d", m.name, m.version, i+1)
		}
		if m.version <= have {
			continue
		}
		tx, err := s.begin(ctx)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, s.ddl(m.sql)); err != nil {
			tx.Rollback()
			return fmt.Errorf("migration %d (%s): %w", m.version, m.name, err)
		}
		if _, err := tx.exec(ctx, `INSERT INTO schema_migrations(version, name, applied_at) VALUES(?, ?, ?)`,
			m.version, m.name, time.Now().UnixMilli()); err != nil {
			tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("migration %d (%s): %w", m.version, m.name, err)
		}
	}
	return nil
}

// ddl returns a migration's statements in the store's dialect.
func (s *Store) ddl(sql string) string {
	if s.dialect == dialectPostgres {
		return postgresDDL(sql)
	}
	return sql
}

// SchemaVersion returns the highest applied migration version, 0 for none.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	var v int
	err := s.queryRow(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&v)
	return v, err
}
