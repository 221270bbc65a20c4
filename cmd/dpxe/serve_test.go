package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
)

// e2eDeadline bounds every wait of the end-to-end test.
const e2eDeadline = 30 * time.Second

// buildDpxe compiles this command into dir; ldflags, if any, are passed
// to go build (the replica tests' mutations).
func buildDpxe(dir string, ldflags ...string) (string, error) {
	bin := filepath.Join(dir, "dpxe")
	args := []string{"build", "-o", bin}
	if len(ldflags) > 0 {
		args = append(args, "-ldflags", strings.Join(ldflags, " "))
	}
	out, err := exec.Command("go", append(args, ".")...).CombinedOutput()
	if err != nil {
		return "", errors.New(string(out))
	}
	return bin, nil
}

// serveProc is a running `dpxe serve`.
type serveProc struct {
	cmd   *exec.Cmd
	url   string
	logMu sync.Mutex
	log   bytes.Buffer
	done  chan error
}

var listenRE = regexp.MustCompile(`msg=listening addr=(\d+\.\d+\.\d+\.\d+:\d+)`)

func startServe(t testing.TB, bin string, args ...string) *serveProc {
	t.Helper()
	p := &serveProc{cmd: exec.Command(bin, append([]string{"serve", "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0"}, args...)...), done: make(chan error, 1)}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			p.logMu.Lock()
			p.log.WriteString(line + "\n")
			p.logMu.Unlock()
			if m := listenRE.FindStringSubmatch(line); m != nil {
				addr <- m[1]
			}
		}
		p.done <- p.cmd.Wait()
	}()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			p.cmd.Process.Kill()
		}
	})
	select {
	case a := <-addr:
		p.url = "http://" + a
	case err := <-p.done:
		t.Fatalf("dpxe serve exited early: %v\n%s", err, p.logs())
	case <-time.After(e2eDeadline):
		t.Fatalf("dpxe serve did not report its address:\n%s", p.logs())
	}
	return p
}

func (p *serveProc) logs() string {
	p.logMu.Lock()
	defer p.logMu.Unlock()
	return p.log.String()
}

// stop sends SIGTERM and waits for a clean exit.
func (p *serveProc) stop(t testing.TB) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		if err != nil {
			t.Fatalf("dpxe serve exit after SIGTERM: %v\n%s", err, p.logs())
		}
	case <-time.After(e2eDeadline):
		t.Fatalf("dpxe serve ignored SIGTERM:\n%s", p.logs())
	}
	if !strings.Contains(p.logs(), "msg=stopped") {
		t.Fatalf("no clean stop in the log:\n%s", p.logs())
	}
}

func httpJSON(t *testing.T, method, url, token, body string, out any) int {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	c := &http.Client{Timeout: e2eDeadline}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s %s: %d %s", method, url, resp.StatusCode, data)
		}
	}
	return resp.StatusCode
}

// TestServeEndToEnd builds dpxe, runs `dpxe serve` on a random loopback
// port, adds a node with `dpxe nodes add`, drives check-in, Identify,
// routing and drain over HTTP, stops it with SIGTERM, restarts it on the
// same database and checks that the node, its lease and its assignment
// survived.
func TestServeEndToEnd(t *testing.T) {
	dir := t.TempDir()
	bin := sharedDpxe(t)
	db := filepath.Join(dir, "var", "dpxe.db")
	tokenFile := filepath.Join(dir, "var", "admin.token")
	cfgFile := filepath.Join(dir, "serve.json")
	// The node's lease must outlast the CLI calls and the restart below on
	// a loaded machine: the node renews it right before the restart, and
	// the test checks the restored plan well inside it.
	const lease = 60 * time.Second
	os.WriteFile(cfgFile, []byte(`{"total_shards": 8, "identify_window": "100ms", "lease": "`+lease.String()+`"}`), 0o644)
	args := []string{"--db", db, "--config", cfgFile, "--max-concurrency", "2"}
	p := startServe(t, bin, args...)
	if !strings.Contains(p.logs(), "admin token created") || !strings.Contains(p.logs(), tokenFile) {
		t.Fatalf("log does not name the admin token file:\n%s", p.logs())
	}
	fi, err := os.Stat(tokenFile)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("admin token file: %v %v", fi, err)
	}
	tok, _ := os.ReadFile(tokenFile)
	admin := strings.TrimSpace(string(tok))

	out, err := exec.Command(bin, "nodes", "--server", p.url, "--token-file", tokenFile, "add", "e2e-node.1").CombinedOutput()
	if err != nil {
		t.Fatalf("dpxe nodes add: %v\n%s", err, out)
	}
	lines := strings.Split(string(out), "\n")
	cred := strings.TrimSpace(lines[1])
	if appliance.ValidateCredential(cred) != nil {
		t.Fatalf("dpxe nodes add printed %q", out)
	}
	if strings.Contains(p.logs(), cred) || strings.Contains(p.logs(), admin) {
		t.Fatal("a secret appeared in the server log")
	}

	// Check in as a node does (acknowledging the last generation it got),
	// again after next_checkin_ms until the plan gives it its whole range:
	// a rebalance may be held back by its rate limit.
	var r appliance.CheckinResponse
	checkinUntilRange := func(what string) {
		t.Helper()
		for end := time.Now().Add(e2eDeadline); ; {
			body := `{"node_id":"e2e-node.1","capacity":8,"generation":` + jsonNum(r.Generation) + `}`
			code := httpJSON(t, "POST", p.url+"/v1/checkin", cred, body, &r)
			if code != 200 || r.TotalShards != 8 || r.MaxConcurrency != 2 || r.LeaseSeconds != uint32(lease/time.Second) {
				t.Fatalf("%s: %d %+v", what, code, r)
			}
			if r.RangeCount == 8 && len(r.Pending) == 0 {
				return
			}
			if time.Now().After(end) {
				t.Fatalf("%s: no whole range after %v of check-ins: %+v", what, e2eDeadline, r)
			}
			time.Sleep(time.Duration(r.NextCheckinMS) * time.Millisecond)
		}
	}
	checkinUntilRange("check-in")
	var e struct{ Error, Field string }
	if code := httpJSON(t, "POST", p.url+"/v1/checkin", cred, `{"node_id":"e2e-node.1","capacity":8,"colour":"red"}`, &e); code != 400 || e.Field != "colour" {
		t.Fatalf("unknown field: %d %+v", code, e)
	}
	var ir appliance.IdentifyResponse
	for end := time.Now().Add(e2eDeadline); !ir.Granted && time.Now().Before(end); {
		httpJSON(t, "POST", p.url+"/v1/identify", cred, `{"node_id":"e2e-node.1","shard_id":1}`, &ir)
	}
	if !ir.Granted || ir.Bucket != 1 {
		t.Fatalf("identify: %+v", ir)
	}
	var route struct {
		ShardID uint32 `json:"shard_id"`
		NodeID  string `json:"node_id"`
	}
	if code := httpJSON(t, "GET", p.url+"/v1/route?guild_id=41771983423143937", admin, "", &route); code != 200 ||
		route.ShardID != appliance.ShardForGuild(41771983423143937, 8) || route.NodeID != "e2e-node.1" {
		t.Fatalf("route: %d %+v", code, route)
	}
	list, err := exec.Command(bin, "nodes", "--server", p.url, "--token-file", tokenFile).CombinedOutput()
	if err != nil || !strings.Contains(string(list), "e2e-node.1") || !strings.Contains(string(list), "0-7") {
		t.Fatalf("dpxe nodes: %v\n%s", err, list)
	}
	// The operator commands, flags after the argument as operators type them.
	cli := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(bin, append(args, "--server", p.url, "--token-file", tokenFile)...).CombinedOutput()
		if err != nil {
			t.Fatalf("dpxe %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	if out := cli("route", "41771983423143937"); !strings.Contains(out, "e2e-node.1") ||
		!strings.Contains(out, fmt.Sprintf("%d of 8", appliance.ShardForGuild(41771983423143937, 8))) {
		t.Fatalf("dpxe route:\n%s", out)
	}
	var rj struct {
		ShardID uint32 `json:"shard_id"`
		NodeID  string `json:"node_id"`
	}
	if err := json.Unmarshal([]byte(cli("route", "41771983423143937", "--json")), &rj); err != nil || rj.NodeID != "e2e-node.1" {
		t.Fatalf("dpxe route --json: %v %+v", err, rj)
	}
	for _, bad := range []string{"12x", "-5", "18446744073709551616"} {
		args := []string{"route", "--server", p.url, "--token-file", tokenFile, "--", bad}
		if out, err := exec.Command(bin, args...).CombinedOutput(); err == nil || !strings.Contains(string(out), "guild ID") || strings.Contains(string(out), "want one") {
			t.Fatalf("dpxe route %s was accepted or unclear: %v\n%s", bad, err, out)
		}
	}
	// The only node: draining it strands its shards. The preview says so,
	// the drain is refused without --force and changes nothing.
	if out := cli("drain", "e2e-node.1", "--dry-run"); !strings.Contains(out, "shards 0-7") || !strings.Contains(out, "NO OWNER") {
		t.Fatalf("dpxe drain --dry-run:\n%s", out)
	}
	refused, err := exec.Command(bin, "drain", "e2e-node.1", "--server", p.url, "--token-file", tokenFile).CombinedOutput()
	if err == nil || !strings.Contains(string(refused), "refused: 8 shards would have no owner") || !strings.Contains(string(refused), "--force") {
		t.Fatalf("dpxe drain of the only node was not refused: %v\n%s", err, refused)
	}
	if out := cli("drain", "e2e-node.1", "--force"); !strings.Contains(out, "e2e-node.1 is draining") || !strings.Contains(out, "NO OWNER") {
		t.Fatalf("dpxe drain --force:\n%s", out)
	}
	var nj struct {
		Nodes []struct {
			ID       string `json:"id"`
			Draining bool   `json:"draining"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(cli("nodes", "--json")), &nj); err != nil || len(nj.Nodes) != 1 || !nj.Nodes[0].Draining {
		t.Fatalf("dpxe nodes --json after drain: %v %+v", err, nj)
	}
	if out := cli("undrain", "e2e-node.1", "--json"); !strings.Contains(out, `"draining": false`) {
		t.Fatalf("dpxe undrain --json:\n%s", out)
	}
	// The node takes its range back after the undrain and renews its
	// lease, as it would, just before the restart.
	checkinUntilRange("check-in after the undrain")
	renewedAt := time.Now()
	p.stop(t)

	// Restart on the same file: same token, the node restored live with
	// its assignment, and no new admin token.
	p = startServe(t, bin, args...)
	if strings.Contains(p.logs(), "admin token created") {
		t.Fatal("restart created a new admin token")
	}
	var plan struct {
		Generation uint64 `json:"generation"`
		Owned      uint32 `json:"owned"`
		Grace      string `json:"restart_grace_until"`
	}
	if code := httpJSON(t, "GET", p.url+"/v1/plan", admin, "", &plan); code != 200 || plan.Owned != 8 || plan.Grace == "" || plan.Generation != r.Generation {
		if took := time.Since(renewedAt); took >= lease {
			t.Fatalf("plan after restart: %d %+v: the restart took %v, longer than the %v lease (an overloaded machine, not a controller fault)", code, plan, took, lease)
		}
		t.Fatalf("plan after restart: %d %+v", code, plan)
	}
	var r2 appliance.CheckinResponse
	body := `{"node_id":"e2e-node.1","capacity":8,"generation":` + jsonNum(r.Generation) + `}`
	if code := httpJSON(t, "POST", p.url+"/v1/checkin", cred, body, &r2); code != 200 || r2.Generation != r.Generation || r2.RangeCount != 8 || len(r2.Pending) != 0 {
		t.Fatalf("check-in after restart: %d %+v", code, r2)
	}
	if code := httpJSON(t, "GET", p.url+"/v1/nodes", "wrong-token", "", nil); code != 401 {
		t.Fatalf("wrong admin token: %d", code)
	}
	p.stop(t)
}

func jsonNum(v uint64) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestServeFlagsAndConfig(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	os.WriteFile(good, []byte(`{"total_shards": 64, "lease": "20s", "listen": "127.0.0.1:9000"}`), 0o644)
	cfg, err := parseServeFlags([]string{"--config", good, "--total-shards", "32"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.TotalShards != 32 || time.Duration(cfg.Lease) != 20*time.Second || cfg.Listen != "127.0.0.1:9000" ||
		cfg.DB != defaultDBPath || cfg.AdminTokenFile != filepath.Join("var", adminTokenName) {
		t.Fatalf("config %+v", cfg)
	}
	cases := map[string]string{
		"unknown.json":  `{"total_shards": 8, "shards": 3}`,
		"badlease.json": `{"lease": 30}`,
	}
	for name, body := range cases {
		f := filepath.Join(dir, name)
		os.WriteFile(f, []byte(body), 0o644)
		if _, err := parseServeFlags([]string{"--config", f}); !errors.Is(err, errUsage) {
			t.Errorf("%s accepted: %v", name, err)
		}
	}
	if _, err := parseServeFlags([]string{"extra"}); !errors.Is(err, errUsage) {
		t.Errorf("stray argument accepted: %v", err)
	}
	if _, err := parseServeFlags([]string{"--total-shards", "0"}); !errors.Is(err, errUsage) {
		t.Errorf("zero shards accepted: %v", err)
	}
}

// TestServeFilesBesideAURL: with a PostgreSQL --db, the files serve keeps
// by default (admin and metrics tokens, the broker's store) go under the
// default data directory, never under a path made of the URL (which would
// put its password in a folder name in the working directory).
func TestServeFilesBesideAURL(t *testing.T) {
	cfg, err := parseServeFlags([]string{"--db", "postgres://dpxe:pw-in-url@127.0.0.1:5432/dpxe"})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(defaultDBPath)
	for what, path := range map[string]string{"admin token": cfg.AdminTokenFile,
		"metrics token": cfg.MetricsTokenFile, "nats store": cfg.NATSStore} {
		if filepath.Dir(path) != dir || strings.Contains(path, "pw-in-url") {
			t.Errorf("%s at %q, want it in %s", what, path, dir)
		}
	}
	cfg, err = parseServeFlags([]string{"--db", filepath.Join("some", "where", "dpxe.db")})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.AdminTokenFile != filepath.Join("some", "where", adminTokenName) || cfg.NATSStore != filepath.Join("some", "where", "nats") {
		t.Errorf("beside a SQLite file: %q, %q", cfg.AdminTokenFile, cfg.NATSStore)
	}
}
