package web

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/a-h/templ"

	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/security"
	"github.com/discord-pxe/dpxe/web/templates"
	"github.com/discord-pxe/dpxe/web/view"
)

// Live updates: every open page subscribes to a topic (fleet, nodes in
// one sort order, one node, the newest events of one filter). Once per
// LiveEvery the hub renders each topic that has subscribers once, with the
// same components as the page, and sends each subscriber the parts whose
// HTML changed, as one server-sent event:
//
//	event: update
//	data: {"now":1732900000000,"parts":{"totals":"<section id=\"totals\"…"}}
//
// The page script replaces the element with that ID. A slow subscriber
// never blocks the others: parts wait in its pending set, newer ones
// replacing older ones.

// Stream parameters.
const (
	liveKeepalive     = 15 * time.Second
	liveWriteDeadline = 10 * time.Second
	maxSubscribers    = 500
	// maxSessionStreams bounds the streams of one logged-in session (one
	// per open page), so that one session cannot hold all
	// maxSubscribers.
	maxSessionStreams = 16
)

// subscriber is one open page.
type subscriber struct {
	mu      sync.Mutex
	pending map[string][]byte // part ID → JSON-encoded HTML
	notify  chan struct{}
}

func (sub *subscriber) offer(parts map[string][]byte) {
	sub.mu.Lock()
	for k, v := range parts {
		sub.pending[k] = v
	}
	sub.mu.Unlock()
	select {
	case sub.notify <- struct{}{}:
	default:
	}
}

// take returns the pending parts as one event payload, or nil.
func (sub *subscriber) take(now time.Time) []byte {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	if len(sub.pending) == 0 {
		return nil
	}
	var b bytes.Buffer
	b.WriteString(`{"now":`)
	b.WriteString(strconv.FormatInt(now.UnixMilli(), 10))
	b.WriteString(`,"parts":{`)
	first := true
	for k, v := range sub.pending {
		if !first {
			b.WriteByte(',')
		}
		first = false
		b.WriteString(strconv.Quote(k))
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteString("}}")
	clear(sub.pending)
	return b.Bytes()
}

// topic is one kind of live page with its subscribers.
type topic struct {
	subs   map[*subscriber]struct{}
	last   map[string][]byte // last coarse parts: what a new subscriber gets
	fine   map[string][]byte // last fine parts (shard-map head and groups)
	layout string            // the fine parts' layout; fine updates apply only while it holds
	failed bool              // its last rendering failed (logged once, not every period)
}

// rendered is one rendering of a topic. Coarse parts are whole page
// sections. Fine parts are pieces of one coarse part (fineOf): the shard
// map's head and groups, or the nodes table's rows. While the layout
// (block size and groups, or the rows in order) is unchanged, subscribers
// get only the fine parts that changed instead of the whole section, which
// is most of a large fleet or nodes page.
type rendered struct {
	coarse map[string][]byte
	fine   map[string][]byte
	layout string
}

// hub renders topics and fans parts out to subscribers.
type hub struct {
	s         *Server
	mu        sync.Mutex
	topics    map[string]*topic
	count     int
	bySession map[string]int // open streams per session ID
	closed    bool
	done      chan struct{} // closed by close: every stream ends
}

func newHub(s *Server) *hub {
	return &hub{s: s, topics: map[string]*topic{}, bySession: map[string]int{}, done: make(chan struct{})}
}

// close ends every stream and refuses new ones, so that an HTTP server's
// graceful shutdown does not wait for open dashboards.
func (h *hub) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.closed {
		h.closed = true
		close(h.done)
	}
}

// errClosed is returned when the dashboard is shutting down.
var errClosed = errors.New("the dashboard is shutting down")

// errTooMany is returned when maxSubscribers streams are open.
var errTooMany = fmt.Errorf("more than %d live pages are open", maxSubscribers)

// errSessionStreams is returned when a session has maxSessionStreams open.
var errSessionStreams = fmt.Errorf("this session has %d live pages open; close some", maxSessionStreams)

// subscribe adds a subscriber of session sid to key; it first receives
// the topic's last parts, if any.
func (h *hub) subscribe(key, sid string) (*subscriber, func(), error) {
	sub := &subscriber{pending: map[string][]byte{}, notify: make(chan struct{}, 1)}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, nil, errClosed
	}
	if h.bySession[sid] >= maxSessionStreams {
		h.mu.Unlock()
		return nil, nil, errSessionStreams
	}
	if h.count >= maxSubscribers {
		h.mu.Unlock()
		return nil, nil, errTooMany
	}
	h.bySession[sid]++
	t := h.topics[key]
	if t == nil {
		t = &topic{subs: map[*subscriber]struct{}{}}
		h.topics[key] = t
	}
	t.subs[sub] = struct{}{}
	h.count++
	last := t.last
	h.mu.Unlock()
	if last != nil {
		sub.offer(last)
	}
	return sub, func() {
		h.mu.Lock()
		if _, ok := t.subs[sub]; ok {
			delete(t.subs, sub)
			h.count--
			if h.bySession[sid]--; h.bySession[sid] <= 0 {
				delete(h.bySession, sid)
			}
		}
		if len(t.subs) == 0 && h.topics[key] == t {
			delete(h.topics, key)
		}
		h.mu.Unlock()
	}, nil
}

// run publishes every period until ctx ends, then ends every stream.
func (h *hub) run(ctx context.Context, every time.Duration) error {
	defer h.close()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			h.publish(ctx)
		}
	}
}

// publish renders every topic with subscribers once and offers the
// changed parts to its subscribers.
func (h *hub) publish(ctx context.Context) {
	h.mu.Lock()
	keys := make([]string, 0, len(h.topics))
	for k := range h.topics {
		keys = append(keys, k)
	}
	h.mu.Unlock()
	for _, key := range keys {
		r, err := h.s.renderTopic(ctx, key)
		h.mu.Lock()
		t := h.topics[key]
		if t == nil {
			h.mu.Unlock()
			continue
		}
		if err != nil {
			// Once per failure, not once per period (a node removed
			// while its page is open).
			first := !t.failed
			t.failed = true
			h.mu.Unlock()
			if first {
				h.s.log.Warn("dashboard: live update failed; retrying quietly", "topic", strings.ReplaceAll(key, "\x00", " "), "err", err)
			}
			continue
		}
		t.failed = false
		fineOK := r.fine != nil && t.fine != nil && r.layout == t.layout
		changed := map[string][]byte{}
		for id, v := range r.coarse {
			if fineOK && fineOf[id] {
				continue
			}
			if !bytes.Equal(t.last[id], v) {
				changed[id] = v
			}
		}
		if fineOK {
			for id, v := range r.fine {
				if !bytes.Equal(t.fine[id], v) {
					changed[id] = v
				}
			}
		}
		t.last, t.fine, t.layout = r.coarse, r.fine, r.layout
		subs := make([]*subscriber, 0, len(t.subs))
		for sub := range t.subs {
			subs = append(subs, sub)
		}
		h.mu.Unlock()
		if len(changed) == 0 {
			continue
		}
		for _, sub := range subs {
			sub.offer(changed)
		}
	}
}

// fineOf names the coarse parts that are sent as fine parts while their
// layout holds.
var fineOf = map[string]bool{"shardmap": true, "node-rows": true}

// topicKey validates a /live query and returns its topic key.
func topicKey(q url.Values) (string, bool) {
	switch q.Get("topic") {
	case "fleet":
		return "fleet", true
	case "nodes":
		key, desc := sortKey(q)
		v := url.Values{"sort": {key}}
		if desc {
			v.Set("dir", "desc")
		}
		if p := q.Get("page"); p != "" {
			v.Set("page", p)
		}
		return "nodes\x00" + v.Encode(), true
	case "node":
		if id := q.Get("id"); id != "" {
			return "node\x00" + id, true
		}
	case "events":
		node, kind := q.Get("node"), q.Get("kind")
		if kind != "" && !slices.Contains(controller.EventKinds, kind) {
			return "", false
		}
		return "events\x00" + eventFilter(node, kind).Encode(), true
	}
	return "", false
}

// renderTopic renders a topic's parts, each JSON-encoded.
func (s *Server) renderTopic(ctx context.Context, key string) (rendered, error) {
	coarse := map[string]templ.Component{}
	var fine map[string]templ.Component
	var layout strings.Builder
	p := view.Page{LoggedIn: true}
	kind, rest, _ := strings.Cut(key, "\x00")
	switch kind {
	case "fleet":
		v := s.fleetView(ctx, p)
		// Absolute times, so parts change only when the fleet does; the
		// page script shows them relative.
		v.Totals.PlanChanged.Stable = true
		for i := range v.Identify.Bars {
			v.Identify.Bars[i].LastGrant.Stable = true
		}
		coarse["totals"] = templates.TotalsPanel(v.Totals)
		coarse["budget"] = templates.BudgetPanel(v.Budget)
		coarse["identify"] = templates.IdentifyPanel(v.Identify)
		coarse["shardmap"] = templates.ShardMapPanel(v.Map)
		fine = map[string]templ.Component{"map-head": templates.ShardMapHead(v.Map)}
		fmt.Fprintf(&layout, "%d %v", v.Map.BlockSize, v.Map.Compact)
		for _, g := range v.Map.Groups {
			fine[g.ID()] = templates.MapGroup(g, v.Map.Compact)
			layout.WriteString(" " + g.ID())
		}
	case "nodes":
		q, _ := url.ParseQuery(rest)
		key, desc := sortKey(q)
		rows, _ := s.nodeRows(ctx, key, desc)
		page, _, _ := pageOf(rows, q)
		nb := s.cfg.Netboot != nil
		fine = map[string]templ.Component{}
		fmt.Fprintf(&layout, "%v", nb)
		for i := range page {
			page[i].Lease.Stable, page[i].LastCheckin.Stable = true, true
			fine[page[i].RowID()] = templates.NodeTableRow(page[i], nb)
			layout.WriteString(" " + page[i].RowID())
		}
		coarse["node-rows"] = templates.NodeRows(page, nb)
	case "node":
		v, err := s.nodeView(ctx, p, rest, false)
		if err != nil {
			return rendered{}, err
		}
		v.Row.Lease.Stable, v.Row.LastCheckin.Stable, v.StatusAt.Stable = true, true, true
		coarse["node-summary"] = templates.NodeSummary(v)
		coarse["node-actions"] = templates.NodeActions(v)
		coarse["node-shards"] = templates.NodeShards(v)
	case "events":
		q, _ := url.ParseQuery(rest)
		v := view.Events{Node: q.Get("node"), Kind: q.Get("kind")}
		if err := s.eventList(ctx, &v, 0); err != nil {
			return rendered{}, err
		}
		for i := range v.Rows {
			v.Rows[i].When.Stable = true
		}
		coarse["event-list"] = templates.EventList(v)
	default:
		return rendered{}, fmt.Errorf("unknown topic %q", key)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // the payload is HTML: keep <, > and & as they are
	encode := func(comps map[string]templ.Component) (map[string][]byte, error) {
		if comps == nil {
			return nil, nil
		}
		out := make(map[string][]byte, len(comps))
		var html bytes.Buffer
		for id, c := range comps {
			html.Reset()
			if err := c.Render(ctx, &html); err != nil {
				return nil, err
			}
			buf.Reset()
			if err := enc.Encode(html.String()); err != nil {
				return nil, err
			}
			out[id] = bytes.Clone(bytes.TrimSuffix(buf.Bytes(), []byte("\n")))
		}
		return out, nil
	}
	var r rendered
	var err error
	if r.coarse, err = encode(coarse); err != nil {
		return rendered{}, err
	}
	if r.fine, err = encode(fine); err != nil {
		return rendered{}, err
	}
	r.layout = layout.String()
	return r, nil
}

// live streams a topic's updates as server-sent events.
func (s *Server) live(w http.ResponseWriter, r *http.Request) {
	key, ok := topicKey(r.URL.Query())
	if !ok {
		http.Error(w, "live: topic must be fleet, nodes, node with id, or events (with a known kind, if any)", http.StatusBadRequest)
		return
	}
	// A node's topic is checked once, here: a stream for a node that does
	// not exist is refused instead of failing to render every period.
	if kind, id, _ := strings.Cut(key, "\x00"); kind == "node" {
		if _, err := s.cfg.Controller.Node(r.Context(), id); err != nil {
			http.Error(w, "live: "+err.Error(), http.StatusNotFound)
			return
		}
	}
	// The stream ends when its session does (log out, expiry).
	var sid string
	if c, err := r.Cookie(sessionCookie); err == nil {
		sid = c.Value
	}
	sub, cancel, err := s.hub.subscribe(key, sid)
	if errors.Is(err, errSessionStreams) {
		s.refusals.Refused(security.LiveStreams, security.Source(r.RemoteAddr), "dashboard: live stream refused, session at its cap",
			"cap", maxSessionStreams)
		http.Error(w, "live: "+err.Error(), http.StatusTooManyRequests)
		return
	}
	if err != nil {
		http.Error(w, "live: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	defer cancel()
	rc := http.NewResponseController(w)
	// The stream outlives the server's read timeout, whose expiry would
	// cancel the request: lift it (writes get their own deadline below).
	_ = rc.SetReadDeadline(time.Time{})
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	write := func(b []byte) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(liveWriteDeadline))
		if _, err := w.Write(b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if !write([]byte("retry: 3000\n\n")) {
		return
	}
	keep := time.NewTicker(liveKeepalive)
	defer keep.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-s.hub.done:
			return
		case <-keep.C:
			if s.sess.get(sid, s.cfg.Now()) == nil || !write([]byte(": keepalive\n\n")) {
				return
			}
		case <-sub.notify:
			if s.sess.get(sid, s.cfg.Now()) == nil {
				return
			}
			payload := sub.take(s.cfg.Now())
			if payload == nil {
				continue
			}
			msg := make([]byte, 0, len(payload)+32)
			msg = append(msg, "event: update\ndata: "...)
			msg = append(msg, payload...)
			msg = append(msg, "\n\n"...)
			if !write(msg) {
				return
			}
		}
	}
}
