package store

import (
	"context"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/store/pgtest"
)

// TestShardSessionsFenced: a shard's session row is replaced by a later
// report of the same holder and by a holder granted under a higher
// generation, never by a late report of a deposed holder (a lower
// generation, or the same generation from another node); a drop removes
// only the exact holder's row; the rows survive reopening the store, and
// deleting a node removes its rows.
func TestShardSessionsFenced(t *testing.T) { pgtest.Each(t, testShardSessionsFenced) }

func testShardSessionsFenced(t *testing.T, dsn string) {
	ctx := context.Background()
	s := openDSN(t, dsn)
	for _, id := range []string{"a", "b"} {
		if err := s.CreateNode(ctx, id, []byte{1}, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	at := time.UnixMilli(1_700_000_000_000).UTC()
	row := func(node string, gen uint64, sess string, seq uint32) ShardSession {
		return ShardSession{ShardID: 5, NodeID: node, GrantGen: gen, SessionID: sess, Seq: seq,
			ResumeURL: "ws://10.0.0.1:8080/resume?v=10&encoding=json", ReportedAt: at.Add(time.Duration(seq) * time.Millisecond)}
	}
	apply := func(rows ...ShardSession) {
		t.Helper()
		if err := s.Apply(ctx, &Batch{Sessions: rows}); err != nil {
			t.Fatal(err)
		}
	}
	want := func(w ShardSession, what string) {
		t.Helper()
		got, err := s.ShardSessions(ctx)
		if err != nil || len(got) != 1 || got[0] != w {
			t.Fatalf("%s: stored %+v (%v), want %+v", what, got, err, w)
		}
	}
	apply(row("a", 3, "sa", 10))
	want(row("a", 3, "sa", 10), "first report")
	apply(row("a", 3, "sa", 25))
	want(row("a", 3, "sa", 25), "the same holder's later report")
	apply(row("b", 3, "sb", 30))
	want(row("a", 3, "sa", 25), "another node under the same generation")
	apply(row("b", 4, "sb", 2))
	want(row("b", 4, "sb", 2), "the next holder under a higher generation")
	apply(row("a", 3, "sa", 40))
	want(row("b", 4, "sb", 2), "a late report of the deposed holder")
	apply(ShardSession{ShardID: 5, NodeID: "a", GrantGen: 3, Drop: true}, ShardSession{ShardID: 5, NodeID: "b", GrantGen: 3, Drop: true})
	want(row("b", 4, "sb", 2), "drops of other holders")
	// Another handle on the same database (a restarted controller, or
	// another replica) reads the row.
	if got, err := openDSN(t, dsn).ShardSessions(ctx); err != nil || len(got) != 1 || got[0] != row("b", 4, "sb", 2) {
		t.Fatalf("through another handle: %+v %v", got, err)
	}
	apply(ShardSession{ShardID: 5, NodeID: "b", GrantGen: 4, Drop: true})
	if got, _ := s.ShardSessions(ctx); len(got) != 0 {
		t.Fatalf("after the holder's drop: %+v", got)
	}
	apply(row("b", 5, "sb2", 9))
	if err := s.DeleteNode(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.ShardSessions(ctx); len(got) != 0 {
		t.Fatalf("sessions of a deleted node: %+v", got)
	}
}
