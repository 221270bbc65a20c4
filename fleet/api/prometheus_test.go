package api

import (
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
	// Every panel but the netboot and event-delivery ones: this controller
	// runs neither, and its node reports no delivery. cmd/dpxe's
	// TestServeNetbootMetrics and TestServeEventsExternalCluster check the
	// first two against a dpxe serve, fleet/metrics's
	// TestDeliveryMetricsPrometheus the nodes' delivery.
	special := promtest.Reads("dpxe_netboot_", "dpxe_events_", "dpxe_node_delivery_", "dpxe_node_broker_")
	promtest.CheckDashboard(t, prom, "../../docs/grafana/dpxe-fleet.json", "dpxe", func(q string) bool {
		return !special(q)
	})
}
