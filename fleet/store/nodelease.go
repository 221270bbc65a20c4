package store

import (
	"context"
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
	defer rows.Close()
	m := map[string]time.Duration{}
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
