package main

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/store"
	"github.com/discord-pxe/dpxe/fleet/store/pgtest"
)

// TestServeOnPostgres runs `dpxe serve --db postgres://...` against a
// PostgreSQL server this test starts: a node added through the CLI checks
// in until it holds its range and gets an Identify grant; after a restart
// on the same database the plan and the node's assignment are still there;
// the rows are in PostgreSQL (read back through the store), and the password in the URL never reaches the log.
func TestServeOnPostgres(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("needs the go tool to build dpxe")
	}
	ctx := context.Background()
	srv, err := pgtest.Start(ctx)
	if err != nil {
		if errors.Is(err, pgtest.ErrNotInstalled) {
			t.Skipf("skipping: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Error(err)
		}
	})
	dsn, err := srv.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The server trusts loopback connections, so any password passes: it
	// is here to show that the log carries none.
	const secret = "pw-must-not-be-logged"
	dsnWithPassword := strings.Replace(dsn, "postgres://postgres@", "postgres://postgres:"+secret+"@", 1)

	dir := t.TempDir()
	bin := sharedDpxe(t)
	tokenFile := filepath.Join(dir, "admin.token")
	const lease = 60 * time.Second
	// Every file serve keeps goes to the test's directory (by default they
	// would go to ./var, TestServeFilesBesideAURL).
	args := []string{"--db", dsnWithPassword, "--admin-token-file", tokenFile,
		"--metrics-token-file", filepath.Join(dir, "metrics.token"), "--nats-store", filepath.Join(dir, "nats"), "--total-shards", "8",
		"--max-concurrency", "2", "--identify-window", "100ms", "--lease", lease.String()}
	p := startServe(t, bin, args...)
	if !strings.Contains(p.logs(), `db="postgres://postgres:xxxxx@127.0.0.1:`) {
		t.Fatalf("the log does not name the database without its password:\n%s", p.logs())
	}

	out, err := exec.Command(bin, "nodes", "--server", p.url, "--token-file", tokenFile, "add", "pg-node.1").CombinedOutput()
	if err != nil {
		t.Fatalf("dpxe nodes add: %v\n%s", err, out)
	}
	cred := strings.TrimSpace(strings.Split(string(out), "\n")[1])
	if appliance.ValidateCredential(cred) != nil {
		t.Fatalf("dpxe nodes add printed %q", out)
	}
	var r appliance.CheckinResponse
	for end := time.Now().Add(e2eDeadline); r.RangeCount != 8 || len(r.Pending) != 0; {
		body := `{"node_id":"pg-node.1","capacity":8,"generation":` + jsonNum(r.Generation) + `}`
		if code := httpJSON(t, "POST", p.url+"/v1/checkin", cred, body, &r); code != 200 || r.TotalShards != 8 {
			t.Fatalf("check-in: %d %+v", code, r)
		}
		if time.Now().After(end) {
			t.Fatalf("no whole range after %v of check-ins: %+v", e2eDeadline, r)
		}
		if r.RangeCount != 8 || len(r.Pending) != 0 {
			time.Sleep(time.Duration(r.NextCheckinMS) * time.Millisecond)
		}
	}
	var ir appliance.IdentifyResponse
	for end := time.Now().Add(e2eDeadline); !ir.Granted && time.Now().Before(end); {
		httpJSON(t, "POST", p.url+"/v1/identify", cred, `{"node_id":"pg-node.1","shard_id":1}`, &ir)
	}
	if !ir.Granted || ir.Bucket != 1 {
		t.Fatalf("identify: %+v", ir)
	}
	p.stop(t)

	// A restart on the same database keeps the plan and the assignment.
	p = startServe(t, bin, args...)
	var r2 appliance.CheckinResponse
	body := `{"node_id":"pg-node.1","capacity":8,"generation":` + jsonNum(r.Generation) + `}`
	if code := httpJSON(t, "POST", p.url+"/v1/checkin", cred, body, &r2); code != 200 || r2.Generation != r.Generation ||
		r2.RangeCount != 8 || len(r2.Pending) != 0 {
		t.Fatalf("check-in after restart: %d %+v (before: %+v)", code, r2, r)
	}
	p.stop(t)
	if logs := p.logs(); strings.Contains(logs, secret) || strings.Contains(logs, cred) {
		t.Fatal("a secret appeared in the server log")
	}

	// The state is in PostgreSQL.
	st, err := store.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	n, err := st.Node(ctx, "pg-node.1")
	if err != nil || n.LastSeen.IsZero() || n.Held != "0-7" {
		t.Fatalf("node in PostgreSQL: %+v %v", n.NodeState, err)
	}
	grants, err := st.Events(ctx, 0, "identify_granted", 10)
	if err != nil || len(grants) != 1 || grants[0].ShardID == nil || *grants[0].ShardID != 1 {
		t.Fatalf("grant events in PostgreSQL: %+v %v", grants, err)
	}
	// On PostgreSQL serve is a replica: each start is recorded when it
	// takes the lead, under its term's fence, and never before.
	starts, err := st.Events(ctx, 0, "controller_start", 10)
	if err != nil || len(starts) != 2 {
		t.Fatalf("controller_start events in PostgreSQL: %+v %v, want one per start", starts, err)
	}
	for _, e := range starts {
		if !strings.HasPrefix(e.Detail, "leader of term ") {
			t.Errorf("controller_start %q was not written by a leader", e.Detail)
		}
	}
}
