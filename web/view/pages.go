package view

import "strconv"

// Totals are the fleet's headline counts.
type Totals struct {
	NodesLive, NodesDraining, NodesExpired, NodesWaiting int
	// Discovered counts MACs waiting for approval; DiscoveredKnown is false
	// when netboot is not enabled (the count is then unknown).
	Discovered      int
	DiscoveredKnown bool
	// Shard counts: the first four from the nodes' health counts, Pending
	// and Unowned from the plan.
	Ready, Starting, Backoff, Fatal, Pending, Unowned int
	TotalShards                                       uint32
	Generation                                        uint64
	PlanChanged                                       Moment
	Rebalancing                                       bool   // a membership change awaits the next rebalance
	GraceUntil                                        string // restart grace end, "" when none
}

// Budget is the daily session-start budget.
type Budget struct {
	Total, Remaining, Reserve int
	ResetIn                   string
	Percent                   int  // remaining share, 0..100
	Low                       bool // at or below the reserve: Identify grants stop
}

// BucketBar is one row of the Identify activity chart: one bucket, or a
// range of buckets when there are many.
type BucketBar struct {
	Label            string // "bucket 3" or "buckets 0–63"
	Granted, Refused int
	Width            int // bar width in percent of the busiest row
	LastGrant        Moment
}

// Identify is the Identify activity panel.
type Identify struct {
	Minutes        int // window of the counts
	MaxConcurrency uint32
	Bars           []BucketBar
	Granted        int
	Refused        int
	Error          string // the activity could not be read
}

// MapGroup is one node's range in the shard map (or the unowned rest).
type MapGroup struct {
	NodeID   string // "" for shards in no live node's range
	Href     string
	Start    uint32
	End      uint32 // last shard, inclusive
	Range    string // "64-127", "7"
	Draining bool
	Counts   [NumStates]int
	// Cells has one state per cell: one shard, or BlockSize shards shown
	// by the highest state among them.
	Cells []State
}

// ID is the group's element ID, stable while the plan keeps its ranges.
func (g MapGroup) ID() string { return "g" + strconv.FormatUint(uint64(g.Start), 10) }

// Count is the number of shards in the group.
func (g MapGroup) Count() int { return int(g.End-g.Start) + 1 }

// ShardMap is every global shard as a cell, grouped by owning node.
type ShardMap struct {
	Total     uint32
	BlockSize uint32 // shards per cell; 1 when every shard has its own
	Groups    []MapGroup
	Counts    [NumStates]int
	// Compact draws groups as small tiles, for fleets of many nodes.
	Compact bool
}

// Fleet is the fleet overview page.
type Fleet struct {
	Page
	Totals   Totals
	Budget   Budget
	Identify Identify
	Map      ShardMap
	// NoNodes shows the "how to boot one" empty state.
	NoNodes bool
	// Latency and History are the latest sample's ping percentiles and
	// the 24-hour charts; nil in live updates, which leave them as loaded.
	Latency *Percentiles
	History *History
	// Delivery is the event delivery panel; nil without event delivery,
	// and in live updates.
	Delivery *Delivery
}

// NodeRow is one node in the nodes table and the head of its page.
type NodeRow struct {
	ID, Href string
	// From netboot; "" when unknown (netboot off, or the node never
	// booted over the network).
	MAC, IP, Firmware, BootStage string
	Address                      string // where it checked in from
	Capacity                     uint32
	Range                        string // "0-511", "7", "none"
	RangeStart, RangeCount       uint32
	Ready, Starting, Backoff     int
	Fatal, Pending               int
	Status                       string // live, draining, expired, waiting
	Live, Draining               bool
	Lease                        Countdown
	LastCheckin                  Moment
	// Delivery is the node's event delivery figures; nil when it reports
	// none (delivery off) or is not live.
	Delivery *NodeDelivery
	// Broker is the node's connection to the event broker; nil when it
	// reports none (no broker access) or is not live.
	Broker *Broker
}

// Broker is a node's connection to the event broker as it reports it,
// numbers preformatted. The counters run from the node's boot.
type Broker struct {
	State                    string // "up" or "down"
	Up                       bool
	Connects, Drops, Refused string
}

// RowID is the row's element ID (node IDs are letters, digits, '-', '_'
// and '.', all valid in an ID).
func (r NodeRow) RowID() string { return "n-" + r.ID }

// Column is a sortable column of the nodes table.
type Column struct {
	Key, Label, Href string
	// Sort is the aria-sort value: "ascending", "descending" or "none".
	Sort string
}

// PageLink is one link of a pager.
type PageLink struct {
	Label, Href string
	Current     bool
}

// Nodes is the nodes table page.
type Nodes struct {
	Page
	Columns []Column
	Rows    []NodeRow // this page's rows
	Total   int       // nodes in the inventory
	Showing string    // ", showing 1–500", "" when all fit one page
	Pages   []PageLink
	Netboot bool // netboot is enabled: the MAC, firmware and boot stage columns are shown
}

// ShardRow is one shard of a node.
type ShardRow struct {
	ID         uint32
	State      State
	Reported   string // the state as the node reported it, "" when not reported
	SeqValid   bool
	Acks       uint32
	Misses     uint32
	Reconnects uint32
	LastError  string
	CloseCode  uint16
	CloseText  string // meaning of CloseCode, "" when none
	// RestartRequested: an operator asked the node to start this FATAL
	// shard again and the node has not taken the request up yet.
	RestartRequested bool
	// Ping is the shard's last heartbeat latency as its node reported it.
	Ping Ping
	// Delivery is the shard's event delivery; nil when its node reports
	// none (delivery off).
	Delivery *ShardDelivery
}

// ShardDelivery is one shard's event delivery as its node reported it
// (appliance.ShardStatus Events*), numbers preformatted ("12,345").
type ShardDelivery struct {
	Published string // HPUBs written, resends included
	AckedSeq  string // Discord's sequence of the last acknowledged dispatch
	InFlight  string // dispatches awaiting their PubAck
	Lost      string // not published: oversize or no room (the kernel counts both as lost)
	Skipped   string // not published: their type is skipped
	// Lag is the received sequence minus the acknowledged one, "" when
	// the node does not report what it needs (no resumable session).
	Lag     string
	Lagging bool // Lag is more than 0
	HasLost bool // Lost is more than 0
}

// NodeDelivery is a node's event delivery summed over its shards, with
// its publish rate.
type NodeDelivery struct {
	Published, InFlight, Lost, Skipped string
	// Rate is "12.5" (events per second), "" until the node has sent two
	// check-ins with delivery figures; Window is the interval it spans,
	// "10 s". RateValue orders the nodes table (-1 when unknown).
	Rate, Window string
	RateValue    float64
	HasLost      bool
}

// BootStep is one step of a boot timeline.
type BootStep struct {
	At     string
	Stage  string
	Detail string
	Failed bool
}

// Boot is a node's netboot section: DHCP lease and boot timeline.
type Boot struct {
	Enabled  bool
	Reason   string // why there is nothing to show
	MAC      string
	Firmware string
	LeaseIP  string
	LeaseEnd string // "in 40 min", "" without a lease
	Steps    []BootStep
}

// EventRow is one audit-log entry.
type EventRow struct {
	ID     int64
	At     string // absolute, UTC
	When   Moment // the same instant, shown as "3 min ago"
	Kind   string
	NodeID string
	Shard  string
	Detail string
}

// Node is one node's page.
type Node struct {
	Page
	Row        NodeRow
	Generation uint64 // the plan's current generation
	AckedGen   uint64
	Held       string // ranges text of the shards it may run
	StatusAt   Moment // when the node last reported per-shard status
	Shards     []ShardRow
	Counts     [NumStates]int
	// Restartable counts the FATAL shards of the node's assignment: what
	// "Restart FATAL shards…" would restart.
	Restartable int
	Boot        Boot
	Events      []EventRow
	// Ping is the latency of the node's READY shards with a measured ping.
	Ping Percentiles
}

// Move is where some of a drained node's shards go.
type Move struct {
	From  string // "" when the shards have no owner now
	To    string // "" when they will have none
	Range string
	Count uint32
}

// DrainConfirm asks the operator to confirm a drain or undrain. For a drain
// it shows the controller's preview (controller.DrainPreview): every run of
// shards that changes owner, and how many would be left with none.
type DrainConfirm struct {
	Page
	NodeID   string
	Drain    bool // true: drain; false: undrain
	Range    string
	Count    uint32
	Moves    []Move
	Leaving  uint32 // the node's own shards that move
	Strands  uint32 // shards the drain leaves with no owner
	AllMoved uint32 // shards of the whole fleet that change node
	Live     bool
	Already  bool   // already draining
	Refused  string // why the last POST was refused, if it was
}

// RestartConfirm asks the operator to confirm a restart of a node's FATAL
// shards.
type RestartConfirm struct {
	Page
	NodeID string
	Live   bool
	Shards []ShardRow // the FATAL shards of the node's assignment
	// Requested counts those of Shards whose restart is already pending.
	Requested int
}

// Route is a guild lookup answer.
type Route struct {
	GuildID    string
	Shard      uint32
	Total      uint32
	NodeID     string // "" when no live node holds the shard
	NodeHref   string
	Address    string
	Generation uint64
}

// Guild is the guild lookup page.
type Guild struct {
	Page
	Query  string
	Result *Route
}

// Events is the audit-log page.
type Events struct {
	Page
	Node, Kind string
	Kinds      []string
	Nodes      []string
	Rows       []EventRow
	// Older is the link to the next page of older entries, "" at the end.
	Older string
}

// DiscoveredRow is a MAC that asked to boot and is not approved.
type DiscoveredRow struct {
	MAC, Firmware, IP   string
	FirstSeen, LastSeen string
	Suggested           string // a node name to start from
	Ignored             bool
}

// Discovered is the discovered-nodes page.
type Discovered struct {
	Page
	Enabled bool
	Reason  string // why approval is not possible
	Rows    []DiscoveredRow
}

// Login is the login page.
type Login struct {
	Page
	Next string // where to go after logging in
}

// Problem is a page that only explains an error.
type Problem struct {
	Page
	Status  int
	Heading string
	Detail  string
}
