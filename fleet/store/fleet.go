package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// MaxEvents bounds the audit log; Apply deletes the oldest rows beyond it.
const MaxEvents = 100_000

// Node is one node of the inventory with the controller's last persisted
// view of it.
type Node struct {
	ID        string
	CredHash  []byte // SHA-256 of the node credential
	CreatedAt time.Time
	NodeState
}

// NodeState is the part of a node the controller changes at run time.
type NodeState struct {
	ID              string
	Draining        bool
	Capacity        int
	FirstSeen       time.Time
	LastSeen        time.Time
	LeaseDeadline   time.Time
	Live            bool   // in the controller's live set
	AckedGeneration uint64 // generation of the node's last acknowledged plan
	Held            string // shards the node may be running, as ranges "0-15,40"
	Address         string
	Ready           int
	Starting        int
	Backoff         int
	Fatal           int
}

// PlanRange is one node's contiguous shard range.
type PlanRange struct {
	NodeID string `json:"node"`
	Start  uint32 `json:"start"`
	Count  uint32 `json:"count"`
}

// Plan is the persisted shard plan.
type Plan struct {
	Generation  uint64
	TotalShards uint32
	Ranges      []PlanRange // nodes with a non-empty range, in node order
	ChangedAt   time.Time
}

// ShardStatus is the latest status a node reported for one shard.
type ShardStatus struct {
	ShardID         uint32
	NodeID          string
	State           string
	SeqValid        bool
	HeartbeatAcks   uint32
	HeartbeatMisses uint32
	Reconnects      uint32
	LastError       string
	CloseCode       uint16
	UpdatedAt       time.Time
}

// BucketGrant is the last Identify grant of one concurrency bucket.
type BucketGrant struct {
	Bucket    uint32
	GrantedAt time.Time
	ShardID   uint32
	NodeID    string
}

// Budget is Discord's daily session-start budget as the controller tracks it.
type Budget struct {
	Total     int
	Remaining int
	ResetAt   time.Time
}

// Event is one audit-log entry.
type Event struct {
	ID      int64     `json:"id"`
	At      time.Time `json:"at"`
	Kind    string    `json:"kind"`
	NodeID  string    `json:"node_id,omitempty"`
	ShardID *uint32   `json:"shard_id,omitempty"`
	Detail  string    `json:"detail,omitempty"`
}

// Batch is a set of controller changes written in one transaction.
type Batch struct {
	Plan        *Plan
	Nodes       []NodeState
	ShardStatus []ShardStatus
	Budget      *Budget
	Events      []Event
	// Durable commits with synchronous=FULL, so the batch survives a power
	// loss and not only a process crash.
	Durable bool
	// Fence, when set, makes the batch commit only while its writer still
	// holds the leader lease of Fence.Term (ha.go); otherwise Apply fails
	// with ErrFenced and writes nothing.
	Fence *Fence
	// Handoffs, when not nil, replaces every stored resume hand-off
	// (replicas: a new leader offers them).
	Handoffs *[]Handoff
	// Restarts, when not nil, replaces every stored FATAL-restart
	// request: node ID → shards as ranges text.
	Restarts map[string]string
	// Sessions are the shards' resumable sessions to write or drop, each
	// under its fence (sessions.go).
	Sessions []ShardSession
}

// Empty reports whether b has nothing to write.
func (b *Batch) Empty() bool {
	return b.Plan == nil && len(b.Nodes) == 0 && len(b.ShardStatus) == 0 && b.Budget == nil && len(b.Events) == 0 &&
		b.Handoffs == nil && b.Restarts == nil && len(b.Sessions) == 0
}

// CreateNode adds a node with its credential hash. It returns ErrExists if
// the ID is taken.
func (s *Store) CreateNode(ctx context.Context, id string, credHash []byte, at time.Time) error {
	_, err := s.exec(ctx, `INSERT INTO nodes(id, cred_hash, created_at) VALUES(?, ?, ?)`, id, credHash, ms(at))
	if isConstraint(err, unique) {
		return fmt.Errorf("node %s: %w", id, ErrExists)
	}
	return err
}

// SetCredential replaces a node's credential hash and drops its pending
// network enrollment, if any (the operator's credential is the one that
// counts); ErrNotFound if the node does not exist.
func (s *Store) SetCredential(ctx context.Context, id string, credHash []byte) error {
	tx, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	res, err := tx.exec(ctx, `UPDATE nodes SET cred_hash = ? WHERE id = ?`, credHash, id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("node %s: %w", id, ErrNotFound)
	}
	if _, err := tx.exec(ctx, `DELETE FROM enrollments WHERE node_id = ?`, id); err != nil {
		return err
	}
	return tx.Commit()
}

// DeleteNode removes a node with its credential, pending enrollment and
// shard status; ErrNotFound if there is none.
func (s *Store) DeleteNode(ctx context.Context, id string) error {
	tx, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for _, q := range []string{`DELETE FROM enrollments WHERE node_id = ?`, `DELETE FROM shard_status WHERE node_id = ?`} {
		if _, err := tx.exec(ctx, q, id); err != nil {
			return err
		}
	}
	res, err := tx.exec(ctx, `DELETE FROM nodes WHERE id = ?`, id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("node %s: %w", id, ErrNotFound)
	}
	return tx.Commit()
}

const nodeColumns = `id, cred_hash, created_at, draining, capacity, first_seen, last_seen, lease_deadline,
	live, acked_generation, held, address, ready_shards, starting_shards, backoff_shards, fatal_shards`

func scanNode(sc interface{ Scan(...any) error }) (Node, error) {
	var n Node
	var created, first, last, deadline, draining, live int64
	err := sc.Scan(&n.ID, &n.CredHash, &created, &draining, &n.Capacity, &first, &last, &deadline,
		&live, &n.AckedGeneration, &n.Held, &n.Address, &n.Ready, &n.Starting, &n.Backoff, &n.Fatal)
	n.NodeState.ID = n.ID
	n.Draining, n.Live = draining != 0, live != 0
	n.CreatedAt, n.FirstSeen, n.LastSeen, n.LeaseDeadline = fromMS(created), fromMS(first), fromMS(last), fromMS(deadline)
	return n, err
}

// Nodes returns every node, ordered by ID.
func (s *Store) Nodes(ctx context.Context) ([]Node, error) {
	rows, err := s.query(ctx, `SELECT `+nodeColumns+` FROM nodes ORDER BY id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Node
	for rows.Next() {
		n, err := scanNode(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, rows.Err()
}

// Node returns one node or ErrNotFound.
func (s *Store) Node(ctx context.Context, id string) (Node, error) {
	n, err := scanNode(s.queryRow(ctx, `SELECT `+nodeColumns+` FROM nodes WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Node{}, fmt.Errorf("node %s: %w", id, ErrNotFound)
	}
	return n, err
}

// LoadPlan returns the persisted plan; ok is false when none was saved.
func (s *Store) LoadPlan(ctx context.Context) (p Plan, ok bool, err error) {
	var ranges string
	var changed int64
	err = s.queryRow(ctx, `SELECT generation, total_shards, ranges, changed_at FROM plan WHERE id = 1`).
		Scan(&p.Generation, &p.TotalShards, &ranges, &changed)
	if errors.Is(err, sql.ErrNoRows) {
		return Plan{}, false, nil
	}
	if err != nil {
		return Plan{}, false, err
	}
	if err := json.Unmarshal([]byte(ranges), &p.Ranges); err != nil {
		return Plan{}, false, fmt.Errorf("plan ranges: %w", err)
	}
	p.ChangedAt = fromMS(changed)
	return p, true, nil
}

// ShardStatuses returns the stored shard statuses of one node, or of all
// nodes when nodeID is "", ordered by shard.
func (s *Store) ShardStatuses(ctx context.Context, nodeID string) ([]ShardStatus, error) {
	q := `SELECT shard_id, node_id, state, seq_valid, heartbeat_acks, heartbeat_misses, reconnects, last_error, close_code, updated_at FROM shard_status`
	var args []any
	if nodeID != "" {
		q += ` WHERE node_id = ?`
		args = append(args, nodeID)
	}
	rows, err := s.query(ctx, q+` ORDER BY shard_id`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []ShardStatus
	for rows.Next() {
		var st ShardStatus
		var at, seqValid int64
		if err := rows.Scan(&st.ShardID, &st.NodeID, &st.State, &seqValid, &st.HeartbeatAcks, &st.HeartbeatMisses,
			&st.Reconnects, &st.LastError, &st.CloseCode, &at); err != nil {
			return nil, err
		}
		st.SeqValid = seqValid != 0
		st.UpdatedAt = fromMS(at)
		out = append(out, st)
	}
	return out, rows.Err()
}

// BucketGrants returns the last grant of every bucket.
func (s *Store) BucketGrants(ctx context.Context) ([]BucketGrant, error) {
	rows, err := s.query(ctx, `SELECT bucket, granted_at, shard_id, node_id FROM identify_buckets ORDER BY bucket`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []BucketGrant
	for rows.Next() {
		var g BucketGrant
		var at int64
		if err := rows.Scan(&g.Bucket, &at, &g.ShardID, &g.NodeID); err != nil {
			return nil, err
		}
		g.GrantedAt = fromMS(at)
		out = append(out, g)
	}
	return out, rows.Err()
}

// GrantAge is one bucket's last Identify grant as the database's clock
// dates it: what a controller that starts, or takes the lead, needs to
// know when each bucket may grant again (issue 20: nothing about grants
// lives only in one replica's memory).
type GrantAge struct {
	Bucket  uint32
	ShardID uint32
	// Age is how long before the read the grant was written, on the
	// database's clock (negative if that clock stepped back since).
	Age time.Duration
	// Known is false for a grant written before migration 5, which
	// recorded no database time: its age is unknown.
	Known bool
}

// GrantAges returns every bucket's last grant with its age on the
// database's clock, by bucket, read in one statement.
func (s *Store) GrantAges(ctx context.Context) ([]GrantAge, error) {
	rows, err := s.query(ctx, `SELECT bucket, shard_id, db_granted_at, `+s.dbNowMS()+` FROM identify_buckets ORDER BY bucket`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []GrantAge
	for rows.Next() {
		var g GrantAge
		var at, now int64
		if err := rows.Scan(&g.Bucket, &g.ShardID, &at, &now); err != nil {
			return nil, err
		}
		if at != 0 {
			g.Age, g.Known = time.Duration(now-at)*time.Millisecond, true
		}
		out = append(out, g)
	}
	return out, rows.Err()
}

// LoadBudget returns the stored session budget; ok is false if none.
func (s *Store) LoadBudget(ctx context.Context) (b Budget, ok bool, err error) {
	var reset int64
	err = s.queryRow(ctx, `SELECT total, remaining, reset_at FROM session_budget WHERE id = 1`).Scan(&b.Total, &b.Remaining, &reset)
	if errors.Is(err, sql.ErrNoRows) {
		return Budget{}, false, nil
	}
	b.ResetAt = fromMS(reset)
	return b, err == nil, err
}

// Events returns up to limit events with ID greater than after, oldest
// first, optionally only of one kind.
func (s *Store) Events(ctx context.Context, after int64, kind string, limit int) ([]Event, error) {
	q := `SELECT id, at, kind, node_id, shard_id, detail FROM events WHERE id > ?`
	args := []any{after}
	if kind != "" {
		q += ` AND kind = ?`
		args = append(args, kind)
	}
	q += ` ORDER BY id LIMIT ?`
	args = append(args, limit)
	return s.events(ctx, q, args...)
}

// EventQuery selects audit-log entries for EventLog. Empty fields match
// everything.
type EventQuery struct {
	NodeID string
	Kind   string
	Before int64 // only entries with a smaller ID; 0 for the newest
	Limit  int
}

// EventLog returns up to f.Limit of the newest events that match f, newest
// first.
func (s *Store) EventLog(ctx context.Context, f EventQuery) ([]Event, error) {
	out := []Event{}
	err := s.ScanEventLog(ctx, f, func(e Event) bool {
		out = append(out, e)
		return true
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ScanEventLog calls fn with up to f.Limit of the newest events that match
// f, newest first, reading them one at a time, until fn returns false.
func (s *Store) ScanEventLog(ctx context.Context, f EventQuery, fn func(Event) bool) error {
	var where []string
	var args []any
	if f.NodeID != "" {
		where = append(where, "node_id = ?")
		args = append(args, f.NodeID)
	}
	if f.Kind != "" {
		where = append(where, "kind = ?")
		args = append(args, f.Kind)
	}
	if f.Before > 0 {
		where = append(where, "id < ?")
		args = append(args, f.Before)
	}
	q := `SELECT id, at, kind, node_id, shard_id, detail FROM events`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY id DESC LIMIT ?"
	args = append(args, f.Limit)
	return s.scanEvents(ctx, fn, q, args...)
}

// events runs a query of the event columns and returns its rows.
func (s *Store) events(ctx context.Context, q string, args ...any) ([]Event, error) {
	out := []Event{}
	err := s.scanEvents(ctx, func(e Event) bool {
		out = append(out, e)
		return true
	}, q, args...)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// scanEvents runs a query of the event columns and calls fn with each row
// until fn returns false.
func (s *Store) scanEvents(ctx context.Context, fn func(Event) bool, q string, args ...any) error {
	rows, err := s.query(ctx, q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var e Event
		var at int64
		var shard sql.NullInt64
		if err := rows.Scan(&e.ID, &at, &e.Kind, &e.NodeID, &shard, &e.Detail); err != nil {
			return err
		}
		e.At = fromMS(at)
		if shard.Valid {
			v := uint32(shard.Int64)
			e.ShardID = &v
		}
		if !fn(e) {
			return nil
		}
	}
	return rows.Err()
}

// ShardEventIDs is, for one shard, the ID of its newest event of each of
// two kinds; 0 when it has none of that kind.
type ShardEventIDs struct {
	ShardID uint32
	LastA   int64
	LastB   int64
}

// LastShardEvents returns, for every shard with an event of kind a or b
// whose detail is detail, the IDs of its newest event of each kind.
func (s *Store) LastShardEvents(ctx context.Context, a, b, detail string) ([]ShardEventIDs, error) {
	rows, err := s.query(ctx,
		`SELECT shard_id, COALESCE(MAX(CASE WHEN kind = ? THEN id END), 0), COALESCE(MAX(CASE WHEN kind = ? THEN id END), 0)
		 FROM events WHERE kind IN (?, ?) AND detail = ? AND shard_id IS NOT NULL GROUP BY shard_id ORDER BY shard_id`,
		a, b, a, b, detail)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []ShardEventIDs
	for rows.Next() {
		var shard int64
		var x ShardEventIDs
		if err := rows.Scan(&shard, &x.LastA, &x.LastB); err != nil {
			return nil, err
		}
		if shard < 0 || shard > math.MaxUint32 {
			continue
		}
		x.ShardID = uint32(shard)
		out = append(out, x)
	}
	return out, rows.Err()
}

// beginOn begins a transaction on a connection of its own; with durable,
// on SQLite, it commits with synchronous=FULL. release returns the
// connection once the transaction has ended.
func (s *Store) beginOn(ctx context.Context, durable bool) (tx *txn, release func(), err error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, nil, err
	}
	release = func() { conn.Close() }
	if durable && s.dialect == dialectSQLite {
		if _, err := conn.ExecContext(ctx, `PRAGMA synchronous = FULL`); err != nil {
			conn.Close()
			return nil, nil, err
		}
		release = func() {
			conn.ExecContext(context.WithoutCancel(ctx), `PRAGMA synchronous = NORMAL`)
			conn.Close()
		}
	}
	sqlTx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		release()
		return nil, nil, err
	}
	return &txn{sqlTx, s}, release, nil
}

// Apply writes a batch in one transaction. With b.Durable it commits with
// synchronous=FULL.
func (s *Store) Apply(ctx context.Context, b *Batch) (err error) {
	if b.Empty() {
		return nil
	}
	tx, release, err := s.beginOn(ctx, b.Durable)
	if err != nil {
		return err
	}
	defer release()
	defer func() {
		if err != nil {
			tx.Rollback()
		}
	}()
	if b.Fence != nil {
		if err := tx.checkFence(ctx, b.Fence); err != nil {
			return err
		}
	}
	if b.Plan != nil {
		ranges, err := json.Marshal(b.Plan.Ranges)
		if err != nil {
			return err
		}
		if _, err := tx.exec(ctx, `INSERT INTO plan(id, generation, total_shards, ranges, changed_at) VALUES(1, ?, ?, ?, ?)
			ON CONFLICT(id) DO UPDATE SET generation = excluded.generation, total_shards = excluded.total_shards,
			ranges = excluded.ranges, changed_at = excluded.changed_at`,
			b.Plan.Generation, b.Plan.TotalShards, string(ranges), ms(b.Plan.ChangedAt)); err != nil {
			return fmt.Errorf("plan: %w", err)
		}
	}
	if len(b.Nodes) > 0 && s.dialect == dialectPostgres {
		if err := tx.updateNodeRows(ctx, b.Nodes); err != nil {
			return err
		}
	} else if len(b.Nodes) > 0 {
		st, err := tx.prepare(ctx, `UPDATE nodes SET draining = ?, capacity = ?, first_seen = ?, last_seen = ?,
			lease_deadline = ?, live = ?, acked_generation = ?, held = ?, address = ?, ready_shards = ?,
			starting_shards = ?, backoff_shards = ?, fatal_shards = ? WHERE id = ?`)
		if err != nil {
			return err
		}
		defer st.Close()
		for _, n := range b.Nodes {
			if _, err := st.ExecContext(ctx, b2i(n.Draining), n.Capacity, ms(n.FirstSeen), ms(n.LastSeen), ms(n.LeaseDeadline),
				b2i(n.Live), n.AckedGeneration, n.Held, n.Address, n.Ready, n.Starting, n.Backoff, n.Fatal, n.ID); err != nil {
				return fmt.Errorf("node %s: %w", n.ID, err)
			}
		}
	}
	if len(b.ShardStatus) > 0 && s.dialect == dialectPostgres {
		if err := tx.upsertShardStatusRows(ctx, b.ShardStatus); err != nil {
			return err
		}
	} else if len(b.ShardStatus) > 0 {
		st, err := tx.prepare(ctx, `INSERT INTO shard_status(shard_id, node_id, state, seq_valid, heartbeat_acks,
			heartbeat_misses, reconnects, last_error, close_code, updated_at) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT(shard_id) DO UPDATE SET node_id = excluded.node_id, state = excluded.state,
			seq_valid = excluded.seq_valid, heartbeat_acks = excluded.heartbeat_acks,
			heartbeat_misses = excluded.heartbeat_misses, reconnects = excluded.reconnects,
			last_error = excluded.last_error, close_code = excluded.close_code, updated_at = excluded.updated_at`)
		if err != nil {
			return err
		}
		defer st.Close()
		for _, x := range b.ShardStatus {
			if _, err := st.ExecContext(ctx, x.ShardID, x.NodeID, x.State, b2i(x.SeqValid), x.HeartbeatAcks, x.HeartbeatMisses,
				x.Reconnects, x.LastError, x.CloseCode, ms(x.UpdatedAt)); err != nil {
				return fmt.Errorf("shard status %d: %w", x.ShardID, err)
			}
		}
	}
	if b.Budget != nil {
		if err := tx.writeBudget(ctx, *b.Budget); err != nil {
			return err
		}
	}
	if err := tx.writeHAState(ctx, b); err != nil {
		return err
	}
	if err := tx.writeSessions(ctx, b.Sessions); err != nil {
		return err
	}
	if len(b.Events) > 0 {
		st, err := tx.prepare(ctx, `INSERT INTO events(at, kind, node_id, shard_id, detail) VALUES(?, ?, ?, ?, ?)`)
		if err != nil {
			return err
		}
		defer st.Close()
		for _, e := range b.Events {
			var shard any
			if e.ShardID != nil {
				shard = *e.ShardID
			}
			if _, err := st.ExecContext(ctx, ms(e.At), e.Kind, e.NodeID, shard, e.Detail); err != nil {
				return fmt.Errorf("event: %w", err)
			}
		}
		if _, err := tx.exec(ctx, `DELETE FROM events WHERE id <= (SELECT MAX(id) FROM events) - ?`, s.maxEvents); err != nil {
			return fmt.Errorf("prune events: %w", err)
		}
	}
	return tx.Commit()
}

// nodeRowChunk is how many node rows one statement writes on PostgreSQL
// (fourteen parameters each; the protocol allows 65,535).
const nodeRowChunk = 1000

// nodeRowColumns are the node columns a batch writes, after id, with
// their PostgreSQL types (a VALUES list's parameters have none of their
// own).
var nodeRowColumns = []struct{ name, typ string }{
	{"draining", "bigint"}, {"capacity", "bigint"}, {"first_seen", "bigint"}, {"last_seen", "bigint"},
	{"lease_deadline", "bigint"}, {"live", "bigint"}, {"acked_generation", "bigint"}, {"held", "text"},
	{"address", "text"}, {"ready_shards", "bigint"}, {"starting_shards", "bigint"}, {"backoff_shards", "bigint"},
	{"fatal_shards", "bigint"},
}

// nodeRowTypes are the types of a node row's parameters: its id, then
// nodeRowColumns.
var nodeRowTypes = func() []string {
	t := []string{"text"}
	for _, c := range nodeRowColumns {
		t = append(t, c.typ)
	}
	return t
}()

// shardStatusTypes are a shard status row's parameters, untyped: an
// INSERT's VALUES take their types from the columns.
var shardStatusTypes = make([]string, 10)

// writeRowParams writes one row of numbered parameters, "($first::type,
// ...)", one per type ("" for none), for a multi-row statement. Numbered
// in place: Store.q would cache every chunk size's text.
func writeRowParams(q *strings.Builder, first int, types []string) {
	q.WriteString("(")
	for c, typ := range types {
		if c > 0 {
			q.WriteString(", ")
		}
		q.WriteString("$" + strconv.Itoa(first+c))
		if typ != "" {
			q.WriteString("::" + typ)
		}
	}
	q.WriteString(")")
}

// updateNodeRows writes node rows on PostgreSQL with multi-row updates, a
// thousand rows a statement: every statement is a round trip there, and a
// leader of 10,000 nodes renewing every 10 s writes a thousand rows a
// second (BenchmarkCheckin). Like SQLite's one-row statements it updates
// only rows that exist: a node deleted meanwhile stays deleted. A
// statement may not update one row twice, so only the last state of a node
// in the batch is written.
func (t *txn) updateNodeRows(ctx context.Context, all []NodeState) error {
	seen := make(map[string]bool, len(all))
	rows := make([]NodeState, 0, len(all))
	for i := len(all) - 1; i >= 0; i-- {
		if !seen[all[i].ID] {
			seen[all[i].ID] = true
			rows = append(rows, all[i])
		}
	}
	cols := len(nodeRowColumns) + 1
	for len(rows) > 0 {
		n := min(len(rows), nodeRowChunk)
		var q strings.Builder
		q.WriteString(`UPDATE nodes SET `)
		for i, c := range nodeRowColumns {
			if i > 0 {
				q.WriteString(", ")
			}
			q.WriteString(c.name + " = v." + c.name)
		}
		q.WriteString(` FROM (VALUES `)
		args := make([]any, 0, n*cols)
		for i, x := range rows[:n] {
			if i > 0 {
				q.WriteString(",")
			}
			writeRowParams(&q, i*cols+1, nodeRowTypes)
			args = append(args, x.ID, b2i(x.Draining), x.Capacity, ms(x.FirstSeen), ms(x.LastSeen), ms(x.LeaseDeadline),
				b2i(x.Live), x.AckedGeneration, x.Held, x.Address, x.Ready, x.Starting, x.Backoff, x.Fatal)
		}
		q.WriteString(`) AS v(id`)
		for _, c := range nodeRowColumns {
			q.WriteString(", " + c.name)
		}
		q.WriteString(`) WHERE nodes.id = v.id`)
		// Numbered in place: Store.q would cache every chunk size's text.
		if _, err := t.ExecContext(ctx, q.String(), args...); err != nil {
			return fmt.Errorf("nodes (%d rows from %s): %w", n, rows[0].ID, err)
		}
		rows = rows[n:]
	}
	return nil
}

// shardStatusChunk is how many shard statuses one statement writes on
// PostgreSQL (ten parameters each; the protocol allows 65,535).
const shardStatusChunk = 1000

// upsertShardStatusRows writes statuses on PostgreSQL with multi-row upserts, a
// thousand rows a statement: on PostgreSQL every statement is a round
// trip, and a fleet of 10,000 nodes checking in with 13 shards each sends
// 13,000 statuses a second. A statement may not touch one row twice, so
// only the last status of a shard in the batch is written, as the
// one-row statements of SQLite leave it.
func (t *txn) upsertShardStatusRows(ctx context.Context, all []ShardStatus) error {
	seen := make(map[uint32]bool, len(all))
	rows := make([]ShardStatus, 0, len(all))
	for i := len(all) - 1; i >= 0; i-- {
		if !seen[all[i].ShardID] {
			seen[all[i].ShardID] = true
			rows = append(rows, all[i])
		}
	}
	for len(rows) > 0 {
		n := min(len(rows), shardStatusChunk)
		var q strings.Builder
		q.WriteString(`INSERT INTO shard_status(shard_id, node_id, state, seq_valid, heartbeat_acks,
			heartbeat_misses, reconnects, last_error, close_code, updated_at) VALUES`)
		args := make([]any, 0, n*10)
		for i, x := range rows[:n] {
			if i > 0 {
				q.WriteString(",")
			}
			writeRowParams(&q, i*10+1, shardStatusTypes)
			args = append(args, x.ShardID, x.NodeID, x.State, b2i(x.SeqValid), x.HeartbeatAcks, x.HeartbeatMisses,
				x.Reconnects, x.LastError, x.CloseCode, ms(x.UpdatedAt))
		}
		q.WriteString(` ON CONFLICT(shard_id) DO UPDATE SET node_id = excluded.node_id, state = excluded.state,
			seq_valid = excluded.seq_valid, heartbeat_acks = excluded.heartbeat_acks,
			heartbeat_misses = excluded.heartbeat_misses, reconnects = excluded.reconnects,
			last_error = excluded.last_error, close_code = excluded.close_code, updated_at = excluded.updated_at`)
		// Numbered in place: Store.q would cache every chunk size's text.
		if _, err := t.ExecContext(ctx, q.String(), args...); err != nil {
			return fmt.Errorf("shard status (%d rows from shard %d): %w", n, rows[0].ShardID, err)
		}
		rows = rows[n:]
	}
	return nil
}
