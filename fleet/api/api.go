// Package api is the controller's HTTP API (docs/api.md): node check-in and
// Identify claims authenticated by per-node credentials, and the operator's
// endpoints (inventory, drain, restart of FATAL shards, plan, routing,
// events, budget, Gateway settings) authenticated
// by the admin token, and the health, readiness and Prometheus endpoints
// (health.go). Handlers mount on a caller's *http.ServeMux, so the
// netboot services and the dashboard can share the listener.
package api

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/metrics"
	"github.com/discord-pxe/dpxe/fleet/security"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// adminTokenSetting is the settings key of the admin token's SHA-256.
const adminTokenSetting = "admin_token_sha256"

// adminTokenBytes is the entropy of the admin token.
const adminTokenBytes = 32

// Limits of GET /v1/events.
const (
	defaultEventLimit = 100
	maxEventLimit     = 1000
)

// Errors.
var (
	// ErrUnauthorized is reported for a missing or wrong bearer token.
	ErrUnauthorized = errors.New("missing or wrong bearer token")
)

// Server serves the controller API.
type Server struct {
	c         *controller.Controller
	adminHash [sha256.Size]byte
	log       *slog.Logger
	refusals  *security.Log
	// metrics is the instrumentation (health.go); metricsHash the
	// read-only metrics token's hash, if one is set.
	metrics         *metrics.Metrics
	metricsHash     [sha256.Size]byte
	haveMetricsHash bool
	probe           storeProbe
	ready           readySummary
	version         string // what GET /healthz reports (SetVersion)
	pin             string // what GET /v1/controller/pin reports (SetControllerPin)
}

// New returns a server for c whose operator endpoints accept the admin
// token with SHA-256 adminHash. Refused requests are logged to log,
// rate-limited (see SetRefusals).
func New(c *controller.Controller, adminHash [sha256.Size]byte, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	refusals := security.New(log)
	return &Server{c: c, adminHash: adminHash, log: log, refusals: refusals,
		metrics: metrics.New(c, metrics.Options{Refusals: refusals}), ready: readySummary{reuse: readyReuse}}
}

// SetVersion names the running dpxe in GET /healthz, so an operator or a
// load balancer sees which build answers. Call it before serving.
func (s *Server) SetVersion(v string) { s.version = v }

// SetRefusals makes the server count and log its refused requests in l,
// which `dpxe serve` shares between its parts (one count per reason for
// the whole server). Call it before serving.
func (s *Server) SetRefusals(l *security.Log) {
	s.refusals = l
	s.metrics.SetRefusals(l)
}

// Register mounts every route of the API on mux: RegisterNode's and
// RegisterOperator's.
func (s *Server) Register(mux *http.ServeMux) {
	s.RegisterNode(mux)
	s.RegisterOperator(mux)
}

// RegisterNode mounts what nodes use, and only that: GET /healthz, POST
// /v1/checkin and POST /v1/identify (counted and timed in metrics). `dpxe
// serve` serves these (and the boot files) on the boot network's
// listener, which carries no operator endpoint.
func (s *Server) RegisterNode(mux *http.ServeMux) {
	mux.HandleFunc("GET /healthz", s.health)
	mux.HandleFunc("POST /v1/checkin", s.timed(metrics.RouteCheckin, s.checkin))
	mux.HandleFunc("POST /v1/identify", s.timed(metrics.RouteIdentify, s.identify))
}

// RegisterOperator mounts the operator endpoints (admin token), and the
// fleet verdict and metrics (health.go: admin or metrics token, GET
// /readyz without).
func (s *Server) RegisterOperator(mux *http.ServeMux) {
	s.registerHealth(mux)
	mux.HandleFunc("GET /v1/route", s.admin(s.route))
	mux.HandleFunc("GET /v1/nodes", s.admin(s.nodes))
	mux.HandleFunc("POST /v1/nodes", s.admin(s.addNode))
	mux.HandleFunc("GET /v1/nodes/{id}", s.admin(s.node))
	mux.HandleFunc("DELETE /v1/nodes/{id}", s.admin(s.deleteNode))
	mux.HandleFunc("GET /v1/nodes/{id}/drain", s.admin(s.drainPreview))
	mux.HandleFunc("POST /v1/nodes/{id}/drain", s.admin(s.drain(true)))
	mux.HandleFunc("POST /v1/nodes/{id}/undrain", s.admin(s.drain(false)))
	mux.HandleFunc("POST /v1/nodes/{id}/credential", s.admin(s.rotate))
	mux.HandleFunc("POST /v1/nodes/{id}/restart-fatal", s.admin(s.restartFatal))
	mux.HandleFunc("GET /v1/plan", s.admin(s.plan))
	mux.HandleFunc("GET /v1/events", s.admin(s.events))
	mux.HandleFunc("GET /v1/budget", s.admin(s.budget))
	mux.HandleFunc("PUT /v1/budget", s.admin(s.setBudget))
	mux.HandleFunc("GET /v1/gateway", s.admin(s.gateway))
	mux.HandleFunc("GET /v1/controller/pin", s.admin(s.controllerPin))
}

// HashToken returns the stored form of a bearer token.
func HashToken(tok string) [sha256.Size]byte { return sha256.Sum256([]byte(tok)) }

// LoadOrCreateAdminToken returns the admin token's hash from st. On first
// start, or when rotate is set, it creates a token, stores only its hash,
// and writes the token to file with mode 0600 (write-then-rename: a
// symbolic link at file is replaced, not followed); created reports that.
func LoadOrCreateAdminToken(ctx context.Context, st *store.Store, file string, rotate bool) (hash [sha256.Size]byte, created bool, err error) {
	return loadOrCreateToken(ctx, st, adminTokenSetting, "admin", file, rotate)
}

// loadOrCreateToken is LoadOrCreateAdminToken for the token whose hash is
// the settings key setting; what names it in errors.
func loadOrCreateToken(ctx context.Context, st *store.Store, setting, what, file string, rotate bool) (hash [sha256.Size]byte, created bool, err error) {
	v, err := st.Setting(ctx, setting)
	if rotate && err == nil {
		err = store.ErrNotFound
	}
	if err == nil {
		b, derr := hex.DecodeString(v)
		if derr != nil || len(b) != sha256.Size {
			return hash, false, fmt.Errorf("%s token hash in store is malformed", what)
		}
		copy(hash[:], b)
		return hash, false, nil
	}
	if !errors.Is(err, store.ErrNotFound) {
		return hash, false, err
	}
	raw := make([]byte, adminTokenBytes)
	if _, err := rand.Read(raw); err != nil {
		return hash, false, err
	}
	tok := base64.RawURLEncoding.EncodeToString(raw)
	if err := writeSecretFile(file, tok+"\n"); err != nil {
		return hash, false, fmt.Errorf("%s token file: %w", what, err)
	}
	hash = HashToken(tok)
	if err := st.SetSetting(ctx, setting, hex.EncodeToString(hash[:])); err != nil {
		return hash, false, err
	}
	return hash, true, nil
}

// writeSecretFile puts content in file, mode 0600, without ever opening
// file itself: it writes a new temporary file beside it (O_CREATE|O_EXCL,
// which refuses to follow a symbolic link or reuse an existing file),
// syncs it and renames it over file. A symbolic link planted at file is
// replaced, never followed, so its target is not truncated (issue 24). The
// directory is created 0700 when missing.
func writeSecretFile(file, content string) (err error) {
	dir := filepath.Dir(file)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(file)+".*.tmp") // O_RDWR|O_CREATE|O_EXCL, 0600
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			os.Remove(tmp)
		}
	}()
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if _, err := f.WriteString(content); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, file); err != nil {
		return err
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync() // the rename itself survives a crash
		d.Close()
	}
	return nil
}

// bearer returns the token of an "Authorization: Bearer" header.
func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	const prefix = "Bearer "
	if len(h) > len(prefix) && strings.EqualFold(h[:len(prefix)], prefix) {
		return strings.TrimSpace(h[len(prefix):])
	}
	return ""
}

// admin wraps an operator handler with the admin-token check.
func (s *Server) admin(h http.HandlerFunc) http.HandlerFunc {
	return AdminOnly(s.adminHash, s.refusals, h)
}

// AdminOnly wraps h with the operator check: the request must carry the
// admin token (whose SHA-256 is adminHash) as a bearer token. A refusal is
// counted and logged, rate-limited, in refusals (which may be nil). Other
// parts of `dpxe serve` (netboot, the dashboard) use it for their operator
// endpoints.
func AdminOnly(adminHash [sha256.Size]byte, refusals *security.Log, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		got := HashToken(bearer(r))
		if subtle.ConstantTimeCompare(got[:], adminHash[:]) != 1 {
			refusals.Refused(security.AdminToken, security.Source(r.RemoteAddr), "admin request refused", "path", r.URL.Path)
			writeError(w, http.StatusUnauthorized, "", ErrUnauthorized.Error())
			return
		}
		h(w, r)
	}
}

// WriteJSON writes v as a JSON response with the given status.
func WriteJSON(w http.ResponseWriter, status int, v any) { writeJSON(w, status, v) }

// WriteError writes the API's error body, naming the field at fault.
func WriteError(w http.ResponseWriter, status int, field, msg string) {
	writeError(w, status, field, msg)
}

type errorBody struct {
	Error string `json:"error"`
	Field string `json:"field,omitempty"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	// No HTML escaping: the kernel's small JSON reader then never meets a
	// \u escape ("&" in gateway_url stays "&").
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, status int, field, msg string) {
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="dpxe"`)
	}
	writeJSON(w, status, errorBody{Error: msg, Field: field})
}

// readBody reads a request body of at most appliance.MaxCheckinBody bytes.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, appliance.MaxCheckinBody))
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		writeError(w, http.StatusRequestEntityTooLarge, "", appliance.ErrBodyTooLarge.Error())
		return nil, false
	case err != nil:
		writeError(w, http.StatusBadRequest, "", "reading body: "+err.Error())
		return nil, false
	}
	return body, true
}

// badRequest answers a decoding or validation error, naming the field.
func badRequest(w http.ResponseWriter, err error) {
	var fe *appliance.FieldError
	if errors.As(err, &fe) {
		writeError(w, http.StatusBadRequest, fe.Field, fe.Error())
		return
	}
	if errors.Is(err, appliance.ErrBodyTooLarge) {
		writeError(w, http.StatusRequestEntityTooLarge, "", err.Error())
		return
	}
	writeError(w, http.StatusBadRequest, "", err.Error())
}

// controllerError maps a controller error to a status.
func (s *Server) controllerError(w http.ResponseWriter, r *http.Request, err error) {
	var fe *appliance.FieldError
	switch {
	case errors.As(err, &fe):
		badRequest(w, err)
	case errors.Is(err, controller.ErrUnknownNode):
		writeError(w, http.StatusNotFound, "", err.Error())
	case errors.Is(err, controller.ErrNotLive), errors.Is(err, controller.ErrLive):
		writeError(w, http.StatusConflict, "", err.Error())
	case errors.Is(err, controller.ErrConfig):
		writeError(w, http.StatusBadRequest, "", err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		writeError(w, http.StatusServiceUnavailable, "", "request cancelled")
	case errors.Is(err, controller.ErrNotLeader):
		// A replica that does not lead, or no longer trusts its lease
		// (docs/ha.md): the node asks again, here or at another replica.
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "", err.Error())
	default:
		s.log.Error("request failed", "path", r.URL.Path, "err", err)
		writeError(w, http.StatusServiceUnavailable, "", "controller could not persist the change; retry")
	}
}

// authNode checks the node credential of a node request. A check-in may
// redeem the node's pending network enrollment (controller.Enroll).
func (s *Server) authNode(w http.ResponseWriter, r *http.Request, nodeID string, checkin bool) bool {
	var err error
	if checkin {
		err = s.c.AuthenticateCheckin(r.Context(), nodeID, bearer(r), remoteHost(r))
	} else {
		err = s.c.Authenticate(r.Context(), nodeID, bearer(r))
	}
	if err == nil {
		return true
	}
	if errors.Is(err, controller.ErrUnknownNode) || errors.Is(err, controller.ErrBadCredential) {
		reason := security.NodeCredential
		switch {
		case errors.Is(err, controller.ErrEnrollmentAddress):
			reason = security.EnrollAddress
		case errors.Is(err, controller.ErrEnrollmentLive):
			reason = security.EnrollLive
		}
		s.refusals.Refused(reason, security.Source(r.RemoteAddr), "node request refused",
			"node", nodeID, "path", r.URL.Path, "why", err.Error())
		writeError(w, http.StatusUnauthorized, "", ErrUnauthorized.Error())
		return false
	}
	s.controllerError(w, r, err)
	return false
}

func remoteHost(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

func (s *Server) checkin(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	req, err := appliance.ParseCheckinRequest(body)
	if err != nil {
		badRequest(w, err)
		return
	}
	if !s.authNode(w, r, req.NodeID, true) {
		return
	}
	resp, err := s.c.Checkin(r.Context(), &req, remoteHost(r))
	if err != nil {
		s.controllerError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

func (s *Server) identify(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	req, err := appliance.ParseIdentifyRequest(body)
	if err != nil {
		badRequest(w, err)
		return
	}
	if !s.authNode(w, r, req.NodeID, false) {
		return
	}
	resp, err := s.c.Identify(r.Context(), req)
	if err != nil {
		s.controllerError(w, r, err)
		return
	}
	s.metrics.ObserveIdentify(resp)
	writeJSON(w, http.StatusOK, resp)
}

func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	raw := r.URL.Query().Get("guild_id")
	gid, err := appliance.ParseGuildID(raw)
	if err != nil {
		writeError(w, http.StatusBadRequest, "guild_id", "guild_id: "+err.Error())
		return
	}
	v, err := s.c.Route(gid)
	if errors.Is(err, controller.ErrNoOwner) {
		writeJSON(w, http.StatusNotFound, struct {
			errorBody
			controller.RouteView
		}{errorBody{Error: fmt.Sprintf("shard %d has no live owner", v.ShardID)}, v})
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func (s *Server) nodes(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"nodes": s.c.Nodes()})
}

// AddNodeRequest is the body of POST /v1/nodes.
type AddNodeRequest struct {
	NodeID string `json:"node_id"`
}

// AddNodeResponse carries a new node's credential; it is shown only once.
type AddNodeResponse struct {
	NodeID     string `json:"node_id"`
	Credential string `json:"credential"`
}

func (s *Server) addNode(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req AddNodeRequest
	if err := appliance.DecodeStrict(body, &req); err != nil {
		badRequest(w, err)
		return
	}
	if err := appliance.ValidateNodeID(req.NodeID); err != nil {
		writeError(w, http.StatusBadRequest, "node_id", "node_id: "+err.Error())
		return
	}
	cred, err := s.c.AddNode(r.Context(), req.NodeID)
	if errors.Is(err, store.ErrExists) {
		writeError(w, http.StatusConflict, "node_id", fmt.Sprintf("node %s already exists", req.NodeID))
		return
	}
	if err != nil {
		s.controllerError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, AddNodeResponse{NodeID: req.NodeID, Credential: cred})
}

// rotate gives a node a new credential; the old one stops working.
func (s *Server) rotate(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	cred, err := s.c.RotateCredential(r.Context(), id)
	if err != nil {
		s.controllerError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, AddNodeResponse{NodeID: id, Credential: cred})
}

func (s *Server) node(w http.ResponseWriter, r *http.Request) {
	d, err := s.c.Node(r.Context(), r.PathValue("id"))
	if err != nil {
		s.controllerError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, d)
}

// deleteNode answers DELETE /v1/nodes/{id}: a node that is not live
// leaves the inventory and its credential stops working (409 while live).
func (s *Server) deleteNode(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := s.c.DeleteNode(r.Context(), id); err != nil {
		s.controllerError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"node_id": id, "deleted": true})
}

// DrainResponse answers POST /v1/nodes/{id}/drain and /undrain: the node
// after the change and, for a drain, the preview the decision was made on.
type DrainResponse struct {
	controller.NodeView
	Preview *controller.DrainPreview `json:"preview,omitempty"`
}

// DrainRefusal is the 409 body of a drain that would leave shards with no
// owner: the error and the preview that shows which.
type DrainRefusal struct {
	Error   string                  `json:"error"`
	Preview controller.DrainPreview `json:"preview"`
}

// drainPreview answers GET /v1/nodes/{id}/drain: what a drain would move
// where and leave unowned, changing nothing.
func (s *Server) drainPreview(w http.ResponseWriter, r *http.Request) {
	p, err := s.c.PreviewDrain(r.PathValue("id"))
	if err != nil {
		s.controllerError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, p)
}

// drain answers POST /v1/nodes/{id}/drain (on) and /undrain. A drain that
// would leave shards unowned is refused with 409 and its preview unless
// the query has force=true.
func (s *Server) drain(on bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		var resp DrainResponse
		if on {
			force := false
			if v := r.URL.Query().Get("force"); v != "" {
				f, err := strconv.ParseBool(v)
				if err != nil {
					writeError(w, http.StatusBadRequest, "force", fmt.Sprintf("force: %q is not true or false", v))
					return
				}
				force = f
			}
			p, err := s.c.Drain(r.Context(), id, force)
			if errors.Is(err, controller.ErrDrainStrands) {
				writeJSON(w, http.StatusConflict, DrainRefusal{Error: err.Error(), Preview: p})
				return
			}
			if err != nil {
				s.controllerError(w, r, err)
				return
			}
			resp.Preview = &p
		} else if err := s.c.SetDraining(r.Context(), id, false); err != nil {
			s.controllerError(w, r, err)
			return
		}
		d, err := s.c.Node(r.Context(), id)
		if err != nil {
			s.controllerError(w, r, err)
			return
		}
		resp.NodeView = d.NodeView
		writeJSON(w, http.StatusOK, resp)
	}
}

// RestartFatalRequest is the optional body of POST
// /v1/nodes/{id}/restart-fatal: without it (or with shards absent or
// null) every FATAL shard of the node is restarted.
type RestartFatalRequest struct {
	Shards []uint32 `json:"shards"`
}

// RestartFatalResponse answers POST /v1/nodes/{id}/restart-fatal: the
// shards the node is now asked to start again, ascending (maybe none).
type RestartFatalResponse struct {
	NodeID        string   `json:"node_id"`
	RestartShards []uint32 `json:"restart_shards"`
}

// restartFatal asks a live node to start its FATAL shards again (all, or
// those the body lists; each must be FATAL there). The request is in the
// controller's memory until the node takes it up; with replicas it is
// committed to the database before this answers (docs/api.md, docs/ha.md).
func (s *Server) restartFatal(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req RestartFatalRequest
	if len(bytes.TrimSpace(body)) > 0 {
		if err := appliance.DecodeStrict(body, &req); err != nil {
			badRequest(w, err)
			return
		}
	}
	id := r.PathValue("id")
	shards, err := s.c.RestartFatal(r.Context(), id, req.Shards)
	var nf *controller.NotFatalError
	switch {
	case errors.As(err, &nf):
		writeError(w, http.StatusConflict, fmt.Sprintf("shards[%d]", nf.Index), nf.Error())
	case err != nil:
		s.controllerError(w, r, err)
	default:
		writeJSON(w, http.StatusOK, RestartFatalResponse{NodeID: id, RestartShards: shards})
	}
}

func (s *Server) plan(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.c.Plan())
}

func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	after, limit := int64(0), defaultEventLimit
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, "after", "after: must be a non-negative event ID")
			return
		}
		after = n
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxEventLimit {
			writeError(w, http.StatusBadRequest, "limit", fmt.Sprintf("limit: must be 1..%d", maxEventLimit))
			return
		}
		limit = n
	}
	ev, err := s.c.Events(r.Context(), after, q.Get("kind"), limit)
	if err != nil {
		s.controllerError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"events": ev})
}

func (s *Server) budget(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.c.Budget())
}

// SetBudgetRequest is the body of PUT /v1/budget: Discord's
// session_start_limit as GET /gateway/bot reports it.
type SetBudgetRequest struct {
	Total        int   `json:"total"`
	Remaining    int   `json:"remaining"`
	ResetAfterMS int64 `json:"reset_after"`
}

func (s *Server) setBudget(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req SetBudgetRequest
	if err := appliance.DecodeStrict(body, &req); err != nil {
		badRequest(w, err)
		return
	}
	if err := s.c.SetBudget(r.Context(), req.Total, req.Remaining, time.Duration(req.ResetAfterMS)*time.Millisecond); err != nil {
		s.controllerError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.c.Budget())
}

// gateway answers GET /v1/gateway: the Gateway settings nodes receive (the
// token only as token_set), where the URL came from, and the state of
// GET /gateway/bot.
func (s *Server) gateway(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.c.Gateway())
}
