package store

import (
	"context"
	"fmt"
	"math"
	"time"
)

// This file keeps the fleet's history for the dashboard's 24-hour charts:
// one sample per minute (table fleet_history, migration 4). The table is
// bounded: AddHistory deletes, in the same transaction, every row more
// than HistoryMinutes minutes older than the newest, so it never holds
// more than HistoryMinutes rows whatever the clock does.

// HistoryMinutes is how many one-minute samples the history keeps: 24 h.
const HistoryMinutes = 24 * 60

// historySpan is HistoryMinutes as a span of Unix milliseconds.
const historySpan = int64(HistoryMinutes) * int64(time.Minute/time.Millisecond)

// HistorySample is the fleet at one minute: how many shards were in each
// state and the heartbeat latency of the READY shards with a measured
// ping. The counts are the shard map's states.
type HistorySample struct {
	// At is the sample's minute; AddHistory truncates it to the minute.
	At time.Time
	// Shard counts by state.
	Ready, Starting, Assigned, Pending, Backoff, Fatal, Unowned uint32
	// PingCount is how many shards the percentiles are over; with 0 the
	// percentiles are 0 and mean "no measurement".
	PingCount uint32
	// Ping percentiles and maximum in milliseconds, stored to the
	// microsecond.
	PingP50, PingP90, PingP99, PingMax float64
}

// us converts milliseconds to whole microseconds for storage.
func us(msec float64) int64 {
	if !(msec > 0) { // NaN too
		return 0
	}
	return int64(math.Round(msec * 1000))
}

// AddHistory stores s as its minute's sample (replacing one already stored
// for that minute) and prunes, in the same transaction, the samples more
// than HistoryMinutes minutes older than the newest one.
func (s *Store) AddHistory(ctx context.Context, h HistorySample) error {
	if h.At.IsZero() {
		return fmt.Errorf("history: sample time is zero")
	}
	minute := h.At.Truncate(time.Minute).UnixMilli()
	tx, err := s.begin(ctx)
	if err != nil {
		return fmt.Errorf("history: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.exec(ctx, `INSERT INTO fleet_history(minute, ready, starting, assigned, pending, backoff, fatal, unowned,
		ping_count, ping_p50_us, ping_p90_us, ping_p99_us, ping_max_us) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT(minute) DO UPDATE SET ready = excluded.ready, starting = excluded.starting,
		assigned = excluded.assigned, pending = excluded.pending, backoff = excluded.backoff, fatal = excluded.fatal,
		unowned = excluded.unowned, ping_count = excluded.ping_count, ping_p50_us = excluded.ping_p50_us,
		ping_p90_us = excluded.ping_p90_us, ping_p99_us = excluded.ping_p99_us, ping_max_us = excluded.ping_max_us`,
		minute, h.Ready, h.Starting, h.Assigned, h.Pending, h.Backoff, h.Fatal, h.Unowned,
		h.PingCount, us(h.PingP50), us(h.PingP90), us(h.PingP99), us(h.PingMax)); err != nil {
		return fmt.Errorf("history: add %s: %w", h.At.UTC().Format(time.RFC3339), err)
	}
	if _, err := tx.exec(ctx, `DELETE FROM fleet_history WHERE minute <= (SELECT MAX(minute) FROM fleet_history) - ?`,
		historySpan); err != nil {
		return fmt.Errorf("history: prune: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("history: %w", err)
	}
	return nil
}

// History returns the stored samples from since on, oldest first (at most
// HistoryMinutes of them).
func (s *Store) History(ctx context.Context, since time.Time) ([]HistorySample, error) {
	rows, err := s.query(ctx, `SELECT minute, ready, starting, assigned, pending, backoff, fatal, unowned,
		ping_count, ping_p50_us, ping_p90_us, ping_p99_us, ping_max_us
		FROM fleet_history WHERE minute >= ? ORDER BY minute LIMIT ?`, since.Truncate(time.Minute).UnixMilli(), HistoryMinutes)
	if err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	defer rows.Close()
	out := make([]HistorySample, 0, 64)
	for rows.Next() {
		var h HistorySample
		var minute, p50, p90, p99, pmax int64
		if err := rows.Scan(&minute, &h.Ready, &h.Starting, &h.Assigned, &h.Pending, &h.Backoff, &h.Fatal, &h.Unowned,
			&h.PingCount, &p50, &p90, &p99, &pmax); err != nil {
			return nil, fmt.Errorf("history: %w", err)
		}
		h.At = time.UnixMilli(minute).UTC()
		h.PingP50, h.PingP90, h.PingP99, h.PingMax = float64(p50)/1000, float64(p90)/1000, float64(p99)/1000, float64(pmax)/1000
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	return out, nil
}
