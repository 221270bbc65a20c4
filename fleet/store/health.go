package store

import (
	"context"
	"fmt"
)

// healthProbeKey is the settings key CheckWritable writes and rolls back.
const healthProbeKey = "health_probe"

// CheckWritable reports whether the database accepts a write now: it
// begins a write transaction (taking SQLite's write lock, waiting at most
// the busy timeout or ctx), writes a settings row and rolls back. It
// proves the file is open, not read-only and not locked by a stuck
// writer; a rolled-back change never reaches the disk, so it does not
// prove the disk has room for the next commit.
func (s *Store) CheckWritable(ctx context.Context) error {
	tx, err := s.db.BeginTx(ctx, nil) // _txlock=immediate: BEGIN IMMEDIATE
	if err != nil {
		return fmt.Errorf("store: begin write: %w", err)
	}
	defer tx.Rollback()
	// No placeholders: the statement is the same in every SQL dialect.
	if _, err := tx.ExecContext(ctx, `INSERT INTO settings(key, value) VALUES('`+healthProbeKey+`', '1')
		ON CONFLICT(key) DO UPDATE SET value = excluded.value`); err != nil {
		return fmt.Errorf("store: probe write: %w", err)
	}
	if err := tx.Rollback(); err != nil {
		return fmt.Errorf("store: rollback: %w", err)
	}
	return nil
}
