package gatewayemu

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Paths served by the emulator.
const (
	// ResumePath is the path of resume_gateway_url; the main gateway is "/".
	ResumePath = "/resume"
	// StatePath serves the State document as JSON.
	StatePath = "/debug/state"
	// FaultPath accepts a Fault as JSON (POST).
	FaultPath = "/debug/fault"
	// CAPath serves the generated CA certificate as PEM when TLS is on.
	CAPath = "/debug/ca.pem"
)

// ErrClosed is returned by Serve after Close.
var ErrClosed = errors.New("gatewayemu: emulator closed")

// Emulator is an in-process Discord Gateway. Its methods are safe for
// concurrent use. Create it with New or Start; stop it with Close.
type Emulator struct {
	opts   Options
	guilds []uint64
	log    *slog.Logger

	tlsConf *tls.Config // server config, nil without TLS
	caPEM   []byte
	caPool  *x509.CertPool

	srv     *http.Server
	baseCtx context.Context
	cancel  context.CancelFunc

	connSeq  atomic.Uint64
	msgSeq   atomic.Uint64 // synthetic MESSAGE_CREATEs, for unique message IDs
	counters struct {
		connections, identifyAccepted, identifyRefused, identifyClosed atomic.Uint64
		resumes, resumesFailed, heartbeats, acks, dispatches, replayed atomic.Uint64
		payloadBytes, wireBytes                                        atomic.Uint64
		open                                                           atomic.Int64
		maxTimerLate                                                   atomic.Int64 // ns
	}

	mu         sync.Mutex
	host       string // host:port written into URLs
	resumeHost string // host:port of resume_gateway_url when Options.ResumeHost is set
	conns      map[*conn]struct{}
	sessions   map[string]*session
	live       map[[2]int]map[*session]struct{} // sessions attached to a connection
	bucketLast map[int]time.Time                // bucket → last accepted Identify
	attempts   []time.Time                      // Identify attempts within the window
	started    map[int]*startTracker            // num_shards → shards ever identified
	budget     budgetState
	noAck      map[int]bool // shard IDs whose heartbeats are not ACKed
	noAckCount atomic.Int32 // len(noAck), read without e.mu on every heartbeat
	helloDelay time.Duration
	helloCount int // connections left to delay; 0 = all while helloDelay > 0
	// helloReconnect new connections get op 7 instead of Hello.
	helloReconnect int
	// resumeUnavailable handshakes on ResumePath are answered with HTTP 503.
	resumeUnavailable int
	identifies        []IdentifyRecord
	firstBeats        []FirstHeartbeat
	beats             []HeartbeatRecord // with Options.RecordHeartbeats
	commands          []CommandRecord   // ops 3, 4, 8 received
	commandsDropped   uint64
	rest              restState // REST messages and the pings they answer
	violations        []Violation
	malformedFrames   map[string]uint64    // malformed client frames by reason
	closedStats       []ConnStats          // records of closed connections, oldest first
	memberRequests    map[uint64]time.Time // guild → last all-members request
	changed           chan struct{}        // closed and replaced on every record change
	closed            bool
}

// budgetState is the daily session-start budget.
type budgetState struct {
	remaining   int
	periodStart time.Time
	revoked     bool
}

// startTracker remembers which shards of one num_shards were ever identified.
type startTracker struct {
	done       map[int]bool
	lowestMiss int // smallest shard ID never identified
}

// New validates opts and returns an Emulator that is not yet serving.
func New(opts Options) (*Emulator, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &Emulator{
		opts:       o,
		guilds:     o.guildIDs(),
		log:        o.Logger,
		baseCtx:    ctx,
		cancel:     cancel,
		conns:      map[*conn]struct{}{},
		sessions:   map[string]*session{},
		live:       map[[2]int]map[*session]struct{}{},
		bucketLast: map[int]time.Time{},
		started:    map[int]*startTracker{},
		noAck:      map[int]bool{},
		changed:    make(chan struct{}),

		malformedFrames:   map[string]uint64{},
		memberRequests:    map[uint64]time.Time{},
		rest:              restState{buckets: map[string][]time.Time{}},
		resumeUnavailable: o.ResumeUnavailable,
	}
	e.budget = budgetState{remaining: o.SessionStarts, periodStart: o.Now()}
	if o.TLS {
		if err := e.setupTLS(); err != nil {
			cancel()
			return nil, err
		}
	}
	return e, nil
}

// Start listens on addr (e.g. "127.0.0.1:0") and serves in the background
// until ctx ends or Close is called.
func Start(ctx context.Context, addr string, opts Options) (*Emulator, error) {
	e, err := New(opts)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		e.cancel()
		return nil, fmt.Errorf("gatewayemu: listen %s: %w", addr, err)
	}
	e.mu.Lock()
	e.setHostLocked(ln)
	e.mu.Unlock()
	go func() {
		if err := e.Serve(ln); err != nil && !errors.Is(err, ErrClosed) {
			e.log.Error("serve", "err", err)
		}
	}()
	go func() {
		select {
		case <-ctx.Done():
			e.Close()
		case <-e.baseCtx.Done():
		}
	}()
	return e, nil
}

// Serve serves the gateway, the REST routes and the debug routes on ln until
// Close. It returns ErrClosed after Close. The URL methods report ln's
// address only once Serve has started; Start sets them before returning.
func (e *Emulator) Serve(ln net.Listener) error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		ln.Close()
		return ErrClosed
	}
	e.setHostLocked(ln)
	e.srv = &http.Server{
		Handler:           e.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return e.baseCtx },
		ErrorLog:          slog.NewLogLogger(e.log.Handler(), slog.LevelDebug),
	}
	srv := e.srv
	e.mu.Unlock()
	if e.tlsConf != nil {
		ln = tls.NewListener(ln, e.tlsConf)
	}
	e.log.Info("gateway emulator serving", "addr", ln.Addr().String(), "tls", e.tlsConf != nil)
	err := srv.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return ErrClosed
	}
	return err
}

// setHostLocked fixes the host:port of the URLs from the first listener.
// A PublicHost without a port takes the listener's port, so a client
// behind an address translation (QEMU user-mode networking's 10.0.2.2)
// can be given a listener on port 0.
func (e *Emulator) setHostLocked(ln net.Listener) {
	if e.host != "" {
		return
	}
	e.host = withPort(e.opts.PublicHost, ln)
	if e.opts.ResumeHost != "" {
		e.resumeHost = withPort(e.opts.ResumeHost, ln)
	}
}

// withPort returns host with the listener's port when it has none, or the
// listener's address when host is empty.
func withPort(host string, ln net.Listener) string {
	addr := ln.Addr().String()
	if host == "" {
		return addr
	}
	if _, _, err := net.SplitHostPort(host); err == nil {
		return host
	}
	if _, port, err := net.SplitHostPort(addr); err == nil {
		return net.JoinHostPort(strings.Trim(host, "[]"), port)
	}
	return host
}

// Close stops serving and drops every connection without a close frame.
func (e *Emulator) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	srv := e.srv
	conns := make([]*conn, 0, len(e.conns))
	for c := range e.conns {
		conns = append(conns, c)
	}
	sessions := make([]*session, 0, len(e.sessions))
	for _, s := range e.sessions {
		sessions = append(sessions, s)
	}
	e.mu.Unlock()
	e.cancel()
	var err error
	if srv != nil {
		err = srv.Close()
	}
	for _, c := range conns {
		c.ws.CloseNow()
	}
	for _, s := range sessions {
		s.stop()
	}
	return err
}

// Options returns the effective options (defaults filled in).
func (e *Emulator) Options() Options { return e.opts }

// Handler serves everything: gateway WebSocket, REST and debug routes.
func (e *Emulator) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/api/", e.RESTHandler())
	mux.Handle("/debug/", e.ControlHandler())
	mux.HandleFunc("/", e.serveGateway)
	return mux
}

// scheme returns the WebSocket and HTTP schemes in use.
func (e *Emulator) scheme() (ws, web string) {
	if e.tlsConf != nil {
		return "wss", "https"
	}
	return "ws", "http"
}

func (e *Emulator) hostPort() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.host
}

// URL is the main gateway URL as /gateway/bot returns it ("ws://host:port").
func (e *Emulator) URL() string {
	ws, _ := e.scheme()
	return ws + "://" + e.hostPort()
}

// ResumeURL is the resume_gateway_url sent in READY: the resume host
// without a path when Options.ResumeHost is set, else URL()+ResumePath.
func (e *Emulator) ResumeURL() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.resumeURLLocked()
}

func (e *Emulator) resumeURLLocked() string {
	if e.resumeHost != "" {
		ws, _ := e.scheme()
		return ws + "://" + e.resumeHost
	}
	return e.urlLocked() + ResumePath
}

// HTTPURL is the base URL of the REST and debug routes ("http://host:port").
func (e *Emulator) HTTPURL() string {
	_, web := e.scheme()
	return web + "://" + e.hostPort()
}

// APIBase is the REST base URL for version v, ending in a slash
// ("http://host:port/api/v10/").
func (e *Emulator) APIBase(v int) string { return fmt.Sprintf("%s/api/v%d/", e.HTTPURL(), v) }

// Token returns the valid bot token (without "Bot ").
func (e *Emulator) Token() string { return e.opts.Token }

// Guilds returns the bot's guild IDs.
func (e *Emulator) Guilds() []uint64 { return append([]uint64(nil), e.guilds...) }

// GuildsForShard returns the guild IDs routed to shard id of num.
func (e *Emulator) GuildsForShard(id, num int) []uint64 {
	var out []uint64
	for _, g := range e.guilds {
		if ShardForGuild(g, num) == id {
			out = append(out, g)
		}
	}
	return out
}

// Violations returns a copy of the violation record in recording order.
func (e *Emulator) Violations() []Violation {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]Violation(nil), e.violations...)
}

// ViolationsOf returns the recorded violations of the given kinds.
func (e *Emulator) ViolationsOf(kinds ...Kind) []Violation {
	var out []Violation
	for _, v := range e.Violations() {
		for _, k := range kinds {
			if v.Kind == k {
				out = append(out, v)
				break
			}
		}
	}
	return out
}

// Identifies returns a copy of the Identify log in arrival order.
func (e *Emulator) Identifies() []IdentifyRecord {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]IdentifyRecord(nil), e.identifies...)
}

// Commands returns the Gateway commands (ops 3, 4, 8) received so far.
func (e *Emulator) Commands() []CommandRecord {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]CommandRecord{}, e.commands...)
}

// FirstHeartbeats returns, for every connection that heartbeated, how long
// after Hello its first heartbeat came (join with IdentifyRecord.Conn for
// the shard). Clients jitter the first heartbeat; tests compare it with
// their formula.
func (e *Emulator) FirstHeartbeats() []FirstHeartbeat {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]FirstHeartbeat(nil), e.firstBeats...)
}

// Heartbeats returns every heartbeat received and its ACK, oldest first,
// when Options.RecordHeartbeats is set (nil otherwise).
func (e *Emulator) Heartbeats() []HeartbeatRecord {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]HeartbeatRecord(nil), e.beats...)
}

// Sessions returns every live or resumable session, sorted by shard then ID.
func (e *Emulator) Sessions() []SessionInfo {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.sessionsLocked()
}

func (e *Emulator) sessionsLocked() []SessionInfo {
	out := make([]SessionInfo, 0, len(e.sessions))
	for _, s := range e.sessions {
		out = append(out, s.info(e))
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Shard != b.Shard {
			if a.Shard[1] != b.Shard[1] {
				return a.Shard[1] < b.Shard[1]
			}
			return a.Shard[0] < b.Shard[0]
		}
		return a.ID < b.ID
	})
	return out
}

// State returns the whole debug document.
func (e *Emulator) State() State {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.opts.Now()
	st := State{
		Time:                  now,
		GatewayURL:            e.urlLocked(),
		ResumeGatewayURL:      e.resumeURLLocked(),
		SessionStartLimit:     e.startLimitLocked(now),
		TokenRevoked:          e.budget.revoked,
		Counters:              e.countersSnapshot(),
		Shards:                []ShardSessions{},
		Identifies:            append([]IdentifyRecord{}, e.identifies...),
		Violations:            append([]Violation{}, e.violations...),
		MalformedClientFrames: maps.Clone(e.malformedFrames),
		Connections:           e.connStatsLocked(),
		Commands:              append([]CommandRecord{}, e.commands...),
		CommandsDropped:       e.commandsDropped,
		REST:                  e.restRecordLocked(),
		AckSuppressed:         []int{},
	}
	for id := range e.noAck {
		st.AckSuppressed = append(st.AckSuppressed, id)
	}
	sort.Ints(st.AckSuppressed)
	for _, si := range e.sessionsLocked() {
		n := len(st.Shards)
		if n == 0 || st.Shards[n-1].Shard != si.Shard {
			st.Shards = append(st.Shards, ShardSessions{Shard: si.Shard})
			n++
		}
		st.Shards[n-1].Sessions = append(st.Shards[n-1].Sessions, si)
	}
	return st
}

func (e *Emulator) urlLocked() string {
	ws, _ := e.scheme()
	return ws + "://" + e.host
}

func (e *Emulator) countersSnapshot() Counters {
	c := &e.counters
	return Counters{
		Connections:        c.connections.Load(),
		OpenConnections:    c.open.Load(),
		IdentifyAccepted:   c.identifyAccepted.Load(),
		IdentifyRefused:    c.identifyRefused.Load(),
		IdentifyClosed:     c.identifyClosed.Load(),
		Resumes:            c.resumes.Load(),
		ResumesFailed:      c.resumesFailed.Load(),
		Heartbeats:         c.heartbeats.Load(),
		HeartbeatACKs:      c.acks.Load(),
		Dispatches:         c.dispatches.Load(),
		ReplayedDispatches: c.replayed.Load(),
		MaxTimerLateMS:     time.Duration(c.maxTimerLate.Load()).Milliseconds(),
		PayloadBytes:       c.payloadBytes.Load(),
		WireBytes:          c.wireBytes.Load(),
	}
}

// noteTimerLate records how late a heartbeat timer fired.
func (e *Emulator) noteTimerLate(late time.Duration) {
	for {
		old := e.counters.maxTimerLate.Load()
		if int64(late) <= old || e.counters.maxTimerLate.CompareAndSwap(old, int64(late)) {
			return
		}
	}
}

// Await blocks until cond holds for the current State or ctx ends; it wakes
// on every record change (Identify, violation, session change) and also
// re-checks every 50 ms for counters.
func (e *Emulator) Await(ctx context.Context, cond func(State) bool) error {
	for {
		e.mu.Lock()
		ch := e.changed
		e.mu.Unlock()
		if cond(e.State()) {
			return nil
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("gatewayemu: await: %w", ctx.Err())
		case <-ch:
		case <-t.C:
		}
		t.Stop()
	}
}

// notifyLocked wakes Await callers. e.mu must be held.
func (e *Emulator) notifyLocked() {
	close(e.changed)
	e.changed = make(chan struct{})
}

// violateLocked records a violation. e.mu must be held.
func (e *Emulator) violateLocked(v Violation) {
	if v.Time.IsZero() {
		v.Time = e.opts.Now()
	}
	e.violations = append(e.violations, v)
	e.log.Warn("gateway violation", "kind", v.Kind, "shard", v.Shard, "session", v.Session,
		"conn", v.Conn, "close_code", v.CloseCode, "detail", v.Detail)
	e.notifyLocked()
}

func (e *Emulator) violate(v Violation) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.violateLocked(v)
}

// checkToken reports whether an Identify/Resume token is valid; the "Bot "
// prefix that some libraries send (discordgo) is accepted, as Discord does.
func (e *Emulator) checkTokenLocked(tok string) bool {
	if e.budget.revoked {
		return false
	}
	tok = strings.TrimPrefix(tok, "Bot ")
	return tok == e.opts.Token
}

// refreshBudgetLocked resets the budget if its period has passed.
func (e *Emulator) refreshBudgetLocked(now time.Time) {
	p := e.opts.BudgetPeriod
	if p <= 0 {
		return
	}
	if elapsed := now.Sub(e.budget.periodStart); elapsed >= p {
		e.budget.periodStart = e.budget.periodStart.Add(elapsed / p * p)
		e.budget.remaining = e.opts.SessionStarts
		e.budget.revoked = false
		e.notifyLocked()
	}
}

func (e *Emulator) startLimitLocked(now time.Time) SessionStartLimit {
	e.refreshBudgetLocked(now)
	reset := e.budget.periodStart.Add(e.opts.BudgetPeriod).Sub(now)
	return SessionStartLimit{
		Total:          e.opts.SessionStarts,
		Remaining:      e.budget.remaining,
		ResetAfter:     reset.Milliseconds(),
		MaxConcurrency: e.opts.MaxConcurrency,
	}
}

// SessionStartLimit returns what /gateway/bot would report now.
func (e *Emulator) SessionStartLimit() SessionStartLimit {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.startLimitLocked(e.opts.Now())
}

// ResetBudget restores the full session-start budget and a revoked token.
func (e *Emulator) ResetBudget() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.budget = budgetState{remaining: e.opts.SessionStarts, periodStart: e.opts.Now()}
	e.notifyLocked()
}
