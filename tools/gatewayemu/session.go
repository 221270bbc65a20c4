package gatewayemu

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"sync"
	"time"
)

// Synthetic identities used in READY and dispatches.
const (
	applicationID = 1100000000000000001
	botUsername   = "emulator-bot"
	authorID      = 1100000000000000002
)

// session is a Gateway session: it outlives connections until it is ended
// (client close 1000/1001, op 9 false, fatal close, resume timeout).
type session struct {
	id      string
	version int // API version of the Identify connection
	shard   [2]int
	guilds  []uint64
	intents int64 // of the Identify
	created time.Time

	// sendMu orders what the session writes: a dispatch takes its sequence
	// number and writes its frame under it, and a Resume attaches and
	// replays under it, so frames reach a connection in sequence order.
	// It is held across writes, which block for as long as a slow client
	// keeps its TCP window closed: it is taken before mu and never while
	// e.mu is held.
	sendMu sync.Mutex
	// mu guards the fields below and is held only briefly, never across a
	// write: e.mu holders (State, detaching a connection) take it, and
	// with a write under it every connection's read loop, which takes e.mu
	// for each payload, waited on the slowest client (heartbeats that
	// arrived on time were counted as missed).
	mu            sync.Mutex
	seq           int64
	buf           []buffered // replay ring, oldest first
	conn          *conn      // attached connection; written under e.mu and mu
	ended         bool
	resumes       int
	expiry        *time.Timer // resume timeout while detached
	detachedUntil time.Time
	removed       map[uint64]bool // guilds a guild_delete fault removed
	stopCh        chan struct{}
	stopOnce      sync.Once
}

// buffered is one dispatch kept for replay.
type buffered struct {
	seq   int64
	frame []byte
	sent  time.Time // when the dispatch was made and handed to the connection's writer
}

func newSessionID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// stop ends background work of the session (message generator, expiry).
func (s *session) stop() {
	s.stopOnce.Do(func() { close(s.stopCh) })
	s.mu.Lock()
	s.ended = true
	if s.expiry != nil {
		s.expiry.Stop()
	}
	s.mu.Unlock()
}

// info describes s. e.mu must be held.
func (s *session) info(e *Emulator) SessionInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	si := SessionInfo{ID: s.id, Shard: s.shard, Seq: s.seq, CreatedAt: s.created, Resumes: s.resumes}
	if c := s.conn; c != nil {
		si.State = SessionConnected
		si.Conn = c.id
		si.Heartbeats = c.heartbeats.Load()
		if ns := c.lastHeartbeat.Load(); ns != 0 {
			t := time.Unix(0, ns)
			si.LastHeartbeat = &t
		}
	} else {
		si.State = SessionDetached
		t := s.detachedUntil
		si.ResumableUntil = &t
	}
	si.AckSuppressed = e.noAck[s.shard[0]]
	return si
}

// dispatch sends event t with data d on session s: it takes the next
// sequence number, keeps the frame for replay and writes it to the attached
// connection unless that connection was told to reconnect.
func (e *Emulator) dispatch(s *session, t string, d any) {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return
	}
	s.seq++
	seq := s.seq
	frame, err := json.Marshal(outPayload{Op: OpDispatch, D: d, S: &seq, T: &t})
	if err != nil {
		s.mu.Unlock()
		e.log.Error("marshal dispatch", "t", t, "err", err)
		return
	}
	s.buf = append(s.buf, buffered{seq: seq, frame: frame, sent: time.Now()})
	if len(s.buf) >= 2*e.opts.ReplayLimit {
		// Trim in batches: keep the newest ReplayLimit, amortised O(1).
		s.buf = append(make([]buffered, 0, 2*e.opts.ReplayLimit), s.buf[len(s.buf)-e.opts.ReplayLimit:]...)
	}
	c := s.conn
	s.mu.Unlock()
	e.counters.dispatches.Add(1)
	if c != nil {
		c.writeDispatch(s, frame)
	}
}

// canReplayLocked reports whether a Resume from seq can be served: seq was
// sent by the session and everything after it is still buffered. s.mu must
// be held.
func (s *session) canReplayLocked(seq int64) bool {
	switch {
	case seq > s.seq:
		return false
	case len(s.buf) > 0 && seq < s.buf[0].seq-1:
		return false
	case len(s.buf) == 0 && seq < s.seq:
		return false
	}
	return true
}

// replayLocked returns the buffered dispatches after seq and a RESUMED
// that it numbers, for the caller to write once it has released s.mu. The
// caller checked canReplayLocked and holds s.sendMu and s.mu.
func (e *Emulator) replayLocked(s *session, seq int64) (replay [][]byte, resumed []byte) {
	for _, b := range s.buf {
		if b.seq > seq {
			replay = append(replay, b.frame)
		}
	}
	s.seq++
	rs := s.seq
	t := "RESUMED"
	resumed, _ = json.Marshal(outPayload{Op: OpDispatch, D: map[string]any{}, S: &rs, T: &t})
	return replay, resumed
}

// readyData builds READY (research §1.7).
func (e *Emulator) readyData(s *session, version int) map[string]any {
	outage := outageGuilds(e.opts.ReadyUnavailableGuilds, s.shard[0], s.shard[1])
	guilds := make([]map[string]any, 0, len(s.guilds)+len(outage))
	for _, g := range append(append([]uint64(nil), s.guilds...), outage...) {
		guilds = append(guilds, map[string]any{"id": snowflake(g), "unavailable": true})
	}
	return map[string]any{
		"v": version,
		"user": map[string]any{
			"id": snowflake(applicationID), "username": botUsername, "discriminator": "0",
			"global_name": nil, "avatar": nil, "bot": true, "verified": true,
			"mfa_enabled": false, "flags": 0,
		},
		"guilds":              guilds,
		"session_id":          s.id,
		"resume_gateway_url":  e.ResumeURL(),
		"shard":               []int{s.shard[0], s.shard[1]},
		"application":         map[string]any{"id": snowflake(applicationID), "flags": 0},
		"private_channels":    []any{},
		"relationships":       []any{},
		"guild_join_requests": []any{},
		"user_settings":       map[string]any{},
		"presences":           []any{},
	}
}

// guildCreate returns the `d` of the k-th GUILD_CREATE of a session (for
// guild g): sized by Options.GuildCreateBytes[k] when set, else small.
func (e *Emulator) guildCreate(k int, g uint64, joined time.Time) any {
	if k < len(e.opts.GuildCreateBytes) && e.opts.GuildCreateBytes[k] > 0 {
		return e.opts.sizedGuildCreate(g, joined, e.opts.GuildCreateBytes[k])
	}
	return guildCreateData(g, joined)
}

// guildCreateData builds a small but complete GUILD_CREATE for guild g.
func guildCreateData(g uint64, joined time.Time) map[string]any {
	id := snowflake(g)
	return map[string]any{
		"id": id, "name": "guild " + id, "icon": nil, "owner_id": snowflake(authorID),
		"unavailable": false, "large": false, "member_count": 2,
		"joined_at": joined.UTC().Format(time.RFC3339Nano),
		"features":  []string{}, "roles": []any{map[string]any{
			"id": id, "name": "@everyone", "permissions": "0", "position": 0,
			"color": 0, "hoist": false, "managed": false, "mentionable": false,
		}},
		"emojis": []any{}, "stickers": []any{}, "members": []any{}, "presences": []any{},
		"voice_states": []any{}, "threads": []any{}, "stage_instances": []any{},
		"guild_scheduled_events": []any{}, "soundboard_sounds": []any{},
		"channels": []any{map[string]any{
			"id": snowflake(g + 1), "type": 0, "name": "general", "position": 0,
			"guild_id": id, "permission_overwrites": []any{},
		}},
	}
}

// messageCreateData builds a MESSAGE_CREATE in guild g (0 = a DM), the
// n-th of its session; unique is the emulator's message counter, which
// makes the snowflake unique across sessions (sessions ticking together
// produce the same n in the same millisecond). Bit 17 stays clear: the
// REST endpoint's messages set it.
func messageCreateData(n, unique uint64, g uint64, now time.Time) map[string]any {
	msgID := uint64(now.UnixMilli()-discordEpochMillis)<<22 | unique&0x1ffff
	d := map[string]any{
		"id": snowflake(msgID), "type": 0, "content": "synthetic message " + snowflake(n),
		"author": map[string]any{"id": snowflake(authorID), "username": "someone",
			"discriminator": "0", "global_name": nil, "avatar": nil},
		"timestamp": now.UTC().Format(time.RFC3339Nano), "edited_timestamp": nil,
		"tts": false, "mention_everyone": false, "mentions": []any{}, "mention_roles": []any{},
		"attachments": []any{}, "embeds": []any{}, "pinned": false, "flags": 0,
	}
	if g != 0 {
		d["guild_id"] = snowflake(g)
		d["channel_id"] = snowflake(g + 1)
	} else {
		d["channel_id"] = snowflake(authorID + 1)
	}
	return d
}

// runMessages dispatches synthetic MESSAGE_CREATEs at MessagesPerSecond
// until the session ends. Guild messages rotate over the shard's guilds;
// shard 0 without guilds gets DMs (research §1.14).
func (e *Emulator) runMessages(s *session) {
	period := time.Duration(float64(time.Second) / e.opts.MessagesPerSecond)
	if period <= 0 {
		period = time.Microsecond
	}
	if len(s.guilds) == 0 && s.shard[0] != 0 {
		return
	}
	t := time.NewTicker(period)
	defer t.Stop()
	var n uint64
	for {
		select {
		case <-s.stopCh:
			return
		case <-e.baseCtx.Done():
			return
		case <-t.C:
		}
		n++
		var g uint64
		if len(s.guilds) > 0 {
			g = s.guilds[int(n)%len(s.guilds)]
		}
		d := messageCreateData(n, e.msgSeq.Add(1), g, e.opts.Now())
		if e.opts.PingEvery > 0 && g != 0 && n%uint64(e.opts.PingEvery) == 0 {
			d["content"] = PingContent
			e.notePing(s, d)
		} else if e.opts.MessageBytes > 0 {
			padMessage(d, e.opts.MessageBytes, e.msgSeq.Load())
		}
		e.dispatch(s, "MESSAGE_CREATE", d)
	}
}

// messageFrameOverhead is what the op-0 frame of a MESSAGE_CREATE adds to
// its `d` with a 4-digit sequence number (outPayload's field order).
const messageFrameOverhead = len(`{"op":0,"d":,"s":1234,"t":"MESSAGE_CREATE"}`)

// padWords are the words padMessage writes: text that deflate shrinks
// about as much as a chat message, not a run of one byte that
// zlib-stream would send as a few bytes.
var padWords = [...]string{"the", "shard", "node", "sends", "every", "event", "to", "a",
	"stream", "and", "waits", "for", "its", "ack", "before", "reading", "more", "guild",
	"channel", "message", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "again",
	"today", "tomorrow", "maybe", "never"}

// padMessage appends words to d's content so that the MESSAGE_CREATE
// frame carrying d is about frame bytes long (Options.MessageBytes); n
// seeds the choice of words. A d already as long is left as is.
func padMessage(d map[string]any, frame int, n uint64) {
	b, err := json.Marshal(d)
	if err != nil {
		return
	}
	need := frame - messageFrameOverhead - len(b)
	if need <= 0 {
		return
	}
	content, _ := d["content"].(string)
	pad := make([]byte, 0, need+16)
	for x := n; len(pad) < need; {
		x = mix64(x)
		pad = append(pad, ' ')
		pad = append(pad, padWords[x%uint64(len(padWords))]...)
	}
	d["content"] = content + string(pad[:need]) // ASCII letters and spaces: no JSON escapes
}
