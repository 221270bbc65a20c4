package controller

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/store"
	"github.com/discord-pxe/dpxe/fleet/store/pgtest"
)

// levelLog is a slog handler that keeps the records at Warn and above.
type levelLog struct {
	mu   sync.Mutex
	recs []string
}

func (l *levelLog) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelWarn }
func (l *levelLog) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r.Level.String()+" "+r.Message)
	return nil
}
func (l *levelLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *levelLog) WithGroup(string) slog.Handler      { return l }

func (l *levelLog) records() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.recs)
}

// tableRows counts the rows of every table of the store's PostgreSQL
// schema: what a replica wrote shows as a change.
func tableRows(t *testing.T, st *store.Store) map[string]int {
	t.Helper()
	ctx := context.Background()
	rows, err := st.DB().QueryContext(ctx, `SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'`)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		names = append(names, n)
	}
	rows.Close()
	if len(names) == 0 {
		t.Fatal("no tables in the store's schema")
	}
	out := map[string]int{}
	for _, n := range names {
		var c int
		if err := st.DB().QueryRowContext(ctx, fmt.Sprintf(`SELECT count(*) FROM %q`, n)).Scan(&c); err != nil {
			t.Fatal(err)
		}
		out[n] = c
	}
	return out
}

// discordFigures is a GET /gateway/bot answer with max_concurrency mc.
func discordFigures(mc int) GatewayBot {
	var g GatewayBot
	g.URL = "wss://gateway.example.test"
	g.Shards = 4
	g.SessionStartLimit.Total = 1000
	g.SessionStartLimit.Remaining = 990
	g.SessionStartLimit.ResetAfter = 3_600_000
	g.SessionStartLimit.MaxConcurrency = mc
	return g
}

// openPostgres opens a store on a fresh PostgreSQL database (pgtest).
func openPostgres(t *testing.T) *store.Store {
	t.Helper()
	st, err := store.Open(context.Background(), pgtest.DB(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// leadAs makes c lead for holder on st and returns the term.
func leadAs(t *testing.T, c *Controller, st *store.Store, holder string) uint64 {
	t.Helper()
	ctx := context.Background()
	l, err := st.Campaign(ctx, holder, "http://"+holder, time.Minute)
	if err != nil || !l.Leader {
		t.Fatalf("campaign: %+v %v", l, err)
	}
	if err := c.Lead(ctx, store.Fence{Holder: holder, Term: l.Term}, "http://"+holder, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	return l.Term
}

// TestFollowerGatewayRefreshWritesNothing, on PostgreSQL: a follower
// replica applies a GET /gateway/bot answer without an error (an error
// would make its refresh loop log a failure and fetch again within
// seconds): max_concurrency is taken in memory, nothing is written (no
// table changes) and nothing is logged at Warn or above. Once it leads,
// Discord's figures are recorded (the budget row).
func TestFollowerGatewayRefreshWritesNothing(t *testing.T) {
	ctx := context.Background()
	st := openPostgres(t)
	logs := &levelLog{}
	c, err := New(ctx, st, Config{TotalShards: 4, MaxConcurrency: 1, RebalanceEvery: -1}, newFakeClock().Now, slog.New(logs))
	if err != nil {
		t.Fatal(err)
	}
	c.EnableHA(nil)
	before := tableRows(t, st)
	if after, err := c.FetchGatewayBot(ctx, fixedFetcher{discordFigures(2)}); err != nil || after != 0 {
		t.Fatalf("a follower's GET /gateway/bot: %v (retry after %v), want it applied without error", err, after)
	}
	if mc := c.Config().MaxConcurrency; mc != 2 {
		t.Errorf("the follower's max_concurrency after Discord's answer: %d, want 2", mc)
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatalf("a follower's flush: %v", err)
	}
	if after := tableRows(t, st); !maps.Equal(before, after) {
		t.Fatalf("a follower wrote to the store: rows before %v, after %v", before, after)
	}
	if recs := logs.records(); len(recs) != 0 {
		t.Fatalf("a follower logged at Warn or above: %q", recs)
	}
	leadAs(t, c, st, "r1")
	// The stored budget (written by the single controller's start here,
	// by the previous leader in production) stays until the leader's
	// own fetch: the follower's figures may be older than its grants.
	if b, ok, err := st.LoadBudget(ctx); err != nil || !ok || b.Remaining != DefaultSessionBudget {
		t.Fatalf("the stored budget after the lead: %+v %v %v, want the stored default", b, ok, err)
	}
	if b := c.Budget(); b.Remaining != DefaultSessionBudget {
		t.Fatalf("the leader's budget after the lead: %+v, want the stored default", b)
	}
	if _, err := c.FetchGatewayBot(ctx, fixedFetcher{discordFigures(2)}); err != nil {
		t.Fatalf("the leader's GET /gateway/bot: %v", err)
	}
	if b, ok, err := st.LoadBudget(ctx); err != nil || !ok || b.Total != 1000 || b.Remaining != 990 {
		t.Fatalf("the leader's budget after Discord's answer: %+v %v %v, want 990 of 1000", b, ok, err)
	}
	if recs := logs.records(); len(recs) != 0 {
		t.Errorf("logged at Warn or above: %q", recs)
	}
}

// TestReplicaStartWritesNothing, on PostgreSQL: a controller made as a
// replica (Config.Replica, what `dpxe serve` does on a postgres:// --db)
// starts as a follower and writes nothing, neither its controller_start
// event nor the budget row the empty database lacks, also when it applies
// a GET /gateway/bot answer (no table changes); when it takes the lead it
// records its start under the fence, as "leader of term N", with the
// budget row holding the figures of that answer (not the default), as a
// single controller's first fetch would.
func TestReplicaStartWritesNothing(t *testing.T) {
	ctx := context.Background()
	st := openPostgres(t)
	before := tableRows(t, st)
	c, err := New(ctx, st, Config{TotalShards: 4, Replica: true, RebalanceEvery: -1}, newFakeClock().Now, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r := c.Role(); !r.HA || r.Leading {
		t.Fatalf("a replica's role after New: %+v, want a follower", r)
	}
	if _, err := c.FetchGatewayBot(ctx, fixedFetcher{discordFigures(1)}); err != nil {
		t.Fatalf("a follower's GET /gateway/bot: %v", err)
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatalf("a follower's flush: %v", err)
	}
	if after := tableRows(t, st); !maps.Equal(before, after) {
		t.Fatalf("a replica wrote to the store when it started: rows before %v, after %v", before, after)
	}
	term := leadAs(t, c, st, "r1")
	evs, err := st.Events(ctx, 0, EventControllerStart, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 || !strings.HasPrefix(evs[0].Detail, fmt.Sprintf("leader of term %d:", term)) {
		t.Fatalf("controller_start events after the lead: %+v, want one of term %d", evs, term)
	}
	if b, ok, err := st.LoadBudget(ctx); err != nil || !ok || b.Total != 1000 || b.Remaining != 990 {
		t.Fatalf("budget row after the lead: %+v %v %v, want Discord's 990 of 1000 fetched while following", b, ok, err)
	}
	if sets, err := st.Events(ctx, 0, EventBudgetConfigured, 10); err != nil || len(sets) != 1 {
		t.Fatalf("budget_set events after the lead: %+v %v, want one", sets, err)
	}
}

// fixedFetcher answers every GET /gateway/bot with g.
type fixedFetcher struct{ g GatewayBot }

func (f fixedFetcher) Fetch(context.Context) (GatewayBot, time.Duration, error) { return f.g, 0, nil }
