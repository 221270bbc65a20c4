package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Identify grants in one transaction each (issue 20, docs/ha.md "Identify
// claims without a leader"). Every grant, a leader's or a follower's, is
// committed by GrantIdentify before it is answered: the bucket's row is
// locked for the grant and the spacing checked on the database's clock,
// the daily session-start budget is decremented in the same transaction,
// and the identify_granted entry of the audit log written with them. So
// whichever replicas grant, two grants of one bucket are committed at
// least the window apart on one clock, and the stored budget counts every
// grant.

var (
	// ErrBudgetSpent: the stored session-start budget is down to its
	// reserve.
	ErrBudgetSpent = errors.New("store: the daily session-start budget is down to its reserve")
	// ErrNotOwner: what the store shows does not let the node start the
	// shard (a follower's grant).
	ErrNotOwner = errors.New("store: the store does not show the node owning the shard")
)

// GrantRefused is GrantIdentify's refusal: nothing was written. Reason is
// ErrGrantSpacing, ErrBudgetSpent or ErrNotOwner.
type GrantRefused struct {
	Reason error
	// Wait, for ErrGrantSpacing, is how long until the bucket's window
	// ends on the database's clock.
	Wait   time.Duration
	Detail string
}

func (r *GrantRefused) Error() string { return r.Detail + ": " + r.Reason.Error() }
func (r *GrantRefused) Unwrap() error { return r.Reason }

// Grant is one Identify grant for GrantIdentify to commit.
type Grant struct {
	NodeID  string
	ShardID uint32
	Bucket  uint32
	// MaxConcurrency is the bucket numbering the grant was judged under
	// (bucket = shard mod max_concurrency): a grant still in its window
	// under another numbering closes every bucket.
	MaxConcurrency uint32
	// Spacing is the Identify window; 0 checks none (a single controller
	// spaces its own grants in memory).
	Spacing time.Duration
	// Reserve is the part of the budget no grant may spend.
	Reserve int
	// Fence makes a leader's grant commit only while it leads; a leader's
	// own earlier grants (of Fence.Term) are spaced by its memory, from
	// the moment each was answered, so they are not checked again here.
	Fence *Fence
	// Budget is a controller's own view of the budget after this grant
	// (the leader's, or a single controller's). The stored budget wins
	// where it is lower in the same period (a follower spent from it);
	// the controller's wins for a new period (it refilled) or when none
	// is stored. Nil (a follower) spends from the stored budget only.
	Budget *Budget
	// Owner, for a follower, judges in the transaction whether what the
	// store shows lets the node start the shard; its error refuses the
	// grant with ErrNotOwner.
	Owner func(OwnerView) error
	// Event is the identify_granted entry of the audit log.
	Event Event
}

// OwnerView is what the store shows about a node claiming a shard.
type OwnerView struct {
	Live      bool
	LeaseLeft time.Duration // on the database's clock; <= 0: lapsed or none
	Held      string        // the shards it holds, as ranges text
	Range     PlanRange     // its range in the stored plan (Count 0: none)
	// OthersHeld are the held sets of the other live nodes, by node.
	OthersHeld map[string]string
}

// GrantIdentify commits g, durably, in one transaction, or refuses it
// with a *GrantRefused (or ErrFenced) and writes nothing. It returns the
// budget it stored.
func (s *Store) GrantIdentify(ctx context.Context, g Grant) (_ Budget, err error) {
	tx, release, err := s.beginOn(ctx, true)
	if err != nil {
		return Budget{}, fmt.Errorf("store: identify grant: %w", err)
	}
	defer release()
	defer tx.Rollback()
	refuse := func(why error, wait time.Duration, f string, args ...any) (Budget, error) {
		return Budget{}, &GrantRefused{Reason: why, Wait: wait, Detail: fmt.Sprintf(f, args...)}
	}
	var term uint64
	if g.Fence != nil {
		if err := tx.checkFence(ctx, g.Fence); err != nil {
			return Budget{}, err
		}
		term = g.Fence.Term
	}
	if g.Owner != nil {
		v, err := tx.ownerView(ctx, g.NodeID)
		if err != nil {
			return Budget{}, err
		}
		if err := g.Owner(v); err != nil {
			return refuse(ErrNotOwner, 0, "node %s, shard %d: %v", g.NodeID, g.ShardID, err)
		}
	}
	// The bucket's row exists before it is locked, so that two first
	// grants of a bucket queue on one row (on PostgreSQL the second
	// insert waits for the first's commit). A refused grant rolls the
	// placeholder back with the rest.
	if _, err := tx.exec(ctx, `INSERT INTO identify_buckets(bucket, granted_at, shard_id, node_id, db_granted_at, grant_term)
		VALUES(?, 0, ?, '', 0, 0) ON CONFLICT(bucket) DO NOTHING`, g.Bucket, g.ShardID); err != nil {
		return Budget{}, fmt.Errorf("store: identify grant: bucket %d: %w", g.Bucket, err)
	}
	var last, now int64
	var lastTerm uint64
	if err := tx.QueryRowContext(ctx, s.q(`SELECT db_granted_at, grant_term, `+s.dbNowMS()+` FROM identify_buckets WHERE bucket = ?`+s.forUpdate()), g.Bucket).
		Scan(&last, &lastTerm, &now); err != nil {
		return Budget{}, fmt.Errorf("store: identify grant: bucket %d: %w", g.Bucket, err)
	}
	if g.Spacing > 0 {
		if last != 0 && !(term != 0 && lastTerm == term) && now-last < g.Spacing.Milliseconds() {
			return refuse(ErrGrantSpacing, time.Duration(g.Spacing.Milliseconds()-(now-last))*time.Millisecond,
				"bucket %d granted %d ms ago (term %d), window %v", g.Bucket, now-last, lastTerm, g.Spacing)
		}
		if wait, shard, bucket, renumbered, err := tx.renumbered(ctx, g, now); err != nil {
			return Budget{}, err
		} else if renumbered {
			return refuse(ErrGrantSpacing, wait, "shard %d was granted in bucket %d under another max_concurrency within the window", shard, bucket)
		}
	}
	b, err := tx.spendBudget(ctx, g)
	if err != nil {
		return Budget{}, err
	}
	if _, err := tx.exec(ctx, `UPDATE identify_buckets SET granted_at = ?, shard_id = ?, node_id = ?, db_granted_at = `+s.dbNowMS()+`, grant_term = ?
		WHERE bucket = ?`, ms(g.Event.At), g.ShardID, g.NodeID, term, g.Bucket); err != nil {
		return Budget{}, fmt.Errorf("store: identify grant: bucket %d: %w", g.Bucket, err)
	}
	e := g.Event
	var shard any
	if e.ShardID != nil {
		shard = *e.ShardID
	}
	if _, err := tx.exec(ctx, `INSERT INTO events(at, kind, node_id, shard_id, detail) VALUES(?, ?, ?, ?, ?)`,
		ms(e.At), e.Kind, e.NodeID, shard, e.Detail); err != nil {
		return Budget{}, fmt.Errorf("store: identify grant: event: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return Budget{}, fmt.Errorf("store: identify grant: commit: %w", err)
	}
	return b, nil
}

// renumbered reports a grant still in its window (on the database's
// clock, now) whose bucket is not its shard's under g's max_concurrency:
// it was granted under another numbering, so every bucket waits for it.
func (t *txn) renumbered(ctx context.Context, g Grant, now int64) (wait time.Duration, shard, bucket uint32, found bool, err error) {
	mc := max(g.MaxConcurrency, 1)
	rows, err := t.QueryContext(ctx, t.s.q(`SELECT bucket, shard_id, db_granted_at FROM identify_buckets WHERE db_granted_at > ?`),
		now-g.Spacing.Milliseconds())
	if err != nil {
		return 0, 0, 0, false, fmt.Errorf("store: identify grant: buckets: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var b, s uint32
		var at int64
		if err := rows.Scan(&b, &s, &at); err != nil {
			return 0, 0, 0, false, fmt.Errorf("store: identify grant: buckets: %w", err)
		}
		if s%mc != b {
			w := time.Duration(g.Spacing.Milliseconds()-(now-at)) * time.Millisecond
			if !found || w > wait {
				wait, shard, bucket, found = w, s, b, true
			}
		}
	}
	return wait, shard, bucket, found, rows.Err()
}

// spendBudget takes this grant from the stored budget (see Grant.Budget)
// and returns what it stored.
func (t *txn) spendBudget(ctx context.Context, g Grant) (Budget, error) {
	var st Budget
	var reset int64
	err := t.QueryRowContext(ctx, t.s.q(`SELECT total, remaining, reset_at FROM session_budget WHERE id = 1`+t.s.forUpdate())).
		Scan(&st.Total, &st.Remaining, &reset)
	stored := err == nil
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return Budget{}, fmt.Errorf("store: identify grant: budget: %w", err)
	}
	st.ResetAt = fromMS(reset)
	var b Budget
	switch {
	case g.Budget == nil && !stored:
		return Budget{}, &GrantRefused{Reason: ErrBudgetSpent, Detail: "no budget is stored yet"}
	case g.Budget == nil:
		b = st
		b.Remaining--
	case stored && ms(st.ResetAt) == ms(g.Budget.ResetAt) && st.Total == g.Budget.Total:
		b = *g.Budget
		b.Remaining = min(b.Remaining, st.Remaining-1)
	default:
		b = *g.Budget
	}
	if b.Remaining < g.Reserve {
		return Budget{}, &GrantRefused{Reason: ErrBudgetSpent, Detail: fmt.Sprintf("%d of %d left, reserve %d", b.Remaining+1, b.Total, g.Reserve)}
	}
	if err := t.writeBudget(ctx, b); err != nil {
		return Budget{}, fmt.Errorf("store: identify grant: %w", err)
	}
	return b, nil
}

// writeBudget stores b as the session budget (a batch's, or a grant's).
func (t *txn) writeBudget(ctx context.Context, b Budget) error {
	if _, err := t.exec(ctx, `INSERT INTO session_budget(id, total, remaining, reset_at) VALUES(1, ?, ?, ?)
		ON CONFLICT(id) DO UPDATE SET total = excluded.total, remaining = excluded.remaining, reset_at = excluded.reset_at`,
		b.Total, b.Remaining, ms(b.ResetAt)); err != nil {
		return fmt.Errorf("budget: %w", err)
	}
	return nil
}

// ownerView reads what the store shows about nodeID for a follower's
// grant.
func (t *txn) ownerView(ctx context.Context, nodeID string) (OwnerView, error) {
	wrap := func(what string, err error) error {
		return fmt.Errorf("store: identify grant for %s: %s: %w", nodeID, what, err)
	}
	var v OwnerView
	var left sql.NullInt64
	err := t.QueryRowContext(ctx, t.s.q(`SELECT deadline - `+t.s.dbNowMS()+` FROM node_leases WHERE node_id = ?`), nodeID).Scan(&left)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return v, wrap("lease", err)
	}
	if left.Valid {
		v.LeaseLeft = time.Duration(left.Int64) * time.Millisecond
	}
	rows, err := t.QueryContext(ctx, t.s.q(`SELECT id, live, held FROM nodes WHERE live = 1 OR id = ?`), nodeID)
	if err != nil {
		return v, wrap("nodes", err)
	}
	defer rows.Close()
	v.OthersHeld = map[string]string{}
	for rows.Next() {
		var id, held string
		var live int64
		if err := rows.Scan(&id, &live, &held); err != nil {
			return v, wrap("nodes", err)
		}
		if id == nodeID {
			v.Live, v.Held = live != 0, held
		} else {
			v.OthersHeld[id] = held
		}
	}
	if err := rows.Err(); err != nil {
		return v, wrap("nodes", err)
	}
	var ranges string
	err = t.QueryRowContext(ctx, t.s.q(`SELECT ranges FROM plan WHERE id = 1`)).Scan(&ranges)
	if errors.Is(err, sql.ErrNoRows) {
		return v, nil
	}
	if err != nil {
		return v, wrap("plan", err)
	}
	var plan []PlanRange
	if err := json.Unmarshal([]byte(ranges), &plan); err != nil {
		return v, wrap("plan ranges", err)
	}
	for _, r := range plan {
		if r.NodeID == nodeID {
			v.Range = r
		}
	}
	return v, nil
}
