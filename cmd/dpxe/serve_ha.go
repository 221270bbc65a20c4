package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/api"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// Controller replicas (issue 20, docs/ha.md). With a postgres:// --db,
// every `dpxe serve` is a replica: it campaigns for the store's leader
// lease every third of --leader-lease, leads while it holds it
// (controller.Lead, fenced writes), and otherwise forwards node and
// operator API requests to the leader's advertised URL. Each replica
// heartbeats its row in the replicas table with the URLs nodes reach it
// by (nodeURLs); the check-in answer lists the live replicas' URLs of the
// way the node came (controllersByRoute). On SQLite there is one process
// and no replica layer.

const (
	// defaultLeaderLease is the leader lease: a dead leader's successor
	// acts within about this long.
	defaultLeaderLease = 10 * time.Second
	// forwardedHeader marks a request one replica forwarded to another,
	// so a request is forwarded at most once.
	forwardedHeader = "X-Dpxe-Forwarded"
)

// haConfig is the replica part of serveConfig.
type haConfig struct {
	// ReplicaID names this replica in the replicas table (default: the
	// host name and the --listen port).
	ReplicaID string `json:"replica_id"`
	// AdvertiseURL is how nodes and the other replicas reach this one
	// (default: http:// and the --listen address, the host name when it
	// listens on every address).
	AdvertiseURL string `json:"advertise_url"`
	// LeaderLease is the leader lease, renewed every third of it.
	LeaderLease duration `json:"leader_lease"`
}

var haFlags struct {
	id, advertise string
	lease         time.Duration
}

func init() {
	registerServePart(servePart{
		name: "replicas",
		flags: func(fs *flag.FlagSet) {
			fs.StringVar(&haFlags.id, "replica-id", "", "this replica's name in `dpxe replicas` (postgres:// --db; default: host name and --listen port)")
			fs.StringVar(&haFlags.advertise, "advertise-url", "", "URL nodes and other replicas use to reach this one (postgres:// --db; default: http:// and the --listen address)")
			fs.DurationVar(&haFlags.lease, "leader-lease", defaultLeaderLease, "leader lease among replicas on one PostgreSQL (2s..2m); renewed every third of it")
		},
		apply:  applyHAFlags,
		attach: attachHA,
	})
}

func applyHAFlags(fs *flag.FlagSet, cfg *serveConfig) error {
	h := &cfg.haConfig
	if h.LeaderLease == 0 {
		h.LeaderLease = duration(defaultLeaderLease)
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "replica-id":
			h.ReplicaID = haFlags.id
		case "advertise-url":
			h.AdvertiseURL = haFlags.advertise
		case "leader-lease":
			h.LeaderLease = duration(haFlags.lease)
		}
	})
	if l := time.Duration(h.LeaderLease); l < 2*time.Second || l > 2*time.Minute {
		return fmt.Errorf("%w: leader_lease %v out of range 2s..2m", errUsage, l)
	}
	if h.AdvertiseURL != "" {
		u, err := url.Parse(h.AdvertiseURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
			return fmt.Errorf("%w: advertise_url %q: want http://HOST:PORT or https://HOST:PORT", errUsage, h.AdvertiseURL)
		}
		h.AdvertiseURL = strings.TrimSuffix(h.AdvertiseURL, "/")
	}
	if len(h.ReplicaID) > 128 {
		return fmt.Errorf("%w: replica_id longer than 128 bytes", errUsage)
	}
	return nil
}

// replica is one `dpxe serve` among several on one PostgreSQL.
type replica struct {
	app    *fleetApp
	log    *slog.Logger
	lease  time.Duration
	id     string // --replica-id
	holder string // unique per process: id and a random suffix
	poke   chan struct{}
	// ready is closed after the first campaign: until then requests wait
	// (at most a lease) instead of being refused for want of a leader.
	ready     chan struct{}
	readyOnce sync.Once

	// forwardKey signs and checks the client address of forwarded
	// requests (serve_forwardfor.go); the same on every replica.
	forwardKey []byte

	mu        sync.Mutex
	advertise string
	// nodeURLs are the URLs nodes reach this replica by, per route
	// (nodeURLs, store.Replica.NodeURLs).
	nodeURLs map[string]string
	// tlsPin is the pin of the key this replica serves nodes HTTPS with
	// ("" without HTTPS); pinWarned, the other replicas' pins it has
	// logged as different from it (checkPins).
	tlsPin    string
	pinWarned map[string]string
	started   time.Time
	proxies   map[string]*httputil.ReverseProxy
	// fallbackAt is when a check-in that the leader did not answer was
	// last logged (fallbackNews).
	fallbackAt time.Time
	// leaderDown is, per leader URL, until when Identify claims skip
	// forwarding (leaderFailed).
	leaderDown map[string]time.Time
}

// haTestMutation is empty in every build but the replica tests' mutated
// ones, which set it with -ldflags -X (serve_ha_test.go):
// "answer-before-lease-commit" commits node lease renewals after the
// answer (controller.AnswerBeforeLeaseCommit), "first-lease-only" only
// each node's first renewal of a term (controller.CommitFirstLeaseOnly),
// "no-follower-renewal" makes a follower answer 503 to a check-in or
// claim no leader answers, as before renewals without a leader,
// "no-follower-grants" only to a claim, as before grants without one, and
// "expire-unchecked" makes a leader expire nodes on its memory's
// deadline (controller.ExpireWithoutStoreCheck).
var haTestMutation string

func attachHA(ctx context.Context, app *fleetApp, log *slog.Logger) (func(context.Context) error, error) {
	if !store.IsPostgresURL(app.cfg.DB) {
		return nil, nil
	}
	var suffix [6]byte
	if _, err := rand.Read(suffix[:]); err != nil {
		return nil, err
	}
	r := &replica{app: app, log: log, lease: time.Duration(app.cfg.LeaderLease), id: app.cfg.ReplicaID,
		poke: make(chan struct{}, 1), ready: make(chan struct{}), started: time.Now(), proxies: map[string]*httputil.ReverseProxy{}}
	r.holder = "-" + hex.EncodeToString(suffix[:])
	kctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	key, err := forwardKey(kctx, app.store)
	cancel()
	if err != nil {
		return nil, err
	}
	r.forwardKey = key
	app.controller.EnableHA(func(error) { r.wake() })
	if haTestMutation == "answer-before-lease-commit" {
		log.Warn("deliberate test mutation: lease renewals committed after the answer")
		app.controller.AnswerBeforeLeaseCommit()
	}
	if haTestMutation == "first-lease-only" {
		log.Warn("deliberate test mutation: only first lease renewals committed")
		app.controller.CommitFirstLeaseOnly()
	}
	if haTestMutation == "expire-unchecked" {
		log.Warn("deliberate test mutation: nodes expired without reading their stored lease")
		app.controller.ExpireWithoutStoreCheck()
	}
	app.ha = r
	app.mux.HandleFunc("GET /v1/replicas", r.listReplicas)
	return r.run, nil
}

func (r *replica) wake() {
	select {
	case r.poke <- struct{}{}:
	default:
	}
}

// names fills in the replica ID and advertised URL from the listen
// address, once it is known.
func (r *replica) names() {
	addr := r.app.listenAddr
	host, port, _ := net.SplitHostPort(addr)
	name, _ := os.Hostname()
	if name == "" {
		name = "localhost"
	}
	if r.id == "" {
		r.id = name + ":" + port
	}
	r.holder = r.id + r.holder
	r.mu.Lock()
	defer r.mu.Unlock()
	r.advertise = r.app.cfg.AdvertiseURL
	if r.advertise == "" {
		if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
			host = name
		}
		r.advertise = "http://" + net.JoinHostPort(host, port)
	}
	var tlsPort string
	if r.app.cfg.TLSListen != "" && r.app.tls != nil {
		_, tlsPort, _ = net.SplitHostPort(r.app.cfg.TLSListen)
	}
	var bootHTTP, bootHTTPS string
	if b := r.app.boot; b != nil {
		bootHTTP, bootHTTPS = b.httpURL, b.httpsURL
	}
	r.nodeURLs = nodeURLs(r.advertise, port, tlsPort, bootHTTP, bootHTTPS)
	if r.app.tls != nil {
		r.tlsPin = r.app.tls.Pin
	}
}

// nodeURLs are the URLs nodes reach a replica by, per route
// (controller.Route): on the management network the advertised URL for
// its scheme and, for the other scheme, the advertised host with the
// --listen port (http) or the --tls-listen port (https, when it serves
// HTTPS); on the boot network its netboot URLs (bootRoute). A route
// without a listener has none.
func nodeURLs(advertise, listenPort, tlsPort, bootHTTP, bootHTTPS string) map[string]string {
	m := map[string]string{}
	u, err := url.Parse(advertise)
	if err == nil {
		m[u.Scheme] = advertise
		switch {
		case u.Scheme == "http" && tlsPort != "":
			m[string(controller.RouteHTTPS)] = "https://" + net.JoinHostPort(u.Hostname(), tlsPort)
		case u.Scheme == "https" && listenPort != "":
			m[string(controller.RouteHTTP)] = "http://" + net.JoinHostPort(u.Hostname(), listenPort)
		}
	}
	if bootHTTP != "" {
		m[string(controller.RouteBootHTTP)] = bootHTTP
	}
	if bootHTTPS != "" {
		m[string(controller.RouteBootHTTPS)] = bootHTTPS
	}
	return m
}

// run campaigns every third of the lease until ctx ends, then resigns.
func (r *replica) run(ctx context.Context) error {
	r.names()
	c := r.app.controller
	st := r.app.store
	r.log.Info("replica starting", "replica", r.id, "advertise", r.advertise, "node_urls", r.nodeURLs, "leader_lease", r.lease)
	every := r.lease / 3
	margin := r.lease / 10
	leading, term := false, uint64(0)
	observed := time.Time{}
	for {
		start := time.Now()
		// A renewal may take longer than its period on a busy database:
		// the trust deadline, not this timeout, bounds the leadership.
		cctx, cancel := context.WithTimeout(ctx, r.lease/2)
		l, err := st.Campaign(cctx, r.holder, r.advertise, r.lease)
		cancel()
		switch {
		case ctx.Err() != nil:
		case err != nil:
			r.log.Warn("leader campaign failed", "err", err, "leading", leading)
			if leading && !c.Role().Leading {
				leading = false
				c.Follow(term, "")
				r.log.Warn("role changed", "role", "follower", "term", term, "reason", "lease not renewed in time")
			}
		case l.Leader && (!leading || l.Term != term || !c.HoldsTerm(l.Term)):
			lctx, cancel := context.WithTimeout(ctx, r.lease-margin)
			err := c.Lead(lctx, store.Fence{Holder: r.holder, Term: l.Term}, r.advertise, start.Add(r.lease-margin))
			cancel()
			if err != nil {
				r.log.Error("taking the lead failed", "term", l.Term, "err", err)
				leading = false
				break
			}
			leading, term = true, l.Term
			r.log.Info("role changed", "role", "leader", "term", term, "replica", r.id)
		case l.Leader:
			c.Renewed(term, start.Add(r.lease-margin))
		default:
			if leading {
				r.log.Warn("role changed", "role", "follower", "term", l.Term, "leader", l.URL)
			}
			leading, term = false, l.Term
			c.Follow(l.Term, l.URL)
			if time.Since(observed) >= r.lease {
				observed = time.Now()
				octx, cancel := context.WithTimeout(ctx, every)
				if err := c.Observe(octx); err != nil {
					r.log.Warn("reading the fleet's state failed", "err", err)
				}
				cancel()
			}
		}
		if ctx.Err() == nil {
			r.heartbeat(ctx, every)
		}
		r.readyOnce.Do(func() { close(r.ready) })
		select {
		case <-ctx.Done():
			return r.stop(leading, term)
		case <-time.After(time.Until(start.Add(every))):
		case <-r.poke:
		}
	}
}

// heartbeat records this replica and refreshes the controller URLs that
// check-in answers carry.
func (r *replica) heartbeat(ctx context.Context, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	role := r.app.controller.Role()
	st := r.app.store
	if err := st.Heartbeat(ctx, store.Replica{ID: r.id, URL: r.advertise, NodeURLs: r.nodeURLs, TLSPin: r.tlsPin,
		Role: role.Name(), Term: role.Term, StartedAt: r.started}); err != nil {
		r.log.Warn("replica heartbeat failed", "err", err)
		return
	}
	rs, err := st.Replicas(ctx, r.lease)
	if err != nil {
		r.log.Warn("listing replicas failed", "err", err)
		return
	}
	r.app.controller.SetControllers(controllersByRoute(rs))
	r.checkPins(rs)
}

// checkPins logs, once per replica and key, each live replica serving
// nodes HTTPS with a key other than this replica's: a node pinned to one
// key refuses the other replica, so it cannot move there when this one
// fails (docs/ha.md). The answers still list it; the fix is the
// operator's (one --tls-cert/--tls-key for every replica).
func (r *replica) checkPins(rs []store.Replica) {
	for _, x := range differentPins(r.id, r.tlsPin, rs) {
		if r.pinWarned[x.ID] == x.TLSPin {
			continue
		}
		if r.pinWarned == nil {
			r.pinWarned = map[string]string{}
		}
		r.pinWarned[x.ID] = x.TLSPin
		r.log.Error("another replica serves HTTPS with another key: nodes pinned to this one's key cannot move to it, nor its nodes here; give every replica the same --tls-cert and --tls-key (docs/ha.md)",
			"replica", x.ID, "its_pin", x.TLSPin, "pin", r.tlsPin)
	}
}

// differentPins returns the replicas of rs other than id that serve HTTPS
// with a key other than pin, when pin is one (a replica without HTTPS has
// no key for nodes to pin).
func differentPins(id, pin string, rs []store.Replica) []store.Replica {
	var out []store.Replica
	for _, x := range rs {
		if pin != "" && x.ID != id && x.TLSPin != "" && x.TLSPin != pin {
			out = append(out, x)
		}
	}
	return out
}

// controllersByRoute lists, per route, the URLs of the replicas rs (in
// their order) that nodes coming that way can use: each replica's node
// URL of the route, or for a replica that recorded none (a version before
// node URLs) its advertised URL on the management route of its scheme.
// A replica without a URL of the route is left out of that route's list,
// so a node is never handed a URL of another network or scheme.
func controllersByRoute(rs []store.Replica) map[controller.Route][]string {
	out := map[controller.Route][]string{}
	for _, route := range controller.Routes {
		urls := []string{}
		for _, x := range rs {
			u := x.NodeURLs[string(route)]
			if x.NodeURLs == nil && strings.HasPrefix(x.URL, string(route)+"://") {
				u = x.URL
			}
			if u != "" {
				urls = append(urls, u)
			}
		}
		out[route] = urls
	}
	return out
}

// stop resigns the lease (so another replica leads at once) and removes
// this replica's row.
func (r *replica) stop(leading bool, term uint64) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c := r.app.controller
	if leading {
		// Write what is staged under the lease first, then let it go.
		if err := c.Flush(ctx); err != nil {
			r.log.Warn("last flush before resigning", "err", err)
		}
		c.Follow(term, "")
		if err := r.app.store.Resign(ctx, r.holder, term); err != nil {
			r.log.Warn("resigning the leader lease failed", "err", err)
		} else {
			r.log.Info("resigned the leader lease", "term", term)
		}
	}
	if err := r.app.store.DeleteReplica(ctx, r.id); err != nil {
		r.log.Warn("removing the replica row failed", "err", err)
	}
	return nil
}

// forwarded reports whether a request goes to the leader while this
// replica follows: node and operator API requests (/v1/..., but
// /v1/replicas, which each replica answers), and the dashboard's actions
// (every POST outside /v1/ but logging in and out, which work on stored
// sessions). A dashboard action carries the operator's session cookie and
// CSRF token, which the leader checks against the same stored session.
func forwarded(req *http.Request) bool {
	p := req.URL.Path
	if strings.HasPrefix(p, "/v1/") {
		return p != "/v1/replicas"
	}
	return req.Method == http.MethodPost && p != "/login" && p != "/logout"
}

// forward wraps the API and the dashboard: while this replica does not
// lead, what forwarded names goes to the leader's advertised URL, once;
// without a reachable leader it gets 503 with Retry-After.
func (r *replica) forward(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if !forwarded(req) {
			h.ServeHTTP(w, req)
			return
		}
		select {
		case <-r.ready:
		case <-req.Context().Done():
			return
		case <-time.After(r.lease):
		}
		role := r.app.controller.Role()
		// The way the node came: the listener's, or for a request a
		// follower forwarded, the one it signed (verifyForwarded).
		route := controller.RouteOf(cameByBoot(req.Context()), req.TLS != nil)
		if role.Leading {
			via, err := r.verifyForwarded(req)
			if err != nil {
				r.log.Warn("forwarded request's client address refused; the connection's address stands",
					"from", req.RemoteAddr, "path", req.URL.Path, "err", err)
			} else if via != "" {
				route = via
			}
			h.ServeHTTP(w, req.WithContext(controller.WithRoute(req.Context(), route)))
			return
		}
		r.mu.Lock()
		self := r.advertise
		r.mu.Unlock()
		// A node's check-in or Identify claim that no leader answers,
		// this replica answers itself: a check-in that asks for nothing
		// but its lease, a claim the store lets it grant (renewals and
		// grants without a leader, docs/ha.md); a request another replica
		// forwarded goes back to it, which does the same.
		var fallback func(http.ResponseWriter)
		if req.Method == http.MethodPost && req.Header.Get(forwardedHeader) == "" && haTestMutation != "no-follower-renewal" &&
			(req.URL.Path == "/v1/checkin" || (req.URL.Path == "/v1/identify" && haTestMutation != "no-follower-grants")) {
			body, err := io.ReadAll(io.LimitReader(req.Body, appliance.MaxCheckinBody+1))
			if err != nil {
				unavailable(w, req, "reading the request failed: "+err.Error())
				return
			}
			local := req.Clone(controller.ReceivedAt(controller.AnswerAsFollower(controller.WithRoute(req.Context(), route)), time.Now()))
			local.Body = io.NopCloser(bytes.NewReader(body))
			req.Body = io.NopCloser(bytes.NewReader(body))
			fallback = func(w http.ResponseWriter) { h.ServeHTTP(w, local) }
		}
		if role.LeaderURL == "" || role.LeaderURL == self || req.Header.Get(forwardedHeader) != "" ||
			(fallback != nil && req.URL.Path == "/v1/identify" && r.leaderIsDown(role.LeaderURL)) {
			if fallback != nil {
				fallback(w)
				return
			}
			unavailable(w, req, "no controller replica leads right now; retry, or ask another replica")
			return
		}
		req.Header.Set(forwardedHeader, r.id)
		r.signForwarded(req, route)
		if fallback != nil {
			req = req.WithContext(context.WithValue(req.Context(), fallbackKey{}, fallback))
		}
		r.proxy(role.LeaderURL, fallback != nil).ServeHTTP(w, req)
	})
}

// fallbackNews reports whether a check-in that this replica answers
// itself because the leader did not should be logged and wake the
// campaign loop: at most once per third of the leader lease, so a fleet
// checking in while the leader is cut off neither floods the log nor
// runs a campaign per check-in.
func (r *replica) fallbackNews() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.fallbackAt) < r.lease/3 {
		return false
	}
	r.fallbackAt = time.Now()
	return true
}

// leaderFailed notes that the leader at target did not answer a node
// request this replica then answered itself: for the next sixth of the
// node lease (at most a third of the leader lease) Identify claims are
// answered here without trying the leader first. A forwarding attempt
// costs up to the proxy's timeouts, and a grant answered that late is
// past its use_within_ms (a quarter second by default): the node would
// discard it and its budget would be spent for nothing. Check-ins still
// try the leader first: one that changes state (an acknowledgement, a
// joining node) needs it, and a renewal has a third of the node lease.
func (r *replica) leaderFailed(target string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.leaderDown == nil {
		r.leaderDown = map[string]time.Time{}
	}
	clear(r.leaderDown) // only the latest leader matters
	r.leaderDown[target] = time.Now().Add(min(r.lease/3, time.Duration(r.app.cfg.Lease)/6))
}

// leaderIsDown reports whether the leader at target failed a node
// request recently (leaderFailed).
func (r *replica) leaderIsDown(target string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return time.Now().Before(r.leaderDown[target])
}

// fallbackKey carries, in a forwarded check-in's or claim's context, how
// this replica answers it itself when the leader does not (forward).
type fallbackKey struct{}

// errLeaderUnavailable is a leader's 503 to a forwarded check-in.
var errLeaderUnavailable = errors.New("the leader answered 503")

// unavailable answers 503 with Retry-After: JSON for the API, text for
// the dashboard's forms.
func unavailable(w http.ResponseWriter, req *http.Request, why string) {
	w.Header().Set("Retry-After", "1")
	if strings.HasPrefix(req.URL.Path, "/v1/") {
		b, _ := json.Marshal(map[string]string{"error": why})
		http.Error(w, string(b), http.StatusServiceUnavailable)
		return
	}
	http.Error(w, "This dashboard's replica follows and "+why+".", http.StatusServiceUnavailable)
}

// proxy returns the reverse proxy to a leader URL: for node check-ins
// and Identify claims this replica may answer itself (checkin), or for
// everything else.
func (r *replica) proxy(target string, checkin bool) *httputil.ReverseProxy {
	key := target
	if checkin {
		key += " checkin"
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := r.proxies[key]; p != nil {
		return p
	}
	u, err := url.Parse(target)
	if err != nil {
		u = &url.URL{Scheme: "http", Host: "invalid"}
	}
	p := httputil.NewSingleHostReverseProxy(u)
	dial, answer := r.lease/10, r.lease/3
	if checkin {
		// A node asks another replica after a third of its lease without
		// an answer: a leader that does not answer is given up well
		// before, so that this replica still answers the node's renewal
		// itself (forward), however long the leader lease.
		nodeLease := time.Duration(r.app.cfg.Lease)
		dial, answer = min(dial, nodeLease/10), min(answer, nodeLease/6)
	}
	p.Transport = &http.Transport{
		DialContext:           (&net.Dialer{Timeout: dial}).DialContext,
		ResponseHeaderTimeout: answer,
		MaxIdleConnsPerHost:   16,
	}
	p.ErrorLog = slog.NewLogLogger(r.log.Handler(), slog.LevelWarn)
	p.ModifyResponse = func(resp *http.Response) error {
		if _, ok := resp.Request.Context().Value(fallbackKey{}).(func(http.ResponseWriter)); ok && resp.StatusCode == http.StatusServiceUnavailable {
			return errLeaderUnavailable
		}
		return nil
	}
	p.ErrorHandler = func(w http.ResponseWriter, req *http.Request, err error) {
		if fallback, ok := req.Context().Value(fallbackKey{}).(func(http.ResponseWriter)); ok {
			r.leaderFailed(target)
			if !errors.Is(err, errLeaderUnavailable) && r.fallbackNews() {
				r.log.Warn("forwarding node requests to the leader fails; answering renewals and Identify claims here", "leader", target, "err", err)
				r.wake()
			}
			fallback(w)
			return
		}
		r.log.Warn("forwarding to the leader failed", "leader", target, "path", req.URL.Path, "err", err)
		r.wake()
		unavailable(w, req, "the leading controller replica does not answer; retry, or ask another replica")
	}
	if len(r.proxies) > 32 {
		clear(r.proxies)
	}
	r.proxies[key] = p
	return p
}

// replicasResponse is the body of GET /v1/replicas.
type replicasResponse struct {
	Replicas []store.Replica `json:"replicas"`
	// Answered is the answering replica's role.
	Answered controller.Role `json:"answered"`
	Replica  string          `json:"replica"`
}

// listReplicas answers GET /v1/replicas (admin token): every replica row
// with its heartbeat's age, from this replica (never forwarded).
func (r *replica) listReplicas(w http.ResponseWriter, req *http.Request) {
	got := api.HashToken(strings.TrimPrefix(req.Header.Get("Authorization"), "Bearer "))
	if subtle.ConstantTimeCompare(got[:], r.app.adminHash[:]) != 1 {
		w.Header().Set("WWW-Authenticate", `Bearer realm="dpxe"`)
		http.Error(w, `{"error":"admin token required"}`, http.StatusUnauthorized)
		return
	}
	ctx, cancel := context.WithTimeout(req.Context(), 5*time.Second)
	defer cancel()
	rs, err := r.app.store.Replicas(ctx, 0)
	if err != nil {
		r.log.Error("listing replicas", "err", err)
		http.Error(w, `{"error":"store unavailable"}`, http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(replicasResponse{Replicas: rs, Answered: r.app.controller.Role(), Replica: r.id})
}
