package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/controller"
)

// scrapeInterval is the test Prometheus's scrape interval; every wait of
// the test is derived from it.
const scrapeInterval = time.Second

// promStartup is how long Prometheus may take to start answering queries
// and make its first scrape on a busy machine.
const promStartup = 30 * time.Second

// TestRealPrometheusScrapes starts Debian's Prometheus on loopback,
// scraping the API's GET /metrics with the metrics token (job dpxe) and
// without a token (job dpxe-noauth), and checks through Prometheus's query
// API that the controller's metrics arrived and that the job without the
// token is refused.
func TestRealPrometheusScrapes(t *testing.T) {
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("prometheus not installed (tools/scripts/deps.sh test installs it)")
	}
	s := newHealthServer(t, controller.Config{TotalShards: 4, RebalanceEvery: -1})
	n := s.node("n1")
	n.checkin()
	n.checkin()

	dir := t.TempDir()
	tokFile := filepath.Join(dir, "metrics.token")
	if err := os.WriteFile(tokFile, []byte(s.metrics+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	target := strings.TrimPrefix(s.url, "http://")
	cfg := fmt.Sprintf(`global:
  scrape_interval: %[1]s
  scrape_timeout: %[1]s
scrape_configs:
  - job_name: dpxe
    authorization:
      type: Bearer
      credentials_file: %[2]s
    static_configs:
      - targets: ['%[3]s']
  - job_name: dpxe-noauth
    static_configs:
      - targets: ['%[3]s']
`, scrapeInterval, tokFile, target)
	cfgFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeLoopbackPort(t)
	ctx, cancel := context.WithCancel(context.Background())
	logFile, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, bin, "--config.file="+cfgFile, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		cmd.Wait()
		logFile.Close()
	})
	promLog := func() string {
		b, _ := os.ReadFile(logFile.Name())
		return string(b)
	}

	// Poll until both jobs were scraped: the deadline allows the start
	// and ten scrape intervals.
	deadline := time.Now().Add(promStartup + 10*scrapeInterval)
	var last string
	for {
		total, err1 := query(addr, `dpxe_plan_total_shards{job="dpxe"}`)
		ready, err2 := query(addr, `dpxe_fleet_ready{job="dpxe"}`)
		noauth, err3 := query(addr, `up{job="dpxe-noauth"}`)
		if err1 == nil && err2 == nil && err3 == nil && total == "4" && ready == "1" && noauth == "0" {
			break
		}
		last = fmt.Sprintf("dpxe_plan_total_shards=%q (%v), dpxe_fleet_ready=%q (%v), up{job=dpxe-noauth}=%q (%v)",
			total, err1, ready, err2, noauth, err3)
		if time.Now().After(deadline) {
			t.Fatalf("Prometheus did not get the metrics by the deadline: %s\nprometheus log:\n%s", last, promLog())
		}
		time.Sleep(scrapeInterval / 4) // poll period, not a wait for an outcome
	}
	// A check-in counted by the server shows up in the next scrapes.
	n.checkin()
	deadline = time.Now().Add(10 * scrapeInterval)
	for {
		v, err := query(addr, `sum(dpxe_node_request_duration_seconds_count{job="dpxe",route="checkin",code="200"})`)
		if err == nil && v == "3" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("check-in count %q (%v) after 10 scrape intervals, want 3", v, err)
		}
		time.Sleep(scrapeInterval / 4)
	}
}

// freeLoopbackPort returns a loopback address with a port that was free a
// moment ago (Prometheus cannot report the port it chose for :0).
func freeLoopbackPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// query asks Prometheus's HTTP API for an instant vector with one sample
// and returns its value ("" when the vector is empty).
func query(addr, q string) (string, error) {
	resp, err := http.Get("http://" + addr + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return "", err
	}
	if body.Status != "success" {
		return "", fmt.Errorf("query %s: %s", q, body.Error)
	}
	switch len(body.Data.Result) {
	case 0:
		return "", nil
	case 1:
		v, _ := body.Data.Result[0].Value[1].(string)
		return v, nil
	}
	return "", fmt.Errorf("query %s: %d series", q, len(body.Data.Result))
}
