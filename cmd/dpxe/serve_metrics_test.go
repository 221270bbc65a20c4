package main

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/discord-pxe/dpxe/fleet/metrics/promtest"
	"github.com/discord-pxe/dpxe/internal/freeport"
)

// TestMetricsNodeSeriesConfig: without --metrics-node-series the node
// series follow the node limit (nil), the flag and the config key set
// them on or off, the limit comes from its flag or key, and a negative
// limit is a usage error naming the key.
func TestMetricsNodeSeriesConfig(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "dpxe.db")
	cfg, err := parseServeFlags([]string{"--db", db})
	if err != nil || cfg.MetricsNodeSeries != nil || cfg.MetricsNodeSeriesLimit != 0 {
		t.Fatalf("defaults: %v %v %v", cfg.MetricsNodeSeries, cfg.MetricsNodeSeriesLimit, err)
	}
	cfg, err = parseServeFlags([]string{"--db", db, "--metrics-node-series=false", "--metrics-node-series-limit", "50"})
	if err != nil || cfg.MetricsNodeSeries == nil || *cfg.MetricsNodeSeries || cfg.MetricsNodeSeriesLimit != 50 {
		t.Fatalf("flags: %v %v %v", cfg.MetricsNodeSeries, cfg.MetricsNodeSeriesLimit, err)
	}
	file := filepath.Join(dir, "serve.json")
	if err := os.WriteFile(file, []byte(`{"db":"`+db+`","metrics_node_series":true,"metrics_node_series_limit":7}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err = parseServeFlags([]string{"--config", file})
	if err != nil || cfg.MetricsNodeSeries == nil || !*cfg.MetricsNodeSeries || cfg.MetricsNodeSeriesLimit != 7 {
		t.Fatalf("config file: %v %v %v", cfg.MetricsNodeSeries, cfg.MetricsNodeSeriesLimit, err)
	}
	_, err = parseServeFlags([]string{"--db", db, "--metrics-node-series-limit", "-1"})
	if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "metrics_node_series_limit") {
		t.Fatalf("negative limit: %v", err)
	}
}

// TestServeNetbootMetrics: `dpxe serve --interface lo` exports its netboot
// services' counters on /metrics: a kernel fetched from the boot listener
// shows as an HTTP request, an answer and its bytes, and a missing file as
// a not_found refusal.
func TestServeNetbootMetrics(t *testing.T) {
	dir := t.TempDir()
	bin := sharedDpxe(t)
	boot := filepath.Join(dir, "out")
	if err := os.MkdirAll(boot, 0o755); err != nil {
		t.Fatal(err)
	}
	kernel := bytes.Repeat([]byte("K"), 4096)
	if err := os.WriteFile(filepath.Join(boot, "kernel.bin"), kernel, 0o644); err != nil {
		t.Fatal(err)
	}
	// The operator listener on 127.0.0.2, the boot one on lo's 127.0.0.1
	// at the same port (dpxe serve refuses --listen on the boot address).
	port := strconv.Itoa(freeport.Port(t))
	p := startServe(t, bin, "--db", filepath.Join(dir, "var", "dpxe.db"), "--no-dashboard", "--listen", "127.0.0.2:"+port,
		"--interface", "lo", "--dhcp", "off", "--tftp", "off", "--boot-dir", boot, "--ipxe-dir", dir)
	defer p.stop(t)
	mtok, err := os.ReadFile(filepath.Join(dir, "var", metricsTokenName))
	if err != nil {
		t.Fatal(err)
	}
	bootURL := "http://127.0.0.1:" + port
	for path, want := range map[string]int{"/boot/kernel.bin": 200, "/boot/missing.bin": 404} {
		resp, err := http.Get(bootURL + path)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("GET %s: %d, want %d", path, resp.StatusCode, want)
		}
	}
	req, _ := http.NewRequest("GET", p.url+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(mtok)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`dpxe_netboot_requests_total{service="http"} 2`,
		`dpxe_netboot_answers_total{service="http"} 1`,
		`dpxe_netboot_served_bytes_total{service="http"} 4096`,
		`dpxe_netboot_refusals_total{reason="not_found",service="http"} 1`,
		`dpxe_netboot_requests_total{service="dhcp"} 0`,
	} {
		if !strings.Contains(string(body), want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	// The shipped Grafana dashboard's netboot panels, against a real
	// Prometheus scraping this serve (the other panels are checked in
	// fleet/api's TestRealPrometheusScrapes). A rate needs two samples.
	prom := promtest.Start(t, promtest.Job{Name: "dpxe", Target: strings.TrimPrefix(p.url, "http://"),
		TokenFile: filepath.Join(dir, "var", metricsTokenName)})
	prom.WaitFor(t, promtest.Startup+10*promtest.ScrapeInterval, map[string]string{
		`dpxe_netboot_requests_total{job="dpxe",service="http"}`:                                "2",
		`count_over_time(dpxe_netboot_requests_total{job="dpxe",service="http"}[1m]) >= bool 2`: "1",
	})
	promtest.CheckDashboard(t, prom, "../../docs/grafana/dpxe-fleet.json", "dpxe", promtest.Reads("dpxe_netboot_"))
}
