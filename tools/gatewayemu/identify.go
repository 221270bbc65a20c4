package gatewayemu

import (
	"encoding/json"
	"fmt"
	"time"
)

// identify validates an Identify and then accepts it, refuses it (bucket
// window: op 9 false after IdentifyRejectDelay) or closes the connection.
// Validation order: schema (4001), token (4004), shard (4010), guilds per
// shard (4011), intents (4013, 4014), budget, bucket.
func (c *conn) identify(raw json.RawMessage) {
	e := c.e
	var d identifyData
	if err := decodeStrict(raw, &d, e.opts.AllowUnknownFields); err != nil {
		c.identifyClosed(nil, KindInvalidPayload, CloseUnknownOpcode, err.Error())
		return
	}
	switch {
	case d.Token == nil:
		c.identifyClosed(nil, KindInvalidPayload, CloseUnknownOpcode, "Identify without token")
		return
	case d.Properties == nil:
		c.identifyClosed(nil, KindInvalidPayload, CloseUnknownOpcode, "Identify without properties object")
		return
	case d.LargeThreshold != nil && (*d.LargeThreshold < 50 || *d.LargeThreshold > 250):
		c.identifyClosed(nil, KindInvalidPayload, CloseUnknownOpcode,
			fmt.Sprintf("large_threshold %d outside 50..250", *d.LargeThreshold))
		return
	case len(d.Presence) > 0 && string(d.Presence) != "null" && d.Presence[0] != '{':
		c.identifyClosed(nil, KindInvalidPayload, CloseUnknownOpcode, "presence must be an object")
		return
	}
	shard := [2]int{0, 1}
	if d.Shard != nil {
		if len(d.Shard) != 2 {
			c.identifyClosed(nil, KindInvalidShard, CloseInvalidShard, fmt.Sprintf("shard must be [shard_id, num_shards], got %d elements", len(d.Shard)))
			return
		}
		shard = [2]int{d.Shard[0], d.Shard[1]}
	}
	sp := &shard

	e.mu.Lock()
	validToken := e.checkTokenLocked(*d.Token)
	revoked := e.budget.revoked
	e.mu.Unlock()
	if !validToken {
		why := "invalid token"
		if revoked {
			why = "token was reset after the session-start budget was exceeded"
		}
		c.identifyClosed(sp, KindAuthenticationFailed, CloseAuthenticationFailed, why)
		return
	}
	switch {
	case shard[1] < 1 || shard[0] < 0 || shard[0] >= shard[1]:
		c.identifyClosed(sp, KindInvalidShard, CloseInvalidShard, fmt.Sprintf("shard [%d, %d] out of range", shard[0], shard[1]))
		return
	case e.opts.ShardMultiple > 1 && shard[1]%e.opts.ShardMultiple != 0:
		c.identifyClosed(sp, KindInvalidShard, CloseInvalidShard, fmt.Sprintf("num_shards %d is not a multiple of %d", shard[1], e.opts.ShardMultiple))
		return
	}
	guilds := e.GuildsForShard(shard[0], shard[1])
	if len(guilds) > MaxGuildsPerShard {
		c.identifyClosed(sp, KindShardingRequired, CloseShardingRequired,
			fmt.Sprintf("shard [%d, %d] would hold %d guilds (max %d)", shard[0], shard[1], len(guilds), MaxGuildsPerShard))
		return
	}
	switch {
	case d.Intents == nil:
		c.identifyClosed(sp, KindInvalidIntents, CloseInvalidIntents, "Identify without intents (required since v8)")
		return
	case *d.Intents < 0 || *d.Intents&^ValidIntents != 0:
		c.identifyClosed(sp, KindInvalidIntents, CloseInvalidIntents, fmt.Sprintf("intents %d has unassigned bits %#x", *d.Intents, *d.Intents&^ValidIntents))
		return
	case *d.Intents&PrivilegedIntents&^e.opts.ApprovedIntents != 0:
		c.identifyClosed(sp, KindDisallowedIntents, CloseDisallowedIntents, fmt.Sprintf("privileged intents %#x not enabled", *d.Intents&PrivilegedIntents&^e.opts.ApprovedIntents))
		return
	}
	c.compressD.Store(d.Compress != nil && *d.Compress && !c.zlibTx)
	e.mu.Lock()
	c.intents = *d.Intents
	e.mu.Unlock()
	c.admit(shard, guilds)
}

// identifyClosed logs a failed Identify and closes with code.
func (c *conn) identifyClosed(shard *[2]int, kind Kind, code int, detail string) {
	e := c.e
	e.mu.Lock()
	rec := IdentifyRecord{Time: e.opts.Now(), Conn: c.id, Shard: shard, Outcome: IdentifyClosed, CloseCode: code, Reason: detail}
	if shard != nil {
		rec.Bucket = shard[0] % e.opts.MaxConcurrency
	}
	e.identifies = append(e.identifies, rec)
	c.shard = shard
	e.mu.Unlock()
	e.counters.identifyClosed.Add(1)
	c.fail(kind, code, detail)
}

// admit applies the session-start budget and the bucket window to a valid
// Identify and starts the session when both allow it.
func (c *conn) admit(shard [2]int, guilds []uint64) {
	e := c.e
	mc := e.opts.MaxConcurrency
	bucket := shard[0] % mc
	sp := shardPtr(shard[0], shard[1])

	e.mu.Lock()
	now := e.opts.Now() // under the lock: the Identify log is in time order
	c.shard = sp
	rec := IdentifyRecord{Time: now, Conn: c.id, Shard: sp, Bucket: bucket}

	// Daily budget: an Identify when none remain exceeds it.
	e.refreshBudgetLocked(now)
	if e.budget.remaining <= 0 {
		rec.Outcome, rec.CloseCode = IdentifyClosed, CloseAuthenticationFailed
		rec.Reason = fmt.Sprintf("session-start budget of %d exceeded: every session closed, token reset", e.opts.SessionStarts)
		e.identifies = append(e.identifies, rec)
		e.violateLocked(Violation{Time: now, Kind: KindBudgetExhausted, Shard: sp, Conn: c.id,
			CloseCode: CloseAuthenticationFailed, Detail: rec.Reason})
		if !e.opts.KeepTokenOnExhaust {
			e.budget.revoked = true
		}
		victims := make([]*conn, 0, len(e.conns))
		for o := range e.conns {
			victims = append(victims, o)
		}
		e.mu.Unlock()
		e.counters.identifyClosed.Add(1)
		for _, o := range victims {
			o.closeWith(CloseAuthenticationFailed, "session-start budget exceeded: token reset")
		}
		return
	}
	e.budget.remaining--

	// Identify attempts in the trailing window, all buckets together.
	win := e.opts.IdentifyWindow
	keep := e.attempts[:0]
	for _, t := range e.attempts {
		if now.Sub(t) < win {
			keep = append(keep, t)
		}
	}
	e.attempts = append(keep, now)
	if len(e.attempts) > mc {
		e.violateLocked(Violation{Time: now, Kind: KindIdentifyOverConcurrency, Shard: sp, Conn: c.id,
			Detail: fmt.Sprintf("%d Identify attempts within %v; max_concurrency is %d", len(e.attempts), win, mc)})
	}

	// Bucket window.
	if last, ok := e.bucketLast[bucket]; ok && now.Sub(last) < win {
		opens := last.Add(win).Sub(now)
		rec.Outcome = IdentifyRefused
		rec.Reason = fmt.Sprintf("bucket %d (shard %d %% max_concurrency %d) had an Identify %v ago; window %v opens in %v",
			bucket, shard[0], mc, now.Sub(last).Round(time.Millisecond), win, opens.Round(time.Millisecond))
		e.identifies = append(e.identifies, rec)
		e.violateLocked(Violation{Time: now, Kind: KindIdentifyTooEarly, Shard: sp, Conn: c.id, Detail: rec.Reason})
		c.phase = phaseIdentifying
		e.mu.Unlock()
		e.counters.identifyRefused.Add(1)
		time.AfterFunc(e.opts.IdentifyRejectDelay, func() {
			if c.closing.Load() {
				return
			}
			e.mu.Lock()
			if c.phase == phaseIdentifying {
				c.phase = phaseUnauth
			}
			e.mu.Unlock()
			c.writeOp(OpInvalidSession, false)
		})
		return
	}
	e.bucketLast[bucket] = now

	// Start order: every shard of an earlier start group must have started.
	st := e.started[shard[1]]
	if st == nil {
		st = &startTracker{done: map[int]bool{}}
		e.started[shard[1]] = st
	}
	if !e.opts.SkipBucketOrder && st.lowestMiss < shard[0]/mc*mc {
		e.violateLocked(Violation{Time: now, Kind: KindBucketOutOfOrder, Shard: sp, Conn: c.id,
			Detail: fmt.Sprintf("shard %d (start group %d) identified before shard %d (start group %d) ever started",
				shard[0], shard[0]/mc, st.lowestMiss, st.lowestMiss/mc)})
	}
	st.done[shard[0]] = true
	for st.done[st.lowestMiss] {
		st.lowestMiss++
	}

	s := &session{id: newSessionID(), version: c.version, shard: shard, guilds: guilds, intents: c.intents, created: now, stopCh: make(chan struct{})}
	rec.Outcome, rec.Session = IdentifyAccepted, s.id
	e.identifies = append(e.identifies, rec)
	if live := e.live[shard]; len(live) > 0 {
		for o := range live {
			e.violateLocked(Violation{Time: now, Kind: KindDuplicateSession, Shard: sp, Conn: c.id, Session: s.id,
				Detail: fmt.Sprintf("shard [%d, %d] already has live session %s", shard[0], shard[1], o.id)})
			break
		}
	}
	e.attachLocked(s, c)
	c.phase = phaseReady
	if c.closing.Load() { // closed by a timer or fault meanwhile
		c.sess = nil
		e.detachLocked(s, c, true)
	}
	e.notifyLocked()
	e.mu.Unlock()
	e.counters.identifyAccepted.Add(1)

	e.dispatch(s, "READY", e.readyData(s, c.version))
	// The GUILD_CREATEs (up to megabytes each, to a client that may read
	// slowly) and the message stream go out from their own goroutine: this
	// is the read loop, and it must go on reading heartbeats meanwhile, as
	// Discord does while it sends a large guild.
	go func() {
		for k, g := range guilds {
			e.dispatch(s, "GUILD_CREATE", e.guildCreate(k, g, s.created))
		}
		if e.opts.MessagesPerSecond > 0 {
			e.runMessages(s)
		}
	}()
}

// attachLocked registers s and attaches it to c. e.mu must be held.
func (e *Emulator) attachLocked(s *session, c *conn) {
	e.sessions[s.id] = s
	live := e.live[s.shard]
	if live == nil {
		live = map[*session]struct{}{}
		e.live[s.shard] = live
	}
	live[s] = struct{}{}
	s.mu.Lock()
	s.conn = c
	if s.expiry != nil {
		s.expiry.Stop()
	}
	s.mu.Unlock()
	c.sess = s
	c.hadSession = true
}

// resume handles op 6: replay then RESUMED, op 9 false for an unknown or
// expired session, 4007 for a sequence the session cannot replay.
func (c *conn) resume(raw json.RawMessage) {
	e := c.e
	var d resumeData
	if err := decodeStrict(raw, &d, e.opts.AllowUnknownFields); err != nil {
		c.fail(KindInvalidPayload, CloseUnknownOpcode, err.Error())
		return
	}
	if d.Token == nil || d.SessionID == nil || d.Seq == nil {
		c.fail(KindInvalidPayload, CloseUnknownOpcode, "Resume needs token, session_id and seq")
		return
	}
	e.mu.Lock()
	if !e.checkTokenLocked(*d.Token) {
		e.mu.Unlock()
		c.fail(KindAuthenticationFailed, CloseAuthenticationFailed, "invalid token in Resume")
		return
	}
	s := e.sessions[*d.SessionID]
	if s == nil {
		e.mu.Unlock()
		e.counters.resumesFailed.Add(1)
		e.log.Info("resume of unknown or expired session", "conn", c.id, "session", *d.SessionID)
		c.writeOp(OpInvalidSession, false)
		return
	}
	c.shard = shardPtr(s.shard[0], s.shard[1])
	// Resuming on the same connection after op 9 true is allowed (Discord
	// staff, discord-api-docs#1805); only a fresh connection must use the
	// resume URL.
	if !c.onResume && !c.hadSession {
		e.violateLocked(Violation{Kind: KindResumeWrongURL, Shard: c.shard, Session: s.id, Conn: c.id,
			Detail: "Resume sent to the main gateway URL instead of resume_gateway_url"})
	}
	if c.version != s.version {
		e.violateLocked(Violation{Kind: KindResumeVersionMismatch, Shard: c.shard, Session: s.id, Conn: c.id,
			Detail: fmt.Sprintf("Resume with v=%d of a session identified with v=%d", c.version, s.version)})
	}
	// A session attached elsewhere is taken over; the old connection closes.
	s.mu.Lock()
	old := s.conn
	s.conn = nil
	if s.expiry != nil {
		s.expiry.Stop()
	}
	s.mu.Unlock()
	if old != nil && old != c {
		old.sess = nil
		go old.closeWith(CloseUnknownError, "session resumed on another connection")
	}
	live := e.live[s.shard]
	if live == nil {
		live = map[*session]struct{}{}
		e.live[s.shard] = live
	}
	live[s] = struct{}{}
	c.sess = s
	c.hadSession = true
	c.phase = phaseReady
	e.mu.Unlock()

	// Attach and replay under the session's send lock, so dispatches
	// raised meanwhile land in the buffer and follow the replay in order.
	s.sendMu.Lock()
	s.mu.Lock()
	ok := s.canReplayLocked(*d.Seq)
	var replay [][]byte
	var resumed []byte
	if ok && !c.closing.Load() {
		s.conn = c
		s.resumes++
		e.counters.resumes.Add(1) // before RESUMED is written: clients may look at once
		replay, resumed = e.replayLocked(s, *d.Seq)
	}
	attached := s.conn == c
	last := s.seq
	s.mu.Unlock()
	for _, f := range replay {
		c.writeDispatch(s, f)
		e.counters.replayed.Add(1)
	}
	if resumed != nil {
		c.writeDispatch(s, resumed)
		e.counters.dispatches.Add(1)
	}
	s.sendMu.Unlock()
	if ok && !attached { // the connection closed meanwhile: stay resumable
		e.mu.Lock()
		c.sess = nil
		e.detachLocked(s, c, true)
		e.mu.Unlock()
		return
	}
	if !ok {
		e.counters.resumesFailed.Add(1)
		c.fail(KindInvalidSeq, CloseInvalidSeq, fmt.Sprintf("Resume seq %d cannot be replayed (session at %d)", *d.Seq, last))
		return
	}
	e.mu.Lock()
	e.notifyLocked()
	e.mu.Unlock()
}
