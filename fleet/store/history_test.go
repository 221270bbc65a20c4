package store

import (
	"context"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/store/pgtest"
)

// TestHistory: on both backends, samples come back oldest first with
// every field, a second sample in the same minute replaces the first, the
// table keeps exactly the last HistoryMinutes minutes (pruned in the same
// write, relative to the newest sample, also when a sample arrives after a
// gap or from an earlier clock), and a zero time is refused.
func TestHistory(t *testing.T) { pgtest.Each(t, testHistory) }

func testHistory(t *testing.T, dsn string) {
	ctx := context.Background()
	s := openDSN(t, dsn)
	count := func() int {
		t.Helper()
		var n int
		if err := s.queryRow(ctx, `SELECT COUNT(*) FROM fleet_history`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	if err := s.AddHistory(ctx, HistorySample{}); err == nil {
		t.Fatal("a sample without a time was stored")
	}
	want := HistorySample{At: t0.Add(90 * time.Second), Ready: 2040, Starting: 1, Assigned: 2, Pending: 3, Backoff: 4,
		Fatal: 5, Unowned: 6, PingCount: 2040, PingP50: 41.5, PingP90: 80.25, PingP99: 120.001, PingMax: 4999.999}
	if err := s.AddHistory(ctx, want); err != nil {
		t.Fatal(err)
	}
	// An earlier minute stored after it still comes back first.
	if err := s.AddHistory(ctx, HistorySample{At: t0, Ready: 1}); err != nil {
		t.Fatal(err)
	}
	got, err := s.History(ctx, t0)
	if err != nil {
		t.Fatal(err)
	}
	want.At = t0.Add(time.Minute) // truncated to its minute
	if len(got) != 2 || got[0].At != t0 || got[0].Ready != 1 || got[1] != want {
		t.Fatalf("history = %+v\nwant [{At:%v Ready:1} %+v]", got, t0, want)
	}
	// The same minute again replaces the row.
	if err := s.AddHistory(ctx, HistorySample{At: t0.Add(119 * time.Second), Ready: 7}); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.History(ctx, t0.Add(time.Minute)); len(got) != 1 || got[0].Ready != 7 || got[0].PingCount != 0 {
		t.Fatalf("replaced minute = %+v", got)
	}
	// Fill a day and a bit, one sample a minute: the table stays at
	// HistoryMinutes rows, the oldest gone.
	for i := 2; i < HistoryMinutes+30; i++ {
		if err := s.AddHistory(ctx, HistorySample{At: t0.Add(time.Duration(i) * time.Minute), Ready: uint32(i)}); err != nil {
			t.Fatal(err)
		}
		if n := count(); n > HistoryMinutes {
			t.Fatalf("after minute %d the table holds %d rows", i, n)
		}
	}
	all, err := s.History(ctx, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != HistoryMinutes {
		t.Fatalf("%d samples kept, want %d", len(all), HistoryMinutes)
	}
	newest := t0.Add(time.Duration(HistoryMinutes+29) * time.Minute)
	if first := all[0].At; first != newest.Add(-(HistoryMinutes-1)*time.Minute) {
		t.Fatalf("oldest kept %v, newest %v", first, newest)
	}
	for i := 1; i < len(all); i++ {
		if !all[i].At.After(all[i-1].At) {
			t.Fatalf("not in time order at %d: %v then %v", i, all[i-1].At, all[i].At)
		}
	}
	// History(since) starts at since's minute.
	if part, _ := s.History(ctx, newest.Add(-2*time.Minute+time.Second)); len(part) != 3 || part[0].At != newest.Add(-2*time.Minute) {
		t.Fatalf("the last 3 minutes: %+v", part)
	}
	// After a gap of more than a day one write leaves only itself.
	later := newest.Add(25 * time.Hour)
	if err := s.AddHistory(ctx, HistorySample{At: later, Ready: 9}); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 1 {
		t.Fatalf("after a 25 h gap %d rows remain, want 1", n)
	}
	// A clock set back writes behind the newest and prunes nothing newer.
	if err := s.AddHistory(ctx, HistorySample{At: later.Add(-time.Hour), Ready: 8}); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 2 {
		t.Fatalf("after an earlier minute %d rows, want 2", n)
	}
	// A sample exactly a day older than the newest is pruned at once.
	if err := s.AddHistory(ctx, HistorySample{At: later.Add(-HistoryMinutes * time.Minute), Ready: 1}); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 2 {
		t.Fatalf("a sample a day old was kept: %d rows", n)
	}
}
