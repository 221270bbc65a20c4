package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"syscall"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/store/pgtest"
)

func openTemp(t *testing.T) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sub", "dpxe.db")
	s, err := Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	return s, path
}

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

// openDSN opens the store at dsn (a SQLite path or a PostgreSQL URL).
func openDSN(t *testing.T, dsn string) *Store {
	t.Helper()
	s, err := Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestOpenMigratesAndPragmas(t *testing.T) { pgtest.Each(t, testOpenMigratesAndPragmas) }

func testOpenMigratesAndPragmas(t *testing.T, path string) {
	ctx := context.Background()
	s := openDSN(t, path)
	v, err := s.SchemaVersion(ctx)
	if err != nil || v != len(migrations) {
		t.Fatalf("schema version %d, %v; want %d", v, err, len(migrations))
	}
	if s.dialect == dialectSQLite {
		var mode string
		var fk, timeout int
		s.DB().QueryRow(`PRAGMA journal_mode`).Scan(&mode)
		s.DB().QueryRow(`PRAGMA foreign_keys`).Scan(&fk)
		s.DB().QueryRow(`PRAGMA busy_timeout`).Scan(&timeout)
		if mode != "wal" || fk != 1 || timeout != int(busyTimeout.Milliseconds()) {
			t.Fatalf("journal_mode %q foreign_keys %d busy_timeout %d", mode, fk, timeout)
		}
	}
	s.Close()
	// Reopening applies nothing new and keeps the version.
	s, err = Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if v, _ := s.SchemaVersion(ctx); v != len(migrations) {
		t.Fatalf("version after reopen %d", v)
	}
	// A file from a newer program is refused.
	s.DB().Exec(`INSERT INTO schema_migrations(version, name, applied_at) VALUES(999, 'future', 0)`)
	s.Close()
	if _, err := Open(ctx, path); !errors.Is(err, ErrNewerSchema) {
		t.Fatalf("newer schema: %v", err)
	}
}

func TestMigrationListIsNumbered(t *testing.T) {
	for i, m := range migrations {
		if m.version != i+1 || m.name == "" || m.sql == "" {
			t.Fatalf("migration %d: %+v", i, m)
		}
	}
}

func TestNodesBatchRoundTrip(t *testing.T) { pgtest.Each(t, nodesBatchRoundTrip) }

func nodesBatchRoundTrip(t *testing.T, dsn string) {
	ctx := context.Background()
	s, err := Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	now := time.UnixMilli(1_700_000_000_123).UTC()
	if err := s.CreateNode(ctx, "n1", []byte{1, 2, 3}, now); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateNode(ctx, "n1", []byte{4}, now); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate node: %v", err)
	}
	if _, err := s.Node(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing node: %v", err)
	}
	shard := uint32(7)
	st := NodeState{ID: "n1", Capacity: 8, FirstSeen: now, LastSeen: now, LeaseDeadline: now.Add(30 * time.Second),
		Live: true, AckedGeneration: 4, Held: "0-7", Address: "127.0.0.1", Ready: 3, Starting: 1}
	b := &Batch{
		Plan:        &Plan{Generation: 4, TotalShards: 16, Ranges: []PlanRange{{"n1", 0, 8}}, ChangedAt: now},
		Nodes:       []NodeState{st},
		ShardStatus: []ShardStatus{{ShardID: 7, NodeID: "n1", State: "READY", SeqValid: true, HeartbeatAcks: 9, LastError: "x", CloseCode: 4000, UpdatedAt: now}},
		Budget:      &Budget{Total: 1000, Remaining: 990, ResetAt: now.Add(time.Hour)},
		Events:      []Event{{At: now, Kind: "node_first_seen", NodeID: "n1"}},
		Durable:     true,
	}
	if err := s.Apply(ctx, b); err != nil {
		t.Fatal(err)
	}
	spent := *b.Budget
	spent.Remaining--
	if _, err := s.GrantIdentify(ctx, Grant{NodeID: "n1", ShardID: 7, Bucket: 0, MaxConcurrency: 1, Budget: &spent,
		Event: Event{At: now, Kind: "identify_granted", NodeID: "n1", ShardID: &shard}}); err != nil {
		t.Fatal(err)
	}
	// A shard status for an unknown node violates the foreign key.
	if err := s.Apply(ctx, &Batch{ShardStatus: []ShardStatus{{ShardID: 1, NodeID: "ghost", State: "READY", UpdatedAt: now}}}); err == nil {
		t.Fatal("foreign key not enforced")
	}
	s.Close()
	s, err = Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	n, err := s.Node(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(n.NodeState, st) || !n.CreatedAt.Equal(now) || string(n.CredHash) != "\x01\x02\x03" {
		t.Fatalf("node %+v\nwant %+v", n, st)
	}
	p, ok, err := s.LoadPlan(ctx)
	if err != nil || !ok || p.Generation != 4 || !reflect.DeepEqual(p.Ranges, b.Plan.Ranges) || !p.ChangedAt.Equal(now) {
		t.Fatalf("plan %+v %v %v", p, ok, err)
	}
	ss, _ := s.ShardStatuses(ctx, "n1")
	if len(ss) != 1 || ss[0] != b.ShardStatus[0] {
		t.Fatalf("shard status %+v", ss)
	}
	g, _ := s.BucketGrants(ctx)
	if len(g) != 1 || g[0] != (BucketGrant{Bucket: 0, GrantedAt: now, ShardID: 7, NodeID: "n1"}) {
		t.Fatalf("buckets %+v", g)
	}
	bu, ok, _ := s.LoadBudget(ctx)
	if !ok || bu != spent {
		t.Fatalf("budget %+v", bu)
	}
	ev, _ := s.Events(ctx, 0, "", 10)
	if len(ev) != 2 || ev[1].ShardID == nil || *ev[1].ShardID != 7 || ev[0].ShardID != nil {
		t.Fatalf("events %+v", ev)
	}
	ev, _ = s.Events(ctx, 0, "identify_granted", 10)
	if len(ev) != 1 {
		t.Fatalf("events by kind %+v", ev)
	}
}

func TestEventsAreBounded(t *testing.T) { pgtest.Each(t, eventsAreBounded) }

func eventsAreBounded(t *testing.T, dsn string) {
	ctx := context.Background()
	s := openDSN(t, dsn)
	s.maxEvents = 5
	for i := 0; i < 4; i++ {
		b := &Batch{}
		for j := 0; j < 3; j++ {
			b.Events = append(b.Events, Event{At: time.Now(), Kind: "drain"})
		}
		if err := s.Apply(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	ev, _ := s.Events(ctx, 0, "", 100)
	if len(ev) != 5 || ev[4].ID != 12 || ev[0].ID != 8 {
		t.Fatalf("kept %d events: %+v", len(ev), ev)
	}
}

// TestFilesPrivate: the database and its -wal and -shm files are created
// 0600 even under a permissive umask (issue 24: they were 0644), and an
// existing world-readable file is narrowed to 0600 when opened.
func TestFilesPrivate(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	ctx := context.Background()
	s, path := openTemp(t)
	if err := s.SetSetting(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		for _, p := range []string{path, path + "-wal", path + "-shm"} {
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatalf("%s: %v", when, err)
			}
			if fi.Mode().Perm() != 0o600 {
				t.Errorf("%s: %s has mode %v, want 0600", when, filepath.Base(p), fi.Mode().Perm())
			}
		}
		if fi, _ := os.Stat(filepath.Dir(path)); fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: directory mode %v, want 0700", when, fi.Mode().Perm())
		}
	}
	check("created")
	s.Close()
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		os.Chmod(p, 0o644)
	}
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.SetSetting(ctx, "k", "w")
	check("reopened")
}

// TestShardStatusBatches: a batch with more statuses than one PostgreSQL
// statement takes, and a shard reported twice (it moved between nodes
// within one flush), stores every shard once with its last status.
func TestShardStatusBatches(t *testing.T) { pgtest.Each(t, testShardStatusBatches) }

func testShardStatusBatches(t *testing.T, dsn string) {
	ctx := context.Background()
	s := openDSN(t, dsn)
	now := time.UnixMilli(1_800_000_000_000)
	for _, id := range []string{"n1", "n2"} {
		if err := s.CreateNode(ctx, id, []byte("h"), now); err != nil {
			t.Fatal(err)
		}
	}
	var b Batch
	for i := range 2500 {
		b.ShardStatus = append(b.ShardStatus, ShardStatus{ShardID: uint32(i), NodeID: "n1", State: "READY", UpdatedAt: now})
	}
	b.ShardStatus = append(b.ShardStatus, ShardStatus{ShardID: 7, NodeID: "n2", State: "STARTING", UpdatedAt: now.Add(time.Second)})
	if err := s.Apply(ctx, &b); err != nil {
		t.Fatal(err)
	}
	all, err := s.ShardStatuses(ctx, "")
	if err != nil || len(all) != 2500 {
		t.Fatalf("%d statuses, %v", len(all), err)
	}
	for _, x := range all {
		want := "n1"
		if x.ShardID == 7 {
			want = "n2"
		}
		if x.NodeID != want {
			t.Fatalf("shard %d: node %s, want %s", x.ShardID, x.NodeID, want)
		}
	}
}

func TestNodeRowBatches(t *testing.T) { pgtest.Each(t, testNodeRowBatches) }

// testNodeRowBatches: a batch of more node rows than one PostgreSQL
// statement carries writes each node's last state, and leaves a node
// deleted meanwhile deleted.
func testNodeRowBatches(t *testing.T, dsn string) {
	ctx := context.Background()
	s := openDSN(t, dsn)
	now := time.UnixMilli(1_800_000_000_000).UTC()
	const nodes = nodeRowChunk*2 + 7
	var b Batch
	for i := range nodes {
		id := fmt.Sprintf("n%04d", i)
		if err := s.CreateNode(ctx, id, []byte("h"), now); err != nil {
			t.Fatal(err)
		}
		b.Nodes = append(b.Nodes, NodeState{ID: id, Capacity: i % 128, FirstSeen: now, LastSeen: now.Add(time.Duration(i) * time.Millisecond),
			LeaseDeadline: now.Add(30 * time.Second), Live: i%2 == 0, AckedGeneration: uint64(i) << 33, Held: fmt.Sprintf("%d-%d", i, i+3),
			Address: fmt.Sprintf("10.0.%d.%d:80", i/256, i%256), Ready: i % 5, Starting: 1, Backoff: 2, Fatal: i % 3, Draining: i%7 == 0})
	}
	// The same node twice: its last state is the one kept.
	last := b.Nodes[5]
	last.Capacity, last.Held, last.Draining = 99, "", !last.Draining
	b.Nodes = append(b.Nodes, last)
	if err := s.DeleteNode(ctx, "n0003"); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(ctx, &b); err != nil {
		t.Fatal(err)
	}
	for i, want := range b.Nodes[:nodes] {
		got, err := s.Node(ctx, want.ID)
		switch {
		case i == 3:
			if !errors.Is(err, ErrNotFound) {
				t.Fatalf("deleted node %s came back: %+v %v", want.ID, got, err)
			}
			continue
		case i == 5:
			want = last
		}
		if err != nil || !reflect.DeepEqual(got.NodeState, want) {
			t.Fatalf("node %d: %+v %v\nwant %+v", i, got.NodeState, err, want)
		}
	}
}
