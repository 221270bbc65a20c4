package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Node leases committed before the answer (issue 20, docs/ha.md). With
// replicas, the leader commits each check-in's lease renewal before it
// answers: one statement that writes the node's lease deadline as the
// database's clock plus the lease, under the leader's fence. A node keeps
// its own deadline from the moment it sent the check-in, which is earlier
// than the statement, so the stored deadline is never earlier than the
// node's own, and a new leader can trust it against the database's clock
// instead of granting every node a blind lease from its takeover.

// schemaNodeLeases is migration 8. deadline is the database clock's Unix
// milliseconds; term the leader term that wrote it.
const schemaNodeLeases = `
CREATE TABLE node_leases (
	node_id  TEXT PRIMARY KEY REFERENCES nodes(id) ON DELETE CASCADE,
	deadline INTEGER NOT NULL,
	term     INTEGER NOT NULL
);
`

// RenewLease commits nodeID's lease deadline as the database's clock plus
// lease, if f still holds, in one statement; otherwise it fails with
// ErrFenced and writes nothing. A stored deadline never moves earlier. On
// PostgreSQL the statement locks the leader row in KEY SHARE mode until it
// commits: a leader's own fenced batches (which take NO KEY UPDATE) do not
// wait for it, but a takeover (Campaign's FOR UPDATE) does, so a new
// leader, which loads after its takeover commits, sees every renewal the
// old leader answered.
func (s *Store) RenewLease(ctx context.Context, f Fence, nodeID string, lease time.Duration) error {
	return s.RenewLeases(ctx, f, []string{nodeID}, lease)
}

// RenewLeases is RenewLease for several nodes in one statement (a group
// commit of concurrent check-ins). ids must be distinct.
func (s *Store) RenewLeases(ctx context.Context, f Fence, ids []string, lease time.Duration) error {
	if len(ids) == 0 {
		return nil
	}
	now := s.dbNowMS()
	lock, greatest := ``, `max`
	if s.dialect == dialectPostgres {
		lock, greatest = ` FOR KEY SHARE`, `GREATEST`
	}
	values := strings.TrimSuffix(strings.Repeat("(?),", len(ids)), ",")
	args := []any{f.Term, f.Holder}
	for _, id := range ids {
		args = append(args, id)
	}
	args = append(args, lease.Milliseconds())
	res, err := s.exec(ctx, `WITH f AS (SELECT term FROM ha_leader WHERE id = 1 AND term = ? AND holder = ? AND expires_at > `+now+lock+`),
		ids(id) AS (VALUES `+values+`)
		INSERT INTO node_leases(node_id, deadline, term) SELECT ids.id, `+now+` + ?, f.term FROM f, ids WHERE true
		ON CONFLICT(node_id) DO UPDATE SET deadline = `+greatest+`(node_leases.deadline, excluded.deadline), term = excluded.term`,
		args...)
	if err != nil {
		return fmt.Errorf("store: renew leases of %d nodes (%s...): %w", len(ids), ids[0], err)
	}
	if n, _ := res.RowsAffected(); n != int64(len(ids)) {
		return fmt.Errorf("renew leases of %d nodes, term %d of %s: %w", len(ids), f.Term, f.Holder, ErrFenced)
	}
	return nil
}

// LeaseRemaining returns, per node with a committed lease, how long its
// lease still runs on the database's clock (negative once over), read in
// one statement.
func (s *Store) LeaseRemaining(ctx context.Context) (map[string]time.Duration, error) {
	rows, err := s.query(ctx, `SELECT node_id, deadline - `+s.dbNowMS()+` FROM node_leases`)
	if err != nil {
		return nil, fmt.Errorf("store: node leases: %w", err)
	}
	return scanLeft(rows, map[string]time.Duration{})
}

// scanLeft adds rows of (node ID, milliseconds left) to m and closes rows.
func scanLeft(rows *sql.Rows, m map[string]time.Duration) (map[string]time.Duration, error) {
	defer rows.Close()
	for rows.Next() {
		var id string
		var left int64
		if err := rows.Scan(&id, &left); err != nil {
			return nil, err
		}
		m[id] = time.Duration(left) * time.Millisecond
	}
	return m, rows.Err()
}

// LeaseRemainingOf is LeaseRemaining for the nodes ids only; a node
// without a committed lease is left out.
func (s *Store) LeaseRemainingOf(ctx context.Context, ids []string) (map[string]time.Duration, error) {
	m := map[string]time.Duration{}
	if len(ids) == 0 {
		return m, nil
	}
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	rows, err := s.query(ctx, `SELECT node_id, deadline - `+s.dbNowMS()+` FROM node_leases WHERE node_id IN (`+
		strings.TrimSuffix(strings.Repeat("?,", len(ids)), ",")+`)`, args...)
	if err != nil {
		return nil, fmt.Errorf("store: node leases of %d nodes (%s...): %w", len(ids), ids[0], err)
	}
	return scanLeft(rows, m)
}

// Renewals by a replica that does not lead (docs/ha.md, "Renewals without
// a leader"). A follower that cannot reach a leader answers a node's
// check-in itself when the check-in asks for nothing but its lease: the
// node reports the stored plan's generation and the store shows it live.
// (A node reports the generation it applied, so it runs nothing outside
// that plan's range; the store shows every shard the node was let start
// as held, since grants are committed before they are answered, and
// shows releases late, never early. The acknowledgement itself, and so
// the release, waits for a leader.) The renewal is one statement that
// extends the stored deadline only while it still runs on the database's
// clock, so a lease that has lapsed stays lapsed for every follower, and
// a leader that reads a lapsed deadline (LeaseRemainingOf) may expire the
// node: no follower's renewal can follow that read. A leader that reads a
// running deadline keeps the node.

var (
	// ErrLeaseLapsed: the node's stored lease has run out (or it has
	// none); only a leader may take it back.
	ErrLeaseLapsed = errors.New("store: the node's lease has lapsed on the database's clock")
	// ErrNotSteady: the check-in reports another generation than the
	// stored plan's or less capacity than its range, or the store does
	// not show the node live; only a leader may answer it.
	ErrNotSteady = errors.New("store: the check-in changes what only the leader records")
)

// FollowerLease is what a follower's renewal read back, in the same
// transaction, to answer the check-in with.
type FollowerLease struct {
	Generation uint64
	Range      PlanRange // the node's range in the stored plan (Count 0: none)
	Held       string    // the shards the store shows the node holding, as ranges text
	Term       uint64    // the leader row's term
}

// FollowerRenewLease renews nodeID's lease to the database's clock plus
// lease, in one short transaction, only if its stored lease still runs,
// the store shows it live, gen (the generation the node applied) is the
// stored plan's, and the node's range fits the capacity it reports;
// otherwise it writes nothing and
// fails with ErrLeaseLapsed or ErrNotSteady. A stored deadline never moves
// earlier. It takes no leader fence: the conditions hold whoever leads.
func (s *Store) FollowerRenewLease(ctx context.Context, nodeID string, gen uint64, capacity uint32, lease time.Duration) (FollowerLease, error) {
	tx, err := s.begin(ctx)
	if err != nil {
		return FollowerLease{}, err
	}
	defer tx.Rollback()
	now, greatest := s.dbNowMS(), `max`
	if s.dialect == dialectPostgres {
		greatest = `GREATEST`
	}
	res, err := tx.exec(ctx, `UPDATE node_leases SET deadline = `+greatest+`(deadline, `+now+` + ?)
		WHERE node_id = ? AND deadline > `+now+`
		AND EXISTS (SELECT 1 FROM nodes WHERE id = ? AND live = 1)
		AND EXISTS (SELECT 1 FROM plan WHERE id = 1 AND generation = ?)`,
		lease.Milliseconds(), nodeID, nodeID, int64(gen))
	if err != nil {
		return FollowerLease{}, fmt.Errorf("store: follower renewal of %s: %w", nodeID, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return FollowerLease{}, s.whyNotRenewed(ctx, tx, nodeID, gen)
	}
	var f FollowerLease
	var ranges string
	if err := tx.QueryRowContext(ctx, s.q(`SELECT generation, ranges FROM plan WHERE id = 1`)).Scan(&f.Generation, &ranges); err != nil {
		return FollowerLease{}, fmt.Errorf("store: follower renewal of %s: plan: %w", nodeID, err)
	}
	if f.Generation != gen {
		// A leader committed a new plan since the renewal's statement
		// (PostgreSQL reads each statement's own snapshot): rolled back,
		// the node's next check-in meets the new plan.
		return FollowerLease{}, fmt.Errorf("node %s reports generation %d, the stored plan's is now %d: %w", nodeID, gen, f.Generation, ErrNotSteady)
	}
	var plan []PlanRange
	if err := json.Unmarshal([]byte(ranges), &plan); err != nil {
		return FollowerLease{}, fmt.Errorf("store: follower renewal of %s: plan ranges: %w", nodeID, err)
	}
	for _, r := range plan {
		if r.NodeID == nodeID {
			f.Range = r
		}
	}
	if f.Range.Count > capacity {
		// Rolled back: only a leader may cut the range.
		return FollowerLease{}, fmt.Errorf("node %s reports capacity %d, its range holds %d: %w", nodeID, capacity, f.Range.Count, ErrNotSteady)
	}
	if err := tx.QueryRowContext(ctx, s.q(`SELECT held FROM nodes WHERE id = ?`), nodeID).Scan(&f.Held); err != nil {
		return FollowerLease{}, fmt.Errorf("store: follower renewal of %s: node: %w", nodeID, err)
	}
	var term int64
	err = tx.QueryRowContext(ctx, s.q(`SELECT term FROM ha_leader WHERE id = 1`)).Scan(&term)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return FollowerLease{}, fmt.Errorf("store: follower renewal of %s: leader row: %w", nodeID, err)
	}
	f.Term = uint64(term)
	if err := tx.Commit(); err != nil {
		return FollowerLease{}, fmt.Errorf("store: follower renewal of %s: commit: %w", nodeID, err)
	}
	return f, nil
}

// whyNotRenewed names the condition a follower's renewal failed on.
func (s *Store) whyNotRenewed(ctx context.Context, tx *txn, nodeID string, gen uint64) error {
	var left sql.NullInt64
	err := tx.QueryRowContext(ctx, s.q(`SELECT deadline - `+s.dbNowMS()+` FROM node_leases WHERE node_id = ?`), nodeID).Scan(&left)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("store: follower renewal of %s: %w", nodeID, err)
	}
	if !left.Valid || left.Int64 <= 0 {
		return fmt.Errorf("node %s: %w", nodeID, ErrLeaseLapsed)
	}
	var live int64
	if err := tx.QueryRowContext(ctx, s.q(`SELECT live FROM nodes WHERE id = ?`), nodeID).Scan(&live); err != nil {
		return fmt.Errorf("store: follower renewal of %s: node: %w", nodeID, err)
	}
	var planGen int64
	if err := tx.QueryRowContext(ctx, s.q(`SELECT generation FROM plan WHERE id = 1`)).Scan(&planGen); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("store: follower renewal of %s: plan: %w", nodeID, err)
	}
	if live == 0 {
		return fmt.Errorf("node %s is not live in the store: %w", nodeID, ErrNotSteady)
	}
	return fmt.Errorf("node %s reports generation %d, the stored plan's is %d: %w", nodeID, gen, planGen, ErrNotSteady)
}
