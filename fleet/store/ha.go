package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Controller replicas (issue 20, docs/ha.md). Several `dpxe serve`
// processes share one PostgreSQL database; one of them, the leader, holds
// the row of ha_leader: a lease timed by the database's clock with a term
// that rises at every change of holder. Every batch the leader writes
// (Apply with Batch.Fence) first checks, in the same transaction and under
// the row's lock, that its term is still the stored one and unexpired, so a
// deposed leader's writes fail with ErrFenced however late they arrive.
// The replicas table lists the processes with a heartbeat, for `dpxe
// replicas` and for the controller URLs nodes learn from the check-in.

// schemaHA is migration 5. resume_handoffs and restart_requests keep the
// leader's resume hand-offs and FATAL-restart requests, so a new leader
// offers and repeats them; dashboard_sessions the dashboard's sessions
// (by the SHA-256 of the cookie), so any replica knows them. identify_buckets.db_granted_at is the database
// clock's time of the bucket's last grant and grant_term the leader term
// that wrote it (0 unfenced), so the spacing of grants written under
// different terms is checked on one clock.
const schemaHA = `
CREATE TABLE ha_leader (
	id         INTEGER PRIMARY KEY CHECK (id = 1),
	term       INTEGER NOT NULL,
	holder     TEXT NOT NULL,
	url        TEXT NOT NULL,
	elected_at INTEGER NOT NULL,
	expires_at INTEGER NOT NULL
);
CREATE TABLE replicas (
	id           TEXT PRIMARY KEY,
	url          TEXT NOT NULL,
	role         TEXT NOT NULL,
	term         INTEGER NOT NULL,
	started_at   INTEGER NOT NULL,
	heartbeat_at INTEGER NOT NULL
);
ALTER TABLE identify_buckets ADD COLUMN db_granted_at INTEGER NOT NULL DEFAULT 0;
ALTER TABLE identify_buckets ADD COLUMN grant_term INTEGER NOT NULL DEFAULT 0;
CREATE TABLE resume_handoffs (
	shard_id   INTEGER PRIMARY KEY,
	from_node  TEXT NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
	session_id TEXT NOT NULL,
	seq        INTEGER NOT NULL,
	resume_url TEXT NOT NULL,
	offered_at INTEGER NOT NULL
);
CREATE TABLE restart_requests (
	node_id TEXT PRIMARY KEY REFERENCES nodes(id) ON DELETE CASCADE,
	shards  TEXT NOT NULL
);
CREATE TABLE dashboard_sessions (
	id_hash BLOB PRIMARY KEY,
	csrf    TEXT NOT NULL,
	expires INTEGER NOT NULL
);
`

// schemaReplicaNodeURLs is migration 9: the URLs by which nodes reach
// each replica, by the way they come (Replica.NodeURLs), as a JSON object
// (” from a replica of before it).
const schemaReplicaNodeURLs = `
ALTER TABLE replicas ADD COLUMN node_urls TEXT NOT NULL DEFAULT '';
`

// schemaReplicaTLSPin is migration 10: the SHA-256 pin of the key each
// replica serves nodes HTTPS with (Replica.TLSPin; ” without HTTPS or
// from a replica of before it).
const schemaReplicaTLSPin = `
ALTER TABLE replicas ADD COLUMN tls_pin TEXT NOT NULL DEFAULT '';
`

// Errors of the replica layer.
var (
	// ErrFenced is returned by Apply when the batch's fence no longer
	// holds: another replica took the leader lease (a higher term), or
	// the lease expired on the database's clock. The writer must stop
	// acting as leader.
	ErrFenced = errors.New("store: leader term fenced off (another replica leads, or the lease expired)")
	// ErrGrantSpacing is GrantIdentify's refusal of an Identify grant in
	// a bucket less than the window after the bucket's previous grant, on
	// the database's clock.
	ErrGrantSpacing = errors.New("store: identify grant too soon after the bucket's last grant")
)

// Fence makes a batch conditional on its writer still leading: the stored
// leader row must hold Term and Holder and be unexpired on the database's
// clock when the batch commits.
type Fence struct {
	Holder string
	Term   uint64
}

// Leadership is the leader row as one Campaign saw it.
type Leadership struct {
	Leader    bool   // the caller holds the lease
	Term      uint64 // the current term (0 before any election)
	Holder    string // the current holder ("" before any election)
	URL       string // the holder's advertised URL
	ExpiresAt time.Time
	// Now is the database's clock when the row was read.
	Now time.Time
}

// dbNowMS is an SQL expression for the database's clock in Unix
// milliseconds: clock_timestamp() on PostgreSQL (the time of the
// statement, not of the transaction's start), the system clock on SQLite.
func (s *Store) dbNowMS() string {
	if v, ok := s.dbClockMS(); ok {
		return v
	}
	if s.dialect == dialectPostgres {
		return `(extract(epoch FROM clock_timestamp()) * 1000)::bigint`
	}
	return `CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)`
}

// forUpdate is the row-locking suffix of a SELECT on PostgreSQL; SQLite's
// immediate transactions already hold the database's write lock.
func (s *Store) forUpdate() string {
	if s.dialect == dialectPostgres {
		return ` FOR UPDATE`
	}
	return ``
}

// DBNow returns the database's clock.
func (s *Store) DBNow(ctx context.Context) (time.Time, error) {
	var v int64
	if err := s.queryRow(ctx, `SELECT `+s.dbNowMS()).Scan(&v); err != nil {
		return time.Time{}, err
	}
	return fromMS(v), nil
}

// Campaign is one round of leader election for holder, in one short
// transaction under the leader row's lock. If holder leads and its lease
// is unexpired, the lease is renewed to the database's now + ttl. If the
// lease is expired (or was never taken), holder takes it with the next
// term. Otherwise holder is a follower and the row is unchanged. url is
// what holder advertises to nodes and other replicas.
func (s *Store) Campaign(ctx context.Context, holder, url string, ttl time.Duration) (Leadership, error) {
	if holder == "" {
		return Leadership{}, fmt.Errorf("store: campaign: holder is empty")
	}
	if ttl < time.Millisecond {
		return Leadership{}, fmt.Errorf("store: campaign: ttl %v under 1ms", ttl)
	}
	tx, err := s.begin(ctx)
	if err != nil {
		return Leadership{}, err
	}
	defer tx.Rollback()
	if _, err := tx.exec(ctx, `INSERT INTO ha_leader(id, term, holder, url, elected_at, expires_at)
		VALUES(1, 0, '', '', 0, 0) ON CONFLICT(id) DO NOTHING`); err != nil {
		return Leadership{}, fmt.Errorf("store: campaign: %w", err)
	}
	var l Leadership
	var term, expires, now int64
	err = tx.QueryRowContext(ctx, s.q(`SELECT term, holder, url, expires_at FROM ha_leader WHERE id = 1`+s.forUpdate())).
		Scan(&term, &l.Holder, &l.URL, &expires)
	if err != nil {
		return Leadership{}, fmt.Errorf("store: campaign: %w", err)
	}
	// The clock is read once the row is locked: in the statement that
	// locks it, PostgreSQL evaluates clock_timestamp() before waiting for
	// the lock, so a campaign that waited for another transaction would
	// judge the lease by a time from before its wait.
	if err := tx.QueryRowContext(ctx, `SELECT `+s.dbNowMS()).Scan(&now); err != nil {
		return Leadership{}, fmt.Errorf("store: campaign: %w", err)
	}
	until := now + ttl.Milliseconds()
	switch {
	case l.Holder == holder && expires > now:
		if _, err := tx.exec(ctx, `UPDATE ha_leader SET expires_at = ?, url = ? WHERE id = 1 AND term = ? AND holder = ?`,
			until, url, term, holder); err != nil {
			return Leadership{}, fmt.Errorf("store: renew: %w", err)
		}
		l.Leader, expires, l.URL = true, until, url
	case expires <= now:
		term++
		if _, err := tx.exec(ctx, `UPDATE ha_leader SET term = ?, holder = ?, url = ?, elected_at = ?, expires_at = ? WHERE id = 1`,
			term, holder, url, now, until); err != nil {
			return Leadership{}, fmt.Errorf("store: take lease: %w", err)
		}
		l.Leader, l.Holder, l.URL, expires = true, holder, url, until
	}
	if err := tx.Commit(); err != nil {
		return Leadership{}, fmt.Errorf("store: campaign: %w", err)
	}
	l.Term, l.ExpiresAt, l.Now = uint64(term), fromMS(expires), fromMS(now)
	return l, nil
}

// Resign gives up holder's lease of term at once (a clean shutdown), so
// another replica can take over without waiting for it to expire. A lease
// holder no longer holds is left alone.
func (s *Store) Resign(ctx context.Context, holder string, term uint64) error {
	_, err := s.exec(ctx, `UPDATE ha_leader SET expires_at = 0 WHERE id = 1 AND term = ? AND holder = ?`, term, holder)
	return err
}

// checkFence fails with ErrFenced unless f still holds; on PostgreSQL it
// keeps the leader row locked until tx ends, so no takeover commits in
// between.
func (t *txn) checkFence(ctx context.Context, f *Fence) error {
	res, err := t.exec(ctx, `UPDATE ha_leader SET expires_at = expires_at WHERE id = 1 AND term = ? AND holder = ? AND expires_at > `+t.s.dbNowMS(),
		f.Term, f.Holder)
	if err != nil {
		return fmt.Errorf("fence: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return fmt.Errorf("term %d of %s: %w", f.Term, f.Holder, ErrFenced)
	}
	return nil
}

// Replica is one `dpxe serve` process as the replicas table lists it.
type Replica struct {
	ID  string `json:"id"`
	URL string `json:"url"` // advertised: other replicas and the management network
	// NodeURLs are the URLs nodes reach this replica by, keyed by the way
	// they come: "http" and "https" on the management network (the
	// advertised URL and its other scheme), "boot-http" and "boot-https"
	// on the boot network (its netboot controller URL). The check-in
	// answers list the replicas' URLs of the way the node came.
	NodeURLs map[string]string `json:"node_urls,omitempty"`
	// TLSPin is the pin (hex SHA-256 of the public key, as nodes'
	// controller_pin) of the key it serves nodes HTTPS with; "" when it
	// serves none. A node pinned to one key refuses a replica with another,
	// so every replica should have the same (docs/ha.md).
	TLSPin      string    `json:"tls_pin,omitempty"`
	Role        string    `json:"role"` // "leader" or "follower"
	Term        uint64    `json:"term"` // the term it last saw
	StartedAt   time.Time `json:"started_at"`
	HeartbeatAt time.Time `json:"heartbeat_at"` // the database's clock
	// Age is how long ago the heartbeat was, on the database's clock.
	Age time.Duration `json:"age_ns"`
}

// Heartbeat records r in the replicas table, its heartbeat at the
// database's clock.
func (s *Store) Heartbeat(ctx context.Context, r Replica) error {
	if r.ID == "" {
		return fmt.Errorf("store: heartbeat: replica id is empty")
	}
	nodeURLs := ""
	if len(r.NodeURLs) > 0 {
		b, err := json.Marshal(r.NodeURLs)
		if err != nil {
			return fmt.Errorf("store: heartbeat: node_urls: %w", err)
		}
		nodeURLs = string(b)
	}
	_, err := s.exec(ctx, `INSERT INTO replicas(id, url, node_urls, tls_pin, role, term, started_at, heartbeat_at)
		VALUES(?, ?, ?, ?, ?, ?, ?, `+s.dbNowMS()+`)
		ON CONFLICT(id) DO UPDATE SET url = excluded.url, node_urls = excluded.node_urls, tls_pin = excluded.tls_pin,
		role = excluded.role, term = excluded.term, started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at`,
		r.ID, r.URL, nodeURLs, r.TLSPin, r.Role, r.Term, ms(r.StartedAt))
	return err
}

// Replicas lists the replicas whose heartbeat is at most maxAge old on
// the database's clock (every one if maxAge is 0), by ID.
func (s *Store) Replicas(ctx context.Context, maxAge time.Duration) ([]Replica, error) {
	q := `SELECT id, url, node_urls, tls_pin, role, term, started_at, heartbeat_at, ` + s.dbNowMS() + ` FROM replicas`
	var args []any
	if maxAge > 0 {
		q += ` WHERE heartbeat_at >= ` + s.dbNowMS() + ` - ?`
		args = append(args, maxAge.Milliseconds())
	}
	rows, err := s.query(ctx, q+` ORDER BY id`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []Replica{}
	for rows.Next() {
		var r Replica
		var started, hb, now int64
		var nodeURLs string
		if err := rows.Scan(&r.ID, &r.URL, &nodeURLs, &r.TLSPin, &r.Role, &r.Term, &started, &hb, &now); err != nil {
			return nil, err
		}
		if nodeURLs != "" {
			if err := json.Unmarshal([]byte(nodeURLs), &r.NodeURLs); err != nil {
				return nil, fmt.Errorf("store: replica %s: node_urls: %w", r.ID, err)
			}
		}
		r.StartedAt, r.HeartbeatAt, r.Age = fromMS(started), fromMS(hb), time.Duration(now-hb)*time.Millisecond
		out = append(out, r)
	}
	return out, rows.Err()
}

// DeleteReplica removes a replica's row (a clean shutdown).
func (s *Store) DeleteReplica(ctx context.Context, id string) error {
	_, err := s.exec(ctx, `DELETE FROM replicas WHERE id = ?`, id)
	return err
}

// Handoff is a resumable Gateway session released by node From, on offer
// to the shard's next holder.
type Handoff struct {
	ShardID   uint32
	From      string
	SessionID string
	Seq       uint32
	ResumeURL string
	OfferedAt time.Time
}

// writeHAState replaces the stored hand-offs and restart requests with the
// batch's, each only when the batch carries it.
func (t *txn) writeHAState(ctx context.Context, b *Batch) error {
	if b.Handoffs != nil {
		if _, err := t.exec(ctx, `DELETE FROM resume_handoffs`); err != nil {
			return fmt.Errorf("hand-offs: %w", err)
		}
		for _, h := range *b.Handoffs {
			if _, err := t.exec(ctx, `INSERT INTO resume_handoffs(shard_id, from_node, session_id, seq, resume_url, offered_at) VALUES(?, ?, ?, ?, ?, ?)`,
				h.ShardID, h.From, h.SessionID, h.Seq, h.ResumeURL, ms(h.OfferedAt)); err != nil {
				return fmt.Errorf("hand-off of shard %d: %w", h.ShardID, err)
			}
		}
	}
	if b.Restarts != nil {
		if _, err := t.exec(ctx, `DELETE FROM restart_requests`); err != nil {
			return fmt.Errorf("restart requests: %w", err)
		}
		for node, shards := range b.Restarts {
			if _, err := t.exec(ctx, `INSERT INTO restart_requests(node_id, shards) VALUES(?, ?)`, node, shards); err != nil {
				return fmt.Errorf("restart requests of %s: %w", node, err)
			}
		}
	}
	return nil
}

// Handoffs returns the stored resume hand-offs, by shard.
func (s *Store) Handoffs(ctx context.Context) ([]Handoff, error) {
	rows, err := s.query(ctx, `SELECT shard_id, from_node, session_id, seq, resume_url, offered_at FROM resume_handoffs ORDER BY shard_id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Handoff
	for rows.Next() {
		var h Handoff
		var at int64
		if err := rows.Scan(&h.ShardID, &h.From, &h.SessionID, &h.Seq, &h.ResumeURL, &at); err != nil {
			return nil, err
		}
		h.OfferedAt = fromMS(at)
		out = append(out, h)
	}
	return out, rows.Err()
}

// RestartRequests returns the stored FATAL-restart requests: per node, its
// shards as ranges text ("3,19-20").
func (s *Store) RestartRequests(ctx context.Context) (map[string]string, error) {
	rows, err := s.query(ctx, `SELECT node_id, shards FROM restart_requests`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var id, shards string
		if err := rows.Scan(&id, &shards); err != nil {
			return nil, err
		}
		out[id] = shards
	}
	return out, rows.Err()
}

// maxDashboardSessions bounds the stored dashboard sessions; the soonest
// to expire go first.
const maxDashboardSessions = 1000

// CreateSession stores a dashboard session: the SHA-256 of its cookie,
// its CSRF token and its expiry. Expired sessions, and the soonest to
// expire beyond maxDashboardSessions, are removed.
func (s *Store) CreateSession(ctx context.Context, idHash []byte, csrf string, expires time.Time) error {
	tx, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.exec(ctx, `DELETE FROM dashboard_sessions WHERE expires < ?`, time.Now().UnixMilli()); err != nil {
		return err
	}
	all := "-1"
	if s.dialect == dialectPostgres {
		all = "ALL"
	}
	if _, err := tx.exec(ctx, `DELETE FROM dashboard_sessions WHERE id_hash IN
		(SELECT id_hash FROM dashboard_sessions ORDER BY expires DESC LIMIT `+all+` OFFSET ?)`, maxDashboardSessions-1); err != nil {
		return err
	}
	if _, err := tx.exec(ctx, `INSERT INTO dashboard_sessions(id_hash, csrf, expires) VALUES(?, ?, ?)`, idHash, csrf, ms(expires)); err != nil {
		return err
	}
	return tx.Commit()
}

// Session returns a stored dashboard session's CSRF token and expiry, or
// ErrNotFound.
func (s *Store) Session(ctx context.Context, idHash []byte) (csrf string, expires time.Time, err error) {
	var at int64
	err = s.queryRow(ctx, `SELECT csrf, expires FROM dashboard_sessions WHERE id_hash = ?`, idHash).Scan(&csrf, &at)
	if errors.Is(err, sql.ErrNoRows) {
		return "", time.Time{}, ErrNotFound
	}
	return csrf, fromMS(at), err
}

// DeleteSession removes a stored dashboard session (log-out).
func (s *Store) DeleteSession(ctx context.Context, idHash []byte) error {
	_, err := s.exec(ctx, `DELETE FROM dashboard_sessions WHERE id_hash = ?`, idHash)
	return err
}
