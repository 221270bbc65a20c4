package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/store/pgtest"
)

// TestRenewLeasesFenced: a leader's renewal writes the database clock plus
// the lease for every node of the group, a shorter renewal never moves a
// deadline earlier, and once another replica holds the lease the deposed
// leader's renewal fails with ErrFenced and writes nothing.
func TestRenewLeasesFenced(t *testing.T) { pgtest.Each(t, testRenewLeasesFenced) }

func testRenewLeasesFenced(t *testing.T, dsn string) {
	ctx := context.Background()
	a, b := openDSN(t, dsn), openDSN(t, dsn)
	for _, id := range []string{"n1", "n2"} {
		if err := a.CreateNode(ctx, id, []byte{1}, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	la, err := a.Campaign(ctx, "a", "http://a", time.Minute)
	if err != nil || !la.Leader {
		t.Fatalf("campaign: %+v %v", la, err)
	}
	fa := Fence{Holder: "a", Term: la.Term}
	if err := a.RenewLeases(ctx, fa, []string{"n1", "n2"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := a.RenewLease(ctx, fa, "n1", time.Second); err != nil {
		t.Fatal(err)
	}
	left, err := b.LeaseRemaining(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"n1", "n2"} {
		if d := left[id]; d < 59*time.Minute || d > time.Hour {
			t.Fatalf("%s: %v left, want about an hour: %v", id, d, left)
		}
	}
	if err := a.Resign(ctx, "a", la.Term); err != nil {
		t.Fatal(err)
	}
	lb, err := b.Campaign(ctx, "b", "http://b", time.Minute)
	if err != nil || !lb.Leader {
		t.Fatalf("b's campaign: %+v %v", lb, err)
	}
	if err := a.RenewLeases(ctx, fa, []string{"n1", "n2"}, 2*time.Hour); !errors.Is(err, ErrFenced) {
		t.Fatalf("deposed leader's renewal: %v", err)
	}
	left, err = b.LeaseRemaining(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := left["n2"]; d > time.Hour {
		t.Fatalf("the fenced renewal landed: %v", left)
	}
	if err := b.RenewLease(ctx, Fence{Holder: "b", Term: lb.Term}, "n2", 2*time.Hour); err != nil {
		t.Fatal(err)
	}
}

// TestFollowerRenewLease: a replica that does not lead renews a node's
// running lease when the node reports the stored plan's generation and
// the store shows it live, whoever leads (or nobody), and reads back the
// node's range, held set and the term; a lapsed lease, a node the store
// shows not live, a check-in of another generation and one reporting
// less capacity than the node's range are refused by name and write
// nothing.
func TestFollowerRenewLease(t *testing.T) { pgtest.Each(t, testFollowerRenewLease) }

func testFollowerRenewLease(t *testing.T, dsn string) {
	ctx := context.Background()
	a, b := openDSN(t, dsn), openDSN(t, dsn)
	ids := []string{"n1", "n2", "n3", "n4"}
	for _, id := range ids {
		if err := a.CreateNode(ctx, id, []byte{1}, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	la, err := a.Campaign(ctx, "a", "http://a", time.Minute)
	if err != nil || !la.Leader {
		t.Fatalf("campaign: %+v %v", la, err)
	}
	fa := Fence{Holder: "a", Term: la.Term}
	batch := &Batch{
		Fence: &fa,
		Plan: &Plan{Generation: 3, TotalShards: 16, ChangedAt: time.Now(),
			Ranges: []PlanRange{{NodeID: "n1", Start: 0, Count: 4}, {NodeID: "n2", Start: 4, Count: 4}, {NodeID: "n4", Start: 8, Count: 4}}},
		Nodes: []NodeState{
			{ID: "n1", Live: true, AckedGeneration: 3, Held: "0-2", Capacity: 4},
			{ID: "n2", Live: true, AckedGeneration: 2, Held: "4-7", Capacity: 4},
			{ID: "n3", Live: false, AckedGeneration: 3},
			{ID: "n4", Live: true, AckedGeneration: 3, Held: "8-11", Capacity: 4},
		},
	}
	if err := a.Apply(ctx, batch); err != nil {
		t.Fatal(err)
	}
	if err := a.RenewLeases(ctx, fa, []string{"n1", "n2", "n3"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := a.RenewLease(ctx, fa, "n4", -time.Second); err != nil { // lapsed at once
		t.Fatal(err)
	}
	// With the leader gone (resigned), a follower still renews.
	if err := a.Resign(ctx, "a", la.Term); err != nil {
		t.Fatal(err)
	}
	f, err := b.FollowerRenewLease(ctx, "n1", 3, 4, 2*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	want := FollowerLease{Generation: 3, Range: PlanRange{NodeID: "n1", Start: 0, Count: 4}, Held: "0-2", Term: la.Term}
	if f != want {
		t.Fatalf("follower renewal read %+v, want %+v", f, want)
	}
	if _, err := b.FollowerRenewLease(ctx, "n1", 3, 4, time.Second); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		id   string
		gen  uint64
		want error
	}{
		{"n1", 2, ErrNotSteady},   // not the plan's generation
		{"n2", 2, ErrNotSteady},   // acknowledges 2, the plan is 3
		{"n3", 3, ErrNotSteady},   // not live in the store
		{"n4", 3, ErrLeaseLapsed}, // its lease ran out
		{"nx", 3, ErrLeaseLapsed}, // no lease at all
	} {
		if _, err := b.FollowerRenewLease(ctx, c.id, c.gen, 4, 2*time.Hour); !errors.Is(err, c.want) {
			t.Errorf("%s generation %d: %v, want %v", c.id, c.gen, err, c.want)
		}
	}
	left, err := a.LeaseRemainingOf(ctx, []string{"n1", "n2", "n4", "nx"})
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 3 {
		t.Fatalf("leases of n1, n2, n4 (nx has none): %v", left)
	}
	if d := left["n1"]; d < 119*time.Minute || d > 2*time.Hour {
		t.Errorf("n1: %v left, want about two hours (the shorter renewal never moves it earlier): %v", d, left)
	}
	if d := left["n2"]; d > time.Hour {
		t.Errorf("n2's refused renewal landed: %v", left)
	}
	// n2 applied generation 3; its acknowledgement is not stored yet
	// (the leader writes it with a later batch): renewed, with its range
	// startable only where the store shows it holding.
	// Reporting less capacity than its range: refused, nothing written.
	if _, err := b.FollowerRenewLease(ctx, "n2", 3, 3, 3*time.Hour); !errors.Is(err, ErrNotSteady) {
		t.Errorf("n2 with capacity 3 for a range of 4: %v, want %v", err, ErrNotSteady)
	}
	if left, err := a.LeaseRemainingOf(ctx, []string{"n2"}); err != nil || left["n2"] > time.Hour {
		t.Errorf("n2's refused renewal (capacity) landed: %v %v", left, err)
	}
	if f, err := b.FollowerRenewLease(ctx, "n2", 3, 4, 2*time.Hour); err != nil || f.Range != (PlanRange{NodeID: "n2", Start: 4, Count: 4}) || f.Held != "4-7" {
		t.Errorf("n2 reporting generation 3: %+v %v", f, err)
	}
	if d := left["n4"]; d > 0 {
		t.Errorf("n4's lapsed lease was renewed: %v", left)
	}
}
