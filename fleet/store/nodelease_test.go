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
