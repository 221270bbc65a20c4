package store

import (
	"context"
	"fmt"
	"time"
)

// Crash resume (issue 19, docs/events.md "After a crash"). A node reports,
// with every check-in, each running shard's resumable Gateway session: its
// session ID, resume URL and the sequence it would hand over from (the
// acknowledged one while dispatches after it await their PubAck). The
// controller keeps the latest per shard, from the shard's holder only, so
// that when the holder's lease lapses the shard's next owner Resumes it
// instead of Identifying afresh. The rows survive a controller restart and
// are what a new leader of the replicas reads.
//
// Fence: a row names the node that reported it and GrantGen, the plan
// generation under which that node was granted the shard. Grants of a
// shard to successive holders happen under strictly rising generations (a
// shard moves only with a new plan), so a write holds only if its GrantGen
// is higher than the row's, or equal from the same node: a late write for a
// holder that has since been deposed, by whichever writer, never replaces
// the newer holder's row. A drop holds only for the exact (node, GrantGen).

// schemaSessions is migration 7.
const schemaSessions = `
CREATE TABLE shard_sessions (
	shard_id    INTEGER PRIMARY KEY,
	node_id     TEXT NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
	grant_gen   INTEGER NOT NULL,
	session_id  TEXT NOT NULL,
	seq         INTEGER NOT NULL,
	resume_url  TEXT NOT NULL,
	reported_at INTEGER NOT NULL
);
`

// ShardSession is the resumable session a shard's holder last reported.
// With Drop, the batch removes the row of (ShardID, NodeID, GrantGen)
// instead (the holder reports no resumable session any more).
type ShardSession struct {
	ShardID    uint32
	NodeID     string
	GrantGen   uint64
	SessionID  string
	Seq        uint32
	ResumeURL  string
	ReportedAt time.Time
	Drop       bool
}

// writeSessions applies a batch's session rows under the fence above.
func (t *txn) writeSessions(ctx context.Context, rows []ShardSession) error {
	for _, x := range rows {
		var err error
		if x.Drop {
			_, err = t.exec(ctx, `DELETE FROM shard_sessions WHERE shard_id = ? AND node_id = ? AND grant_gen = ?`,
				x.ShardID, x.NodeID, x.GrantGen)
		} else {
			_, err = t.exec(ctx, `INSERT INTO shard_sessions(shard_id, node_id, grant_gen, session_id, seq, resume_url, reported_at)
				VALUES(?, ?, ?, ?, ?, ?, ?)
				ON CONFLICT(shard_id) DO UPDATE SET node_id = excluded.node_id, grant_gen = excluded.grant_gen,
				session_id = excluded.session_id, seq = excluded.seq, resume_url = excluded.resume_url,
				reported_at = excluded.reported_at
				WHERE excluded.grant_gen > shard_sessions.grant_gen
				OR (excluded.grant_gen = shard_sessions.grant_gen AND excluded.node_id = shard_sessions.node_id)`,
				x.ShardID, x.NodeID, x.GrantGen, x.SessionID, x.Seq, x.ResumeURL, ms(x.ReportedAt))
		}
		if err != nil {
			return fmt.Errorf("session of shard %d: %w", x.ShardID, err)
		}
	}
	return nil
}

// ShardSessions returns the stored sessions, by shard.
func (s *Store) ShardSessions(ctx context.Context) ([]ShardSession, error) {
	rows, err := s.query(ctx, `SELECT shard_id, node_id, grant_gen, session_id, seq, resume_url, reported_at FROM shard_sessions ORDER BY shard_id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []ShardSession
	for rows.Next() {
		var x ShardSession
		var at int64
		if err := rows.Scan(&x.ShardID, &x.NodeID, &x.GrantGen, &x.SessionID, &x.Seq, &x.ResumeURL, &at); err != nil {
			return nil, err
		}
		x.ReportedAt = fromMS(at)
		out = append(out, x)
	}
	return out, rows.Err()
}
