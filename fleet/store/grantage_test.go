package store

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/store/pgtest"
)

// testClock is a settable database clock (SetDBClock).
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// TestGrantAges: each bucket's last grant comes back with its age on the
// database's clock (here a set clock, SetDBClock) and its shard; a grant
// written before migration 5 (no database time) comes back as unknown.
// The clock also dates the spacing check, so a grant in the window is
// refused until the clock moves past it.
// testGrant commits an Identify grant of shard in bucket for node "n",
// with the budget never short; at is the granting replica's clock.
func testGrant(ctx context.Context, s *Store, bucket, shard uint32, spacing time.Duration, f *Fence, at time.Time) error {
	_, err := s.GrantIdentify(ctx, Grant{NodeID: "n", ShardID: shard, Bucket: bucket, MaxConcurrency: 16, Spacing: spacing, Fence: f,
		Budget: &Budget{Total: 1000, Remaining: 1000, ResetAt: time.Unix(86400, 0)},
		Event:  Event{At: at, Kind: "identify_granted", NodeID: "n", ShardID: &shard}})
	return err
}

func TestGrantAges(t *testing.T) { pgtest.Each(t, testGrantAges) }

func testGrantAges(t *testing.T, dsn string) {
	ctx := context.Background()
	s := openDSN(t, dsn)
	clock := &testClock{t: time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)}
	s.SetDBClock(clock.Now)
	if err := s.CreateNode(ctx, "n", []byte{1}, time.Now()); err != nil {
		t.Fatal(err)
	}
	grant := func(bucket, shard uint32) error {
		// GrantedAt, the writer's own clock, is deliberately far off: the
		// age comes from the database's clock alone.
		return testGrant(ctx, s, bucket, shard, 5*time.Second, nil, time.Unix(1, 0))
	}
	if g, err := s.GrantAges(ctx); err != nil || len(g) != 0 {
		t.Fatalf("grant ages of an empty store: %+v %v", g, err)
	}
	if err := grant(0, 16); err != nil {
		t.Fatal(err)
	}
	clock.Advance(1500 * time.Millisecond)
	if err := grant(3, 3); err != nil {
		t.Fatal(err)
	}
	if err := grant(0, 32); err == nil {
		t.Fatal("a grant 1.5 s after the bucket's last one passed a 5 s spacing")
	}
	clock.Advance(250 * time.Millisecond)
	if _, err := s.DB().ExecContext(ctx, s.q(`INSERT INTO identify_buckets(bucket, granted_at, shard_id, node_id) VALUES(?, ?, ?, ?)`),
		5, time.Now().UnixMilli(), 5, "n"); err != nil {
		t.Fatal(err)
	}
	g, err := s.GrantAges(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []GrantAge{
		{Bucket: 0, ShardID: 16, Age: 1750 * time.Millisecond, Known: true},
		{Bucket: 3, ShardID: 3, Age: 250 * time.Millisecond, Known: true},
		{Bucket: 5, ShardID: 5},
	}
	if len(g) != len(want) {
		t.Fatalf("grant ages %+v, want %+v", g, want)
	}
	for i := range want {
		if g[i] != want[i] {
			t.Fatalf("grant ages %+v, want %+v", g, want)
		}
	}
	clock.Advance(3250 * time.Millisecond)
	if err := grant(0, 32); err != nil {
		t.Fatalf("a grant 5 s after the bucket's last one: %v", err)
	}
}
