// Package metrics is the controller's Prometheus instrumentation and its
// fleet health verdict (docs/metrics.md). A Collector reads the
// controller's state at scrape time (controller.FleetStats), so gauges are
// never kept in step with the controller; the few things that happen
// between scrapes (check-ins and Identify claims answered, store commits)
// are counted as they happen. Every label takes its values from a fixed
// set, except node, which takes the inventory's node IDs: the number of
// series grows with the number of nodes and never with the number of
// shards.
package metrics

import (
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/netboot/stats"
	"github.com/discord-pxe/dpxe/fleet/security"
)

// namespace prefixes every metric of the package.
const namespace = "dpxe"

// PingBuckets are the upper bounds, in seconds, of the shard ping
// histograms: a healthy Gateway heartbeat ACK takes tens of milliseconds,
// the kernel flags one late at appliance.PingSlowMS (1 s).
var PingBuckets = []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5}

// latencyBuckets are the upper bounds, in seconds, of request and commit
// latency histograms.
var latencyBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}

// Node request routes (the route label).
const (
	RouteCheckin  = "checkin"
	RouteIdentify = "identify"
)

// Shard states of dpxe_shards (the state label), a fixed set: the four
// reported running states, assigned (held with no status, or ASSIGNED),
// pending (in a node's range, hand-off not done) and unowned.
var shardStates = []string{"ready", "starting", "backoff", "fatal", "assigned", "pending", "unowned"}

// Indexes into shardStates.
const (
	stReady = iota
	stStarting
	stBackoff
	stFatal
	stAssigned
	stPending
	stUnowned
)

// closeCodes are the Gateway close codes dpxe_shards_by_close_code names
// one by one (RFC 6455 §7.4.1 and Discord's 4000..4014); any other is
// "other".
var closeCodes = []uint16{1000, 1001, 1006, 1011, 4000, 4001, 4002, 4003, 4004, 4005, 4007, 4008, 4009,
	4010, 4011, 4012, 4013, 4014}

// Options tune a Metrics. The zero value is usable.
type Options struct {
	// PingBound is the readiness bound on a shard's last ping
	// (DefaultPingBound when zero).
	PingBound time.Duration
	// Refusals, when set, is exported as dpxe_refusals_total.
	Refusals *security.Log
	// NodeSeries says when the series labelled by node (dpxe_node_*) are
	// exported: they are most of a large fleet's series and scrape time
	// (docs/metrics.md has the figures); the fleet-wide ones always are.
	// The zero value, NodeSeriesAuto, exports them while the inventory has
	// at most NodeSeriesLimit nodes.
	NodeSeries NodeSeriesMode
	// NodeSeriesLimit is NodeSeriesAuto's node count
	// (DefaultNodeSeriesLimit when zero or negative).
	NodeSeriesLimit int
}

// NodeSeriesMode says when the series labelled by node are exported.
type NodeSeriesMode int

const (
	// NodeSeriesAuto exports them while the inventory has at most
	// Options.NodeSeriesLimit nodes, so a scrape stays bounded (at most
	// SeriesPerNode × the limit node series) however large the fleet.
	NodeSeriesAuto NodeSeriesMode = iota
	// NodeSeriesOn always exports them (SeriesPerNode a node).
	NodeSeriesOn
	// NodeSeriesOff never does.
	NodeSeriesOff
)

// DefaultNodeSeriesLimit is the node count up to which NodeSeriesAuto
// exports the node series: 400 nodes are at most 11,200 node series
// (8,400 before the delivery series, when the figures below were taken), which
// keeps a scrape at 10,000 nodes and 131,072 shards (the node series then
// off) and one at 400 nodes (on) under 50 ms on the shared 2-core build
// machine (docs/metrics.md#cost).
const DefaultNodeSeriesLimit = 400

// SeriesPerNode is the most series one node adds: up, draining, capacity,
// heartbeat misses and reconnects for every inventory node; for a live
// one also its three shard counts, its lease and its ping histogram (nine
// buckets, +Inf, sum and count); for a live one that reports event
// delivery its published, in flight, lost, skipped and lag, and its
// publish rate once known; for a live one that reports its broker
// connection, broker up: 5 + 3 + 1 + 12 + 6 + 1. TestNodeSeriesLimit
// checks it against a scrape.
const SeriesPerNode = 28

// Metrics is the controller's instrumentation: a registry with the fleet
// collector, the Go runtime and process collectors, and the counters fed
// by the API. Its methods are safe for concurrent use.
type Metrics struct {
	c          *controller.Controller
	opts       Options
	reg        *prometheus.Registry
	requests   *prometheus.HistogramVec
	grants     prometheus.Counter
	refused    *prometheus.CounterVec
	commits    prometheus.Histogram
	commitErrs prometheus.Counter
	// netboot is the netboot services' counters, when they run.
	netboot atomic.Pointer[stats.Counters]
	// events reads the event stream, when serve delivers events.
	events atomic.Pointer[EventsSource]
}

// New returns the instrumentation of c and hooks the store commit latency
// into it (controller.OnCommit). Call it before c's Run.
func New(c *controller.Controller, opts Options) *Metrics {
	if opts.PingBound <= 0 {
		opts.PingBound = DefaultPingBound
	}
	m := &Metrics{c: c, opts: opts, reg: prometheus.NewRegistry()}
	m.requests = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace, Name: "node_request_duration_seconds",
		Help:    "Time to answer a node's check-in or Identify claim, by route and HTTP status code.",
		Buckets: latencyBuckets,
	}, []string{"route", "code"})
	m.grants = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Name: "identify_grants_total",
		Help: "Identify claims granted.",
	})
	m.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "identify_refusals_total",
		Help: "Identify claims refused, by reason.",
	}, []string{"reason"})
	for _, r := range identifyReasons {
		m.refused.WithLabelValues(r)
	}
	m.commits = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: namespace, Name: "store_commit_duration_seconds",
		Help:    "Time of one store commit of the controller's batched and durable writes.",
		Buckets: latencyBuckets,
	})
	m.commitErrs = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Name: "store_commit_errors_total",
		Help: "Store commits that failed (the changes are retried).",
	})
	m.reg.MustRegister(m.requests, m.grants, m.refused, m.commits, m.commitErrs,
		&fleetCollector{m: m},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	c.OnCommit(func(d time.Duration, err error) {
		m.commits.Observe(d.Seconds())
		if err != nil {
			m.commitErrs.Inc()
		}
	})
	return m
}

// identifyReasons are the refusal reasons of dpxe_identify_refusals_total;
// a reason the controller gives that is not listed counts as "other".
var identifyReasons = []string{string(appliance.ReasonNotOwner), string(appliance.ReasonBucketBusy),
	string(appliance.ReasonBudget), string(appliance.ReasonOrder), "other"}

// Registry returns the registry the handler serves (tests gather from it).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus text format (or
// OpenMetrics when the scraper asks for it).
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{EnableOpenMetrics: true})
}

// ObserveRequest records one answered node request: its route (RouteCheckin,
// RouteIdentify), HTTP status code and duration.
func (m *Metrics) ObserveRequest(route string, code int, d time.Duration) {
	m.requests.WithLabelValues(route, strconv.Itoa(code)).Observe(d.Seconds())
}

// ObserveIdentify counts one answered Identify claim.
func (m *Metrics) ObserveIdentify(resp appliance.IdentifyResponse) {
	if resp.Granted {
		m.grants.Inc()
		return
	}
	r := string(resp.Reason)
	for _, known := range identifyReasons {
		if r == known {
			m.refused.WithLabelValues(r).Inc()
			return
		}
	}
	m.refused.WithLabelValues("other").Inc()
}

// Verdict returns the fleet's health verdict now (Judge).
func (m *Metrics) Verdict() Verdict {
	fs := m.c.FleetStats()
	return Judge(&fs, m.opts.PingBound)
}

// SetRefusals exports l as dpxe_refusals_total (nil for none). Call it
// before serving.
func (m *Metrics) SetRefusals(l *security.Log) { m.opts.Refusals = l }

// SetPingBound sets the readiness bound on a shard's last ping
// (DefaultPingBound when d is not positive). Call it before serving.
func (m *Metrics) SetPingBound(d time.Duration) {
	if d <= 0 {
		d = DefaultPingBound
	}
	m.opts.PingBound = d
}

// SetNetboot exports the netboot services' counters c as the
// dpxe_netboot_* metrics (nil for none, the default: netboot is off).
func (m *Metrics) SetNetboot(c *stats.Counters) { m.netboot.Store(c) }

// SetNodeSeries says when the series labelled by node are exported, and
// NodeSeriesAuto's node count (DefaultNodeSeriesLimit when limit is not
// positive). Call it before serving.
func (m *Metrics) SetNodeSeries(mode NodeSeriesMode, limit int) {
	m.opts.NodeSeries, m.opts.NodeSeriesLimit = mode, limit
}

// nodeSeries reports whether a scrape of a fleet of nodes inventory nodes
// exports the node series.
func (o *Options) nodeSeries(nodes int) bool {
	switch o.NodeSeries {
	case NodeSeriesOn:
		return true
	case NodeSeriesOff:
		return false
	}
	limit := o.NodeSeriesLimit
	if limit <= 0 {
		limit = DefaultNodeSeriesLimit
	}
	return nodes <= limit
}
