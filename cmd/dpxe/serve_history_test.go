package main

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/store"
)

// TestServeSamplesHistory: a running `dpxe serve` writes its first
// history sample (fleet/history) at start, with every shard of an empty
// fleet unowned, into its own store, and stops cleanly with the sampler
// running.
func TestServeSamplesHistory(t *testing.T) {
	dir := t.TempDir()
	bin := sharedDpxe(t)
	db := filepath.Join(dir, "var", "dpxe.db")
	p := startServe(t, bin, "--db", db, "--total-shards", "16", "--no-dashboard")
	ctx := context.Background()
	st, err := store.Open(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	deadline := time.Now().Add(e2eDeadline)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		h, err := st.History(ctx, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if len(h) > 0 {
			if h[0].Unowned != 16 || h[0].Ready != 0 || h[0].PingCount != 0 {
				t.Fatalf("first sample %+v, want 16 unowned shards", h[0])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no history sample after %v:\n%s", e2eDeadline, p.logs())
		}
		<-tick.C
	}
	p.stop(t)
}
