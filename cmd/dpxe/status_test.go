package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/metrics"
	"github.com/discord-pxe/dpxe/fleet/metrics/promtest"
)

var metricsListenRE = regexp.MustCompile(`msg="metrics listening without authentication" part=metrics addr=(127\.0\.0\.1:\d+)`)

// TestStatusAndMetricsListener runs `dpxe serve` with --metrics-listen,
// checks who may read /metrics where, follows `dpxe status` (text and
// --json, with the read-only metrics token) from a fleet with no node to
// a ready one, and has a real Prometheus scrape the running server.
func TestStatusAndMetricsListener(t *testing.T) {
	dir := t.TempDir()
	bin := sharedDpxe(t)
	db := filepath.Join(dir, "var", "dpxe.db")
	p := startServe(t, bin, "--db", db, "--total-shards", "2", "--metrics-listen", "127.0.0.1:0", "--no-dashboard")
	defer p.stop(t)
	m := metricsListenRE.FindStringSubmatch(p.logs())
	if m == nil {
		t.Fatalf("no metrics listener in the log:\n%s", p.logs())
	}
	metricsURL := "http://" + m[1]
	admin, err := os.ReadFile(filepath.Join(dir, "var", adminTokenName))
	if err != nil {
		t.Fatal(err)
	}
	mtok, err := os.ReadFile(filepath.Join(dir, "var", metricsTokenName))
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(filepath.Join(dir, "var", metricsTokenName)); fi.Mode().Perm() != 0o600 {
		t.Fatalf("metrics token file mode %v", fi.Mode())
	}
	adminTok, metricsTok := strings.TrimSpace(string(admin)), strings.TrimSpace(string(mtok))

	for _, tc := range []struct {
		url, token string
		want       int
	}{
		{p.url + "/metrics", "", 401},
		{p.url + "/metrics", metricsTok, 200},
		{metricsURL + "/metrics", "", 200},
		{metricsURL + "/healthz", "", 200},
		{metricsURL + "/readyz", "", 503},
		{metricsURL + "/v1/nodes", adminTok, 404}, // the metrics listener serves nothing else
	} {
		if code := httpJSON(t, "GET", tc.url, tc.token, "", nil); code != tc.want {
			t.Errorf("GET %s: %d, want %d", tc.url, code, tc.want)
		}
	}

	tokFile := filepath.Join(dir, "var", metricsTokenName)
	status := func(extra ...string) (int, string) {
		t.Helper()
		cmd := exec.Command(bin, append([]string{"status", "--server", p.url, "--token-file", tokFile}, extra...)...)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		var ee *exec.ExitError
		switch {
		case err == nil:
			return 0, out.String()
		case errors.As(err, &ee):
			return ee.ExitCode(), out.String() + errOut.String()
		}
		t.Fatal(err)
		return 0, ""
	}
	code, out := status()
	if code != 1 || !strings.Contains(out, "fleet NOT READY: 0 of 2 shards ready on 0 live nodes") ||
		!regexp.MustCompile(`0-1\s+unowned\s+-`).MatchString(out) {
		t.Fatalf("status with no node: exit %d\n%s", code, out)
	}

	var added struct{ Credential string }
	if c := httpJSON(t, "POST", p.url+"/v1/nodes", adminTok, `{"node_id":"n1"}`, &added); c != 201 {
		t.Fatalf("add node: %d", c)
	}
	gen := uint64(0)
	var run []uint32
	deadline := time.Now().Add(e2eDeadline)
	for {
		var b strings.Builder
		fmt.Fprintf(&b, `{"node_id":"n1","capacity":2,"generation":%d,"shards":[`, gen)
		for i, s := range run {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"id":%d,"state":"READY","ping_ms":12.5}`, s)
		}
		b.WriteString("]}")
		var r appliance.CheckinResponse
		if c := httpJSON(t, "POST", p.url+"/v1/checkin", added.Credential, b.String(), &r); c != 200 {
			t.Fatalf("checkin: %d", c)
		}
		gen, run = r.Generation, r.Assigned
		if len(r.Pending) > 0 {
			t.Fatalf("pending with one node: %+v", r)
		}
		if code, _ := status(); code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready by the deadline")
		}
	}
	code, out = status()
	if code != 0 || !strings.Contains(out, "fleet READY: 2 of 2 shards ready on 1 live nodes") {
		t.Fatalf("status when ready: exit %d\n%s", code, out)
	}
	code, out = status("--json")
	var v metrics.Verdict
	if err := json.Unmarshal([]byte(out), &v); code != 0 || err != nil || !v.Ready || v.ReadyShards != 2 {
		t.Fatalf("status --json: exit %d %v\n%s", code, err, out)
	}
	// GET /readyz answers from a verdict up to a second old.
	for deadline := time.Now().Add(e2eDeadline); ; {
		code := httpJSON(t, "GET", metricsURL+"/readyz", "", "", nil)
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("readyz on the metrics listener when ready: %d", code)
		}
		time.Sleep(100 * time.Millisecond) // poll period
	}
	// A real Prometheus scrapes the running server: its metrics listener
	// without a token, its API listener with the metrics token.
	prom := promtest.Start(t,
		promtest.Job{Name: "dpxe-metrics-listen", Target: strings.TrimPrefix(metricsURL, "http://")},
		promtest.Job{Name: "dpxe-api", Target: strings.TrimPrefix(p.url, "http://"), TokenFile: tokFile})
	prom.WaitFor(t, promtest.Startup+10*promtest.ScrapeInterval, map[string]string{
		`dpxe_fleet_ready{job="dpxe-metrics-listen"}`: "1",
		`dpxe_nodes{job="dpxe-api",state="live"}`:     "1",
		`dpxe_shards{job="dpxe-api",state="ready"}`:   "2",
	})
	if strings.Contains(p.logs(), metricsTok) || strings.Contains(p.logs(), adminTok) {
		t.Fatal("a token is in the server log")
	}
	// Usage errors exit 2 before any request.
	if code, _ := status("extra"); code != 2 {
		t.Errorf("status with an argument: exit %d, want 2", code)
	}
}
