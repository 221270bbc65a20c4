package api

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/metrics/promtest"
)

// TestRealPrometheusScrapes starts Debian's Prometheus on loopback,
// scraping the API's GET /metrics with the metrics token (job dpxe) and
// without a token (job dpxe-noauth), and checks through Prometheus's query
// API that the controller's metrics arrived, that the job without the
// token is refused, and that a check-in shows up in the next scrapes.
func TestRealPrometheusScrapes(t *testing.T) {
	s := newHealthServer(t, controller.Config{TotalShards: 4, RebalanceEvery: -1})
	n := s.node("n1")
	n.checkin()
	n.checkin()
	tokFile := filepath.Join(t.TempDir(), "metrics.token")
	if err := os.WriteFile(tokFile, []byte(s.metrics+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	target := strings.TrimPrefix(s.url, "http://")
	prom := promtest.Start(t, promtest.Job{Name: "dpxe", Target: target, TokenFile: tokFile},
		promtest.Job{Name: "dpxe-noauth", Target: target})
	prom.WaitFor(t, promtest.Startup+10*promtest.ScrapeInterval, map[string]string{
		`dpxe_plan_total_shards{job="dpxe"}`: "4",
		`dpxe_fleet_ready{job="dpxe"}`:       "1",
		`up{job="dpxe-noauth"}`:              "0",
	})
	n.checkin()
	prom.WaitFor(t, 10*promtest.ScrapeInterval, map[string]string{
		`sum(dpxe_node_request_duration_seconds_count{job="dpxe",route="checkin",code="200"})`: "3",
	})
	checkGrafanaQueries(t, prom)
}

// grafanaDashboard is the shipped Grafana dashboard (docs/metrics.md).
const grafanaDashboard = "../../docs/grafana/dpxe-fleet.json"

// checkGrafanaQueries runs every query of the shipped Grafana dashboard
// (its variables replaced) against the real Prometheus: each must parse
// and evaluate, and each returns data except those that filter on "> 0".
func checkGrafanaQueries(t *testing.T, prom *promtest.Server) {
	t.Helper()
	b, err := os.ReadFile(grafanaDashboard)
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
		t.Fatalf("%s: %v (uid %q, %d panels)", grafanaDashboard, err, dash.UID, len(dash.Panels))
	}
	vars := strings.NewReplacer("$job", "dpxe", "$__rate_interval", "1m")
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			q := vars.Replace(tg.Expr)
			vals, err := prom.QueryAll(q)
			if err != nil {
				t.Errorf("panel %q: %v", p.Title, err)
				continue
			}
			if len(vals) == 0 && !strings.Contains(q, "> 0") {
				t.Errorf("panel %q: %s returns no data", p.Title, q)
			}
		}
	}
}
