// Package promtest runs a real Prometheus server for tests: Debian's
// prometheus binary on loopback, with a generated configuration scraping
// the targets a test gives, and a client for its query API. Tests skip
// when the binary is missing (tools/scripts/deps.sh test installs it).
package promtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/internal/freeport"
)

// ScrapeInterval is the scrape interval of the server; waits on it should
// be derived from it.
const ScrapeInterval = time.Second

// Startup is how long the server may take to start answering queries and
// make its first scrapes on a busy machine.
const Startup = 30 * time.Second

// Job is one scrape job.
type Job struct {
	Name   string
	Target string // host:port
	// TokenFile, when set, is sent as a bearer token (credentials_file).
	TokenFile string
}

// Server is a running Prometheus.
type Server struct {
	addr string
	log  string
}

// Start runs Prometheus scraping jobs every ScrapeInterval until the test
// ends. It skips the test when the prometheus binary is missing.
func Start(t testing.TB, jobs ...Job) *Server {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("prometheus not installed (tools/scripts/deps.sh test installs it)")
	}
	dir := t.TempDir()
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "global:\n  scrape_interval: %[1]s\n  scrape_timeout: %[1]s\nscrape_configs:\n", ScrapeInterval)
	for _, j := range jobs {
		fmt.Fprintf(&cfg, "  - job_name: %q\n", j.Name)
		if j.TokenFile != "" {
			fmt.Fprintf(&cfg, "    authorization:\n      type: Bearer\n      credentials_file: %q\n", j.TokenFile)
		}
		fmt.Fprintf(&cfg, "    static_configs:\n      - targets: [%q]\n", j.Target)
	}
	cfgFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgFile, []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &Server{addr: freeport.Addr(t), log: filepath.Join(dir, "prometheus.log")}
	logFile, err := os.Create(s.log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "--config.file="+cfgFile, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+s.addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		cmd.Wait()
		logFile.Close()
	})
	return s
}

// Log returns what the server logged so far.
func (s *Server) Log() string {
	b, _ := os.ReadFile(s.log)
	return string(b)
}

// Query asks the query API for an instant vector of at most one sample
// and returns its value ("" when the vector is empty).
func (s *Server) Query(q string) (string, error) {
	vals, err := s.QueryAll(q)
	switch {
	case err != nil:
		return "", err
	case len(vals) == 0:
		return "", nil
	case len(vals) > 1:
		return "", fmt.Errorf("query %s: %d series", q, len(vals))
	}
	return vals[0], nil
}

// QueryAll asks the query API for an instant vector and returns the value
// of each of its samples.
func (s *Server) QueryAll(q string) ([]string, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + s.addr + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		return nil, err
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
		return nil, err
	}
	if body.Status != "success" {
		return nil, fmt.Errorf("query %s: %s", q, body.Error)
	}
	vals := make([]string, 0, len(body.Data.Result))
	for _, r := range body.Data.Result {
		v, _ := r.Value[1].(string)
		vals = append(vals, v)
	}
	return vals, nil
}

// WaitFor polls the queries every quarter of ScrapeInterval until each
// answers its wanted value, and fails the test with the last answers and
// the server's log when that has not happened within wait.
func (s *Server) WaitFor(t testing.TB, wait time.Duration, want map[string]string) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		var bad []string
		for q, w := range want {
			got, err := s.Query(q)
			if err != nil || got != w {
				bad = append(bad, fmt.Sprintf("%s = %q (%v), want %q", q, got, err, w))
			}
		}
		if len(bad) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Prometheus answers after %v:\n%s\nprometheus log:\n%s", wait, strings.Join(bad, "\n"), s.Log())
		}
		time.Sleep(ScrapeInterval / 4) // the poll period, not a wait for an outcome
	}
}

// CheckDashboard runs the queries of a Grafana dashboard file (its $job
// variable set to job) that keep says to check against the server: each
// must parse and evaluate, and each returns data except those filtering
// on "> 0". It fails the test when keep leaves no query to check.
func CheckDashboard(t testing.TB, s *Server, file, job string, keep func(expr string) bool) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil || dash.UID == "" || len(dash.Panels) == 0 {
		t.Fatalf("%s: %v (uid %q, %d panels)", file, err, dash.UID, len(dash.Panels))
	}
	vars := strings.NewReplacer("$job", job, "$__rate_interval", "1m")
	checked := 0
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if !keep(tg.Expr) {
				continue
			}
			checked++
			q := vars.Replace(tg.Expr)
			vals, err := s.QueryAll(q)
			if err != nil {
				t.Errorf("panel %q: %v", p.Title, err)
				continue
			}
			if len(vals) == 0 && !strings.Contains(q, "> 0") {
				t.Errorf("panel %q: %s returns no data", p.Title, q)
			}
		}
	}
	if checked == 0 {
		t.Errorf("%s: no query checked", file)
	}
}

// Reads returns a CheckDashboard filter keeping the queries that read a
// metric whose name starts with one of prefixes (e.g. "dpxe_netboot_",
// which exist only when dpxe serve runs its netboot services).
func Reads(prefixes ...string) func(expr string) bool {
	return func(expr string) bool {
		for _, p := range prefixes {
			if strings.Contains(expr, p) {
				return true
			}
		}
		return false
	}
}
