package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/store"
	"github.com/discord-pxe/dpxe/tools/gatewayemu"
)

// heldGrant is what claimProxy did to the one granted claim answer it held.
type heldGrant struct {
	shard    uint32
	limit    time.Duration // the grant's use_within_ms (or the default)
	hold     time.Duration // how long the answer was held
	answered time.Time     // when the controller's answer reached the proxy
	released time.Time     // when the proxy passed it on to the node
}

// labProxy is a reverse proxy in the lab's namespace between the nodes and
// `dpxe serve`: a real controller behind a network that misbehaves in one
// chosen way. It passes everything through, except that
//   - with holdGrant, it holds the first granted answer to POST
//     /v1/identify for longer than the grant may be used, as a congested
//     switch or a retransmitted segment would;
//   - with claimCapacity > 0, it tells the controller that capacity in each
//     check-in, whatever the node reported (so the controller assigns the
//     node more than it can run), and records the largest sum of health
//     counts a node reported.
type labProxy struct {
	holdGrant     bool
	claimCapacity int

	mu        sync.Mutex
	held      *heldGrant
	checkins  int
	maxHealth int    // largest ready+starting+backoff+fatal a node reported
	url       string // the proxy's base URL, for the nodes' controller=
}

// startLabProxy listens on addr in the lab's namespace and forwards to the
// lab's controller, dialling from inside the namespace too.
func startLabProxy(t *testing.T, l *gwLab, addr string, p *labProxy) *labProxy {
	t.Helper()
	target, err := url.Parse(l.server)
	if err != nil {
		t.Fatal(err)
	}
	p.url = "http://" + addr
	rp := httputil.NewSingleHostReverseProxy(target)
	director := rp.Director
	rp.Director = func(r *http.Request) {
		director(r)
		if p.claimCapacity > 0 && strings.HasSuffix(r.URL.Path, "/v1/checkin") && r.Body != nil {
			body, err := io.ReadAll(r.Body)
			r.Body.Close()
			var req appliance.CheckinRequest
			if err == nil && json.Unmarshal(body, &req) == nil {
				p.mu.Lock()
				p.checkins++
				p.maxHealth = max(p.maxHealth, req.ReadyShards+req.StartingShards+req.BackoffShards+req.FatalShards)
				p.mu.Unlock()
				req.Capacity = p.claimCapacity
				body, _ = json.Marshal(req)
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			r.ContentLength = int64(len(body))
			r.Header.Set("Content-Length", strconv.Itoa(len(body)))
		}
	}
	rp.Transport = &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
			var c net.Conn
			err := inNetns(l.ns.Name, func() (err error) {
				c, err = (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, address)
				return err
			})
			return c, err
		},
	}
	rp.ModifyResponse = func(resp *http.Response) error {
		if !strings.HasSuffix(resp.Request.URL.Path, "/v1/identify") || resp.StatusCode != http.StatusOK {
			return nil
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		var r appliance.IdentifyResponse
		if !p.holdGrant || json.Unmarshal(body, &r) != nil || !r.Granted {
			return nil
		}
		p.mu.Lock()
		first := p.held == nil
		var h *heldGrant
		if first {
			within := r.UseWithinMS
			if within == 0 {
				within = appliance.DefaultGrantUseWithinMS
			}
			limit := time.Duration(within) * time.Millisecond
			h = &heldGrant{shard: r.ShardID, limit: limit, hold: limit + 750*time.Millisecond, answered: time.Now()}
			p.held = h
		}
		p.mu.Unlock()
		if first {
			time.Sleep(h.hold)
			p.mu.Lock()
			h.released = time.Now()
			p.mu.Unlock()
		}
		return nil
	}
	ln, err := listenInNetns(l.ns.Name, addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: rp, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return p
}

// heldAnswer returns the held grant once the proxy has passed it on.
func (p *labProxy) heldAnswer() (heldGrant, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held == nil || p.held.released.IsZero() {
		return heldGrant{}, false
	}
	return *p.held, true
}

// TestKernelGatewayLateGrant is issue 22's grant rule on a real node: a
// proxy between the node and `dpxe serve` holds the first granted Identify
// claim answer for longer than the grant may be used (use_within_ms, 250 ms
// when the answer has none). The node must discard it and say so, claim
// again with unused_grant (the controller logs identify_unused and refuses
// with bucket_busy until its window is over),
// then Identify on a fresh grant and reach READY; each shard identifies
// once, nothing identifies while the late grant is in the air, and the
// emulator records no violation (no early Identify of a bucket).
func TestKernelGatewayLateGrant(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const subnet = "10.90.0"
	l := newGWLab(t, ctx, subnet, gatewayemu.Options{HeartbeatInterval: time.Second, Shards: 2, MaxConcurrency: 1},
		"--total-shards", "2", "--lease", "15s")
	proxy := startLabProxy(t, l, subnet+".1:8081", &labProxy{holdGrant: true})
	l.nodeController = proxy.url
	n := l.boot("gw-late", "e1000", 2)

	line := n.serial.waitFor(regexp.MustCompile(`shard (\d+): grant arrived after (\d+) ms, past its (\d+) ms limit: discarded`), 90*time.Second)
	if line == nil {
		t.Fatal("no console line discarding the late grant")
	}
	held, ok := proxy.heldAnswer()
	for i := 0; !ok && i < 50; i++ {
		time.Sleep(100 * time.Millisecond)
		held, ok = proxy.heldAnswer()
	}
	if !ok {
		t.Fatal("the proxy held no granted answer")
	}
	shard, _ := strconv.Atoi(line[1])
	elapsed, _ := strconv.Atoi(line[2])
	limit, _ := strconv.Atoi(line[3])
	t.Logf("held shard %d's grant %v (limit %v); the node said: %s", held.shard, held.hold, held.limit, line[0])
	if uint32(shard) != held.shard {
		t.Errorf("the node discarded shard %d's grant, the proxy held shard %d's", shard, held.shard)
	}
	if time.Duration(limit)*time.Millisecond != held.limit {
		t.Errorf("the node's limit is %d ms, the grant's %v", limit, held.limit)
	}
	if time.Duration(elapsed)*time.Millisecond < held.hold {
		t.Errorf("the node measured %d ms from its claim to the answer, less than the %v the answer was held", elapsed, held.hold)
	}

	l.awaitEmu(90*time.Second, "both shards READY with 2 heartbeats", func(s gatewayemu.State) bool {
		m := readySessions(s, 2)
		return m[0] == 1 && m[1] == 1
	})
	ids := l.emu.Identifies()
	if len(ids) != 2 {
		t.Errorf("%d Identifies reached the Gateway, want 2 (one per shard, none on the late grant): %+v", len(ids), ids)
	}
	for s := 0; s < 2; s++ {
		if got := l.identifiesOf(s); got != 1 {
			t.Errorf("shard %d: %d accepted Identifies, want 1", s, got)
		}
	}
	// The held shard identified on a later grant: after the late answer
	// reached it, and after a second identify_granted for it.
	grants, err := l.grants()
	if err != nil {
		t.Fatal(err)
	}
	var heldGrants []time.Time
	for _, e := range grants {
		if e.ShardID != nil && *e.ShardID == held.shard {
			heldGrants = append(heldGrants, e.At)
		}
	}
	for _, r := range ids {
		if r.Shard == nil || uint32(r.Shard[0]) != held.shard {
			continue
		}
		if r.Time.Before(held.released) {
			t.Errorf("shard %d identified at %v, before its late grant reached the node (%v)", held.shard, r.Time, held.released)
		}
		if len(heldGrants) < 2 || r.Time.Before(heldGrants[len(heldGrants)-1]) {
			t.Errorf("shard %d's Identify at %v did not follow a second grant (grants at %v)", held.shard, r.Time, heldGrants)
		} else {
			t.Logf("shard %d: late grant answered %v, passed on %v later; Identify %v after the first grant, on grant %d",
				held.shard, held.answered.Format("15:04:05.000"), held.hold, r.Time.Sub(heldGrants[0]).Round(time.Millisecond), len(heldGrants))
		}
	}
	// The claim after the discarded grant said so (unused_grant): the
	// controller logged one identify_unused for the shard.
	var unused struct {
		Events []store.Event `json:"events"`
	}
	if err := l.adminGet("/v1/events?kind="+controller.EventIdentifyUnused+"&limit=100", &unused); err != nil {
		t.Fatal(err)
	}
	reported := 0
	for _, e := range unused.Events {
		if e.ShardID != nil && *e.ShardID == held.shard {
			reported++
		}
	}
	if reported != 1 {
		t.Errorf("%d identify_unused events for shard %d, want 1 (the claim after the late grant says unused_grant)", reported, held.shard)
	}
	if re := regexp.MustCompile(`late_grants=1 `); n.serial.waitFor(re, 12*time.Second) == nil {
		t.Error("the node line does not count one late grant (late_grants=1)")
	}
	if v := l.emu.Violations(); len(v) != 0 {
		t.Errorf("emulator violations: %+v", v)
	}
}

// TestKernelGatewayCapacity is issue 22's capacity rule on a real node: it
// boots with capacity 3 while a proxy tells the controller 8, so the
// controller's answer assigns it all 8 shards. The node runs only the
// lowest 3, says so in one console line, reports the other 5 ASSIGNED, and
// never reports health counts above 3; the Gateway sees sessions of shards
// 0-2 only.
func TestKernelGatewayCapacity(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const subnet = "10.91.0"
	l := newGWLab(t, ctx, subnet, gatewayemu.Options{HeartbeatInterval: time.Second, Shards: 8, MaxConcurrency: 8},
		"--total-shards", "8", "--lease", "15s", "--max-concurrency", "8")
	proxy := startLabProxy(t, l, subnet+".1:8081", &labProxy{claimCapacity: 8})
	l.nodeController = proxy.url
	n := l.boot("gw-cap", "virtio-net-pci", 3)

	want := regexp.MustCompile(`capacity: the plan gives this node 8 startable shards, more than its capacity 3 allows: the lowest 3 run, 5 held \(not started\)`)
	if n.serial.waitFor(want, 60*time.Second) == nil {
		t.Fatal("no console line saying the plan exceeds the capacity")
	}
	l.awaitEmu(60*time.Second, "shards 0-2 READY with 3 heartbeats", func(s gatewayemu.State) bool {
		m := readySessions(s, 3)
		return m[0] == 1 && m[1] == 1 && m[2] == 1
	})
	// Three more check-ins (next_checkin_ms is a third of the 15 s lease
	// at most) after READY: none may start a held shard.
	proxy.mu.Lock()
	seen := proxy.checkins
	proxy.mu.Unlock()
	deadline := time.Now().Add(30 * time.Second)
	for {
		proxy.mu.Lock()
		c := proxy.checkins
		proxy.mu.Unlock()
		if c >= seen+3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d check-ins in 30 s", c-seen)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, ses := range l.emu.Sessions() {
		if ses.Shard[0] > 2 {
			t.Errorf("shard %d (held) has a Gateway session: %+v", ses.Shard[0], ses)
		}
	}
	if got := strings.Count(n.serial.String(), "capacity: the plan gives"); got != 1 {
		t.Errorf("the capacity line was printed %d times, want once", got)
	}
	proxy.mu.Lock()
	maxHealth, checkins := proxy.maxHealth, proxy.checkins
	proxy.mu.Unlock()
	if maxHealth > 3 {
		t.Errorf("a check-in reported %d shards in health counts, more than the capacity 3", maxHealth)
	}
	t.Logf("%d check-ins through the proxy, largest health count %d", checkins, maxHealth)
	d, err := l.nodeDetail("gw-cap")
	if err != nil {
		t.Fatal(err)
	}
	states := map[uint32]appliance.ShardState{}
	for _, s := range d.Shards {
		states[s.ID] = s.State
	}
	for id := uint32(0); id < 8; id++ {
		want := appliance.ShardAssigned
		if id < 3 {
			want = appliance.ShardReady
		}
		if states[id] != want {
			t.Errorf("shard %d is %q at the controller, want %q (all: %v)", id, states[id], want, states)
		}
	}
	if v := l.emu.Violations(); len(v) != 0 {
		t.Errorf("emulator violations: %+v", v)
	}
}
