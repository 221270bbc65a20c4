package gatewayemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// FaultKind names an injectable fault.
type FaultKind string

// Fault kinds. Connection faults apply to identified connections matching the
// Fault's Shard or Session (all identified connections if neither is set).
const (
	// FaultReconnect sends op 7; the connection gets no further dispatches
	// (they are kept for replay) and is closed with 4000 after ReconnectGrace
	// unless the client closes first.
	FaultReconnect FaultKind = "reconnect"
	// FaultInvalidSession sends op 9 with d = Resumable. With false the
	// session ends; with true it stays resumable. The connection stays open
	// and accepts a new Identify or Resume.
	FaultInvalidSession FaultKind = "invalid_session"
	// FaultClose closes with Code (1000–1003, 1007–1014, 3000–4999).
	// Resumability follows the code (see closeResumable).
	FaultClose FaultKind = "close"
	// FaultDrop closes the TCP connection without a close frame; the
	// session stays resumable.
	FaultDrop FaultKind = "drop"
	// FaultStopAck stops ACKing heartbeats of shard Shard (now and on later
	// connections) until FaultResumeAck.
	FaultStopAck FaultKind = "stop_ack"
	// FaultResumeAck undoes FaultStopAck for Shard.
	FaultResumeAck FaultKind = "resume_ack"
	// FaultHeartbeatRequest sends op 1; the client must heartbeat within
	// HeartbeatGrace or it is closed (missed_heartbeat).
	FaultHeartbeatRequest FaultKind = "heartbeat_request"
	// FaultDelayHello delays Hello by DelayMS on the next Count new
	// connections (Count 0: every connection until a delay_hello with
	// DelayMS 0).
	FaultDelayHello FaultKind = "delay_hello"
	// FaultHelloReconnect sends op 7 instead of Hello on the next Count new
	// connections, then closes them (4000) after ReconnectGrace.
	FaultHelloReconnect FaultKind = "hello_reconnect"
	// FaultResumeUnavailable answers the next Count WebSocket handshakes on
	// resume_gateway_url with HTTP 503 (a dead resume edge, research §2.7).
	FaultResumeUnavailable FaultKind = "resume_unavailable"
	// FaultDispatch dispatches Event with Data to matching sessions,
	// including detached ones (kept for replay).
	FaultDispatch FaultKind = "dispatch"
	// FaultGuildDelete dispatches GUILD_DELETE for Guild to the sessions
	// holding it: {"id", "unavailable": true} for an outage when
	// Unavailable, else {"id"} (the bot was removed), after which Request
	// Guild Members for that guild is members_wrong_guild.
	FaultGuildDelete FaultKind = "guild_delete"
	// FaultCorruptZlib sends, on matching compress=zlib-stream connections,
	// one binary message whose deflate data is invalid (a block of the
	// reserved type 3, RFC 1951 §3.2.3) but which ends in 00 00 ff ff like
	// any message: the client's inflate must fail and it must reconnect.
	// The session stays resumable.
	FaultCorruptZlib FaultKind = "corrupt_zlib"
	// FaultResetBudget restores the session-start budget and a revoked token.
	FaultResetBudget FaultKind = "reset_budget"
)

// Errors of fault injection.
var (
	// ErrBadFault means the fault is malformed (unknown kind, bad code, ...).
	ErrBadFault = errors.New("gatewayemu: bad fault")
	// ErrNoTarget means no connection or session matched the fault.
	ErrNoTarget = errors.New("gatewayemu: fault matched no connection or session")
)

// Fault is one injected fault; it is also the JSON body of POST /debug/fault.
type Fault struct {
	Kind FaultKind `json:"kind"`
	// Shard selects connections/sessions by shard_id (any num_shards).
	Shard *int `json:"shard,omitempty"`
	// Session selects one session by ID.
	Session string `json:"session,omitempty"`
	// Code is the close code of FaultClose.
	Code int `json:"code,omitempty"`
	// Reason is the close reason of FaultClose.
	Reason string `json:"reason,omitempty"`
	// Resumable is op 9's d for FaultInvalidSession.
	Resumable bool `json:"resumable,omitempty"`
	// DelayMS is the Hello delay of FaultDelayHello.
	DelayMS int64 `json:"delay_ms,omitempty"`
	// Count is the number of connections FaultDelayHello,
	// FaultHelloReconnect and FaultResumeUnavailable apply to (0 clears the
	// latter two).
	Count int `json:"count,omitempty"`
	// Guild is the guild snowflake of FaultGuildDelete, Unavailable its flag.
	Guild       string `json:"guild,omitempty"`
	Unavailable bool   `json:"unavailable,omitempty"`
	// Event and Data are the dispatch of FaultDispatch.
	Event string          `json:"event,omitempty"`
	Data  json.RawMessage `json:"data,omitempty"`
}

// DecodeFault reads one Fault as strict JSON (unknown fields are errors).
func DecodeFault(r io.Reader) (Fault, error) {
	var f Fault
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return f, fmt.Errorf("%w: %v", ErrBadFault, err)
	}
	return f, nil
}

// validCloseCode reports whether code may be sent in a close frame.
func validCloseCode(code int) bool {
	switch {
	case code >= 1000 && code <= 1003, code >= 1007 && code <= 1014, code >= 3000 && code <= 4999:
		return true
	}
	return false
}

// Inject applies f and returns how many connections or sessions it touched.
func (e *Emulator) Inject(f Fault) (int, error) {
	switch f.Kind {
	case FaultDelayHello:
		if f.DelayMS < 0 || f.Count < 0 {
			return 0, fmt.Errorf("%w: delay_ms and count must be >= 0", ErrBadFault)
		}
		e.mu.Lock()
		e.helloDelay = time.Duration(f.DelayMS) * time.Millisecond
		e.helloCount = f.Count
		e.mu.Unlock()
		return 1, nil
	case FaultResetBudget:
		e.ResetBudget()
		return 1, nil
	case FaultHelloReconnect, FaultResumeUnavailable:
		if f.Count < 0 {
			return 0, fmt.Errorf("%w: count must be >= 0", ErrBadFault)
		}
		e.mu.Lock()
		if f.Kind == FaultHelloReconnect {
			e.helloReconnect = f.Count
		} else {
			e.resumeUnavailable = f.Count
		}
		e.mu.Unlock()
		return 1, nil
	case FaultStopAck, FaultResumeAck:
		if f.Shard == nil {
			return 0, fmt.Errorf("%w: %s needs shard", ErrBadFault, f.Kind)
		}
		e.mu.Lock()
		if f.Kind == FaultStopAck {
			e.noAck[*f.Shard] = true
		} else {
			delete(e.noAck, *f.Shard)
		}
		e.noAckCount.Store(int32(len(e.noAck)))
		e.notifyLocked()
		e.mu.Unlock()
		return 1, nil
	case FaultDispatch:
		if f.Event == "" || strings.ToUpper(f.Event) != f.Event {
			return 0, fmt.Errorf("%w: dispatch needs an upper-case event name", ErrBadFault)
		}
		var data any = map[string]any{}
		if len(f.Data) > 0 {
			if err := json.Unmarshal(f.Data, &data); err != nil {
				return 0, fmt.Errorf("%w: dispatch data: %v", ErrBadFault, err)
			}
		}
		targets := e.matchSessions(f)
		for _, s := range targets {
			e.dispatch(s, f.Event, data)
		}
		return len(targets), noTarget(len(targets))
	case FaultGuildDelete:
		g, err := parseSnowflake(json.RawMessage(strconv.Quote(f.Guild)))
		if err != nil {
			return 0, fmt.Errorf("%w: guild_delete guild: %v", ErrBadFault, err)
		}
		d := map[string]any{"id": snowflake(g)}
		if f.Unavailable {
			d["unavailable"] = true
		}
		n := 0
		for _, s := range e.matchSessions(f) {
			s.mu.Lock()
			holds := slices.Contains(s.guilds, g) && !s.removed[g]
			if holds && !f.Unavailable {
				if s.removed == nil {
					s.removed = map[uint64]bool{}
				}
				s.removed[g] = true // the bot left: op 8 for it is now wrong
			}
			s.mu.Unlock()
			if holds {
				e.dispatch(s, "GUILD_DELETE", d)
				n++
			}
		}
		return n, noTarget(n)
	case FaultClose:
		if !validCloseCode(f.Code) {
			return 0, fmt.Errorf("%w: close code %d cannot be sent", ErrBadFault, f.Code)
		}
	case FaultCorruptZlib:
		var targets []*conn
		for _, c := range e.matchConns(f) {
			if c.zlibTx {
				targets = append(targets, c)
			}
		}
		for _, c := range targets {
			c.writeCorruptZlib()
		}
		return len(targets), noTarget(len(targets))
	case FaultReconnect, FaultInvalidSession, FaultDrop, FaultHeartbeatRequest:
	default:
		return 0, fmt.Errorf("%w: unknown kind %q", ErrBadFault, f.Kind)
	}
	targets := e.matchConns(f)
	for _, c := range targets {
		e.applyConnFault(c, f)
	}
	return len(targets), noTarget(len(targets))
}

func noTarget(n int) error {
	if n == 0 {
		return ErrNoTarget
	}
	return nil
}

// matchConns returns identified connections matching f's selector.
func (e *Emulator) matchConns(f Fault) []*conn {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []*conn
	for c := range e.conns {
		if c.sess == nil || c.closing.Load() {
			continue
		}
		if f.Shard != nil && c.sess.shard[0] != *f.Shard {
			continue
		}
		if f.Session != "" && c.sess.id != f.Session {
			continue
		}
		out = append(out, c)
	}
	return out
}

// matchSessions returns sessions (attached or detached) matching f's selector.
func (e *Emulator) matchSessions(f Fault) []*session {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []*session
	for _, s := range e.sessions {
		if f.Shard != nil && s.shard[0] != *f.Shard {
			continue
		}
		if f.Session != "" && s.id != f.Session {
			continue
		}
		out = append(out, s)
	}
	return out
}

// applyConnFault applies a connection fault to c.
func (e *Emulator) applyConnFault(c *conn, f Fault) {
	switch f.Kind {
	case FaultReconnect:
		c.draining.Store(true)
		c.writeOp(OpReconnect, nil)
		time.AfterFunc(e.opts.ReconnectGrace, func() {
			c.closeWith(CloseUnknownError, "reconnect requested (op 7) and the client did not close")
		})
	case FaultInvalidSession:
		e.mu.Lock()
		s := c.sess
		c.sess = nil
		c.phase = phaseUnauth
		if s != nil {
			e.detachLocked(s, c, f.Resumable)
		}
		e.mu.Unlock()
		c.writeOp(OpInvalidSession, f.Resumable)
	case FaultClose:
		reason := f.Reason
		if reason == "" {
			reason = fmt.Sprintf("injected close %d", f.Code)
		}
		c.closeWith(f.Code, reason)
	case FaultDrop:
		c.drop()
	case FaultHeartbeatRequest:
		c.requestHeartbeat()
	}
}

// ScriptStep is one line of a fault script: a Fault applied AtMS
// milliseconds after the script starts.
type ScriptStep struct {
	AtMS int64 `json:"at_ms"`
	Fault
}

// RunScript applies a fault script: one JSON ScriptStep per line, in
// non-decreasing at_ms order; empty lines and lines starting with # are
// skipped. A step that matches no target is logged, not fatal. It returns
// when the script ends or ctx is done.
func (e *Emulator) RunScript(ctx context.Context, r io.Reader) error {
	sc := bufio.NewScanner(r)
	start := time.Now()
	line := 0
	var last int64
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		var st ScriptStep
		dec := json.NewDecoder(strings.NewReader(text))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&st); err != nil {
			return fmt.Errorf("fault script line %d: %w: %v", line, ErrBadFault, err)
		}
		if st.AtMS < last {
			return fmt.Errorf("fault script line %d: at_ms %d before previous %d", line, st.AtMS, last)
		}
		last = st.AtMS
		wait := time.Until(start.Add(time.Duration(st.AtMS) * time.Millisecond))
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
		}
		n, err := e.Inject(st.Fault)
		switch {
		case errors.Is(err, ErrNoTarget):
			e.log.Warn("fault script step matched nothing", "line", line, "kind", st.Kind)
		case err != nil:
			return fmt.Errorf("fault script line %d: %w", line, err)
		default:
			e.log.Info("fault script step", "line", line, "kind", st.Kind, "applied", n)
		}
	}
	return sc.Err()
}
