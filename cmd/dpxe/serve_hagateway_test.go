package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/store"
	"github.com/discord-pxe/dpxe/tools/gatewayemu"
)

// TestReplicasGatewayRefresh: two `dpxe serve` replicas on one PostgreSQL
// both fetch GET /gateway/bot from the Gateway emulator (--gateway-refresh
// 10s, the least allowed): the follower takes the answer without writing
// it, so no replica logs a failed fetch (before, a follower's fetch failed
// with "does not lead", was logged and retried every few seconds), and
// the leader records Discord's session budget (77, not the default). The
// test waits for a third fetch: with two replicas fetching every 10 s,
// that is the first refresh, well after both first answers were applied
// (a failing follower fetches again after 2 s).
func TestReplicasGatewayRefresh(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL and two dpxe serve replicas")
	}
	_, dsn := haDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const botToken = "MTIz.emulated-bot.TOKEN_ha"
	emu, err := gatewayemu.Start(ctx, "127.0.0.1:0", gatewayemu.Options{Token: botToken, Shards: 4, MaxConcurrency: 2, SessionStarts: 77})
	if err != nil {
		t.Fatal(err)
	}
	defer emu.Close()
	var fetches atomic.Int64
	rest := emu.RESTHandler()
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/gateway/bot") {
			fetches.Add(1)
		}
		rest.ServeHTTP(w, r)
	}))
	defer api.Close()
	dir := t.TempDir()
	tokFile := filepath.Join(dir, "bot.token")
	if err := os.WriteFile(tokFile, []byte(botToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := sharedDpxe(t)
	var procs [2]*serveProc
	for i := range procs {
		d := filepath.Join(dir, fmt.Sprintf("r%d", i))
		procs[i] = startServe(t, bin, "--db", dsn, "--no-dashboard", "--admin-token-file", filepath.Join(dir, "admin.token"),
			"--metrics-token-file", filepath.Join(d, "metrics.token"), "--nats-store", filepath.Join(d, "nats"),
			"--replica-id", fmt.Sprintf("r%d", i), "--total-shards", "4", "--leader-lease", "3s",
			"--gateway-api", api.URL+"/api/v10", "--bot-token-file", tokFile, "--gateway-refresh", "10s")
		defer procs[i].stop(t)
	}
	logs := func() string { return procs[0].logs() + procs[1].logs() }
	for end := time.Now().Add(60 * time.Second); fetches.Load() < 3; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%d GET /gateway/bot in 60 s, want 3\n%s", fetches.Load(), logs())
		}
	}
	for i, p := range procs {
		for _, bad := range []string{"GET /gateway/bot failed", "does not lead", "level=ERROR"} {
			if strings.Contains(p.logs(), bad) {
				t.Errorf("replica r%d logged %q:\n%s", i, bad, grepLog(p.logs(), bad))
			}
		}
	}
	st, err := store.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	b, ok, err := st.LoadBudget(ctx)
	if err != nil || !ok || b.Total != 77 {
		t.Fatalf("stored budget %+v %v %v, want Discord's total 77", b, ok, err)
	}
	t.Logf("%d fetches; stored budget %d of %d", fetches.Load(), b.Remaining, b.Total)
}

// grepLog returns the lines of s that contain sub.
func grepLog(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
