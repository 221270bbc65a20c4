package store

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/store/pgtest"
)

// BenchmarkGrantIdentify commits Identify grants with GrantIdentify on a
// SQLite file and on PostgreSQL side by side (rounds alternate, so the
// machine's background load hits both alike), as a leader's grants
// (fenced) and as a follower's (the owner view read in the transaction,
// 64 live nodes), each grant in a bucket of its own so none is refused.
// It reports each backend's time per grant and PostgreSQL's as a ratio of
// SQLite's. The test's PostgreSQL runs with fsync off, SQLite commits
// grants with synchronous=FULL: on a real disk PostgreSQL adds its flush.
//
//	DPXE_BENCH=1 go test -run '^$' -bench GrantIdentify ./fleet/store/
func BenchmarkGrantIdentify(b *testing.B) {
	if os.Getenv("DPXE_BENCH") == "" {
		b.Skip("set DPXE_BENCH=1 (make bench)")
	}
	for _, follower := range []bool{false, true} {
		name := "leader"
		if follower {
			name = "follower"
		}
		b.Run(name, func(b *testing.B) {
			var st [2]*Store
			var fences [2]*Fence
			for i, be := range pgtest.Backends {
				st[i], fences[i] = grantBenchStore(b, be.NewDB(b))
			}
			const round = 100
			var next uint32
			var spent [2]time.Duration
			var grants int
			for b.Loop() {
				for i := range st {
					start := time.Now()
					for range round {
						next++
						shard := next
						g := Grant{NodeID: "n0", ShardID: shard, Bucket: shard, MaxConcurrency: 1 << 30, Spacing: 5 * time.Second,
							Event: Event{At: time.Now(), Kind: "identify_granted", NodeID: "n0", ShardID: &shard, Detail: "bench"}}
						if follower {
							g.Owner = func(v OwnerView) error { return nil }
						} else {
							g.Fence = fences[i]
							g.Budget = &Budget{Total: 1 << 30, Remaining: 1 << 30, ResetAt: time.Unix(1<<31, 0)}
						}
						if _, err := st[i].GrantIdentify(context.Background(), g); err != nil {
							b.Fatal(err)
						}
					}
					spent[i] += time.Since(start)
				}
				grants += round
			}
			sq, pg := spent[0]/time.Duration(grants), spent[1]/time.Duration(grants)
			b.ReportMetric(float64(sq.Microseconds())/1000, "sqlite-ms/grant")
			b.ReportMetric(float64(pg.Microseconds())/1000, "pg-ms/grant")
			b.ReportMetric(float64(pg)/float64(sq), "pg/sqlite")
		})
	}
}

// grantBenchStore opens dsn with 64 live nodes holding shards, a stored
// budget, and a leader's fence.
func grantBenchStore(b *testing.B, dsn string) (*Store, *Fence) {
	ctx := context.Background()
	s, err := Open(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	batch := &Batch{Budget: &Budget{Total: 1 << 30, Remaining: 1 << 30, ResetAt: time.Unix(1<<31, 0)}}
	for i := range 64 {
		id := fmt.Sprintf("n%d", i)
		if err := s.CreateNode(ctx, id, []byte{1}, time.Now()); err != nil {
			b.Fatal(err)
		}
		batch.Nodes = append(batch.Nodes, NodeState{ID: id, Live: true, Held: "0-7"})
	}
	l, err := s.Campaign(ctx, "bench", "http://bench", time.Hour)
	if err != nil || !l.Leader {
		b.Fatalf("campaign: %+v %v", l, err)
	}
	f := &Fence{Holder: "bench", Term: l.Term}
	batch.Fence = f
	if err := s.Apply(ctx, batch); err != nil {
		b.Fatal(err)
	}
	if err := s.RenewLeases(ctx, *f, []string{"n0"}, time.Hour); err != nil {
		b.Fatal(err)
	}
	return s, f
}
