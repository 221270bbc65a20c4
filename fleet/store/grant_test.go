package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/store/pgtest"
)

// TestGrantIdentify: a follower's grant commits only if the owner check
// passes on what the store shows (the node's lease, liveness, held set,
// range and the other nodes' held sets, read in the transaction), the
// bucket's last grant is a window old on the database's clock (whoever
// wrote it), no grant of the window was made under another
// max_concurrency, and the stored budget is above its reserve; it spends
// from the stored budget and writes the audit entry with the bucket. A
// refusal names its reason and writes nothing. A leader's budget meets
// the stored one: the lower wins in one period, the leader's in a new one.
func TestGrantIdentify(t *testing.T) { pgtest.Each(t, testGrantIdentify) }

func testGrantIdentify(t *testing.T, dsn string) {
	ctx := context.Background()
	leader, follower := openDSN(t, dsn), openDSN(t, dsn)
	for _, id := range []string{"n1", "n2", "n3"} {
		if err := leader.CreateNode(ctx, id, []byte{1}, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	l, err := leader.Campaign(ctx, "a", "http://a", time.Minute)
	if err != nil || !l.Leader {
		t.Fatalf("campaign: %+v %v", l, err)
	}
	fence := &Fence{Holder: "a", Term: l.Term}
	reset := time.UnixMilli(time.Now().Add(time.Hour).UnixMilli())
	if err := leader.Apply(ctx, &Batch{Fence: fence,
		Plan: &Plan{Generation: 2, TotalShards: 16, ChangedAt: time.Now(),
			Ranges: []PlanRange{{NodeID: "n1", Start: 0, Count: 8}, {NodeID: "n2", Start: 8, Count: 8}}},
		Nodes:  []NodeState{{ID: "n1", Live: true, Held: "0-7"}, {ID: "n2", Live: true, Held: "8-15"}, {ID: "n3", Held: ""}},
		Budget: &Budget{Total: 10, Remaining: 4, ResetAt: reset}}); err != nil {
		t.Fatal(err)
	}
	if err := leader.RenewLeases(ctx, *fence, []string{"n1", "n2"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	var seen OwnerView
	owns := func(v OwnerView) error {
		seen = v
		if v.LeaseLeft <= 0 || !v.Live {
			return errors.New("not live")
		}
		return nil
	}
	follow := func(node string, shard uint32) error {
		_, err := follower.GrantIdentify(ctx, Grant{NodeID: node, ShardID: shard, Bucket: shard % 4, MaxConcurrency: 4,
			Spacing: 5 * time.Second, Reserve: 2, Owner: owns,
			Event: Event{At: time.Now(), Kind: "identify_granted", NodeID: node, ShardID: &shard, Detail: "num_shards 16"}})
		return err
	}
	stored := func() (int, int) {
		t.Helper()
		b, _, err := leader.LoadBudget(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ev, err := leader.Events(ctx, 0, "identify_granted", 100)
		if err != nil {
			t.Fatal(err)
		}
		return b.Remaining, len(ev)
	}

	if err := follow("n1", 1); err != nil {
		t.Fatal(err)
	}
	want := OwnerView{Live: true, Held: "0-7", Range: PlanRange{NodeID: "n1", Start: 0, Count: 8}, OthersHeld: map[string]string{"n2": "8-15"}}
	if seen.LeaseLeft < 59*time.Minute || seen.Live != want.Live || seen.Held != want.Held || seen.Range != want.Range ||
		fmt.Sprint(seen.OthersHeld) != fmt.Sprint(want.OthersHeld) {
		t.Fatalf("owner view %+v, want %+v with about an hour of lease", seen, want)
	}
	if left, events := stored(); left != 3 || events != 1 {
		t.Fatalf("after a follower's grant: budget %d (want 3), %d grant events (want 1)", left, events)
	}
	// Refusals, each writing nothing.
	var r *GrantRefused
	if err := follow("n3", 2); !errors.As(err, &r) || !errors.Is(err, ErrNotOwner) || !strings.Contains(err.Error(), "not live") {
		t.Errorf("a node the store shows not live: %v", err)
	}
	if err := follow("n2", 9); !errors.Is(err, ErrGrantSpacing) || !errors.As(err, &r) || r.Wait <= 4*time.Second || r.Wait > 5*time.Second {
		t.Errorf("bucket 1 again within the window: %v (wait %v)", err, r.Wait)
	}
	if _, err := leader.GrantIdentify(ctx, Grant{NodeID: "n2", ShardID: 13, Bucket: 1, MaxConcurrency: 4, Spacing: 5 * time.Second,
		Fence: fence, Budget: &Budget{Total: 10, Remaining: 9, ResetAt: reset},
		Event: Event{At: time.Now(), Kind: "identify_granted"}}); !errors.Is(err, ErrGrantSpacing) {
		t.Errorf("the leader's grant in bucket 1 within the window of a follower's: %v", err)
	}
	// Under max_concurrency 1 every shard is in bucket 0, which holds no
	// grant; but shard 1 was granted in bucket 1 within the window.
	six := uint32(6)
	if _, err := follower.GrantIdentify(ctx, Grant{NodeID: "n1", ShardID: six, Bucket: 0, MaxConcurrency: 1, Spacing: 5 * time.Second,
		Owner: owns, Event: Event{At: time.Now(), Kind: "identify_granted", ShardID: &six}}); !errors.Is(err, ErrGrantSpacing) ||
		!strings.Contains(err.Error(), "another max_concurrency") {
		t.Errorf("bucket 0 under max_concurrency 1 with a grant in bucket 1 within the window: %v", err)
	}
	if left, events := stored(); left != 3 || events != 1 {
		t.Fatalf("after refusals: budget %d (want 3), %d grant events (want 1)", left, events)
	}
	// The leader, whose memory still says 9 left, spends from the stored
	// 3: it stores 2, the reserve.
	b, err := leader.GrantIdentify(ctx, Grant{NodeID: "n2", ShardID: 10, Bucket: 2, MaxConcurrency: 4, Spacing: 5 * time.Second,
		Reserve: 2, Fence: fence, Budget: &Budget{Total: 10, Remaining: 9, ResetAt: reset},
		Event: Event{At: time.Now(), Kind: "identify_granted"}})
	if err != nil || b.Remaining != 2 {
		t.Fatalf("leader's grant: budget %+v, %v", b, err)
	}
	if err := follow("n1", 3); !errors.Is(err, ErrBudgetSpent) {
		t.Errorf("a follower's grant at the reserve: %v", err)
	}
	// A new period (the leader refilled): its budget wins.
	b, err = leader.GrantIdentify(ctx, Grant{NodeID: "n1", ShardID: 3, Bucket: 3, MaxConcurrency: 4, Spacing: 5 * time.Second,
		Reserve: 2, Fence: fence, Budget: &Budget{Total: 10, Remaining: 9, ResetAt: reset.Add(24 * time.Hour)},
		Event: Event{At: time.Now(), Kind: "identify_granted"}})
	if err != nil || b.Remaining != 9 {
		t.Fatalf("leader's grant after a refill: budget %+v, %v", b, err)
	}
	// A deposed leader's grant is fenced off.
	if err := leader.Resign(ctx, "a", l.Term); err != nil {
		t.Fatal(err)
	}
	if _, err := leader.GrantIdentify(ctx, Grant{NodeID: "n1", ShardID: 0, Bucket: 0, MaxConcurrency: 4, Fence: fence,
		Budget: &Budget{Total: 10, Remaining: 9, ResetAt: reset}, Event: Event{At: time.Now(), Kind: "identify_granted"}}); !errors.Is(err, ErrFenced) {
		t.Errorf("a resigned leader's grant: %v", err)
	}
	if left, events := stored(); left != 9 || events != 3 {
		t.Fatalf("in the end: budget %d (want 9), %d grant events (want 3)", left, events)
	}
}

// TestGrantIdentifyConcurrent: followers on separate connections claim
// the same never-granted bucket at once; exactly one grant commits, and
// the stored budget drops by one. (The row a first grant inserts is what
// the others queue on: without it each would see no row and grant.)
func TestGrantIdentifyConcurrent(t *testing.T) { pgtest.Each(t, testGrantIdentifyConcurrent) }

func testGrantIdentifyConcurrent(t *testing.T, dsn string) {
	ctx := context.Background()
	const replicas = 6
	var st [replicas]*Store
	for i := range st {
		st[i] = openDSN(t, dsn)
	}
	if err := st[0].CreateNode(ctx, "n", []byte{1}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := st[0].Apply(ctx, &Batch{Budget: &Budget{Total: 100, Remaining: 100, ResetAt: time.Now().Add(time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	for round := range 3 {
		bucket := uint32(round)
		var wg sync.WaitGroup
		var mu sync.Mutex
		granted, refused := 0, 0
		start := make(chan struct{})
		for i := range st {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				shard := bucket + 8*uint32(i)
				_, err := st[i].GrantIdentify(ctx, Grant{NodeID: "n", ShardID: shard, Bucket: bucket, MaxConcurrency: 8,
					Spacing: time.Minute, Owner: func(OwnerView) error { return nil },
					Event: Event{At: time.Now(), Kind: "identify_granted", NodeID: "n", ShardID: &shard}})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					granted++
				case errors.Is(err, ErrGrantSpacing):
					refused++
				default:
					t.Errorf("replica %d: %v", i, err)
				}
			}()
		}
		close(start)
		wg.Wait()
		if granted != 1 || refused != replicas-1 {
			t.Fatalf("bucket %d: %d granted, %d refused; want 1 and %d", bucket, granted, refused, replicas-1)
		}
	}
	if b, _, err := st[0].LoadBudget(ctx); err != nil || b.Remaining != 97 {
		t.Fatalf("budget after three grants: %+v %v", b, err)
	}
}
