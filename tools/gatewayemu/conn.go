package gatewayemu

import (
	"bytes"
	"compress/zlib"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// writeTimeout bounds one frame write to a slow or dead client.
const writeTimeout = 5 * time.Second

// smallFrame is the size up to which a write has no timeout of its own.
const smallFrame = 128

// maxDrain is how much of an oversize message is read and discarded before
// the 4002 close, so the close handshake is not stuck behind it.
const maxDrain = 1 << 20

// connPhase is where a connection is in the handshake.
type connPhase int

const (
	phaseHello       connPhase = iota // Hello not yet sent
	phaseUnauth                       // waiting for Identify or Resume
	phaseIdentifying                  // Identify refused, op 9 pending
	phaseReady                        // identified or resumed
)

// conn is one WebSocket connection.
type conn struct {
	e        *Emulator
	id       uint64
	ws       *websocket.Conn
	version  int
	onResume bool // connected to resume_gateway_url
	zlibTx   bool // compress=zlib-stream

	wmu       sync.Mutex // serialises frames (and the zlib stream)
	zbuf      bytes.Buffer
	zw        *zlib.Writer
	compressD atomic.Bool // Identify compress:true: dispatches as zlib frames

	// phase, sess and shard are guarded by e.mu.
	phase      connPhase
	sess       *session
	shard      *[2]int
	hadSession bool  // a session was attached to this connection before
	intents    int64 // of the Identify being admitted

	closing       atomic.Bool // the emulator closed or dropped it
	draining      atomic.Bool // op 7 sent: no further dispatches
	hbTimer       *time.Timer
	hbDeadline    atomic.Int64 // unix ns, real clock (it pairs with hbTimer)
	hbRechecked   atomic.Int64 // the deadline a late timer already rechecked once
	heartbeats    atomic.Int64
	lastHeartbeat atomic.Int64
	helloAt       atomic.Int64 // unix ns when Hello was written

	sendTimes []int64 // ring of recent client event times (unix ns)
	sendPos   int
	sendFull  bool

	stats     connStats
	fragState uint64 // fragmentation generator, under wmu
	// lastMembers is closed when the latest Request Guild Members answer
	// is written; read loop only.
	lastMembers chan struct{}
}

// serveGateway upgrades a request on "/" or ResumePath to a gateway connection.
func (e *Emulator) serveGateway(w http.ResponseWriter, r *http.Request) {
	path := strings.TrimSuffix(r.URL.Path, "/")
	if path != "" && path != ResumePath {
		http.NotFound(w, r)
		return
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		http.Error(w, "this is a Discord Gateway emulator: connect with a WebSocket client", http.StatusUpgradeRequired)
		return
	}
	onResume := path == ResumePath
	if rh := e.opts.ResumeHost; rh != "" {
		// A resume host is told apart by the Host header, as Discord's
		// resume edges are (resume_gateway_url has no path then).
		onResume = onResume || sameHostName(r.Host, rh)
	}
	if onResume {
		e.mu.Lock()
		unavailable := e.resumeUnavailable > 0
		if unavailable {
			e.resumeUnavailable--
		}
		e.mu.Unlock()
		if unavailable {
			http.Error(w, "resume gateway unavailable (injected fault)", http.StatusServiceUnavailable)
			return
		}
	}
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		InsecureSkipVerify: true, // any Origin: it is a test tool
		CompressionMode:    websocket.CompressionDisabled,
	})
	if err != nil {
		e.log.Debug("websocket accept", "err", err)
		return
	}
	ws.SetReadLimit(-1) // the emulator enforces 4096 bytes itself, with 4002
	c := &conn{
		e:        e,
		id:       e.connSeq.Add(1),
		ws:       ws,
		onResume: onResume,
	}
	c.stats.st = ConnStats{Conn: c.id, SendLimit: e.opts.SendLimit}
	c.fragState = mix64(e.opts.Seed ^ mix64(c.id))
	e.counters.connections.Add(1)
	e.counters.open.Add(1)
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		ws.CloseNow()
		e.counters.open.Add(-1)
		return
	}
	e.conns[c] = struct{}{}
	delay := e.helloDelay
	if e.helloCount > 0 {
		e.helloCount--
		if e.helloCount == 0 {
			e.helloDelay = 0
		}
	}
	reconnectFirst := e.helloReconnect > 0
	if reconnectFirst {
		e.helloReconnect--
	}
	e.mu.Unlock()
	defer c.finish()
	if e.checksHost() {
		e.mu.Lock()
		main, resume := e.host, e.resumeHost
		e.mu.Unlock()
		if !sameHostName(r.Host, main) && (resume == "" || !sameHostName(r.Host, resume)) {
			e.violate(Violation{Kind: KindWrongHost, Conn: c.id,
				Detail: fmt.Sprintf("handshake Host %q names neither the gateway host %q nor the resume host %q", r.Host, main, resume)})
		}
	}

	q := r.URL.Query()
	switch v := q.Get("v"); v {
	case "10":
		c.version = 10
	case "9":
		c.version = 9
	default:
		c.fail(KindInvalidAPIVersion, CloseInvalidAPIVersion, fmt.Sprintf("unsupported API version v=%q (9 and 10 are available)", v))
		c.wait()
		return
	}
	switch enc := q.Get("encoding"); enc {
	case "", "json":
	case "etf":
		c.closeWith(CloseUnsupported, "encoding=etf is not supported by the emulator; use encoding=json")
		c.wait()
		return
	default:
		c.closeWith(CloseUnsupported, fmt.Sprintf("unknown encoding %q; use encoding=json", enc))
		c.wait()
		return
	}
	switch comp := q.Get("compress"); comp {
	case "":
	case "zlib-stream":
		c.zlibTx = true
		c.stats.st.ZlibStream = true
		c.zw = zlib.NewWriter(&c.zbuf)
	default:
		c.closeWith(CloseUnsupported, fmt.Sprintf("compress=%q is not supported by the emulator; use zlib-stream or none", comp))
		c.wait()
		return
	}
	c.sendTimes = make([]int64, e.opts.SendLimit)

	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-e.baseCtx.Done():
			t.Stop()
			return
		}
	}
	if reconnectFirst {
		// op 7 "even before/in place of receiving a Hello" (research §1.4).
		c.draining.Store(true)
		c.writeOp(OpReconnect, nil)
		t := time.AfterFunc(e.opts.ReconnectGrace, func() {
			c.closeWith(CloseUnknownError, "reconnect requested (op 7) and the client did not close")
		})
		defer t.Stop()
		c.waitFor(e.opts.ReconnectGrace + writeTimeout)
		return
	}
	interval := e.opts.HeartbeatInterval
	c.hbTimer = time.AfterFunc(interval+e.opts.HeartbeatGrace, c.heartbeatMissed)
	c.hbDeadline.Store(time.Now().Add(interval + e.opts.HeartbeatGrace).UnixNano())
	e.mu.Lock()
	c.phase = phaseUnauth
	e.mu.Unlock()
	c.helloAt.Store(time.Now().UnixNano())
	c.writeOp(OpHello, map[string]any{"heartbeat_interval": interval.Milliseconds()})
	c.readLoop()
}

// checksHost reports whether handshakes must carry a configured host name:
// when the public or resume host is a name, as Discord's are.
func (e *Emulator) checksHost() bool {
	return isHostName(e.opts.PublicHost) || e.opts.ResumeHost != "" && isHostName(e.opts.ResumeHost)
}

// wait blocks until the close handshake started by closeWith finishes.
func (c *conn) wait() { c.waitFor(writeTimeout) }

// waitFor reads and discards until the connection ends or d passes.
func (c *conn) waitFor(d time.Duration) {
	ctx, cancel := context.WithTimeout(c.e.baseCtx, d)
	defer cancel()
	for {
		if _, _, err := c.ws.Read(ctx); err != nil {
			return
		}
	}
}

// readLoop reads client frames until the connection ends.
func (c *conn) readLoop() {
	e := c.e
	buf := make([]byte, MaxPayloadBytes+1)
	for {
		// No context deadline: Close and closeWith end blocked reads by
		// closing the connection, and a cancellable context would cost a
		// callback registration per message.
		typ, r, err := c.ws.Reader(context.Background())
		if err != nil {
			c.clientGone(err)
			return
		}
		n, err := io.ReadFull(r, buf)
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
			c.clientGone(err)
			return
		}
		if c.closing.Load() {
			continue // drain until the close handshake completes
		}
		c.stats.noteFrame(n)
		if n > MaxPayloadBytes {
			io.CopyN(io.Discard, r, maxDrain) // let the close handshake through
			c.malformed(FrameOversize)
			c.fail(KindOversizePayload, CloseDecodeError, fmt.Sprintf("client payload over %d bytes", MaxPayloadBytes))
			continue
		}
		if c.rateLimited() {
			c.fail(KindRateLimited, CloseRateLimited, fmt.Sprintf("more than %d client events in %v", e.opts.SendLimit, e.opts.SendWindow))
			continue
		}
		if typ != websocket.MessageText {
			c.malformed(FrameBinary)
			c.fail(KindDecodeError, CloseDecodeError, "binary frame: the client must send JSON text frames")
			continue
		}
		c.handle(buf[:n])
	}
}

// rateLimited counts one client event and reports whether it is over the
// send limit (the SendLimit+1-th event inside SendWindow).
func (c *conn) rateLimited() bool {
	now := c.e.opts.Now().UnixNano()
	oldest := c.sendTimes[c.sendPos]
	if c.sendFull && now-oldest < int64(c.e.opts.SendWindow) {
		c.stats.noteEvent(now, c.e.opts.SendWindow) // the SendLimit+1-th
		return true
	}
	c.stats.noteEvent(now, c.e.opts.SendWindow)
	c.sendTimes[c.sendPos] = now
	c.sendPos++
	if c.sendPos == len(c.sendTimes) {
		c.sendPos, c.sendFull = 0, true
	}
	return false
}

// handle processes one client payload.
func (c *conn) handle(frame []byte) {
	e := c.e
	p, err := decodeEnvelope(frame)
	if err != nil {
		if errors.Is(err, errMissingOp) {
			c.malformed(FrameMissingOp)
		} else {
			c.malformed(FrameNotJSON)
		}
		c.fail(KindDecodeError, CloseDecodeError, err.Error())
		return
	}
	e.mu.Lock()
	phase := c.phase
	e.mu.Unlock()
	switch op := *p.Op; op {
	case OpHeartbeat:
		c.heartbeat(p.D)
	case OpIdentify:
		if phase != phaseUnauth {
			c.fail(KindAlreadyAuthenticated, CloseAlreadyAuthenticated, "Identify on a connection that already identified or resumed")
			return
		}
		c.identify(p.D)
	case OpResume:
		if phase != phaseUnauth {
			c.fail(KindAlreadyAuthenticated, CloseAlreadyAuthenticated, "Resume on a connection that already identified or resumed")
			return
		}
		c.resume(p.D)
	case OpPresenceUpdate, OpVoiceStateUpdate, OpRequestGuildMembers, OpRequestSoundboard, OpRequestChannelInfo:
		if phase != phaseReady {
			c.fail(KindNotAuthenticated, CloseNotAuthenticated, fmt.Sprintf("op %d before Identify", op))
			return
		}
		if op == OpPresenceUpdate || op == OpVoiceStateUpdate || op == OpRequestGuildMembers {
			c.noteCommand(op, len(frame))
		}
		if op == OpRequestGuildMembers {
			c.requestMembers(p.D)
			return
		}
		// Accepted and ignored: the emulator has no presence or voice.
		if len(p.D) == 0 || string(p.D) == "null" || p.D[0] != '{' {
			c.fail(KindInvalidPayload, CloseUnknownOpcode, fmt.Sprintf("op %d needs an object in d", op))
		}
	default:
		c.fail(KindUnknownOpcode, CloseUnknownOpcode, fmt.Sprintf("unknown or client-forbidden opcode %d", op))
	}
}

// noteCommand records a Gateway command a ready connection sent.
func (c *conn) noteCommand(op, n int) {
	e := c.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.commands) >= maxCommandRecords {
		e.commandsDropped++
		return
	}
	shard := -1
	if c.shard != nil {
		shard = c.shard[0]
	}
	e.commands = append(e.commands, CommandRecord{Conn: c.id, Shard: shard, Op: op, Bytes: n, Received: time.Now()})
}

// heartbeat ACKs an op 1 (unless a stop_ack fault holds) and re-arms the
// missed-heartbeat timer. `d` must be the last sequence number or null.
func (c *conn) heartbeat(d json.RawMessage) {
	e := c.e
	if len(d) > 0 && string(d) != "null" {
		var seq int64
		if err := json.Unmarshal(d, &seq); err != nil {
			c.fail(KindInvalidPayload, CloseUnknownOpcode, "heartbeat d must be an integer sequence or null")
			return
		}
	}
	now := e.opts.Now()
	received := time.Now()
	n := c.heartbeats.Add(1)
	if n == 1 {
		if hello := c.helloAt.Load(); hello != 0 {
			after := time.Duration(time.Now().UnixNano() - hello)
			e.mu.Lock()
			e.firstBeats = append(e.firstBeats, FirstHeartbeat{Conn: c.id, After: after, Interval: e.opts.HeartbeatInterval})
			e.mu.Unlock()
		}
	}
	c.lastHeartbeat.Store(now.UnixNano())
	e.counters.heartbeats.Add(1)
	dl := e.opts.HeartbeatInterval + e.opts.HeartbeatGrace
	c.hbDeadline.Store(time.Now().Add(dl).UnixNano())
	c.hbTimer.Reset(dl)
	shard, rec, suppressed := -1, -1, false
	if e.opts.RecordHeartbeats || e.opts.AckDelay != nil || e.noAckCount.Load() > 0 {
		// (only then: the common case takes no lock per heartbeat)
		e.mu.Lock()
		if c.shard != nil {
			shard = c.shard[0]
		}
		if e.opts.RecordHeartbeats {
			rec = len(e.beats)
			e.beats = append(e.beats, HeartbeatRecord{Conn: c.id, Shard: shard, N: int(n), Received: received})
		}
		suppressed = e.noAckCount.Load() > 0 && c.shard != nil && e.noAck[c.shard[0]] // a stop_ack fault
		e.mu.Unlock()
	}
	if suppressed {
		return
	}
	e.counters.acks.Add(1)
	ack := func() {
		c.write(ackFrame, false)
		if rec >= 0 {
			t := time.Now()
			e.mu.Lock()
			e.beats[rec].Acked = t
			e.mu.Unlock()
		}
	}
	if e.opts.AckDelay != nil {
		if d := e.opts.AckDelay(shard, int(n)); d > 0 {
			time.AfterFunc(d, ack) // the read loop goes on
			return
		}
	}
	// The ACK waits for the connection's writer in its own goroutine: a
	// large dispatch to a slow client may hold the writer for seconds, and
	// the read loop must go on reading (and timing) the heartbeats that
	// arrive meanwhile, as Discord's does. Waiting here made a heartbeat
	// that arrived on time behind an 8 MiB GUILD_CREATE count as missed.
	go ack()
}

// ackFrame is the constant Heartbeat ACK payload.
var ackFrame = []byte(`{"op":11,"d":null,"s":null,"t":null}`)

// requestHeartbeat sends op 1 and shortens the deadline to the grace period.
func (c *conn) requestHeartbeat() {
	e := c.e
	dl := time.Now().Add(e.opts.HeartbeatGrace)
	if dl.UnixNano() < c.hbDeadline.Load() {
		c.hbDeadline.Store(dl.UnixNano())
		c.hbTimer.Reset(e.opts.HeartbeatGrace)
	}
	c.writeOp(OpHeartbeat, nil)
}

// timerLateRecheck is how late the heartbeat timer may fire before the
// emulator distrusts its own view: a timer that fires this late means this
// process was starved of CPU, and its reader goroutine may have a heartbeat
// buffered that it has not had the CPU to read. Such a timer rechecks once,
// after timerLateRecheck, before it records missed_heartbeat. A timer that
// fires on time decides at once, so the oracle is no looser on a machine
// with headroom.
const timerLateRecheck = 100 * time.Millisecond

// heartbeatMissed runs when the heartbeat deadline passes.
func (c *conn) heartbeatMissed() {
	if c.closing.Load() {
		return
	}
	deadline := c.hbDeadline.Load()
	now := time.Now().UnixNano()
	if now < deadline {
		return // a heartbeat re-armed the timer concurrently
	}
	late := time.Duration(now - deadline)
	c.e.noteTimerLate(late)
	if late >= timerLateRecheck && c.hbRechecked.Swap(deadline) != deadline {
		c.hbTimer.Reset(timerLateRecheck)
		return
	}
	c.failLate(KindMissedHeartbeat, CloseSessionTimedOut, fmt.Sprintf("no heartbeat within %v + %v grace",
		c.e.opts.HeartbeatInterval, c.e.opts.HeartbeatGrace), late)
}

// fail records a violation by the client and closes with code.
func (c *conn) fail(kind Kind, code int, detail string) { c.failLate(kind, code, detail, 0) }

// failLate is fail for a violation found by a timer that fired late.
func (c *conn) failLate(kind Kind, code int, detail string, late time.Duration) {
	e := c.e
	if reason := frameReason(kind); reason != "" {
		c.malformed(reason)
	}
	e.mu.Lock()
	v := Violation{Kind: kind, Conn: c.id, CloseCode: code, Detail: detail, Shard: c.shard, TimerLateMS: late.Milliseconds()}
	if c.sess != nil {
		v.Session = c.sess.id
	}
	e.violateLocked(v)
	e.mu.Unlock()
	c.closeWith(code, detail)
}

// closeWith closes the connection with code (once). The session, if any, is
// detached (resumable) or ended according to closeResumable.
func (c *conn) closeWith(code int, reason string) {
	if !c.closing.CompareAndSwap(false, true) {
		return
	}
	c.detach(closeResumable(code))
	if len(reason) > 120 { // a close reason must fit a 125-byte control frame
		reason = reason[:120]
	}
	go c.ws.Close(websocket.StatusCode(code), reason)
}

// drop closes the TCP connection without a close frame; the session stays resumable.
func (c *conn) drop() {
	if !c.closing.CompareAndSwap(false, true) {
		return
	}
	c.detach(true)
	c.ws.CloseNow()
}

// clientGone handles the end of the read loop. A client close with 1000 or
// 1001 ends the session; any other end keeps it resumable (research §1.8).
func (c *conn) clientGone(err error) {
	if c.closing.Load() {
		return
	}
	code := websocket.CloseStatus(err)
	c.closing.Store(true)
	c.detach(!(code == websocket.StatusNormalClosure || code == websocket.StatusGoingAway))
	c.e.log.Debug("client closed", "conn", c.id, "code", int(code), "err", err)
}

// finish releases the connection's resources.
func (c *conn) finish() {
	e := c.e
	if c.hbTimer != nil {
		c.hbTimer.Stop()
	}
	if !c.closing.Load() {
		c.closing.Store(true)
		c.detach(true)
	}
	c.ws.CloseNow()
	e.mu.Lock()
	if _, ok := e.conns[c]; ok {
		e.keepStatsLocked(c)
	}
	delete(e.conns, c)
	e.mu.Unlock()
	e.counters.open.Add(-1)
}

// detach separates the connection from its session: the session becomes
// resumable for ResumeTimeout, or ends.
func (c *conn) detach(resumable bool) {
	e := c.e
	e.mu.Lock()
	defer e.mu.Unlock()
	s := c.sess
	c.sess = nil
	if s == nil {
		return
	}
	e.detachLocked(s, c, resumable)
}

// detachLocked detaches s from c. e.mu must be held.
func (e *Emulator) detachLocked(s *session, c *conn, resumable bool) {
	s.mu.Lock()
	if s.conn == c {
		s.conn = nil
	}
	attached := s.conn != nil
	s.mu.Unlock()
	if live := e.live[s.shard]; live != nil && !attached {
		delete(live, s)
		if len(live) == 0 {
			delete(e.live, s.shard)
		}
	}
	if !resumable {
		e.endLocked(s)
		return
	}
	if attached {
		return
	}
	s.mu.Lock()
	s.detachedUntil = e.opts.Now().Add(e.opts.ResumeTimeout)
	if s.expiry != nil {
		s.expiry.Stop()
	}
	s.expiry = time.AfterFunc(e.opts.ResumeTimeout, func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		s.mu.Lock()
		stillDetached := s.conn == nil
		s.mu.Unlock()
		if stillDetached {
			e.endLocked(s)
		}
	})
	s.mu.Unlock()
	e.notifyLocked()
}

// endLocked ends session s for good. e.mu must be held.
func (e *Emulator) endLocked(s *session) {
	if _, ok := e.sessions[s.id]; !ok {
		return
	}
	delete(e.sessions, s.id)
	if live := e.live[s.shard]; live != nil {
		delete(live, s)
		if len(live) == 0 {
			delete(e.live, s.shard)
		}
	}
	s.mu.Lock()
	if c := s.conn; c != nil && c.sess == s {
		c.sess = nil
	}
	s.conn = nil
	s.mu.Unlock()
	go s.stop()
	e.notifyLocked()
}

// writeOp sends a non-dispatch payload.
func (c *conn) writeOp(op int, d any) {
	frame, err := json.Marshal(outPayload{Op: op, D: d})
	if err != nil {
		c.e.log.Error("marshal op", "op", op, "err", err)
		return
	}
	c.write(frame, false)
}

// writeDispatch sends a dispatch of session s, compressed per Identify
// compress:true, unless, once it holds the connection's writer, s is no
// longer attached to c or c was told to reconnect. s.mu is not held across
// writes, so detaching a session does not wait for one on its way; this
// check keeps a detach followed by op 9 or a close frame from being
// followed in turn by that dispatch.
func (c *conn) writeDispatch(s *session, frame []byte) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	s.mu.Lock()
	attached := s.conn == c
	s.mu.Unlock()
	if !attached || c.draining.Load() {
		return
	}
	c.writeLocked(frame, c.compressD.Load(), true)
}

// write sends one frame: through the zlib stream if the connection asked for
// compress=zlib-stream, as a standalone zlib message if payloadZlib, else as
// a text frame.
func (c *conn) write(frame []byte, payloadZlib bool) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.writeLocked(frame, payloadZlib, false)
}

// writeLocked is write under c.wmu that also tells the record whether
// frame is a dispatch.
func (c *conn) writeLocked(frame []byte, payloadZlib, dispatch bool) {
	ctx := context.Background()
	if len(frame) > smallFrame {
		// Small frames (Hello, ACK, op 7/9) fit the socket buffer of any
		// live peer; only larger ones get a timer against stuck clients.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(c.e.baseCtx, writeDeadline(len(frame)))
		defer cancel()
	}
	typ, data := websocket.MessageText, frame
	switch {
	case c.zlibTx:
		c.zbuf.Reset()
		c.zw.Write(frame)
		c.zw.Flush() // Z_SYNC_FLUSH: the message ends in 00 00 ff ff
		typ, data = websocket.MessageBinary, c.zbuf.Bytes()
	case payloadZlib:
		var b bytes.Buffer
		zw := zlib.NewWriter(&b)
		zw.Write(frame)
		zw.Close()
		typ, data = websocket.MessageBinary, b.Bytes()
	}
	frames, err := c.writeMessage(ctx, typ, data)
	if err != nil {
		if !c.closing.Load() {
			c.e.log.Debug("write", "conn", c.id, "err", err)
		}
		return // only messages handed to the connection whole are counted
	}
	c.stats.noteSent(len(frame), len(data), frames, dispatch)
	c.e.counters.payloadBytes.Add(uint64(len(frame)))
	c.e.counters.wireBytes.Add(uint64(len(data)))
}
