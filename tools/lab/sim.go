package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/events"
	"github.com/discord-pxe/dpxe/fleet/events/natsauth"
)

// The simulated lab: `dpxe serve` on loopback without netboot, the Gateway
// emulator on loopback, and nodes that are goroutines of the lab. Each
// simulated node is created through the API (POST /v1/nodes, which returns
// its credential), checks in with that credential as a kernel would
// (POST /v1/checkin), applies its assignment, asks POST /v1/identify before
// every Identify, and runs each shard as a real WebSocket session against
// the emulator: Hello, Identify, READY, heartbeats. Resumes are not
// simulated: a dropped session Identifies again after a backoff.

// simCapacity is the shard slots a simulated node offers, as the kernel.
const simCapacity = appliance.MaxShardsPerNode

// startSimulated starts the simulated lab.
func (l *Lab) startSimulated(ctx context.Context) error {
	if l.Why != "" {
		l.logf("the namespace lab cannot run here: %s", l.Why)
		l.logf("falling back to simulated nodes: dpxe serve on loopback, nodes named %sN are Go programs checking in over HTTP", SimPrefix)
	}
	listen, err := freeHostAddr(l.cfg.Listen)
	if err != nil {
		return fmt.Errorf("lab: the dashboard's address %s: %w (another dpxe serve or lab? LISTEN=127.0.0.1:8081 picks another)", l.cfg.Listen, err)
	}
	gwListen, err := freeHostAddr(l.cfg.GatewayListen)
	if err != nil {
		return fmt.Errorf("lab: the Gateway emulator's address %s: %w", l.cfg.GatewayListen, err)
	}
	l.URL, l.GatewayURL = "http://"+listen, l.scheme("http", "https")+"://"+gwListen
	l.state.Listen = l.URL
	botToken := randomToken()
	if err := os.WriteFile(filepath.Join(l.cfg.Var, "bot.token"), []byte(botToken+"\n"), 0o600); err != nil {
		return err
	}
	if _, err := l.startEmulator(ctx, nil, gwListen, botToken); err != nil {
		return err
	}
	l.TokenFile = filepath.Join(l.cfg.Var, "admin.token")
	serve, err := l.start("dpxe serve", "serve.log", nil, l.serveArgs(listen, l.GatewayURL+"/api/v10", "wss://"+gwListen)...)
	if err != nil {
		return err
	}
	if err := waitHealthy(ctx, l.URL, serve, filepath.Join(l.cfg.Var, "serve.log")); err != nil {
		return err
	}
	if err := l.loadAdmin(); err != nil {
		return err
	}
	if err := l.connectEvents(""); err != nil {
		return err
	}
	if err := l.startPingbot(); err != nil {
		return err
	}
	for i := 0; i < l.cfg.Nodes; i++ {
		if _, err := l.AddNode(ctx); err != nil {
			return err
		}
	}
	return nil
}

// addSimNode creates sim-N at the controller and starts it.
func (l *Lab) addSimNode(ctx context.Context, n int) (*Node, error) {
	name := fmt.Sprintf("%s%d", SimPrefix, n)
	var out struct {
		Credential string `json:"credential"`
	}
	if err := l.admin.do(ctx, "POST", "/v1/nodes", map[string]string{"node_id": name}, &out); err != nil {
		return nil, fmt.Errorf("creating %s: %w", name, err)
	}
	u, _ := url.Parse(l.GatewayURL)
	gw := l.scheme("ws", "wss") + "://" + u.Host + "/?v=10&encoding=json"
	hc, err := l.GatewayClient()
	if err != nil {
		return nil, err
	}
	hc.Timeout = 0 // the dial's context bounds it (websocket.Dial refuses a client timeout)
	tok, err := os.ReadFile(filepath.Join(l.cfg.Var, "bot.token"))
	if err != nil {
		return nil, err
	}
	pub, err := l.simPublisher(name)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	nc, natsURL, auth := l.nc, l.NATSURL, l.auth
	l.mu.Unlock()
	s := &simNode{id: name, api: newClient(l.URL, out.Credential), gateway: gw, gatewayHTTP: hc, botToken: strings.TrimSpace(string(tok)),
		shards: map[uint32]*simShard{}, done: make(chan struct{}), pub: pub, nc: nc, natsURL: natsURL, auth: auth}
	sctx, cancel := context.WithCancel(l.runCtx)
	s.cancel = cancel
	go s.run(sctx)
	node := &Node{Name: name, Firmware: "simulated", Started: time.Now()}
	l.mu.Lock()
	l.sims = append(l.sims, s)
	l.nodes = append(l.nodes, node)
	l.mu.Unlock()
	l.logf("started simulated node %s", name)
	return node, nil
}

// simNode is one simulated node.
type simNode struct {
	id      string
	api     *client
	gateway string
	// gatewayHTTP dials the Gateway: it trusts the emulator's CA when
	// the lab runs wss://.
	gatewayHTTP *http.Client
	botToken    string
	cancel      context.CancelFunc
	// skip holds the event types the check-in answer says not to publish
	// (appliance.NATSAccess.Skip), nil before an answer with nats.
	skip atomic.Pointer[map[string]bool]
	done chan struct{}
	// pub publishes every dispatch (nil: no event delivery). Resumes are
	// not simulated, so a session's acknowledged sequence is not used.
	pub *events.Publisher
	// nc answers the workers' commands for the shards the node runs
	// (nil: no event delivery, no commands).
	nc *nats.Conn
	// With `dpxe serve --nats-auth`, nc and pub are nil and each shard
	// connects to natsURL as node-<id> with the password the controller
	// would hand out (auth), so the server gives it the node's shards'
	// permissions: one connection per shard, opened once the shard is
	// assigned (the kernel will use one per node).
	natsURL string
	auth    *natsauth.File

	mu      sync.Mutex
	shards  map[uint32]*simShard
	total   uint32
	applied uint64
}

// simShard is one shard session of a simulated node.
type simShard struct {
	// pub publishes the shard's dispatches (nil: no event delivery).
	pub    *events.Publisher
	mu     sync.Mutex
	st     appliance.ShardStatus
	cancel context.CancelFunc
	done   chan struct{}
	// send checks and sends a worker's command on the current
	// connection (nil between connections); released is set once the
	// node gives the shard up.
	send     events.CommandHandler
	released bool
}

// command answers a worker's command for shard id of total: through the
// current connection, or refused (not_owner once released, otherwise
// not_ready, after the checks that need no connection).
func (s *simShard) command(body []byte, id, total uint32) events.CommandReply {
	s.mu.Lock()
	send, released := s.send, s.released
	s.mu.Unlock()
	if send != nil && !released {
		return send(body)
	}
	_, r := events.CheckCommand(body, events.ShardView{Shard: id, TotalShards: total, Owned: !released})
	return r
}

func (s *simShard) set(f func(st *appliance.ShardStatus)) {
	s.mu.Lock()
	f(&s.st)
	s.mu.Unlock()
}

func (s *simNode) stop() {
	s.cancel()
	<-s.done
}

// run checks in until ctx ends, then closes every session.
func (s *simNode) run(ctx context.Context) {
	defer close(s.done)
	defer s.stopShards(nil)
	wait := time.Duration(0)
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		resp, err := s.checkin(ctx)
		if err != nil {
			wait = 2 * time.Second
			continue
		}
		s.apply(ctx, resp)
		wait = time.Duration(max(resp.NextCheckinMS, 200)) * time.Millisecond
	}
}

// checkin sends the node's status and returns the controller's answer.
func (s *simNode) checkin(ctx context.Context) (appliance.CheckinResponse, error) {
	req := appliance.CheckinRequest{NodeID: s.id, Capacity: simCapacity}
	s.mu.Lock()
	req.Generation = s.applied
	ids := make([]uint32, 0, len(s.shards))
	for id := range s.shards {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		sh := s.shards[id]
		sh.mu.Lock()
		st := sh.st
		sh.mu.Unlock()
		switch st.State {
		case appliance.ShardReady:
			req.ReadyShards++
		case appliance.ShardStarting:
			req.StartingShards++
		case appliance.ShardBackoff:
			req.BackoffShards++
		case appliance.ShardFatal:
			req.FatalShards++
		}
		req.Shards = append(req.Shards, st)
	}
	s.mu.Unlock()
	var resp appliance.CheckinResponse
	err := s.api.do(ctx, "POST", "/v1/checkin", req, &resp)
	return resp, err
}

// apply stops the shards the answer no longer assigns, starts the
// assigned ones that are not pending (and the FATAL ones it asks to
// restart, afresh) within the node's capacity, as the kernel does
// (appliance.RunnableShards: the lowest IDs run, FATAL shards keep their
// place, the rest are held and stopped if they ran), and records the
// generation as applied (reported in the next check-in, which releases
// what it stopped).
func (s *simNode) apply(ctx context.Context, resp appliance.CheckinResponse) {
	if resp.NATS != nil { // the event types not to publish, as a kernel node takes them
		skip := map[string]bool{}
		for _, name := range resp.NATS.Skip {
			skip[name] = true
		}
		s.skip.Store(&skip)
	}
	keep := map[uint32]bool{}
	for _, id := range resp.Assigned {
		keep[id] = true
	}
	s.stopShards(keep)
	s.stopFatal(resp.RestartShards)
	var fatal []uint32
	s.mu.Lock()
	for id, sh := range s.shards {
		sh.mu.Lock()
		if sh.st.State == appliance.ShardFatal {
			fatal = append(fatal, id)
		}
		sh.mu.Unlock()
	}
	s.mu.Unlock()
	run, held := appliance.RunnableShards(resp.Assigned, resp.Pending, fatal, simCapacity)
	s.stopWhere(func(id uint32, _ *simShard) bool { return slices.Contains(held, id) })
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total = resp.TotalShards
	for _, id := range run {
		if s.shards[id] != nil {
			continue
		}
		sctx, cancel := context.WithCancel(ctx)
		sh := &simShard{st: appliance.ShardStatus{ID: id, State: appliance.ShardAssigned}, cancel: cancel, done: make(chan struct{})}
		s.shards[id] = sh
		go func() {
			defer close(sh.done)
			s.runShard(sctx, sh, id, resp.TotalShards)
		}()
	}
	s.applied = resp.Generation
}

// stopShards ends every running shard not in keep (all when keep is nil)
// and waits for their sessions to close.
func (s *simNode) stopShards(keep map[uint32]bool) {
	s.stopWhere(func(id uint32, _ *simShard) bool { return keep == nil || !keep[id] })
}

// stopFatal ends the listed shards that are FATAL (an operator asked to
// restart them, restart_shards), so that apply starts them again with a
// claimed Identify, as the kernel does; the others are left alone.
func (s *simNode) stopFatal(ids []uint32) {
	s.stopWhere(func(id uint32, sh *simShard) bool {
		if !slices.Contains(ids, id) {
			return false
		}
		sh.mu.Lock()
		defer sh.mu.Unlock()
		return sh.st.State == appliance.ShardFatal
	})
}

// stopWhere ends the running shards stop picks and waits for their
// sessions to close.
func (s *simNode) stopWhere(stop func(id uint32, sh *simShard) bool) {
	s.mu.Lock()
	var stopping []*simShard
	for id, sh := range s.shards {
		if stop(id, sh) {
			sh.cancel()
			stopping = append(stopping, sh)
			delete(s.shards, id)
		}
	}
	s.mu.Unlock()
	for _, sh := range stopping {
		<-sh.done
	}
}

// gatewayPayload is a Gateway frame.
type gatewayPayload struct {
	Op int             `json:"op"`
	D  json.RawMessage `json:"d"`
	S  *int64          `json:"s,omitempty"`
	T  *string         `json:"t,omitempty"`
	// raw is the frame as received (published unchanged).
	raw []byte
}

// runShard keeps one shard's session up until ctx ends, and answers the
// workers' commands for the shard meanwhile.
func (s *simNode) runShard(ctx context.Context, sh *simShard, id, total uint32) {
	nc, pub := s.nc, s.pub
	if s.auth != nil {
		var err error
		if nc, err = s.connectAs(ctx, sh); err != nil {
			return // ctx ended
		}
		defer nc.Close()
		if pub, err = events.NewPublisher(nc, events.PublisherConfig{App: labEventsApp, Node: s.id}); err != nil {
			return
		}
	}
	sh.pub = pub
	if nc != nil {
		sub, err := events.ServeCommands(nc, labEventsApp, id, func(body []byte) events.CommandReply {
			r := sh.command(body, id, total)
			r.Node = s.id
			return r
		})
		if err == nil {
			defer func() {
				sh.set(func(*appliance.ShardStatus) { sh.released = true })
				sub.Unsubscribe()
			}()
		}
	}
	for ctx.Err() == nil {
		err := s.session(ctx, sh, id, total)
		if ctx.Err() != nil {
			return
		}
		var ce websocket.CloseError
		fatal := errors.As(err, &ce) && (ce.Code == 4004 || (ce.Code >= 4010 && ce.Code <= 4014))
		sh.set(func(st *appliance.ShardStatus) {
			st.Reconnects++
			st.SeqValid = false
			st.LastError = shortError(err)
			if errors.As(err, &ce) {
				st.CloseCode = uint16(ce.Code)
			}
			st.State = appliance.ShardBackoff
			if fatal {
				st.State = appliance.ShardFatal
			}
		})
		if fatal {
			<-ctx.Done()
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
		}
	}
}

// connectAs connects to serve's NATS server as this node, retrying
// every second until ctx ends (the controller may not list the node as
// live with this shard yet); a refusal is shown as the shard's last error.
func (s *simNode) connectAs(ctx context.Context, sh *simShard) (*nats.Conn, error) {
	for {
		nc, err := nats.Connect(s.natsURL, nats.Name("dpxe lab "+s.id), nats.MaxReconnects(-1),
			nats.UserInfo(natsauth.NodePrefix+s.id, s.auth.NodePassword(s.id)))
		if err == nil {
			return nc, nil
		}
		sh.set(func(st *appliance.ShardStatus) { st.LastError = shortError(fmt.Errorf("NATS: %w", err)) })
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// shortError fits an error into ShardStatus.LastError (printable ASCII).
func shortError(err error) string {
	if err == nil {
		return ""
	}
	b := []byte(err.Error())
	for i, c := range b {
		if c < 0x20 || c > 0x7e {
			b[i] = '?'
		}
	}
	if len(b) > appliance.MaxLastErrorLen {
		b = b[:appliance.MaxLastErrorLen]
	}
	return string(b)
}

// claim asks the controller until it grants an Identify for the shard,
// and uses a grant only if it arrived within its use_within_ms of the
// claim's sending, as the kernel does (appliance.GrantUsable); a late one
// is claimed again with unused_grant.
func (s *simNode) claim(ctx context.Context, id uint32) error {
	unused := false
	for {
		var r appliance.IdentifyResponse
		sent := time.Now()
		err := s.api.do(ctx, "POST", "/v1/identify", appliance.IdentifyRequest{NodeID: s.id, ShardID: id, UnusedGrant: unused}, &r)
		wait := time.Second
		if err == nil && r.Granted {
			if appliance.GrantUsable(time.Since(sent), r.UseWithinMS) {
				return nil
			}
			unused, wait = true, 0
		} else if err == nil {
			unused = false
		}
		if err == nil && r.RetryAfterMS > 0 {
			wait = time.Duration(r.RetryAfterMS) * time.Millisecond
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// session runs one Gateway connection: Hello, a granted Identify, READY,
// heartbeats. It returns when the connection ends or ctx ends (then it
// closes with 1000, which ends the session at the Gateway).
func (s *simNode) session(ctx context.Context, sh *simShard, id, total uint32) error {
	sh.set(func(st *appliance.ShardStatus) { st.State = appliance.ShardStarting })
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	conn, _, err := websocket.Dial(dctx, s.gateway, &websocket.DialOptions{HTTPClient: s.gatewayHTTP})
	cancel()
	if err != nil {
		return err
	}
	defer conn.CloseNow()
	conn.SetReadLimit(1 << 20)
	var hello struct {
		HeartbeatInterval int64 `json:"heartbeat_interval"`
	}
	p, err := readPayload(ctx, conn)
	if err != nil {
		return err
	}
	if p.Op != 10 || json.Unmarshal(p.D, &hello) != nil || hello.HeartbeatInterval <= 0 {
		return fmt.Errorf("expected Hello, got op %d", p.Op)
	}
	interval := time.Duration(hello.HeartbeatInterval) * time.Millisecond
	// Every event the connection sends is noted in its send budget;
	// workers' commands go out only within it (events.CheckCommand). A
	// heartbeat interval shorter than Discord's (the lab's tests) shrinks
	// the 60 s window by the same ratio, as the emulator does.
	window := 60 * time.Second
	if interval < 41250*time.Millisecond {
		window = time.Duration(float64(window) * float64(interval) / float64(41250*time.Millisecond))
	}
	budget := events.NewSendBudget(window)
	var wmu sync.Mutex
	write := func(b []byte) error {
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		err := conn.Write(wctx, websocket.MessageText, b)
		if err == nil {
			budget.Note()
		}
		return err
	}
	send := func(v any) error {
		b, _ := json.Marshal(v)
		wmu.Lock()
		defer wmu.Unlock()
		return write(b)
	}
	var ready atomic.Bool
	sh.set(func(*appliance.ShardStatus) {
		sh.send = func(body []byte) events.CommandReply {
			wmu.Lock()
			defer wmu.Unlock()
			cmd, r := budget.Check(body, events.ShardView{Shard: id, TotalShards: total, Owned: true, Ready: ready.Load()}, interval)
			if r.Status == events.CodeOK {
				if err := write(cmd.Frame); err != nil {
					r.Status, r.Reason = events.CodeNotReady, "the connection failed: "+shortError(err)
				}
			}
			return r
		}
	})
	defer sh.set(func(*appliance.ShardStatus) { sh.send = nil })
	var seqMu sync.Mutex
	var seq *int64
	acked := true
	beat := func() error {
		seqMu.Lock()
		if !acked {
			sh.set(func(st *appliance.ShardStatus) { st.HeartbeatMisses++ })
		}
		acked = false
		d := seq
		seqMu.Unlock()
		return send(map[string]any{"op": 1, "d": d})
	}
	hctx, stopBeats := context.WithCancel(ctx)
	defer stopBeats()
	go func() {
		wait := time.Duration(rand.Float64() * float64(interval)) // first beat jittered, as Discord asks
		for {
			select {
			case <-hctx.Done():
				return
			case <-time.After(wait):
			}
			if beat() != nil {
				return
			}
			wait = interval
		}
	}()
	readErr := make(chan error, 1)
	go func() {
		var sp *events.SessionPublisher
		for {
			p, err := readPayload(context.Background(), conn)
			if err != nil {
				readErr <- err
				return
			}
			switch p.Op {
			case 0:
				seqMu.Lock()
				if p.S != nil {
					v := *p.S
					seq = &v
				}
				seqMu.Unlock()
				if sp, err = s.publish(hctx, sh.pub, sp, id, p); err != nil {
					readErr <- err
					return
				}
				if p.T != nil && (*p.T == "READY" || *p.T == "RESUMED") {
					ready.Store(true)
					sh.set(func(st *appliance.ShardStatus) {
						st.State, st.SeqValid, st.LastError, st.CloseCode = appliance.ShardReady, true, "", 0
					})
				}
			case 1:
				beat()
			case 11:
				seqMu.Lock()
				acked = true
				seqMu.Unlock()
				sh.set(func(st *appliance.ShardStatus) { st.HeartbeatAcks++ })
			case 7:
				readErr <- errors.New("op 7: reconnect requested")
				return
			case 9:
				readErr <- errors.New("op 9: invalid session")
				return
			}
		}
	}()
	// Heartbeats run from Hello on; the Identify waits for the
	// controller's grant meanwhile.
	identified := make(chan error, 1)
	go func() {
		if err := s.claim(hctx, id); err != nil {
			identified <- err
			return
		}
		identified <- send(map[string]any{"op": 2, "d": map[string]any{
			"token":      s.botToken,
			"intents":    labIntents,
			"shard":      []uint32{id, total},
			"properties": map[string]string{"os": "linux", "browser": "dpxe-lab", "device": "dpxe-lab"},
		}})
	}()
	for {
		select {
		case <-ctx.Done():
			conn.Close(websocket.StatusNormalClosure, "shard stopped")
			return ctx.Err()
		case err := <-identified:
			if err != nil && ctx.Err() == nil {
				conn.Close(websocket.StatusCode(4000), "reconnecting")
				return err
			}
			continue
		case err := <-readErr:
			conn.Close(websocket.StatusCode(4000), "reconnecting")
			return err
		}
	}
}

func readPayload(ctx context.Context, conn *websocket.Conn) (gatewayPayload, error) {
	var p gatewayPayload
	_, b, err := conn.Read(ctx)
	if err != nil {
		return p, err
	}
	p.raw = b
	return p, json.Unmarshal(b, &p)
}

// publish hands a dispatch to the node's Publisher: READY starts the
// session's publisher (its session_id names the messages), every dispatch
// with a sequence is published with its frame unchanged. Publish blocks
// while the session's window is full, so the shard stops reading, as the
// no-loss rule asks; an error ends the session.
func (s *simNode) publish(ctx context.Context, pub *events.Publisher, sp *events.SessionPublisher, shard uint32, p gatewayPayload) (*events.SessionPublisher, error) {
	if pub == nil || p.T == nil || p.S == nil || *p.S < 1 {
		return sp, nil
	}
	if *p.T == "READY" {
		var ready struct {
			SessionID string `json:"session_id"`
		}
		if err := json.Unmarshal(p.D, &ready); err != nil {
			return nil, fmt.Errorf("READY: %w", err)
		}
		var err error
		if sp, err = pub.Session(shard, ready.SessionID, 0); err != nil {
			return nil, fmt.Errorf("READY: %w", err)
		}
	}
	if sp == nil {
		return nil, nil // a dispatch before READY: not in a session
	}
	if skip := s.skip.Load(); skip != nil && (*skip)[*p.T] {
		sp.Skip(uint64(*p.S)) // the answer's nats.skip: counted, not sent
		return sp, nil
	}
	err := sp.Publish(ctx, events.Dispatch{Seq: uint64(*p.S), Event: *p.T, Payload: p.raw, Received: time.Now()})
	return sp, err
}
