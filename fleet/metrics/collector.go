package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/netboot/stats"
	"github.com/discord-pxe/dpxe/fleet/security"
)

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(namespace+"_"+name, help, labels, nil)
}

// The fleet collector's metrics (docs/metrics.md lists them).
var (
	descNodes        = desc("nodes", "Inventory nodes by state: live, draining (live and draining) or down.", "state")
	descShards       = desc("shards", "Shards of the plan by state: ready, starting, backoff, fatal (as their node reports), assigned (held, no state reported), pending (hand-off not done) or unowned.", "state")
	descCloseCode    = desc("shards_by_close_code", "Shards whose node reports this last Gateway close code (other: a code not listed).", "code")
	descGeneration   = desc("plan_generation", "Generation of the current shard plan.")
	descTotalShards  = desc("plan_total_shards", "Global shard count of the plan.")
	descRebalancing  = desc("plan_rebalancing", "1 while a membership change awaits the next rebalance.")
	descMaxConc      = desc("identify_max_concurrency", "Discord's max_concurrency: the number of Identify buckets.")
	descBudgetTotal  = desc("session_budget_limit", "Daily session starts Discord allows.")
	descBudgetLeft   = desc("session_budget_remaining", "Session starts left in the current budget window.")
	descBudgetRes    = desc("session_budget_reserve", "Session starts kept back from Identify grants.")
	descBudgetReset  = desc("session_budget_reset_timestamp_seconds", "When the session budget window resets, Unix time.")
	descReady        = desc("fleet_ready", "1 when every shard of the plan is READY on a live node with a ping within the bound (GET /readyz).")
	descUnready      = desc("fleet_unready_shards", "Shards that are not ready, by the first reason that applies (docs/api.md, GET /v1/health).", "reason")
	descPingBound    = desc("fleet_ping_bound_seconds", "The readiness bound on a shard's last ping.")
	descShardPing    = desc("shard_ping_seconds", "Last heartbeat-to-ACK latency of every held shard that has one, fleet-wide.")
	descRefusals     = desc("refusals_total", "Requests refused by the server's security checks, by reason.", "reason")
	descNodeUp       = desc("node_up", "1 when the node holds a lease (checked in within the lease).", "node")
	descNodeDraining = desc("node_draining", "1 when the node is being drained.", "node")
	descNodeCap      = desc("node_capacity", "Shards the node offers, as it last checked in.", "node")
	descNodeShards   = desc("node_shards", "Shards in the node's plan range: ready (it reports READY), not_ready (held, any other or no state), pending (hand-off not done).", "node", "state")
	descNodeLease    = desc("node_lease_remaining_seconds", "Time until the node's lease lapses unless it checks in.", "node")
	descNodeMisses   = desc("node_heartbeat_misses", "Sum of the heartbeat misses the node's shards report (each since the shard started there; falls when shards leave).", "node")
	descNodeReconn   = desc("node_reconnects", "Sum of the reconnects the node's shards report (each since the shard started there; falls when shards leave).", "node")
	descNodePing     = desc("node_shard_ping_seconds", "Last heartbeat-to-ACK latency of the node's held shards that have one.", "node")
	descNBRequests   = desc("netboot_requests_total", "Requests to the netboot services (dhcp: parsed datagrams; tftp: read and write requests, a retransmission once; http: /boot/ requests).", "service")
	descNBAnswers    = desc("netboot_answers_total", "Requests the netboot services answered: DHCP replies sent, TFTP transfers completed (and size probes), HTTP responses below 400 sent whole.", "service")
	descNBRefusals   = desc("netboot_refusals_total", "Requests the netboot services refused or left unanswered, by reason (docs/metrics.md#netboot lists each service's reasons).", "service", "reason")
	descNBErrors     = desc("netboot_errors_total", "Answers that failed on the way: a DHCP reply not sent, a TFTP transfer or an HTTP body that ended early.", "service")
	descNBBytes      = desc("netboot_served_bytes_total", "Bytes the netboot services sent: DHCP replies, TFTP file data, HTTP response bodies.", "service")
	descDelPublished = desc("delivery_published", "Messages the live nodes' shards wrote to the broker, resends included, summed over their latest check-ins (slot counters: falls when a node restarts or a shard leaves it).")
	descDelRate      = desc("delivery_publish_rate", "Events per second the live nodes published between each one's two latest check-ins with delivery figures, summed over the nodes whose rate is known.")
	descDelInFlight  = desc("delivery_in_flight", "Dispatches the live nodes' shards are waiting to have acknowledged by the broker (PubAck).")
	descDelLost      = desc("delivery_lost", "Dispatches the live nodes' shards did not publish (over the broker's max_payload, no room), as their slots count them.")
	descDelSkipped   = desc("delivery_skipped", "Dispatches the live nodes' shards did not publish because their event type is skipped.")
	descDelLag       = desc("delivery_lag", "Received minus acknowledged sequence, summed over the live nodes' shards with a resumable session.")
	descDelNodes     = desc("delivery_nodes", "Live nodes by the broker connection their latest check-in reported: up, down, or none (no broker report).", "broker")
	descNodePub      = desc("node_delivery_published", "Messages the node's shards wrote to the broker, resends included (slot counters: falls when the node restarts or a shard leaves it).", "node")
	descNodeRate     = desc("node_delivery_publish_rate", "Events per second the node published between its two latest check-ins with delivery figures (absent until known).", "node")
	descNodeInFlight = desc("node_delivery_in_flight", "Dispatches the node's shards are waiting to have acknowledged by the broker (PubAck).", "node")
	descNodeLost     = desc("node_delivery_lost", "Dispatches the node's shards did not publish (over the broker's max_payload, no room).", "node")
	descNodeSkipped  = desc("node_delivery_skipped", "Dispatches the node's shards did not publish because their event type is skipped.", "node")
	descNodeLag      = desc("node_delivery_lag", "Received minus acknowledged sequence, summed over the node's shards with a resumable session.", "node")
	descNodeBroker   = desc("node_broker_up", "1 while the node's connection to the NATS broker is up, 0 while down, as its latest check-in reported (absent without a report).", "node")
	descActing       = desc("replica_acting", "1 while this dpxe serve process acts on the fleet: a single controller, or the leading replica; 0 for a follower (docs/ha.md).")
	descTerm         = desc("replica_term", "The latest leader term this replica saw (0 for a single controller).")
	descFollowCheck  = desc("replica_follower_checkins_total", "Node check-ins this replica answered itself because no leader answered them (renewals without a leader, docs/ha.md).")
	descFollowGrant  = desc("replica_follower_grants_total", "Identify claims this replica granted itself because no leader answered them (docs/ha.md).")
	descNodeSeries   = desc("metrics_node_series", "1 when this scrape has the series labelled by node (--metrics-node-series; by default only while the inventory has at most --metrics-node-series-limit nodes).")
)

// fleetCollector exports the controller's state as it is at scrape time.
type fleetCollector struct{ m *Metrics }

func (f *fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descNodes, descShards, descCloseCode, descGeneration, descTotalShards,
		descRebalancing, descMaxConc, descBudgetTotal, descBudgetLeft, descBudgetRes, descBudgetReset, descReady,
		descUnready, descPingBound, descShardPing, descNodeUp, descNodeDraining, descNodeCap, descNodeShards,
		descNodeLease, descNodeMisses, descNodeReconn, descNodePing, descRefusals, descNodeSeries,
		descActing, descTerm, descFollowCheck, descFollowGrant,
		descNBRequests, descNBAnswers, descNBRefusals, descNBErrors, descNBBytes,
		descDelPublished, descDelRate, descDelInFlight, descDelLost, descDelSkipped, descDelLag, descDelNodes,
		descNodePub, descNodeRate, descNodeInFlight, descNodeLost, descNodeSkipped, descNodeLag, descNodeBroker} {
		ch <- d
	}
	for _, d := range eventsDescs {
		ch <- d
	}
}

// pingHist accumulates one ping histogram.
type pingHist struct {
	count   uint64
	sum     float64
	buckets []uint64 // cumulative at export, per PingBuckets
}

func (h *pingHist) observe(sec float64) {
	if h.buckets == nil {
		h.buckets = make([]uint64, len(PingBuckets))
	}
	h.count++
	h.sum += sec
	for i, ub := range PingBuckets {
		if sec <= ub {
			h.buckets[i]++
			break
		}
	}
}

func (h *pingHist) metric(d *prometheus.Desc, labels ...string) prometheus.Metric {
	m := make(map[float64]uint64, len(PingBuckets))
	var cum uint64
	for i, ub := range PingBuckets {
		if h.buckets != nil {
			cum += h.buckets[i]
		}
		m[ub] = cum
	}
	return prometheus.MustNewConstHistogram(d, h.count, h.sum, m, labels...)
}

// nodeAcc is what one pass over the shards gathers per node.
type nodeAcc struct {
	ready, notReady, pending float64
	ping                     pingHist
}

func gauge(d *prometheus.Desc, v float64, labels ...string) prometheus.Metric {
	return prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

func boolf(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func (f *fleetCollector) Collect(ch chan<- prometheus.Metric) {
	fs := f.m.c.FleetStats()
	v := Judge(&fs, f.m.opts.PingBound)

	var states [stUnowned + 1]float64
	codes := make(map[uint16]float64, len(closeCodes))
	var otherCode float64
	acc := make([]nodeAcc, len(fs.Nodes))
	var fleetPing pingHist
	for i := range fs.Shards {
		sh := &fs.Shards[i]
		if sh.CloseCode != 0 {
			if isListedCode(sh.CloseCode) {
				codes[sh.CloseCode]++
			} else {
				otherCode++
			}
		}
		if sh.Node < 0 {
			states[stUnowned]++
			continue
		}
		a := &acc[sh.Node]
		if !sh.Held {
			states[stPending]++
			a.pending++
			continue
		}
		switch sh.State {
		case appliance.ShardReady:
			states[stReady]++
			a.ready++
		case appliance.ShardStarting:
			states[stStarting]++
			a.notReady++
		case appliance.ShardBackoff:
			states[stBackoff]++
			a.notReady++
		case appliance.ShardFatal:
			states[stFatal]++
			a.notReady++
		default: // not reported, or ASSIGNED
			states[stAssigned]++
			a.notReady++
		}
		if sh.Reported && sh.PingMS > 0 {
			sec := sh.PingMS / 1000
			a.ping.observe(sec)
			fleetPing.observe(sec)
		}
	}
	for i, s := range shardStates {
		ch <- gauge(descShards, states[i], s)
	}
	for _, c := range closeCodes {
		ch <- gauge(descCloseCode, codes[c], strconv.Itoa(int(c)))
	}
	ch <- gauge(descCloseCode, otherCode, "other")

	var live, draining, down float64
	var del controller.NodeDelivery // the live nodes' sums
	var brokerUp, brokerDown, brokerNone float64
	perNode := f.m.opts.nodeSeries(len(fs.Nodes))
	for i := range fs.Nodes {
		n := &fs.Nodes[i]
		switch {
		case n.Live && n.Draining:
			draining++
		case n.Live:
			live++
		default:
			down++
		}
		if n.Live {
			if d := &n.Delivery; n.DeliveryOK {
				del.Published += d.Published
				del.InFlight += d.InFlight
				del.Lost += d.Lost
				del.Skipped += d.Skipped
				del.Lag += d.Lag
				if d.RateWindowMS > 0 {
					del.PublishRate += d.PublishRate
				}
			}
			switch n.Broker {
			case appliance.BrokerUp:
				brokerUp++
			case "":
				brokerNone++
			default:
				brokerDown++
			}
		}
		if !perNode {
			continue
		}
		ch <- gauge(descNodeUp, boolf(n.Live), n.ID)
		ch <- gauge(descNodeDraining, boolf(n.Draining), n.ID)
		ch <- gauge(descNodeCap, float64(n.Capacity), n.ID)
		ch <- gauge(descNodeMisses, float64(n.HeartbeatMisses), n.ID)
		ch <- gauge(descNodeReconn, float64(n.Reconnects), n.ID)
		if !n.Live {
			continue
		}
		a := &acc[i]
		ch <- gauge(descNodeShards, a.ready, n.ID, "ready")
		ch <- gauge(descNodeShards, a.notReady, n.ID, "not_ready")
		ch <- gauge(descNodeShards, a.pending, n.ID, "pending")
		ch <- gauge(descNodeLease, max(0, n.LeaseDeadline.Sub(fs.At).Seconds()), n.ID)
		ch <- a.ping.metric(descNodePing, n.ID)
		if d := &n.Delivery; n.DeliveryOK {
			ch <- gauge(descNodePub, float64(d.Published), n.ID)
			ch <- gauge(descNodeInFlight, float64(d.InFlight), n.ID)
			ch <- gauge(descNodeLost, float64(d.Lost), n.ID)
			ch <- gauge(descNodeSkipped, float64(d.Skipped), n.ID)
			ch <- gauge(descNodeLag, float64(d.Lag), n.ID)
			if d.RateWindowMS > 0 {
				ch <- gauge(descNodeRate, d.PublishRate, n.ID)
			}
		}
		if n.Broker != "" {
			ch <- gauge(descNodeBroker, boolf(n.Broker == appliance.BrokerUp), n.ID)
		}
	}
	ch <- gauge(descDelPublished, float64(del.Published))
	ch <- gauge(descDelRate, del.PublishRate)
	ch <- gauge(descDelInFlight, float64(del.InFlight))
	ch <- gauge(descDelLost, float64(del.Lost))
	ch <- gauge(descDelSkipped, float64(del.Skipped))
	ch <- gauge(descDelLag, float64(del.Lag))
	ch <- gauge(descDelNodes, brokerUp, appliance.BrokerUp)
	ch <- gauge(descDelNodes, brokerDown, appliance.BrokerDown)
	ch <- gauge(descDelNodes, brokerNone, "none")
	ch <- gauge(descNodes, live, "live")
	ch <- gauge(descNodes, draining, "draining")
	ch <- gauge(descNodes, down, "down")
	ch <- fleetPing.metric(descShardPing)
	ch <- gauge(descNodeSeries, boolf(perNode))

	role := f.m.c.Role()
	checkins, grants := f.m.c.FollowerAnswers()
	ch <- gauge(descActing, boolf(!role.HA || role.Leading))
	ch <- gauge(descTerm, float64(role.Term))
	ch <- prometheus.MustNewConstMetric(descFollowCheck, prometheus.CounterValue, float64(checkins))
	ch <- prometheus.MustNewConstMetric(descFollowGrant, prometheus.CounterValue, float64(grants))

	ch <- gauge(descGeneration, float64(fs.Generation))
	ch <- gauge(descTotalShards, float64(fs.TotalShards))
	ch <- gauge(descRebalancing, boolf(fs.Rebalancing))
	ch <- gauge(descMaxConc, float64(fs.MaxConcurrency))
	ch <- gauge(descBudgetTotal, float64(fs.Budget.Total))
	ch <- gauge(descBudgetLeft, float64(fs.Budget.Remaining))
	ch <- gauge(descBudgetRes, float64(fs.Budget.Reserve))
	ch <- gauge(descBudgetReset, float64(fs.Budget.ResetAt.UnixMilli())/1000)
	ch <- gauge(descReady, boolf(v.Ready))
	for _, r := range Reasons {
		ch <- gauge(descUnready, float64(v.Reasons[r]), r)
	}
	ch <- gauge(descPingBound, f.m.opts.PingBound.Seconds())
	if f.m.opts.Refusals != nil {
		counts := f.m.opts.Refusals.Counts()
		for _, r := range security.Reasons {
			ch <- prometheus.MustNewConstMetric(descRefusals, prometheus.CounterValue, float64(counts[r]), string(r))
		}
	}
	if nb := f.m.netboot.Load(); nb != nil {
		counter := func(d *prometheus.Desc, v uint64, labels ...string) prometheus.Metric {
			return prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
		}
		for _, sc := range nb.Snapshot() {
			svc := sc.Service.String()
			ch <- counter(descNBRequests, sc.Requests, svc)
			ch <- counter(descNBAnswers, sc.Answers, svc)
			ch <- counter(descNBErrors, sc.Errors, svc)
			ch <- counter(descNBBytes, sc.Bytes, svc)
			for i, r := range stats.Reasons[sc.Service] {
				ch <- counter(descNBRefusals, sc.Refusals[i], svc, r)
			}
		}
	}
	f.m.collectEvents(ch)
}

func isListedCode(c uint16) bool {
	for _, l := range closeCodes {
		if l == c {
			return true
		}
	}
	return false
}

// Ensure the collector satisfies the interface.
var _ prometheus.Collector = (*fleetCollector)(nil)
