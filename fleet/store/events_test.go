package store

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/store/pgtest"
)

// TestEventLogQueries covers the dashboard's reads of the audit log:
// newest first, filtered by node, kind and ID, bounded, and a scan that
// stops when told; the start order's per-shard newest grant and re-claim.
func TestEventLogQueries(t *testing.T) { pgtest.Each(t, testEventLogQueries) }

func testEventLogQueries(t *testing.T, dsn string) {
	ctx := context.Background()
	s := openDSN(t, dsn)
	at := time.UnixMilli(1_700_000_000_000).UTC()
	shard := func(v uint32) *uint32 { return &v }
	b := &Batch{Events: []Event{
		{At: at, Kind: "granted", NodeID: "a", ShardID: shard(1), Detail: "n 8"},                      // 1
		{At: at.Add(time.Second), Kind: "granted", NodeID: "b", ShardID: shard(2), Detail: "n 8"},     // 2
		{At: at.Add(2 * time.Second), Kind: "unused", NodeID: "a", ShardID: shard(1), Detail: "n 8"},  // 3
		{At: at.Add(3 * time.Second), Kind: "granted", NodeID: "a", ShardID: shard(3), Detail: "n 4"}, // 4: another count
		{At: at.Add(4 * time.Second), Kind: "drain", NodeID: "a"},                                     // 5
		{At: at.Add(5 * time.Second), Kind: "unused", NodeID: "b", ShardID: shard(2), Detail: "n 8"},  // 6
		{At: at.Add(6 * time.Second), Kind: "granted", NodeID: "b", ShardID: shard(2), Detail: "n 8"}, // 7
	}}
	if err := s.Apply(ctx, b); err != nil {
		t.Fatal(err)
	}
	ids := func(evs []Event, err error) []int64 {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		out := []int64{}
		for _, e := range evs {
			out = append(out, e.ID)
		}
		return out
	}
	for _, c := range []struct {
		name string
		q    EventQuery
		want []int64
	}{
		{"all", EventQuery{Limit: 100}, []int64{7, 6, 5, 4, 3, 2, 1}},
		{"limit", EventQuery{Limit: 2}, []int64{7, 6}},
		{"node", EventQuery{NodeID: "a", Limit: 100}, []int64{5, 4, 3, 1}},
		{"kind", EventQuery{Kind: "granted", Limit: 100}, []int64{7, 4, 2, 1}},
		{"node+kind+before", EventQuery{NodeID: "b", Kind: "granted", Before: 7, Limit: 100}, []int64{2}},
		{"none", EventQuery{Kind: "nothing", Limit: 100}, []int64{}},
	} {
		if got := ids(s.EventLog(ctx, c.q)); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	evs, _ := s.EventLog(ctx, EventQuery{Limit: 1})
	if e := evs[0]; !e.At.Equal(at.Add(6*time.Second)) || e.ShardID == nil || *e.ShardID != 2 || e.Detail != "n 8" {
		t.Fatalf("newest event %+v", e)
	}
	var seen []int64
	if err := s.ScanEventLog(ctx, EventQuery{Limit: 100}, func(e Event) bool {
		seen = append(seen, e.ID)
		return e.ID > 5
	}); err != nil || !slices.Equal(seen, []int64{7, 6, 5}) {
		t.Fatalf("scan stopping at 5: %v %v", seen, err)
	}

	last, err := s.LastShardEvents(ctx, "granted", "unused", "n 8")
	if err != nil {
		t.Fatal(err)
	}
	want := []ShardEventIDs{{ShardID: 1, LastA: 1, LastB: 3}, {ShardID: 2, LastA: 7, LastB: 6}}
	if len(last) != len(want) || last[0] != want[0] || last[1] != want[1] {
		t.Fatalf("LastShardEvents = %+v, want %+v", last, want)
	}

	if err := s.SetSetting(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSetting(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Setting(ctx, "k"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("setting after delete: %v", err)
	}
	if err := s.DeleteSetting(ctx, "k"); err != nil {
		t.Fatalf("deleting a missing setting: %v", err)
	}
}
