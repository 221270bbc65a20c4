package api

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/store"
	"github.com/discord-pxe/dpxe/fleet/store/pgtest"
)

// benchStoreEnv picks BenchmarkCheckin's store: unset for a SQLite file,
// "postgres" for a fresh database on a PostgreSQL server the benchmark
// starts, with the controller leading as a replica (docs/ha.md: fenced
// batches), so the two backends compare on one machine:
//
//	DPXE_BENCH=1 DPXE_BENCH_STORE=postgres go test -run '^$' -bench 'Checkin/nodes=10000$' ./fleet/api/
const benchStoreEnv = "DPXE_BENCH_STORE"

// benchStore opens the benchmark's store; lead, when not nil, makes a
// controller the leading replica on it.
func benchStore(b *testing.B) (st *store.Store, lead func(*controller.Controller)) {
	ctx := context.Background()
	if os.Getenv(benchStoreEnv) != "postgres" {
		st, err := store.Open(ctx, filepath.Join(b.TempDir(), "bench.db"))
		if err != nil {
			b.Fatal(err)
		}
		return st, nil
	}
	srv, err := pgtest.Start(ctx)
	if err != nil {
		b.Skipf("PostgreSQL: %v", err)
	}
	b.Cleanup(func() { srv.Stop() })
	dsn, err := srv.NewDatabase(ctx)
	if err != nil {
		b.Fatal(err)
	}
	st, err = store.Open(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	return st, func(c *controller.Controller) {
		c.EnableHA(nil)
		l, err := st.Campaign(ctx, "bench", "http://bench", time.Hour)
		if err != nil || !l.Leader {
			b.Fatalf("campaign: %+v %v", l, err)
		}
		if err := c.Lead(ctx, store.Fence{Holder: "bench", Term: l.Term}, "http://bench", time.Now().Add(time.Hour)); err != nil {
			b.Fatal(err)
		}
	}
}
