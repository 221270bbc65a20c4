package controller

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// BenchmarkControllerRebalance measures the controller's full rebalance
// (members, plan, generation compare, staging) with 10,000 live nodes and
// 131,072 shards, each iteration toggling one node's drain so every range
// after it moves; and the durable write of that plan.
func BenchmarkControllerRebalance(b *testing.B) {
	if os.Getenv("DPXE_BENCH") == "" {
		b.Skip("set DPXE_BENCH=1 (make bench)")
	}
	const nodes = 10000
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(b.TempDir(), "bench.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	clock := newFakeClock()
	c, err := New(ctx, st, Config{TotalShards: appliance.MaxTotalShards, RebalanceEvery: time.Hour}, clock.Now, nil)
	if err != nil {
		b.Fatal(err)
	}
	tx, _ := st.DB().Begin()
	for i := 0; i < nodes; i++ {
		id := fmt.Sprintf("node-%05d", i)
		h := HashCredential(id)
		tx.Exec(`INSERT INTO nodes(id, cred_hash, created_at) VALUES(?, ?, 0)`, id, h[:])
		c.nodes[id] = &node{id: id, credHash: h}
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < nodes; i++ {
		if _, err := c.Checkin(ctx, &appliance.CheckinRequest{NodeID: fmt.Sprintf("node-%05d", i), Capacity: 14}, ""); err != nil {
			b.Fatal(err)
		}
	}
	toggle := c.nodes["node-00000"]
	b.Run("rebalance", func(b *testing.B) {
		for b.Loop() {
			c.mu.Lock()
			toggle.draining = !toggle.draining
			c.rebalanceLocked(clock.Now())
			c.mu.Unlock()
		}
	})
	b.Run("rebalance+durable-write", func(b *testing.B) {
		for b.Loop() {
			c.mu.Lock()
			toggle.draining = !toggle.draining
			c.rebalanceLocked(clock.Now())
			seq := c.stage.seq
			c.mu.Unlock()
			if err := c.waitDurable(ctx, seq); err != nil {
				b.Fatal(err)
			}
		}
	})
}
