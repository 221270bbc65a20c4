package web

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/web/templates"
	"github.com/discord-pxe/dpxe/web/view"
)

// fleetView builds the fleet page's view model.
func (s *Server) fleetView(ctx context.Context, p view.Page) view.Fleet {
	now := s.cfg.Now()
	c := s.cfg.Controller
	nodes := c.Nodes()
	plan := c.Plan()
	discovered, known := 0, false
	if s.cfg.Netboot != nil {
		if d, err := s.cfg.Netboot.Discovered(ctx); err == nil {
			discovered, known = len(d), true
		} else {
			s.log.Warn("dashboard: netboot discovered nodes", "err", err)
		}
	}
	v := view.Fleet{Page: p, NoNodes: len(nodes) == 0,
		Totals: BuildTotals(nodes, plan, discovered, known, now),
		Budget: BuildBudget(c.Budget(), now),
		Map:    BuildShardMap(c.ShardMap(), now)}
	acts, err := c.IdentifyActivity(ctx, now.Add(-s.cfg.IdentifyWindow))
	v.Identify = BuildIdentify(acts, s.cfg.IdentifyWindow, now)
	if err != nil {
		v.Identify.Error = "Identify activity could not be read: " + err.Error()
		v.Identify.MaxConcurrency = c.Config().MaxConcurrency
	}
	return v
}

func (s *Server) fleet(w http.ResponseWriter, r *http.Request) {
	p := s.page(r, "Fleet", "fleet")
	p.Live = "/live?topic=fleet"
	v := s.fleetView(r.Context(), p)
	v.Latency, v.History = s.historyView(r.Context(), s.cfg.Now())
	if s.cfg.Events != nil {
		if st, ok := s.cfg.Events(r.Context()); ok {
			d := BuildDelivery(st)
			v.Delivery = &d
		}
	}
	s.render(w, r, http.StatusOK, templates.FleetPage(v))
}

// nodeColumns are the nodes table's columns: key, heading.
var nodeColumns = [][2]string{
	{"id", "Node"}, {"mac", "MAC"}, {"ip", "IP"}, {"firmware", "Firmware"}, {"capacity", "Capacity"},
	{"range", "Range"}, {"ready", "R"}, {"starting", "S"}, {"backoff", "B"}, {"fatal", "F"}, {"pending", "P"},
	{"rate", "Events/s"}, {"lease", "Lease expires"}, {"checkin", "Last check-in"}, {"status", "State"}, {"boot", "Boot stage"},
}

// sortKey reads ?sort= and ?dir=, defaulting to node ID ascending.
func sortKey(q url.Values) (string, bool) {
	key := q.Get("sort")
	if !slices.ContainsFunc(nodeColumns, func(c [2]string) bool { return c[0] == key }) {
		key = "id"
	}
	return key, q.Get("dir") == "desc"
}

// sortRows orders node rows by a column; ties break by node ID.
func sortRows(rows []view.NodeRow, key string, desc bool) {
	cmpInt := func(a, b int) int { return a - b }
	slices.SortStableFunc(rows, func(a, b view.NodeRow) int {
		var c int
		switch key {
		case "id":
			c = strings.Compare(a.ID, b.ID)
		case "mac":
			c = strings.Compare(a.MAC, b.MAC)
		case "ip":
			c = strings.Compare(a.IP+a.Address, b.IP+b.Address)
		case "firmware":
			c = strings.Compare(a.Firmware, b.Firmware)
		case "capacity":
			c = cmpInt(int(a.Capacity), int(b.Capacity))
		case "range":
			c = cmpInt(int(a.RangeStart), int(b.RangeStart))
			if c == 0 {
				c = cmpInt(int(a.RangeCount), int(b.RangeCount))
			}
		case "ready":
			c = cmpInt(a.Ready, b.Ready)
		case "starting":
			c = cmpInt(a.Starting, b.Starting)
		case "backoff":
			c = cmpInt(a.Backoff, b.Backoff)
		case "fatal":
			c = cmpInt(a.Fatal, b.Fatal)
		case "pending":
			c = cmpInt(a.Pending, b.Pending)
		case "rate":
			c = cmp.Compare(rateOf(a), rateOf(b))
		case "lease":
			c = a.Lease.Deadline.Compare(b.Lease.Deadline)
		case "checkin":
			c = a.LastCheckin.At.Compare(b.LastCheckin.At)
		case "status":
			c = strings.Compare(a.Status, b.Status)
		case "boot":
			c = strings.Compare(a.BootStage, b.BootStage)
		}
		if desc {
			c = -c
		}
		if c == 0 {
			c = strings.Compare(a.ID, b.ID)
		}
		return c
	})
}

// rateOf is a row's publish rate for sorting: -2 without event delivery,
// -1 while its rate is unknown.
func rateOf(r view.NodeRow) float64 {
	if r.Delivery == nil {
		return -2
	}
	return r.Delivery.RateValue
}

// nodeRows builds the sorted rows of the nodes table.
func (s *Server) nodeRows(ctx context.Context, key string, desc bool) ([]view.NodeRow, bool) {
	now := s.cfg.Now()
	var boots map[string]BootSummary
	if s.cfg.Netboot != nil {
		var err error
		if boots, err = s.cfg.Netboot.Summaries(ctx); err != nil {
			s.log.Warn("dashboard: netboot summaries", "err", err)
		}
	}
	nodes := s.cfg.Controller.Nodes()
	rows := make([]view.NodeRow, 0, len(nodes))
	for _, n := range nodes {
		rows = append(rows, BuildNodeRow(n, boots[n.ID], now))
	}
	sortRows(rows, key, desc)
	return rows, s.cfg.Netboot != nil
}

// netbootColumns are the columns whose data come from netboot.
var netbootColumns = []string{"mac", "firmware", "boot"}

// BuildColumns makes the sortable headings: the active column links to
// the opposite direction. Without netboot its columns are left out.
func BuildColumns(key string, desc, netboot bool) []view.Column {
	out := make([]view.Column, 0, len(nodeColumns))
	for _, c := range nodeColumns {
		if !netboot && slices.Contains(netbootColumns, c[0]) {
			continue
		}
		col := view.Column{Key: c[0], Label: c[1], Sort: "none", Href: "/nodes?sort=" + c[0]}
		if c[0] == key {
			col.Sort = "ascending"
			if desc {
				col.Sort = "descending"
			} else {
				col.Href += "&dir=desc"
			}
		}
		out = append(out, col)
	}
	return out
}

// NodesPerPage is the number of rows of one page of the nodes table.
const NodesPerPage = 500

// pageOf cuts one page out of sorted rows (?page=, from 1) and returns it
// with its number and the number of pages.
func pageOf(rows []view.NodeRow, q url.Values) ([]view.NodeRow, int, int) {
	pages := max(1, (len(rows)+NodesPerPage-1)/NodesPerPage)
	n, err := strconv.Atoi(q.Get("page"))
	if err != nil || n < 1 {
		n = 1
	}
	n = min(n, pages)
	lo := (n - 1) * NodesPerPage
	return rows[lo:min(len(rows), lo+NodesPerPage)], n, pages
}

func (s *Server) nodes(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	key, desc := sortKey(q)
	rows, nb := s.nodeRows(r.Context(), key, desc)
	pageRows, n, pages := pageOf(rows, q)
	p := s.page(r, "Nodes", "nodes")
	base := url.Values{"sort": {key}}
	if desc {
		base.Set("dir", "desc")
	}
	live := url.Values{"topic": {"nodes"}, "sort": {key}, "page": {strconv.Itoa(n)}}
	if desc {
		live.Set("dir", "desc")
	}
	p.Live = "/live?" + live.Encode()
	v := view.Nodes{Page: p, Columns: BuildColumns(key, desc, nb), Rows: pageRows, Total: len(rows), Netboot: nb}
	if pages > 1 {
		lo := (n-1)*NodesPerPage + 1
		v.Showing = fmt.Sprintf(", showing %d–%d", lo, lo+len(pageRows)-1)
		for i := 1; i <= pages; i++ {
			base.Set("page", strconv.Itoa(i))
			hi := min(len(rows), i*NodesPerPage)
			v.Pages = append(v.Pages, view.PageLink{Label: fmt.Sprintf("%d–%d", (i-1)*NodesPerPage+1, hi),
				Href: "/nodes?" + base.Encode(), Current: i == n})
		}
	}
	s.render(w, r, http.StatusOK, templates.NodesPage(v))
}

// nodeEventLimit is how many events the node page shows.
const nodeEventLimit = 20

// nodeView builds one node's page.
func (s *Server) nodeView(ctx context.Context, p view.Page, id string, withEvents bool) (view.Node, error) {
	now := s.cfg.Now()
	c := s.cfg.Controller
	d, err := c.Node(ctx, id)
	if err != nil {
		return view.Node{}, err
	}
	var boot BootSummary
	v := view.Node{Page: p, Generation: c.Plan().Generation, AckedGen: d.AckedGeneration, Held: d.Held}
	if v.Held == "" {
		v.Held = "none"
	}
	v.StatusAt = view.Moment{At: d.StatusAt, Now: now}
	v.Shards, v.Counts = BuildShardRows(d, c.ShardMap())
	v.Ping = addPings(v.Shards, d.Shards)
	v.Restartable = len(FatalInRange(d, v.Shards))
	if withEvents {
		v.Boot = s.nodeBoot(ctx, id, now)
		boot = BootSummary{MAC: v.Boot.MAC, Firmware: v.Boot.Firmware}
		evs, err := c.EventLog(ctx, controller.EventFilter{NodeID: id, Limit: nodeEventLimit})
		if err != nil {
			return view.Node{}, err
		}
		v.Events = BuildEventRows(evs, now)
	}
	v.Row = BuildNodeRow(d.NodeView, boot, now)
	return v, nil
}

func (s *Server) node(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	p := s.page(r, "Node "+id, "nodes")
	p.Live = "/live?topic=node&id=" + url.QueryEscape(id)
	v, err := s.nodeView(r.Context(), p, id, true)
	if err != nil {
		s.controllerProblem(w, r, err)
		return
	}
	s.render(w, r, http.StatusOK, templates.NodePage(v))
}

func (s *Server) drainConfirm(drain bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		d, err := s.cfg.Controller.Node(r.Context(), id)
		if err != nil {
			s.controllerProblem(w, r, err)
			return
		}
		title := "Undrain " + id
		if drain {
			title = "Drain " + id
		}
		v := view.DrainConfirm{Page: s.page(r, title, "nodes"), NodeID: id, Drain: drain, Live: d.Live,
			Range: controller.Range{Start: d.RangeStart, Count: d.RangeCount}.String(), Count: d.RangeCount, Already: d.Draining}
		if drain {
			p, err := s.cfg.Controller.PreviewDrain(id)
			if err != nil {
				s.controllerProblem(w, r, err)
				return
			}
			v.Moves, v.Leaving, v.Strands, v.AllMoved = BuildDrainConfirm(p)
		}
		s.render(w, r, http.StatusOK, templates.DrainConfirmPage(v))
	}
}

func (s *Server) drain(on bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		var err error
		if on {
			// A drain that strands shards needs the confirmation's explicit
			// "leave them unowned" box; without it the page comes back with
			// the preview as it is now.
			var p controller.DrainPreview
			p, err = s.cfg.Controller.Drain(r.Context(), id, r.PostFormValue("strand") == "yes")
			if errors.Is(err, controller.ErrDrainStrands) {
				v := view.DrainConfirm{Page: s.page(r, "Drain "+id, "nodes"), NodeID: id, Drain: true, Live: p.Live,
					Range: controller.Range{Start: p.RangeStart, Count: p.RangeCount}.String(), Count: p.RangeCount,
					Refused: fmt.Sprintf("Not drained: %d shards would have no owner. Tick the box to drain anyway, or add capacity first.", p.Strands)}
				v.Moves, v.Leaving, v.Strands, v.AllMoved = BuildDrainConfirm(p)
				s.render(w, r, http.StatusConflict, templates.DrainConfirmPage(v))
				return
			}
		} else {
			err = s.cfg.Controller.SetDraining(r.Context(), id, false)
		}
		if err != nil {
			s.controllerProblem(w, r, err)
			return
		}
		verb := "undrain"
		if on {
			verb = "drain"
		}
		s.log.Info("dashboard: "+verb, "node", id, "remote", r.RemoteAddr)
		http.Redirect(w, r, "/nodes/"+url.PathEscape(id)+"?done="+url.QueryEscape(verb+":"+id), http.StatusSeeOther)
	}
}

// restartConfirm asks before restarting a node's FATAL shards and lists
// them with their close codes.
func (s *Server) restartConfirm(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	c := s.cfg.Controller
	d, err := c.Node(r.Context(), id)
	if err != nil {
		s.controllerProblem(w, r, err)
		return
	}
	rows, _ := BuildShardRows(d, c.ShardMap())
	v := view.RestartConfirm{Page: s.page(r, "Restart FATAL shards of "+id, "nodes"), NodeID: id, Live: d.Live,
		Shards: FatalInRange(d, rows)}
	for _, sr := range v.Shards {
		if sr.RestartRequested {
			v.Requested++
		}
	}
	s.render(w, r, http.StatusOK, templates.RestartConfirmPage(v))
}

// restartFatal records a restart request for every FATAL shard of the
// node's assignment (controller.RestartFatal).
func (s *Server) restartFatal(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	shards, err := s.cfg.Controller.RestartFatal(r.Context(), id, nil)
	if errors.Is(err, controller.ErrNotLive) {
		s.problem(w, r, http.StatusConflict, "Node "+id+" is not live",
			"Node "+id+" has no valid lease, so it runs no shard to restart. Its shards start afresh when it checks in again.")
		return
	}
	if err != nil {
		s.controllerProblem(w, r, err)
		return
	}
	s.log.Info("dashboard: restart of FATAL shards", "node", id, "shards", len(shards), "remote", r.RemoteAddr)
	done := "restart:" + id + ":"
	for i, sh := range shards {
		if i > 0 {
			done += ","
		}
		done += strconv.FormatUint(uint64(sh), 10)
	}
	http.Redirect(w, r, "/nodes/"+url.PathEscape(id)+"?done="+url.QueryEscape(done), http.StatusSeeOther)
}

func (s *Server) guild(w http.ResponseWriter, r *http.Request) {
	v := view.Guild{Page: s.page(r, "Guild lookup", "guild"), Query: r.URL.Query().Get("guild_id")}
	status := http.StatusOK
	if v.Query != "" {
		gid, err := appliance.ParseGuildID(strings.TrimSpace(v.Query))
		if err != nil {
			v.Error = "Guild ID " + strconv.Quote(v.Query) + ": " + err.Error() + ". A guild ID is 1 to 20 decimal digits."
			status = http.StatusBadRequest
		} else {
			rt, err := s.cfg.Controller.Route(gid)
			if err != nil && !errors.Is(err, controller.ErrNoOwner) {
				s.controllerProblem(w, r, err)
				return
			}
			res := view.Route{GuildID: rt.GuildID, Shard: rt.ShardID, Total: rt.TotalShards, NodeID: rt.NodeID,
				Address: rt.Address, Generation: rt.Generation}
			if res.NodeID != "" {
				res.NodeHref = "/nodes/" + url.PathEscape(res.NodeID)
			}
			v.Result = &res
		}
	}
	s.render(w, r, status, templates.GuildPage(v))
}

// eventPage is the number of audit-log entries per events page.
const eventPage = 100

// eventFilter is the events page's filter as a query: node and kind,
// only those set.
func eventFilter(node, kind string) url.Values {
	q := url.Values{}
	if node != "" {
		q.Set("node", node)
	}
	if kind != "" {
		q.Set("kind", kind)
	}
	return q
}

// eventList fills v's rows and older-page link: the entries of v's filter
// before the entry ID before (0: the newest).
func (s *Server) eventList(ctx context.Context, v *view.Events, before int64) error {
	evs, err := s.cfg.Controller.EventLog(ctx, controller.EventFilter{NodeID: v.Node, Kind: v.Kind, Before: before, Limit: eventPage})
	if err != nil {
		return err
	}
	v.Rows = BuildEventRows(evs, s.cfg.Now())
	if len(evs) == eventPage {
		older := eventFilter(v.Node, v.Kind)
		older.Set("before", strconv.FormatInt(evs[len(evs)-1].ID, 10))
		v.Older = "/events?" + older.Encode()
	}
	return nil
}

func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	v := view.Events{Page: s.page(r, "Events", "events"), Node: q.Get("node"), Kind: q.Get("kind"), Kinds: controller.EventKinds}
	for _, n := range s.cfg.Controller.Nodes() {
		v.Nodes = append(v.Nodes, n.ID)
	}
	if v.Kind != "" && !slices.Contains(v.Kinds, v.Kind) {
		v.Error = "Unknown event kind " + strconv.Quote(v.Kind) + "; showing all kinds."
		v.Kind = ""
	}
	var before int64
	if b := q.Get("before"); b != "" {
		n, err := strconv.ParseInt(b, 10, 64)
		if err != nil || n < 0 {
			v.Error = "The page position " + strconv.Quote(b) + " is not an event number; showing the newest events."
		} else {
			before = n
		}
	}
	if err := s.eventList(r.Context(), &v, before); err != nil {
		s.controllerProblem(w, r, err)
		return
	}
	// The newest entries update live; a page of older ones stays as it is
	// (nothing new ever lands there).
	if before == 0 {
		lq := eventFilter(v.Node, v.Kind)
		lq.Set("topic", "events")
		v.Live = "/live?" + lq.Encode()
	}
	s.render(w, r, http.StatusOK, templates.EventsPage(v))
}

// netbootOff explains why the discovered-nodes actions are unavailable.
const netbootOff = "Netboot is not enabled in this dpxe serve, so no machine can be discovered or approved here. " +
	"Nodes booted from USB are added with `dpxe nodes add NAME` and appear on the Nodes page when they check in."

func (s *Server) discovered(w http.ResponseWriter, r *http.Request) {
	v := view.Discovered{Page: s.page(r, "Discovered nodes", "discovered")}
	if s.cfg.Netboot == nil {
		v.Reason = netbootOff
		s.render(w, r, http.StatusOK, templates.DiscoveredPage(v))
		return
	}
	v.Enabled = true
	list, err := s.cfg.Netboot.Discovered(r.Context())
	if err != nil {
		v.Error = "The discovered nodes could not be read: " + err.Error()
	}
	now := s.cfg.Now()
	for _, d := range list {
		v.Rows = append(v.Rows, view.DiscoveredRow{MAC: d.MAC, Firmware: d.Firmware, IP: d.IP,
			FirstSeen: view.Ago(now, d.FirstSeen), LastSeen: view.Ago(now, d.LastSeen),
			Suggested: suggestName(d.MAC)})
	}
	s.render(w, r, http.StatusOK, templates.DiscoveredPage(v))
}

func (s *Server) approve(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Netboot == nil {
		s.problem(w, r, http.StatusConflict, "Netboot is not enabled", netbootOff)
		return
	}
	mac, name := r.PathValue("mac"), strings.TrimSpace(r.PostFormValue("name"))
	if err := appliance.ValidateNodeID(name); err != nil {
		s.problem(w, r, http.StatusBadRequest, "Invalid node name", "Node name "+strconv.Quote(name)+": "+err.Error()+".")
		return
	}
	if err := s.cfg.Netboot.Approve(r.Context(), mac, name); err != nil {
		s.problem(w, r, http.StatusConflict, "Could not approve "+mac, err.Error())
		return
	}
	s.log.Info("dashboard: approved", "mac", mac, "node", name, "remote", r.RemoteAddr)
	http.Redirect(w, r, "/discovered?done="+url.QueryEscape("approve:"+mac+" as "+name), http.StatusSeeOther)
}

func (s *Server) ignore(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Netboot == nil {
		s.problem(w, r, http.StatusConflict, "Netboot is not enabled", netbootOff)
		return
	}
	mac := r.PathValue("mac")
	if err := s.cfg.Netboot.Ignore(r.Context(), mac); err != nil {
		s.problem(w, r, http.StatusConflict, "Could not ignore "+mac, err.Error())
		return
	}
	http.Redirect(w, r, "/discovered?done="+url.QueryEscape("ignore:"+mac), http.StatusSeeOther)
}

// suggestName proposes a node name from a MAC: "node-" and its last three
// bytes in hex.
func suggestName(mac string) string {
	hex := strings.NewReplacer("-", "", ":", "").Replace(strings.ToLower(mac))
	if len(hex) > 6 {
		hex = hex[len(hex)-6:]
	}
	return "node-" + hex
}
