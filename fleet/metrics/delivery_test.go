package metrics_test

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/metrics"
	"github.com/discord-pxe/dpxe/fleet/metrics/promtest"
)

// deliveryFleet is three live nodes of two shards each: a publishes and
// has reported twice, 10 s apart (its rate is known), with its broker up;
// b publishes, has reported once with delivery figures (rate unknown),
// and its broker is down; c reports no delivery and no broker.
func deliveryFleet(t *testing.T) (*fleet, map[string][]uint32) {
	t.Helper()
	f := newFleet(t, controller.Config{TotalShards: 6})
	ids := []string{"a", "b", "c"}
	addNodes(t, f.c, ids...)
	f.broker["a"] = &appliance.BrokerStatus{State: appliance.BrokerUp, Connects: 1}
	f.broker["b"] = &appliance.BrokerStatus{State: appliance.BrokerDown, Connects: 2, Drops: 2}
	round := 0
	status := func(node string, s uint32) *appliance.ShardStatus {
		st := &appliance.ShardStatus{State: appliance.ShardReady, PingMS: 20}
		switch {
		case node == "a" && round == 1:
			// Shard lags: received 100+3, acknowledged 90: 13; the other
			// has no resumable session, so no lag.
			st.EventsPublished, st.EventsAckedSeq, st.EventsInFlight, st.EventsLost, st.EventsSkipped = 100+s, 90, 3, 1, 4
			if s%2 == 0 {
				st.SeqValid, st.SessionID, st.Seq, st.ResumeURL = true, "sess", 100, "ws://10.0.0.9:9000/"
			}
		case node == "a":
			st.EventsPublished, st.EventsAckedSeq = 50, 50
		case node == "b" && round == 1:
			st.EventsPublished, st.EventsAckedSeq, st.EventsInFlight = 7, 7, 2
		}
		return st
	}
	run := f.settle(t, ids, 2, func(node string, s uint32) *appliance.ShardStatus {
		if node == "b" {
			return &appliance.ShardStatus{State: appliance.ShardReady, PingMS: 20}
		}
		return status(node, s)
	})
	f.clock.advance(10 * time.Second)
	round = 1
	for _, id := range ids {
		f.checkin(t, id, 2, func(s uint32) *appliance.ShardStatus { return status(id, s) }, run[id])
	}
	return f, run
}

// TestDeliveryMetrics: the nodes' event delivery from their check-ins,
// per node (bounded by the node series rule) and summed over the live
// nodes: a's published 100+101 and rate (201-100)/10 s, in flight, lost,
// skipped, and the lag of its shard with a session; b without a rate;
// c with nothing; nodes by broker state. A node whose lease lapsed
// counts no more.
func TestDeliveryMetrics(t *testing.T) {
	f, run := deliveryFleet(t)
	m := metrics.New(f.c, metrics.Options{})
	names := []string{"dpxe_delivery_published", "dpxe_delivery_publish_rate", "dpxe_delivery_in_flight", "dpxe_delivery_lost",
		"dpxe_delivery_skipped", "dpxe_delivery_lag", "dpxe_delivery_nodes", "dpxe_node_delivery_published",
		"dpxe_node_delivery_publish_rate", "dpxe_node_delivery_in_flight", "dpxe_node_delivery_lost", "dpxe_node_delivery_skipped",
		"dpxe_node_delivery_lag", "dpxe_node_broker_up"}
	// The scrape's lines of the delivery metrics, sorted.
	lines := func() string {
		var out []string
		for _, l := range strings.Split(string(scrape(t, m)), "\n") {
			name, _, _ := strings.Cut(l, " ")
			name, _, _ = strings.Cut(name, "{")
			if slices.Contains(names, name) {
				out = append(out, l)
			}
		}
		sort.Strings(out)
		return strings.Join(out, "\n")
	}
	check := func(what, want string) {
		t.Helper()
		if got := lines(); got != strings.TrimSpace(want) {
			t.Fatalf("%s: got\n%s\nwant\n%s", what, got, strings.TrimSpace(want))
		}
	}
	check("per node and fleet-wide", `
dpxe_delivery_in_flight 10
dpxe_delivery_lag 13
dpxe_delivery_lost 2
dpxe_delivery_nodes{broker="down"} 1
dpxe_delivery_nodes{broker="none"} 1
dpxe_delivery_nodes{broker="up"} 1
dpxe_delivery_publish_rate 10.1
dpxe_delivery_published 215
dpxe_delivery_skipped 8
dpxe_node_broker_up{node="a"} 1
dpxe_node_broker_up{node="b"} 0
dpxe_node_delivery_in_flight{node="a"} 6
dpxe_node_delivery_in_flight{node="b"} 4
dpxe_node_delivery_lag{node="a"} 13
dpxe_node_delivery_lag{node="b"} 0
dpxe_node_delivery_lost{node="a"} 2
dpxe_node_delivery_lost{node="b"} 0
dpxe_node_delivery_publish_rate{node="a"} 10.1
dpxe_node_delivery_published{node="a"} 201
dpxe_node_delivery_published{node="b"} 14
dpxe_node_delivery_skipped{node="a"} 8
dpxe_node_delivery_skipped{node="b"} 0
`)
	m.SetNodeSeries(metrics.NodeSeriesOff, 0)
	check("node series off: the totals stay", `
dpxe_delivery_in_flight 10
dpxe_delivery_lag 13
dpxe_delivery_lost 2
dpxe_delivery_nodes{broker="down"} 1
dpxe_delivery_nodes{broker="none"} 1
dpxe_delivery_nodes{broker="up"} 1
dpxe_delivery_publish_rate 10.1
dpxe_delivery_published 215
dpxe_delivery_skipped 8
`)
	// b checks in again without a broker report and without figures; a's
	// and c's leases lapse.
	f.clock.advance(25 * time.Second)
	f.broker["b"] = nil
	f.checkin(t, "b", 2, func(uint32) *appliance.ShardStatus {
		return &appliance.ShardStatus{State: appliance.ShardReady, PingMS: 20}
	}, run["b"])
	f.clock.advance(10 * time.Second)
	check("a and c lapsed, b reports nothing", `
dpxe_delivery_in_flight 0
dpxe_delivery_lag 0
dpxe_delivery_lost 0
dpxe_delivery_nodes{broker="down"} 0
dpxe_delivery_nodes{broker="none"} 1
dpxe_delivery_nodes{broker="up"} 0
dpxe_delivery_publish_rate 0
dpxe_delivery_published 0
dpxe_delivery_skipped 0
`)
}

// TestDeliveryMetricsPrometheus: Debian's Prometheus scrapes the
// delivery metrics of the fleet above, and every Grafana panel that reads
// them evaluates with data.
func TestDeliveryMetricsPrometheus(t *testing.T) {
	f, _ := deliveryFleet(t)
	m := metrics.New(f.c, metrics.Options{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	prom := promtest.Start(t, promtest.Job{Name: "dpxe", Target: strings.TrimPrefix(srv.URL, "http://")})
	prom.WaitFor(t, promtest.Startup+10*promtest.ScrapeInterval, map[string]string{
		`dpxe_delivery_published{job="dpxe"}`:                  "215",
		`dpxe_node_delivery_publish_rate{job="dpxe",node="a"}`: "10.1",
		`dpxe_node_broker_up{job="dpxe",node="b"}`:             "0",
	})
	promtest.CheckDashboard(t, prom, "../../docs/grafana/dpxe-fleet.json", "dpxe",
		promtest.Reads("dpxe_delivery_", "dpxe_node_delivery_", "dpxe_node_broker_"))
}
