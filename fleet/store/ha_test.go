package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/store/pgtest"
)

// TestCampaignTermsAndFencing: on both backends, the first campaign takes
// term 1, a second holder follows while the lease runs, renewals keep the
// term, and once the lease expires on the database's clock the other
// holder takes term 2; from then on the first holder's fenced batches fail
// with ErrFenced and write nothing, while the same batch unfenced (the
// deliberate mutation) would have gone through. Resign hands over at once.
func TestCampaignTermsAndFencing(t *testing.T) { pgtest.Each(t, testCampaignTermsAndFencing) }

func testCampaignTermsAndFencing(t *testing.T, dsn string) {
	ctx := context.Background()
	a, b := openDSN(t, dsn), openDSN(t, dsn)
	// A lease far longer than any step of the test, so a loaded machine
	// cannot let one lapse where the test does not mean it to; a's lease
	// is made to lapse on purpose below, by a renewal with the shortest ttl.
	const ttl = time.Minute
	la, err := a.Campaign(ctx, "a", "http://a", ttl)
	if err != nil || !la.Leader || la.Term != 1 || la.Holder != "a" {
		t.Fatalf("first campaign: %+v %v", la, err)
	}
	lb, err := b.Campaign(ctx, "b", "http://b", ttl)
	if err != nil || lb.Leader || lb.Term != 1 || lb.Holder != "a" || lb.URL != "http://a" {
		t.Fatalf("second holder while a leads: %+v %v", lb, err)
	}
	if la, err = a.Campaign(ctx, "a", "http://a", ttl); err != nil || !la.Leader || la.Term != 1 {
		t.Fatalf("renewal: %+v %v", la, err)
	}
	if err := a.Apply(ctx, &Batch{Events: []Event{{At: time.Now(), Kind: "x", Detail: "term 1"}}, Fence: &Fence{Holder: "a", Term: 1}}); err != nil {
		t.Fatalf("leader's fenced write: %v", err)
	}
	if err := b.Apply(ctx, &Batch{Events: []Event{{At: time.Now(), Kind: "x"}}, Fence: &Fence{Holder: "b", Term: 1}}); !errors.Is(err, ErrFenced) {
		t.Fatalf("follower's fenced write: %v", err)
	}
	// b takes over once the lease has expired on the database's clock.
	if la, err = a.Campaign(ctx, "a", "http://a", time.Millisecond); err != nil || !la.Leader || la.Term != 1 {
		t.Fatalf("renewal with the shortest ttl: %+v %v", la, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		lb, err = b.Campaign(ctx, "b", "http://b", ttl)
		if err != nil {
			t.Fatal(err)
		}
		if lb.Leader {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("b never took the lease: %+v", lb)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if lb.Term != 2 || lb.Holder != "b" {
		t.Fatalf("takeover: %+v", lb)
	}
	stale := &Batch{Plan: &Plan{Generation: 99, TotalShards: 4}, Fence: &Fence{Holder: "a", Term: 1}}
	if err := a.Apply(ctx, stale); !errors.Is(err, ErrFenced) {
		t.Fatalf("deposed leader's write: %v", err)
	}
	if p, ok, _ := a.LoadPlan(ctx); ok && p.Generation == 99 {
		t.Fatal("a fenced-off plan was written")
	}
	if la, err = a.Campaign(ctx, "a", "http://a", ttl); err != nil || la.Leader || la.Term != 2 {
		t.Fatalf("deposed leader campaigns: %+v %v", la, err)
	}
	// The mutation: without its fence the deposed leader's write lands,
	// so the check above is what stops it.
	stale.Fence = nil
	if err := a.Apply(ctx, stale); err != nil {
		t.Fatal(err)
	}
	if p, _, _ := a.LoadPlan(ctx); p.Generation != 99 {
		t.Fatalf("unfenced write did not land: %+v", p)
	}
	if err := b.Resign(ctx, "b", 2); err != nil {
		t.Fatal(err)
	}
	if la, err = a.Campaign(ctx, "a", "http://a", ttl); err != nil || !la.Leader || la.Term != 3 {
		t.Fatalf("after resignation: %+v %v", la, err)
	}
	if err := b.Resign(ctx, "b", 2); err != nil {
		t.Fatal(err)
	}
	if la, err = a.Campaign(ctx, "a", "http://a", ttl); !la.Leader || la.Term != 3 {
		t.Fatalf("a stale resignation moved the lease: %+v %v", la, err)
	}
}

// TestConcurrentCampaignsOneLeader: many holders campaigning at once on
// one expired lease produce exactly one leader per term.
func TestConcurrentCampaignsOneLeader(t *testing.T) { pgtest.Each(t, testConcurrentCampaignsOneLeader) }

func testConcurrentCampaignsOneLeader(t *testing.T, dsn string) {
	ctx := context.Background()
	stores := []*Store{openDSN(t, dsn), openDSN(t, dsn), openDSN(t, dsn)}
	type res struct {
		l   Leadership
		err error
	}
	out := make(chan res, 12)
	for i := range 12 {
		go func() {
			l, err := stores[i%3].Campaign(ctx, string(rune('a'+i)), "", time.Minute)
			out <- res{l, err}
		}()
	}
	leaders := 0
	for range 12 {
		r := <-out
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.l.Leader {
			leaders++
		}
		if r.l.Term != 1 {
			t.Fatalf("term %d", r.l.Term)
		}
	}
	if leaders != 1 {
		t.Fatalf("%d leaders of term 1", leaders)
	}
}

// TestGrantSpacingOnDatabaseClock: a second grant of one bucket within
// GrantSpacing fails with ErrGrantSpacing and writes nothing, another
// bucket is free, and without the check (spacing 0, the mutation) the
// same too-early grant is accepted. Under a fence, only a grant of
// another term (or unfenced) in the window refuses.
func TestGrantSpacingOnDatabaseClock(t *testing.T) { pgtest.Each(t, testGrantSpacingOnDatabaseClock) }

func testGrantSpacingOnDatabaseClock(t *testing.T, dsn string) {
	ctx := context.Background()
	s := openDSN(t, dsn)
	if err := s.CreateNode(ctx, "n", []byte{1}, time.Now()); err != nil {
		t.Fatal(err)
	}
	grant := func(bucket, shard uint32, spacing time.Duration) error {
		return testGrant(ctx, s, bucket, shard, spacing, nil, time.Now())
	}
	if err := grant(0, 0, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := grant(0, 16, time.Minute); !errors.Is(err, ErrGrantSpacing) {
		t.Fatalf("second grant in the window: %v", err)
	}
	if g, _ := s.BucketGrants(ctx); len(g) != 1 || g[0].ShardID != 0 {
		t.Fatalf("grants after the refusal: %+v", g)
	}
	if err := grant(1, 1, time.Minute); err != nil {
		t.Fatalf("other bucket: %v", err)
	}
	if err := grant(0, 32, 0); err != nil {
		t.Fatalf("unchecked grant: %v", err)
	}
	// Under a leader's fence: its own earlier grant does not count (it
	// spaces those in memory), another term's does.
	if _, err := s.Campaign(ctx, "L", "", time.Minute); err != nil {
		t.Fatal(err)
	}
	fenced := func(bucket uint32, term uint64) error {
		return testGrant(ctx, s, bucket, bucket, time.Minute, &Fence{Holder: "L", Term: term}, time.Now())
	}
	if err := fenced(0, 1); !errors.Is(err, ErrGrantSpacing) {
		t.Fatalf("grant after an unfenced one in the window: %v", err)
	}
	if err := fenced(2, 1); err != nil {
		t.Fatal(err)
	}
	if err := fenced(2, 1); err != nil {
		t.Fatalf("same term's second grant: %v", err)
	}
	if _, err := s.DB().Exec(s.q(`UPDATE identify_buckets SET grant_term = 7 WHERE bucket = 2`)); err != nil {
		t.Fatal(err)
	}
	if err := fenced(2, 1); !errors.Is(err, ErrGrantSpacing) {
		t.Fatalf("grant after another term's in the window: %v", err)
	}
}

// TestReplicasHeartbeat: heartbeats list replicas by ID with their role
// and term, a stale one drops out of a maxAge listing, and a deleted one
// is gone.
func TestReplicasHeartbeat(t *testing.T) { pgtest.Each(t, testReplicasHeartbeat) }

func testReplicasHeartbeat(t *testing.T, dsn string) {
	ctx := context.Background()
	s := openDSN(t, dsn)
	start := time.Now()
	nodeURLs := map[string]string{"boot-http": "http://10.0.0.2:8080", "boot-https": "https://10.0.0.2:8443"}
	pin := strings.Repeat("3f", 32)
	for _, r := range []Replica{{ID: "r2", URL: "http://b", NodeURLs: nodeURLs, TLSPin: pin, Role: "follower", Term: 3, StartedAt: start},
		{ID: "r1", URL: "http://a", Role: "leader", Term: 3, StartedAt: start}} {
		if err := s.Heartbeat(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	rs, err := s.Replicas(ctx, time.Minute)
	if err != nil || len(rs) != 2 || rs[0].ID != "r1" || rs[0].Role != "leader" || rs[1].URL != "http://b" || rs[0].Term != 3 {
		t.Fatalf("replicas: %+v %v", rs, err)
	}
	if !maps.Equal(rs[1].NodeURLs, nodeURLs) || rs[0].NodeURLs != nil {
		t.Fatalf("node URLs: %v and %v, want %v and none", rs[1].NodeURLs, rs[0].NodeURLs, nodeURLs)
	}
	if rs[1].TLSPin != pin || rs[0].TLSPin != "" {
		t.Fatalf("TLS pins: %q and %q, want %q and none", rs[1].TLSPin, rs[0].TLSPin, pin)
	}
	if _, err := s.DB().Exec(s.q(`UPDATE replicas SET heartbeat_at = heartbeat_at - 600000 WHERE id = ?`), "r2"); err != nil {
		t.Fatal(err)
	}
	if rs, _ = s.Replicas(ctx, time.Minute); len(rs) != 1 || rs[0].ID != "r1" {
		t.Fatalf("fresh replicas: %+v", rs)
	}
	if rs, _ = s.Replicas(ctx, 0); len(rs) != 2 || rs[1].Age < 9*time.Minute {
		t.Fatalf("all replicas: %+v", rs)
	}
	if err := s.DeleteReplica(ctx, "r1"); err != nil {
		t.Fatal(err)
	}
	if rs, _ = s.Replicas(ctx, 0); len(rs) != 1 {
		t.Fatalf("after delete: %+v", rs)
	}
	if err := s.Heartbeat(ctx, Replica{}); err == nil {
		t.Fatal("heartbeat without an id accepted")
	}
}

// TestHandoffsAndRestartsStored: a batch's hand-offs and restart requests
// replace the stored ones, a batch without them keeps them, and deleting a
// node removes its rows.
func TestHandoffsAndRestartsStored(t *testing.T) { pgtest.Each(t, testHandoffsAndRestartsStored) }

func testHandoffsAndRestartsStored(t *testing.T, dsn string) {
	ctx := context.Background()
	s := openDSN(t, dsn)
	for _, id := range []string{"a", "b"} {
		if err := s.CreateNode(ctx, id, []byte{1}, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	at := time.UnixMilli(1_700_000_000_000).UTC()
	hs := []Handoff{{ShardID: 3, From: "a", SessionID: "s3", Seq: 42, ResumeURL: "wss://g/?v=10", OfferedAt: at},
		{ShardID: 1, From: "b", SessionID: "s1", Seq: 7, ResumeURL: "wss://g/?v=10", OfferedAt: at}}
	if err := s.Apply(ctx, &Batch{Handoffs: &hs, Restarts: map[string]string{"a": "3,5-6"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(ctx, &Batch{Events: []Event{{At: at, Kind: "x"}}}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Handoffs(ctx)
	if err != nil || len(got) != 2 || got[0] != hs[1] || got[1] != hs[0] {
		t.Fatalf("hand-offs: %+v %v", got, err)
	}
	rs, err := s.RestartRequests(ctx)
	if err != nil || len(rs) != 1 || rs["a"] != "3,5-6" {
		t.Fatalf("restarts: %v %v", rs, err)
	}
	one := hs[:1]
	if err := s.Apply(ctx, &Batch{Handoffs: &one, Restarts: map[string]string{}}); err != nil {
		t.Fatal(err)
	}
	if got, _ = s.Handoffs(ctx); len(got) != 1 || got[0].ShardID != 3 {
		t.Fatalf("replaced hand-offs: %+v", got)
	}
	if rs, _ = s.RestartRequests(ctx); len(rs) != 0 {
		t.Fatalf("replaced restarts: %v", rs)
	}
	if err := s.DeleteNode(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if got, _ = s.Handoffs(ctx); len(got) != 0 {
		t.Fatalf("hand-offs of a deleted node: %+v", got)
	}
}

// TestDashboardSessionsStored: a session created through one handle is
// found through another, is gone after DeleteSession, an expired one is
// pruned by the next creation, and the table keeps at most
// maxDashboardSessions rows.
func TestDashboardSessionsStored(t *testing.T) { pgtest.Each(t, testDashboardSessionsStored) }

func testDashboardSessionsStored(t *testing.T, dsn string) {
	ctx := context.Background()
	a, b := openDSN(t, dsn), openDSN(t, dsn)
	exp := time.UnixMilli(time.Now().Add(time.Hour).UnixMilli()).UTC()
	if err := a.CreateSession(ctx, []byte("h1"), "csrf1", exp); err != nil {
		t.Fatal(err)
	}
	if csrf, e, err := b.Session(ctx, []byte("h1")); err != nil || csrf != "csrf1" || !e.Equal(exp) {
		t.Fatalf("session from the other handle: %q %v %v", csrf, e, err)
	}
	if err := b.DeleteSession(ctx, []byte("h1")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Session(ctx, []byte("h1")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleted session: %v", err)
	}
	if err := a.CreateSession(ctx, []byte("old"), "x", time.Now().Add(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := a.CreateSession(ctx, []byte("new"), "y", exp); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Session(ctx, []byte("old")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("expired session kept: %v", err)
	}
	for i := range maxDashboardSessions + 5 {
		if err := a.CreateSession(ctx, []byte{byte(i), byte(i >> 8), 'k'}, "z", exp.Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	a.DB().QueryRow(`SELECT COUNT(*) FROM dashboard_sessions`).Scan(&n)
	if n != maxDashboardSessions {
		t.Fatalf("%d stored sessions", n)
	}
}

// TestStalledTransactionFreesLeaderRow: a replica that stalls inside a
// transaction holding the leader row's lock (cut off from the database
// mid-transaction, its socket still open on the server's side) does not
// keep the other replicas from taking over: the server ends the idle
// session after pgIdleInTransaction and another replica's campaign takes
// the expired lease. PostgreSQL only (SQLite has one process). Mutation:
// without the session's idle_in_transaction_session_timeout the campaign
// waits for the lock until its one-minute deadline and the test fails.
func TestStalledTransactionFreesLeaderRow(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DB(t)
	a, b := openDSN(t, dsn), openDSN(t, dsn)
	if l, err := a.Campaign(ctx, "a", "http://a", time.Second); err != nil || !l.Leader {
		t.Fatalf("a's campaign: %+v %v", l, err)
	}
	tx, err := a.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `SELECT term FROM ha_leader WHERE id = 1 FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	// a now sits in its transaction, as a partitioned replica would.
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	l, err := b.Campaign(cctx, "b", "http://b", time.Second)
	if err != nil || !l.Leader || l.Term != 2 {
		t.Fatalf("b's campaign while a stalls in a transaction: %+v %v", l, err)
	}
	if _, err := tx.ExecContext(ctx, `SELECT 1`); err == nil {
		t.Fatal("the stalled session survived")
	}
}

func TestInitSettingFirstWins(t *testing.T) { pgtest.Each(t, testInitSettingFirstWins) }

// testInitSettingFirstWins: replicas starting at once each offer their
// own forwarding key (cmd/dpxe); all must end up with the one stored.
func testInitSettingFirstWins(t *testing.T, dsn string) {
	ctx := context.Background()
	const n = 6
	stores := make([]*Store, n)
	for i := range stores {
		stores[i] = openDSN(t, dsn)
	}
	got := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = stores[i].InitSetting(ctx, "k", fmt.Sprintf("v%d", i))
		}()
	}
	wg.Wait()
	for i := range got {
		if errs[i] != nil || got[i] != got[0] || !strings.HasPrefix(got[0], "v") {
			t.Fatalf("InitSetting answers %q (errors %v): want one value for all", got, errs)
		}
	}
	if v, err := stores[0].InitSetting(ctx, "k", "later"); err != nil || v != got[0] {
		t.Fatalf("a later InitSetting = %q, %v; want the stored %q", v, err, got[0])
	}
}
