package gatewayemu

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// resumeOn dials url path ("/" or ResumePath) and sends Resume.
func resumeOn(t *testing.T, emu *Emulator, path, session string, seq int64) *wsClient {
	t.Helper()
	c := dial(t, emu, path+"?v=10&encoding=json")
	c.expectOp(OpHello)
	c.send(OpResume, map[string]any{"token": emu.Token(), "session_id": session, "seq": seq})
	return c
}

func TestResumeReplaysMissedDispatches(t *testing.T) {
	t.Parallel()
	o := fastOptions()
	o.Guilds = 3
	emu := startEmu(t, o)
	c := connect(t, emu)
	r := c.identify(emu, 0, 1)
	seen := c.lastS // READY + 3 GUILD_CREATE = 4
	if seen != 4 {
		t.Fatalf("last seq %d, want 4", seen)
	}
	// The client goes away with a resumable close code.
	c.ws.Close(4000, "client zombie")
	awaitState(t, emu, "session detached", func(s State) bool {
		return len(s.Shards) == 1 && s.Shards[0].Sessions[0].State == SessionDetached
	})
	// Three events happen while it is away.
	for i := 0; i < 3; i++ {
		if n, err := emu.Inject(Fault{Kind: FaultDispatch, Shard: intp(0), Event: "TEST_EVENT",
			Data: json.RawMessage(`{"n":` + string(rune('0'+i)) + `}`)}); n != 1 || err != nil {
			t.Fatal(n, err)
		}
	}
	c2 := resumeOn(t, emu, ResumePath, r.SessionID, seen)
	for i := 0; i < 3; i++ {
		f := c2.expectDispatch("TEST_EVENT")
		if *f.S != seen+int64(i)+1 || !bytes.Contains(f.D, []byte{byte('0' + i)}) {
			t.Fatalf("replay %d: %v s=%d", i, f, *f.S)
		}
	}
	f := c2.expectDispatch("RESUMED")
	if *f.S != seen+4 {
		t.Fatalf("RESUMED s=%d, want %d", *f.S, seen+4)
	}
	// Live again: new dispatches arrive directly.
	emu.Inject(Fault{Kind: FaultDispatch, Shard: intp(0), Event: "AFTER"})
	c2.expectDispatch("AFTER")
	st := emu.State()
	if st.Counters.Resumes != 1 || st.Counters.ReplayedDispatches != 3 {
		t.Fatalf("counters %+v", st.Counters)
	}
	if s := emu.Sessions(); len(s) != 1 || s[0].State != SessionConnected || s[0].Resumes != 1 {
		t.Fatalf("sessions %+v", s)
	}
	noViolations(t, emu)
	// A full partial replay: resume from an older seq after a TCP drop.
	emu.Inject(Fault{Kind: FaultDrop, Shard: intp(0)})
	c2.expectClose(-1)
	c3 := resumeOn(t, emu, ResumePath, r.SessionID, 2)
	for _, want := range []string{"GUILD_CREATE", "GUILD_CREATE", "TEST_EVENT", "TEST_EVENT", "TEST_EVENT", "AFTER", "RESUMED"} {
		c3.expectDispatch(want)
	}
	noViolations(t, emu)
}

func TestResumeFailures(t *testing.T) {
	t.Parallel()
	o := fastOptions()
	o.ResumeTimeout = 2 * time.Second // long enough to observe "detached" on a loaded machine
	emu := startEmu(t, o)

	// Unknown session: op 9 false, and the same connection may Identify.
	c := resumeOn(t, emu, ResumePath, "no-such-session", 3)
	if f := c.expectOp(OpInvalidSession); string(f.D) != "false" {
		t.Fatalf("op 9 d=%s", f.D)
	}
	r := c.identify(emu, 0, 1)

	// seq beyond what the session sent: 4007, session over.
	c.ws.Close(4000, "away")
	awaitState(t, emu, "detached", func(s State) bool {
		return len(s.Shards) == 1 && s.Shards[0].Sessions[0].State == SessionDetached
	})
	c2 := resumeOn(t, emu, ResumePath, r.SessionID, 999)
	c2.expectClose(CloseInvalidSeq)
	if k := violationKinds(emu); len(k) != 1 || k[0] != KindInvalidSeq {
		t.Fatalf("violations %v", k)
	}
	awaitState(t, emu, "session ended by 4007", func(s State) bool { return len(s.Shards) == 0 })

	// Client close 1000 ends the session.
	c3 := connect(t, emu)
	r3 := c3.identify(emu, 0, 1)
	c3.ws.Close(1000, "bye")
	awaitState(t, emu, "session ended by 1000", func(s State) bool { return len(s.Shards) == 0 })
	c4 := resumeOn(t, emu, ResumePath, r3.SessionID, c3.lastS)
	c4.expectOp(OpInvalidSession)

	// Resume timeout: a detached session expires.
	c5 := connect(t, emu)
	r5 := c5.identify(emu, 0, 1)
	c5.ws.CloseNow() // TCP drop by the client: resumable
	awaitState(t, emu, "detached", func(s State) bool {
		return len(s.Shards) == 1 && s.Shards[0].Sessions[0].State == SessionDetached &&
			s.Shards[0].Sessions[0].ResumableUntil != nil
	})
	awaitState(t, emu, "expired", func(s State) bool { return len(s.Shards) == 0 })
	c6 := resumeOn(t, emu, ResumePath, r5.SessionID, c5.lastS)
	c6.expectOp(OpInvalidSession)

	// Bad Resume payloads.
	c7 := connect(t, emu)
	c7.send(OpResume, map[string]any{"token": emu.Token(), "session_id": "x"})
	c7.expectClose(CloseUnknownOpcode)
	c8 := connect(t, emu)
	c8.send(OpResume, map[string]any{"token": emu.Token(), "session_id": "x", "seq": 1, "extra": 1})
	c8.expectClose(CloseUnknownOpcode)
	c9 := connect(t, emu)
	c9.send(OpResume, map[string]any{"token": "bad", "session_id": "x", "seq": 1})
	c9.expectClose(CloseAuthenticationFailed)
}

func TestResumeOnMainURLIsRecorded(t *testing.T) {
	t.Parallel()
	emu := startEmu(t, fastOptions())
	c := connect(t, emu)
	r := c.identify(emu, 0, 1)
	c.ws.Close(4000, "away")
	awaitState(t, emu, "detached", func(s State) bool {
		return len(s.Shards) == 1 && s.Shards[0].Sessions[0].State == SessionDetached
	})
	c2 := resumeOn(t, emu, "/", r.SessionID, c.lastS)
	c2.expectDispatch("RESUMED")
	vs := emu.Violations()
	if len(vs) != 1 || vs[0].Kind != KindResumeWrongURL || vs[0].Session != r.SessionID {
		t.Fatalf("violations %+v", vs)
	}
}

func TestResumeTakesOverLiveConnection(t *testing.T) {
	t.Parallel()
	emu := startEmu(t, fastOptions())
	c := connect(t, emu)
	r := c.identify(emu, 0, 1)
	c2 := resumeOn(t, emu, ResumePath, r.SessionID, c.lastS)
	c2.expectDispatch("RESUMED")
	c.expectClose(CloseUnknownError)
	s := emu.Sessions()
	if len(s) != 1 || s[0].State != SessionConnected {
		t.Fatalf("sessions %+v", s)
	}
	noViolations(t, emu)
}

func TestIdentifyBucketWindow(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	o := fastOptions()
	o.Now = clock.Now
	o.MaxConcurrency = 2
	o.IdentifyWindow = 5 * time.Second
	o.IdentifyRejectDelay = 50 * time.Millisecond
	o.SessionStarts = 100
	emu := startEmu(t, o)

	a := connect(t, emu)
	a.identify(emu, 0, 4) // bucket 0
	b := connect(t, emu)
	b.identify(emu, 1, 4) // bucket 1: its own window
	clock.Advance(time.Second)
	c := connect(t, emu)
	start := time.Now()
	c.send(OpIdentify, identifyPayload(emu, 2, 4)) // bucket 0 again, 1 s later
	f := c.expectOp(OpInvalidSession)
	if string(f.D) != "false" {
		t.Fatalf("op 9 d=%s", f.D)
	}
	if el := time.Since(start); el < 40*time.Millisecond {
		t.Fatalf("op 9 after %v, want the reject delay", el)
	}
	ids := emu.Identifies()
	if len(ids) != 3 || ids[2].Outcome != IdentifyRefused || ids[2].Bucket != 0 || !strings.Contains(ids[2].Reason, "opens in 4s") {
		t.Fatalf("identifies %+v", ids)
	}
	vs := emu.Violations()
	if len(vs) != 2 || vs[0].Kind != KindIdentifyOverConcurrency || vs[1].Kind != KindIdentifyTooEarly || *vs[1].Shard != [2]int{2, 4} {
		t.Fatalf("violations %+v", vs)
	}
	// The refused Identify cost a session start.
	if ssl := emu.SessionStartLimit(); ssl.Remaining != 97 {
		t.Fatalf("remaining %d, want 97", ssl.Remaining)
	}
	// The same connection may Identify again once the window opened.
	clock.Advance(4 * time.Second)
	c.identify(emu, 2, 4)
	if ids := emu.Identifies(); ids[3].Outcome != IdentifyAccepted {
		t.Fatalf("identifies %+v", ids)
	}
	if got := len(emu.Violations()); got != 2 {
		t.Fatalf("%d violations after a timely Identify", got)
	}
}

func TestBucketOrder(t *testing.T) {
	t.Parallel()
	o := fastOptions()
	o.MaxConcurrency = 2
	emu := startEmu(t, o)
	// Start group 1 (shards 2, 3) before group 0 (shards 0, 1).
	c := connect(t, emu)
	c.identify(emu, 2, 4)
	vs := emu.ViolationsOf(KindBucketOutOfOrder)
	if len(vs) != 1 || *vs[0].Shard != [2]int{2, 4} {
		t.Fatalf("violations %+v", emu.Violations())
	}
	// In order: no further order violations, even for a restart of shard 2.
	for _, id := range []int{0, 1, 3} {
		connect(t, emu).identify(emu, id, 4)
	}
	if vs := emu.ViolationsOf(KindBucketOutOfOrder); len(vs) != 1 {
		t.Fatalf("violations %+v", vs)
	}
	// Another num_shards is tracked separately; shard 1 of 2 is group 0 there.
	o2 := fastOptions()
	o2.MaxConcurrency = 2
	o2.SkipBucketOrder = true
	emu2 := startEmu(t, o2)
	connect(t, emu2).identify(emu2, 3, 4)
	noViolations(t, emu2)
}

func TestDuplicateLiveSession(t *testing.T) {
	t.Parallel()
	emu := startEmu(t, fastOptions())
	a := connect(t, emu)
	ra := a.identify(emu, 0, 2)
	b := connect(t, emu)
	rb := b.identify(emu, 0, 2)
	vs := emu.Violations()
	if len(vs) != 1 || vs[0].Kind != KindDuplicateSession || vs[0].Session != rb.SessionID || !strings.Contains(vs[0].Detail, ra.SessionID) {
		t.Fatalf("violations %+v", vs)
	}
	st := emu.State()
	if len(st.Shards) != 1 || len(st.Shards[0].Sessions) != 2 {
		t.Fatalf("shards %+v", st.Shards)
	}
	// A different num_shards is not a duplicate (resharding hand-off).
	connect(t, emu).identify(emu, 0, 4)
	if len(emu.Violations()) != 1 {
		t.Fatalf("violations %+v", emu.Violations())
	}
}

func TestSessionStartBudget(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	o := fastOptions()
	o.Now = clock.Now
	o.SessionStarts = 2
	o.MaxConcurrency = 2 // the fake clock stands still: use two buckets
	o.BudgetPeriod = time.Hour
	emu := startEmu(t, o)
	a := connect(t, emu)
	a.identify(emu, 0, 2)
	b := connect(t, emu)
	b.identify(emu, 1, 2)
	if ssl := emu.SessionStartLimit(); ssl.Remaining != 0 || ssl.ResetAfter != time.Hour.Milliseconds() {
		t.Fatalf("limit %+v", ssl)
	}
	noViolations(t, emu)
	// Over the budget: every session closes and the token is revoked.
	c := connect(t, emu)
	c.send(OpIdentify, identifyPayload(emu, 0, 2))
	c.expectClose(CloseAuthenticationFailed)
	a.expectClose(CloseAuthenticationFailed)
	b.expectClose(CloseAuthenticationFailed)
	if k := violationKinds(emu); len(k) != 1 || k[0] != KindBudgetExhausted {
		t.Fatalf("violations %v", k)
	}
	awaitState(t, emu, "sessions gone", func(s State) bool { return len(s.Shards) == 0 && s.TokenRevoked })
	req, _ := http.NewRequest(http.MethodGet, emu.APIBase(10)+"gateway/bot", nil)
	req.Header.Set("Authorization", "Bot "+emu.Token())
	resp, err := emu.HTTPClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("/gateway/bot with a reset token: %d", resp.StatusCode)
	}
	d := connect(t, emu)
	d.send(OpIdentify, identifyPayload(emu, 0, 2))
	d.expectClose(CloseAuthenticationFailed)
	// The period passes: budget and token come back.
	clock.Advance(time.Hour + time.Second)
	if ssl := emu.SessionStartLimit(); ssl.Remaining != 2 || ssl.ResetAfter != (time.Hour-time.Second).Milliseconds() {
		t.Fatalf("after reset %+v", ssl)
	}
	connect(t, emu).identify(emu, 0, 2)
}

func TestFaults(t *testing.T) {
	t.Parallel()
	o := fastOptions()
	o.ReconnectGrace = 100 * time.Millisecond
	emu := startEmu(t, o)

	t.Run("reconnect then server close", func(t *testing.T) {
		c := connect(t, emu)
		c.identify(emu, 0, 1)
		if n, err := emu.Inject(Fault{Kind: FaultReconnect, Shard: intp(0)}); n != 1 || err != nil {
			t.Fatal(n, err)
		}
		c.expectOp(OpReconnect)
		// Dispatches after op 7 are held for replay, not sent.
		emu.Inject(Fault{Kind: FaultDispatch, Shard: intp(0), Event: "HELD"})
		c.expectClose(CloseUnknownError)
		s := emu.Sessions()
		if len(s) != 1 || s[0].State != SessionDetached {
			t.Fatalf("sessions %+v", s)
		}
		c2 := resumeOn(t, emu, ResumePath, s[0].ID, c.lastS)
		c2.expectDispatch("HELD")
		c2.expectDispatch("RESUMED")
		c2.ws.Close(1000, "done")
		awaitState(t, emu, "ended", func(s State) bool { return len(s.Shards) == 0 })
	})
	t.Run("invalid session", func(t *testing.T) {
		for _, resumable := range []bool{true, false} {
			c := connect(t, emu)
			r := c.identify(emu, 0, 1)
			emu.Inject(Fault{Kind: FaultInvalidSession, Session: r.SessionID, Resumable: resumable})
			f := c.expectOp(OpInvalidSession)
			if string(f.D) != map[bool]string{true: "true", false: "false"}[resumable] {
				t.Fatalf("op 9 d=%s", f.D)
			}
			if resumable {
				// Resume on the same connection.
				c.send(OpResume, map[string]any{"token": emu.Token(), "session_id": r.SessionID, "seq": c.lastS})
				c.expectDispatch("RESUMED")
			} else {
				if len(emu.Sessions()) != 0 {
					t.Fatalf("session survived op 9 false: %+v", emu.Sessions())
				}
				c.identify(emu, 0, 1) // re-Identify on the same connection
			}
			c.ws.Close(1000, "done")
			awaitState(t, emu, "ended", func(s State) bool { return len(s.Shards) == 0 })
		}
	})
	t.Run("close codes", func(t *testing.T) {
		for _, tc := range []struct {
			code      int
			resumable bool
		}{{4000, true}, {4009, false}, {4014, false}, {1001, true}, {3001, true}} {
			c := connect(t, emu)
			c.identify(emu, 0, 1)
			if n, err := emu.Inject(Fault{Kind: FaultClose, Code: tc.code}); n != 1 || err != nil {
				t.Fatal(tc.code, n, err)
			}
			c.expectClose(tc.code)
			st := awaitState(t, emu, "closed", func(s State) bool { return s.Counters.OpenConnections == 0 })
			if got := len(st.Shards) == 1; got != tc.resumable {
				t.Fatalf("close %d: resumable=%v, want %v", tc.code, got, tc.resumable)
			}
			for _, s := range emu.Sessions() {
				emu.mu.Lock()
				emu.endLocked(emu.sessions[s.ID])
				emu.mu.Unlock()
			}
		}
		if _, err := emu.Inject(Fault{Kind: FaultClose, Code: 1005}); err == nil {
			t.Fatal("close 1005 accepted")
		}
	})
	t.Run("drop", func(t *testing.T) {
		c := connect(t, emu)
		c.identify(emu, 0, 1)
		emu.Inject(Fault{Kind: FaultDrop})
		c.expectClose(-1)
		awaitState(t, emu, "detached", func(s State) bool {
			return len(s.Shards) == 1 && s.Shards[0].Sessions[0].State == SessionDetached
		})
		emu.Inject(Fault{Kind: FaultDispatch, Event: "CLEANUP"}) // reaches the detached session
		for _, s := range emu.Sessions() {
			emu.mu.Lock()
			emu.endLocked(emu.sessions[s.ID])
			emu.mu.Unlock()
		}
	})
	t.Run("stop ack", func(t *testing.T) {
		c := connect(t, emu)
		c.identify(emu, 0, 1)
		emu.Inject(Fault{Kind: FaultStopAck, Shard: intp(0)})
		if s := emu.Sessions(); !s[0].AckSuppressed {
			t.Fatalf("sessions %+v", s)
		}
		c.send(OpHeartbeat, c.lastS)
		// No ACK: the next frame is the dispatch we inject afterwards.
		emu.Inject(Fault{Kind: FaultDispatch, Shard: intp(0), Event: "MARK"})
		c.expectDispatch("MARK")
		emu.Inject(Fault{Kind: FaultResumeAck, Shard: intp(0)})
		c.send(OpHeartbeat, c.lastS)
		c.expectOp(OpHeartbeatACK)
		c.ws.Close(1000, "done")
		awaitState(t, emu, "ended", func(s State) bool { return len(s.Shards) == 0 })
	})
	t.Run("delay hello", func(t *testing.T) {
		const delay = 2 * time.Second
		emu.Inject(Fault{Kind: FaultDelayHello, DelayMS: delay.Milliseconds(), Count: 1})
		start := time.Now()
		connect(t, emu)
		if el := time.Since(start); el < delay {
			t.Fatalf("hello after %v", el)
		}
		start = time.Now()
		connect(t, emu) // count 1: this one is not delayed
		if el := time.Since(start); el >= delay {
			t.Fatalf("second hello delayed %v", el)
		}
	})
	t.Run("bad faults", func(t *testing.T) {
		for _, f := range []Fault{{Kind: "explode"}, {Kind: FaultStopAck}, {Kind: FaultDispatch, Event: "lower"}, {Kind: FaultDelayHello, DelayMS: -1}} {
			if _, err := emu.Inject(f); err == nil {
				t.Errorf("%+v accepted", f)
			}
		}
		if _, err := emu.Inject(Fault{Kind: FaultReconnect, Shard: intp(77)}); err != ErrNoTarget {
			t.Errorf("no target: %v", err)
		}
	})
	noViolations(t, emu)
}

func TestDebugHTTP(t *testing.T) {
	t.Parallel()
	emu := startEmu(t, fastOptions())
	c := connect(t, emu)
	r := c.identify(emu, 0, 1)
	hc := emu.HTTPClient()
	post := func(body string) (int, string) {
		resp, err := hc.Post(emu.HTTPURL()+FaultPath, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := post(`{"kind":"heartbeat_request","shard":0}`); code != 200 || !strings.Contains(body, `"applied": 1`) {
		t.Fatalf("fault: %d %s", code, body)
	}
	c.expectOp(OpHeartbeat)
	for _, bad := range []string{`{"kind":"nope"}`, `{"kind":"close","code":5}`, `{"kind":"drop","bogus":1}`, `not json`} {
		if code, body := post(bad); code != 400 {
			t.Errorf("%s: %d %s", bad, code, body)
		}
	}
	if code, _ := post(`{"kind":"drop","shard":9}`); code != 409 {
		t.Errorf("no target: %d", code)
	}
	resp, err := hc.Get(emu.HTTPURL() + StatePath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	dec.DisallowUnknownFields()
	var st State
	if err := dec.Decode(&st); err != nil {
		t.Fatal(err)
	}
	if len(st.Shards) != 1 || st.Shards[0].Sessions[0].ID != r.SessionID || st.GatewayURL != emu.URL() ||
		len(st.Identifies) != 1 || st.Violations == nil || st.SessionStartLimit.Total != 1000 {
		t.Fatalf("state %+v", st)
	}
	// Plain GET on the gateway path explains itself.
	resp2, err := hc.Get(emu.HTTPURL() + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp2.Body.Close()
	if resp2.StatusCode != http.StatusUpgradeRequired {
		t.Fatalf("GET / = %d", resp2.StatusCode)
	}
}

func TestTLS(t *testing.T) {
	t.Parallel()
	o := fastOptions()
	o.TLS = true
	emu := startEmu(t, o)
	if !strings.HasPrefix(emu.URL(), "wss://") || !strings.HasPrefix(emu.HTTPURL(), "https://") {
		t.Fatalf("urls %s %s", emu.URL(), emu.HTTPURL())
	}
	// Fetch the CA over https without trusting it, then trust it.
	insecure := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := insecure.Get(emu.HTTPURL() + CAPath)
	if err != nil {
		t.Fatal(err)
	}
	pemBytes, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Equal(pemBytes, emu.CAPEM()) {
		t.Fatal("served CA differs from CAPEM")
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemBytes) {
		t.Fatal("bad CA PEM")
	}
	trusted := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	resp, err = trusted.Get(emu.APIBase(10) + "gateway")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if _, err := http.Get(emu.APIBase(10) + "gateway"); err == nil {
		t.Fatal("an untrusting client connected")
	}
	c := connect(t, emu)
	c.identify(emu, 0, 1)
	noViolations(t, emu)
}

func TestReplayLimit(t *testing.T) {
	t.Parallel()
	o := fastOptions()
	o.ReplayLimit = 4
	o.Guilds = 1
	emu := startEmu(t, o)
	c := connect(t, emu)
	r := c.identify(emu, 0, 1) // READY s=1, GUILD_CREATE s=2
	c.ws.Close(4000, "away")
	awaitState(t, emu, "detached", func(s State) bool {
		return len(s.Shards) == 1 && s.Shards[0].Sessions[0].State == SessionDetached
	})
	for i := 0; i < 20; i++ { // s = 3..22
		emu.Inject(Fault{Kind: FaultDispatch, Shard: intp(0), Event: "TICK"})
	}
	// The newest ReplayLimit dispatches are always kept.
	c2 := resumeOn(t, emu, ResumePath, r.SessionID, 22-4)
	for s := int64(19); s <= 22; s++ {
		if f := c2.expectDispatch("TICK"); *f.S != s {
			t.Fatalf("replayed s=%d, want %d", *f.S, s)
		}
	}
	c2.expectDispatch("RESUMED") // s=23
	noViolations(t, emu)
	// A sequence that fell out of the buffer cannot be resumed: 4007.
	c2.ws.Close(4000, "away")
	awaitState(t, emu, "detached", func(s State) bool {
		return len(s.Shards) == 1 && s.Shards[0].Sessions[0].State == SessionDetached
	})
	c3 := resumeOn(t, emu, ResumePath, r.SessionID, 2)
	c3.expectClose(CloseInvalidSeq)
	if k := violationKinds(emu); len(k) != 1 || k[0] != KindInvalidSeq {
		t.Fatalf("violations %v", k)
	}
}

func TestHelloReconnectAndResumeUnavailable(t *testing.T) {
	t.Parallel()
	o := fastOptions()
	o.ReconnectGrace = 100 * time.Millisecond
	emu := startEmu(t, o)

	// op 7 in place of Hello, then the server closes.
	if _, err := emu.Inject(Fault{Kind: FaultHelloReconnect, Count: 1}); err != nil {
		t.Fatal(err)
	}
	c := dial(t, emu, "/?v=10&encoding=json")
	c.expectOp(OpReconnect)
	c.expectClose(CloseUnknownError)
	c2 := connect(t, emu) // count 1: the next one gets Hello
	r := c2.identify(emu, 0, 1)
	c2.ws.Close(4000, "away")
	awaitState(t, emu, "detached", func(s State) bool {
		return len(s.Shards) == 1 && s.Shards[0].Sessions[0].State == SessionDetached
	})

	// The resume URL answers 503 twice; the session stays resumable.
	if _, err := emu.Inject(Fault{Kind: FaultResumeUnavailable, Count: 2}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		_, resp, err := websocket.Dial(ctx, emu.ResumeURL()+"?v=10&encoding=json", nil)
		cancel()
		if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("dial %d: %v %v", i, resp, err)
		}
	}
	c3 := resumeOn(t, emu, ResumePath, r.SessionID, c2.lastS)
	c3.expectDispatch("RESUMED")
	noViolations(t, emu)
	if _, err := emu.Inject(Fault{Kind: FaultResumeUnavailable, Count: -1}); err == nil {
		t.Fatal("negative count accepted")
	}
}

func TestResumeVersionMismatch(t *testing.T) {
	t.Parallel()
	emu := startEmu(t, fastOptions())
	c := connect(t, emu) // v=10
	r := c.identify(emu, 0, 1)
	c.ws.Close(4000, "away")
	awaitState(t, emu, "detached", func(s State) bool {
		return len(s.Shards) == 1 && s.Shards[0].Sessions[0].State == SessionDetached
	})
	c2 := dial(t, emu, ResumePath+"?v=9&encoding=json")
	c2.expectOp(OpHello)
	c2.send(OpResume, map[string]any{"token": emu.Token(), "session_id": r.SessionID, "seq": c.lastS})
	c2.expectDispatch("RESUMED")
	if k := violationKinds(emu); len(k) != 1 || k[0] != KindResumeVersionMismatch {
		t.Fatalf("violations %v", k)
	}
}
