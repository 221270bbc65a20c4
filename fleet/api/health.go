package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"sync"
	"time"

	"github.com/discord-pxe/dpxe/fleet/metrics"
	"github.com/discord-pxe/dpxe/fleet/security"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// This file holds the API's observability: GET /healthz (process up,
// store writable), GET /readyz and GET /v1/health (the fleet verdict),
// GET /metrics (Prometheus), and the metrics token (docs/metrics.md).

// metricsTokenSetting is the settings key of the metrics token's SHA-256.
const metricsTokenSetting = "metrics_token_sha256"

// storeCheckTimeout bounds the store probe of GET /healthz, well under a
// prober's usual timeout; the store's busy timeout is longer.
const storeCheckTimeout = 2 * time.Second

// storeCheckReuse is how long one store probe answers GET /healthz, so
// frequent probes do not queue on the store's write lock.
const storeCheckReuse = time.Second

// readyReuse is how long one verdict answers GET /readyz, which needs no
// token: a verdict is a pass over every shard under the controller's lock
// (about 10 ms at 131,072 shards), which a flood of unauthenticated
// requests must not repeat back to back.
const readyReuse = time.Second

// LoadOrCreateMetricsToken is LoadOrCreateAdminToken for the read-only
// metrics token, which GET /metrics and GET /v1/health accept besides
// the admin token.
func LoadOrCreateMetricsToken(ctx context.Context, st *store.Store, file string, rotate bool) (hash [sha256.Size]byte, created bool, err error) {
	return loadOrCreateToken(ctx, st, metricsTokenSetting, "metrics", file, rotate)
}

// SetMetricsToken makes GET /metrics and GET /v1/health accept the token
// whose SHA-256 is hash, as well as the admin token. Call it before
// serving.
func (s *Server) SetMetricsToken(hash [sha256.Size]byte) {
	s.metricsHash, s.haveMetricsHash = hash, true
}

// SetPingBound sets the readiness bound on a shard's last ping
// (metrics.DefaultPingBound by default). Call it before serving.
func (s *Server) SetPingBound(d time.Duration) { s.metrics.SetPingBound(d) }

// Metrics returns the server's instrumentation, whose Handler another
// listener may serve (dpxe serve --metrics-listen).
func (s *Server) Metrics() *metrics.Metrics { return s.metrics }

// registerHealth mounts the readiness, health detail and metrics routes.
func (s *Server) registerHealth(mux *http.ServeMux) {
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.HandleFunc("GET /v1/health", s.reader(s.fleetHealth))
	mux.Handle("GET /metrics", s.reader(s.metrics.Handler().ServeHTTP))
}

// RegisterMetricsListener mounts, without authentication, what a separate
// metrics listener serves: GET /metrics, GET /healthz and GET /readyz.
func (s *Server) RegisterMetricsListener(mux *http.ServeMux) {
	mux.Handle("GET /metrics", s.metrics.Handler())
	mux.HandleFunc("GET /healthz", s.health)
	mux.HandleFunc("GET /readyz", s.readyz)
}

// reader wraps a read-only operator handler: the request must carry the
// metrics token or the admin token.
func (s *Server) reader(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		got := HashToken(bearer(r))
		ok := subtle.ConstantTimeCompare(got[:], s.adminHash[:]) == 1
		if s.haveMetricsHash && subtle.ConstantTimeCompare(got[:], s.metricsHash[:]) == 1 {
			ok = true
		}
		if !ok {
			s.refusals.Refused(security.AdminToken, security.Source(r.RemoteAddr), "metrics request refused", "path", r.URL.Path)
			writeError(w, http.StatusUnauthorized, "", ErrUnauthorized.Error())
			return
		}
		h(w, r)
	}
}

// HealthResponse is the body of GET /healthz.
type HealthResponse struct {
	OK         bool   `json:"ok"`
	Version    string `json:"version,omitempty"` // of dpxe serve (SetVersion)
	Store      string `json:"store"`             // "writable", or why not
	Generation uint64 `json:"generation"`
	LiveNodes  int    `json:"live_nodes"`
	// Role is "leader" or "follower" when several replicas may run
	// (docs/ha.md), with the latest leader term the replica saw; absent
	// for a single controller.
	Role string `json:"role,omitempty"`
	Term uint64 `json:"term,omitempty"`
	// FollowerCheckins is how many node check-ins this replica answered
	// itself since it started, while no leader answered them (docs/ha.md,
	// renewals without a leader); absent when none.
	FollowerCheckins uint64 `json:"follower_checkins,omitempty"`
	// FollowerGrants is how many Identify claims it granted itself the
	// same way (identify claims without a leader); absent when none.
	FollowerGrants uint64 `json:"follower_grants,omitempty"`
}

// storeProbe shares one store check among the GET /healthz requests of
// storeCheckReuse.
type storeProbe struct {
	mu  sync.Mutex
	at  time.Time
	err error
}

func (s *Server) checkStore(ctx context.Context) error {
	p := &s.probe
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.at.IsZero() && time.Since(p.at) < storeCheckReuse {
		return p.err
	}
	ctx, cancel := context.WithTimeout(ctx, storeCheckTimeout)
	defer cancel()
	p.err = s.c.CheckStore(ctx)
	p.at = time.Now()
	return p.err
}

// health answers GET /healthz: 200 when the process is up and the store
// accepts a write (store.CheckWritable), 503 otherwise.
func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	p := s.c.Plan()
	resp := HealthResponse{OK: true, Version: s.version, Store: "writable", Generation: p.Generation, LiveNodes: p.LiveNodes}
	if role := s.c.Role(); role.HA {
		resp.Role, resp.Term = role.Name(), role.Term
		resp.FollowerCheckins, resp.FollowerGrants = s.c.FollowerAnswers()
	}
	status := http.StatusOK
	if err := s.checkStore(r.Context()); err != nil {
		s.log.Error("health: store not writable", "err", err)
		resp.OK, resp.Store, status = false, err.Error(), http.StatusServiceUnavailable
	}
	writeJSON(w, status, resp)
}

func verdictStatus(ready bool) int {
	if ready {
		return http.StatusOK
	}
	return http.StatusServiceUnavailable
}

// readySummary caches the summary GET /readyz answers.
type readySummary struct {
	mu    sync.Mutex
	reuse time.Duration // readyReuse; tests set 0
	at    time.Time
	sum   metrics.Summary
}

// readyz answers GET /readyz: the verdict's summary, without node names,
// 200 when the fleet is ready and 503 when not. It needs no token, and a
// summary answers for readyReuse.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	c := &s.ready
	c.mu.Lock()
	if c.at.IsZero() || time.Since(c.at) >= c.reuse {
		c.sum, c.at = s.metrics.Verdict().Summary, time.Now()
	}
	sum := c.sum
	c.mu.Unlock()
	writeJSON(w, verdictStatus(sum.Ready), sum)
}

// fleetHealth answers GET /v1/health: the whole verdict with the runs of
// shards that are not ready and why.
func (s *Server) fleetHealth(w http.ResponseWriter, r *http.Request) {
	v := s.metrics.Verdict()
	writeJSON(w, verdictStatus(v.Ready), v)
}

// statusRecorder remembers the status code a handler writes.
type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (sr *statusRecorder) WriteHeader(code int) {
	sr.code = code
	sr.ResponseWriter.WriteHeader(code)
}

// timed wraps a node route so its answers are counted and timed
// (dpxe_node_request_duration_seconds).
func (s *Server) timed(route string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sr := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
		h(sr, r)
		s.metrics.ObserveRequest(route, sr.code, time.Since(start))
	}
}
