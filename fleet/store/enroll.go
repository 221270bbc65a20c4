package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// The network enrollment of netbooted nodes (docs/security.md): a script
// fetch stores a pending enrollment, the node's first check-in redeems it.

// Enrollment is a node's pending network enrollment.
type Enrollment struct {
	CredHash []byte // SHA-256 of the enrollment credential
	Address  string // the address the boot script went to
	IssuedAt time.Time
	Expires  time.Time
}

// Auth is what authenticating a node reads from the store: its credential
// hash and its pending enrollment, if any.
type Auth struct {
	CredHash   []byte
	CreatedAt  time.Time
	Enrollment *Enrollment // nil without a pending enrollment
}

// NodeAuth returns id's stored credential hash and pending enrollment in
// one query, or ErrNotFound for an unknown node.
func (s *Store) NodeAuth(ctx context.Context, id string) (Auth, error) {
	var a Auth
	var eh []byte
	var addr sql.NullString
	var created int64
	var issued, expires sql.NullInt64
	err := s.queryRow(ctx, `SELECT n.cred_hash, n.created_at, e.cred_hash, e.address, e.issued_at, e.expires
		FROM nodes n LEFT JOIN enrollments e ON e.node_id = n.id WHERE n.id = ?`, id).
		Scan(&a.CredHash, &created, &eh, &addr, &issued, &expires)
	if errors.Is(err, sql.ErrNoRows) {
		return Auth{}, fmt.Errorf("node %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Auth{}, err
	}
	a.CreatedAt = fromMS(created)
	if eh != nil {
		a.Enrollment = &Enrollment{CredHash: eh, Address: addr.String, IssuedAt: fromMS(issued.Int64), Expires: fromMS(expires.Int64)}
	}
	return a, nil
}

// PutEnrollment stores id's pending enrollment, replacing an older one;
// ErrNotFound if the node does not exist.
func (s *Store) PutEnrollment(ctx context.Context, id string, e Enrollment) error {
	// The foreign key on node_id refuses an unknown node.
	_, err := s.exec(ctx, `INSERT INTO enrollments(node_id, cred_hash, address, issued_at, expires) VALUES(?, ?, ?, ?, ?)
		ON CONFLICT(node_id) DO UPDATE SET cred_hash = excluded.cred_hash, address = excluded.address,
			issued_at = excluded.issued_at, expires = excluded.expires`,
		id, e.CredHash, e.Address, ms(e.IssuedAt), ms(e.Expires))
	if isConstraint(err, foreignKey) {
		return fmt.Errorf("node %s: %w", id, ErrNotFound)
	}
	return err
}

// CompleteEnrollment makes id's pending enrollment, whose credential hash
// must be credHash, the node's credential and deletes it, in one
// transaction. ErrNotFound if there is no such pending enrollment (it was
// redeemed or replaced meanwhile).
func (s *Store) CompleteEnrollment(ctx context.Context, id string, credHash []byte) error {
	tx, err := s.begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	res, err := tx.exec(ctx, `DELETE FROM enrollments WHERE node_id = ? AND cred_hash = ?`, id, credHash)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("enrollment of node %s: %w", id, ErrNotFound)
	}
	if _, err := tx.exec(ctx, `UPDATE nodes SET cred_hash = ? WHERE id = ?`, credHash, id); err != nil {
		return err
	}
	return tx.Commit()
}
