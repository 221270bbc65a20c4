package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// This file holds what nodes need to open Gateway sessions (the Gateway
// URL, the bot token, the intents, Discord's max_concurrency and session
// budget from GET /gateway/bot) and the resume hand-off: when a node
// releases a shard whose session it closed resumably, the controller hands
// session ID, sequence and resume URL to the shard's next holder only, so
// the move costs no Identify (docs/handoff.md, "Resume hand-off").

// Defaults and bounds of the Gateway settings.
const (
	// DefaultIntents is GUILDS | GUILD_MESSAGES (1 | 512): no privileged
	// intent, and GUILDS gives every shard its guilds' GUILD_CREATE.
	DefaultIntents = 513
	// DefaultResumeTTL is how long a recorded hand-off is offered. Discord
	// keeps a session closed with a code other than 1000/1001 resumable
	// for "a few minutes" (research gateway-protocol-and-sharding.md §1.8;
	// the emulator uses 3 min); one minute stays well inside that while
	// covering the new owner's next check-in and connect.
	DefaultResumeTTL = time.Minute
	// MaxBotTokenLen bounds a bot token, in bytes (Discord's are ~70).
	MaxBotTokenLen = 256
)

// ErrBotToken is wrapped by bot token validation errors. The token itself
// never appears in an error.
var ErrBotToken = errors.New("bot token")

// ValidateBotToken checks a bot token as nodes receive it: 1..256 bytes of
// visible ASCII other than '"' and '\', so it needs no JSON escape.
func ValidateBotToken(tok string) error {
	if len(tok) == 0 || len(tok) > MaxBotTokenLen {
		return fmt.Errorf("%w: %d bytes, want 1..%d", ErrBotToken, len(tok), MaxBotTokenLen)
	}
	for i := 0; i < len(tok); i++ {
		if b := tok[i]; b < 0x21 || b > 0x7e || b == '"' || b == '\\' {
			return fmt.Errorf("%w: byte at position %d is not visible ASCII other than '\"' and '\\'", ErrBotToken, i)
		}
	}
	return nil
}

// secret is a string that never prints: slog, fmt and JSON see a
// placeholder. The bot token lives in one.
type secret string

func (secret) String() string               { return "[redacted]" }
func (secret) GoString() string             { return "[redacted]" }
func (secret) LogValue() slog.Value         { return slog.StringValue("[redacted]") }
func (secret) MarshalJSON() ([]byte, error) { return []byte(`"[redacted]"`), nil }

// GatewaySettings are the static Gateway settings of `dpxe serve`.
type GatewaySettings struct {
	// URL is a Gateway URL set by the operator (--gateway-url), or "" when
	// it comes from GET /gateway/bot (or is not known). ws:// only.
	URL string
	// Token is the bot token handed to nodes; "" hands out none.
	Token string
	// Intents is the Identify intents bitmask (DefaultIntents when 0).
	Intents uint32
	// MaxConcurrencyFixed says the operator fixed Config.MaxConcurrency:
	// Discord's max_concurrency then only lowers it, never raises it.
	MaxConcurrencyFixed bool
	// TotalShardsFixed says the operator fixed Config.TotalShards (for the
	// log line when Discord recommends another count).
	TotalShardsFixed bool
}

// SetGateway installs the static Gateway settings. Call it before serving
// check-ins; it may be called again (the settings are replaced).
func (c *Controller) SetGateway(s GatewaySettings) error {
	var dial string
	if s.URL != "" {
		var err error
		if dial, err = appliance.GatewayDialURL(s.URL); err != nil {
			return fmt.Errorf("%w: gateway URL: %v", ErrConfig, err)
		}
	}
	if s.Token != "" {
		if err := ValidateBotToken(s.Token); err != nil {
			return fmt.Errorf("%w: %v", ErrConfig, err)
		}
	}
	if s.Intents == 0 {
		s.Intents = DefaultIntents
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gw.url = dial
	c.gw.fixedURL = s.URL != ""
	c.gw.token = secret(s.Token)
	c.gw.intents = s.Intents
	c.gw.mcFixed = s.MaxConcurrencyFixed
	c.gw.mcOperator = c.cfg.MaxConcurrency
	c.gw.totalFixed = s.TotalShardsFixed
	return nil
}

// gatewayState is the controller's Gateway state; guarded by mu.
type gatewayState struct {
	url        string // dial URL handed to nodes, "" for none
	fixedURL   bool   // url came from the operator; /gateway/bot does not replace it
	token      secret
	intents    uint32
	mcFixed    bool
	mcOperator uint32 // the operator's max_concurrency when mcFixed
	totalFixed bool

	// From GET /gateway/bot.
	fetchedAt      time.Time
	lastError      string
	lastErrorAt    time.Time
	failures       int
	shards         int
	discordMC      uint32
	warnedShards   int // recommended count last reported in the log
	budgetTotalSet int // the budget total last reported as an event
	// unrecorded is the session budget of the last answer a follower
	// replica took without writing it (ApplyGatewayBot); Lead records it
	// when the store has no budget row yet.
	unrecorded *store.Budget

	sessionGaps int // sessions not resumed: hand-offs and holders' own (crashresume.go)
}

// GatewayBot is Discord's answer to GET /gateway/bot.
type GatewayBot struct {
	URL               string `json:"url"`
	Shards            int    `json:"shards"`
	SessionStartLimit struct {
		Total          int   `json:"total"`
		Remaining      int   `json:"remaining"`
		ResetAfter     int64 `json:"reset_after"` // milliseconds
		MaxConcurrency int   `json:"max_concurrency"`
	} `json:"session_start_limit"`
}

// Validate checks an answer's numbers before the controller uses any of
// it. The URL is checked on its own (ApplyGatewayBot): a URL nodes
// cannot dial does not spoil the rest.
func (g *GatewayBot) Validate() error {
	l := g.SessionStartLimit
	switch {
	case g.Shards < 1 || g.Shards > appliance.MaxTotalShards:
		return fmt.Errorf("shards %d out of range 1..%d", g.Shards, appliance.MaxTotalShards)
	case l.MaxConcurrency < 1 || l.MaxConcurrency > MaxMaxConcurrency:
		return fmt.Errorf("session_start_limit.max_concurrency %d out of range 1..%d", l.MaxConcurrency, MaxMaxConcurrency)
	case l.Total < 1 || l.Remaining < 0 || l.Remaining > l.Total:
		return fmt.Errorf("session_start_limit total %d remaining %d: need total >= 1 and 0 <= remaining <= total", l.Total, l.Remaining)
	case l.ResetAfter < 0 || time.Duration(l.ResetAfter)*time.Millisecond > budgetPeriod:
		return fmt.Errorf("session_start_limit.reset_after %d ms out of range 0..%d", l.ResetAfter, budgetPeriod.Milliseconds())
	}
	return nil
}

// ApplyGatewayBot takes a fresh GET /gateway/bot answer: its URL becomes
// the Gateway URL handed to nodes (unless the operator fixed one), its
// max_concurrency the Identify bucket count (capped by an operator-fixed
// value), and its session_start_limit the daily budget. Its shard count
// is only reported: the plan's total is fixed for the process's life (see
// docs/protocol.md, "Gateway settings"). An answer that fails Validate
// changes nothing and is returned as an error. A URL nodes cannot dial
// (neither ws:// nor wss://) is not handed out: the last good one
// stays, and the reason shows in the log and in Gateway().LastError.
//
// A follower replica (ha.go) writes nothing: it takes the URL, the shard
// count and max_concurrency in memory, so they are in use when it leads,
// and leaves the budget and the audit events to the leader, which
// fetches the same figures.
func (c *Controller) ApplyGatewayBot(ctx context.Context, g GatewayBot) error {
	if err := g.Validate(); err != nil {
		c.GatewayFetchFailed(err)
		return err
	}
	dial, uerr := appliance.GatewayDialURL(g.URL)
	t := c.now()
	l := g.SessionStartLimit
	c.mu.Lock()
	record := !c.ha.enabled || c.ha.leading // a follower writes nothing
	gw := &c.gw
	gw.fetchedAt, gw.failures, gw.shards, gw.discordMC = t, 0, g.Shards, uint32(l.MaxConcurrency)
	switch {
	case gw.fixedURL:
	case uerr != nil:
		msg := fmt.Sprintf("GET /gateway/bot url %q not handed to nodes: %v", clipText(g.URL, 100), uerr)
		if msg != gw.lastError {
			c.log.Warn("gateway URL from /gateway/bot not usable by nodes; keeping the last good one", "url", clipText(g.URL, 100), "err", uerr)
		}
		gw.lastError, gw.lastErrorAt = msg, t
	case gw.url != dial:
		c.log.Info("gateway URL from /gateway/bot", "url", dial)
		gw.url = dial
	}
	mc := uint32(l.MaxConcurrency)
	if gw.mcFixed && gw.mcOperator < mc {
		mc = gw.mcOperator
	}
	if mc != c.cfg.MaxConcurrency {
		c.setMaxConcurrencyLocked(t, mc, record)
	}
	if g.Shards != int(c.cfg.TotalShards) && g.Shards != gw.warnedShards {
		gw.warnedShards = g.Shards
		how := "restart dpxe serve once no node holds shards to take it"
		if gw.totalFixed {
			how = "--total-shards / total_shards fixes the count; change it and restart to follow"
		}
		if record {
			detail := fmt.Sprintf("Discord recommends %d shards, the plan has %d; %s", g.Shards, c.cfg.TotalShards, how)
			c.eventLocked(t, EventGatewayShards, "", nil, detail)
		}
		c.log.Warn("shard count differs from Discord's recommendation", "recommended", g.Shards,
			"total_shards", c.cfg.TotalShards, "fixed", gw.totalFixed)
	}
	if !record {
		gw.unrecorded = &store.Budget{Total: l.Total, Remaining: l.Remaining, ResetAt: t.Add(time.Duration(l.ResetAfter) * time.Millisecond)}
		c.mu.Unlock()
		return nil
	}
	gw.unrecorded = nil
	event := l.Total != gw.budgetTotalSet
	gw.budgetTotalSet = l.Total
	seq := c.setBudgetLocked(t, l.Total, l.Remaining, time.Duration(l.ResetAfter)*time.Millisecond, event)
	c.mu.Unlock()
	return c.waitDurable(ctx, seq)
}

// GatewayFetchFailed records a failed GET /gateway/bot; the last good
// values stay in use.
func (c *Controller) GatewayFetchFailed(err error) {
	t := c.now()
	c.mu.Lock()
	c.gw.failures++
	c.gw.lastError = err.Error()
	c.gw.lastErrorAt = t
	c.mu.Unlock()
}

// setMaxConcurrencyLocked changes the number of Identify buckets. A bucket
// number means other shards once the modulus changes, so no bucket may
// grant before a full window has passed since any grant under the old
// numbering: every bucket counts as granted at the latest grant of any
// old bucket, or now while one is being answered (its answer, still to
// come, restarts every window again: grantAnswered). Before any grant (a
// controller that just started and learns Discord's max_concurrency from
// GET /gateway/bot) no bucket waits. record says whether the change is an
// audit event (not on a follower replica, which writes nothing).
func (c *Controller) setMaxConcurrencyLocked(t time.Time, mc uint32, record bool) {
	old := c.cfg.MaxConcurrency
	var newest time.Time
	for i, last := range c.lastGrant {
		newest = latest(newest, last)
		if c.answering[i] > 0 {
			newest = t
		}
	}
	c.cfg.MaxConcurrency = mc
	c.lastGrant, c.answering = make([]time.Time, mc), make([]int, mc)
	c.grantEpoch++
	for i := range c.lastGrant {
		c.lastGrant[i] = newest
	}
	if record {
		c.eventLocked(t, EventGatewayConcurrency, "", nil, fmt.Sprintf("max_concurrency %d (was %d)", mc, old))
	}
	c.log.Info("max_concurrency changed", "max_concurrency", mc, "was", old)
}

// GatewayView is the Gateway state for GET /v1/gateway. It never carries
// the token, only whether one is set.
type GatewayView struct {
	URL               string    `json:"gateway_url,omitempty"`
	URLSource         string    `json:"url_source"` // "operator", "gateway_bot" or "none"
	TokenSet          bool      `json:"token_set"`
	Intents           uint32    `json:"intents"`
	MaxConcurrency    uint32    `json:"max_concurrency"`
	TotalShards       uint32    `json:"total_shards"`
	DiscordShards     int       `json:"discord_shards,omitempty"`
	DiscordConcurrent uint32    `json:"discord_max_concurrency,omitempty"`
	FetchedAt         time.Time `json:"fetched_at,omitzero"`
	LastError         string    `json:"last_error,omitempty"`
	LastErrorAt       time.Time `json:"last_error_at,omitzero"`
	Failures          int       `json:"consecutive_failures"`
	Handoffs          int       `json:"resume_handoffs"` // hand-offs on offer now
	// SessionGaps counts hand-offs (after a release or a lapsed lease)
	// whose shard's next holder started another session instead, and
	// sessions a holder reported under its current grant that ended there
	// without a Resume (noteOwnGapLocked): the old session's dispatches
	// after the reported sequence were lost. Since this controller started.
	SessionGaps int `json:"session_gaps"`
}

// Gateway returns the Gateway state.
func (c *Controller) Gateway() GatewayView {
	c.mu.Lock()
	defer c.mu.Unlock()
	gw := &c.gw
	v := GatewayView{URL: gw.url, URLSource: "none", TokenSet: gw.token != "", Intents: gw.intents,
		MaxConcurrency: c.cfg.MaxConcurrency, TotalShards: c.cfg.TotalShards, DiscordShards: gw.shards,
		DiscordConcurrent: gw.discordMC, FetchedAt: gw.fetchedAt, LastError: gw.lastError,
		LastErrorAt: gw.lastErrorAt, Failures: gw.failures, Handoffs: len(c.handoffs), SessionGaps: gw.sessionGaps}
	switch {
	case gw.fixedURL:
		v.URLSource = "operator"
	case gw.url != "":
		v.URLSource = "gateway_bot"
	}
	return v
}

// gatewayFieldsLocked fills the Gateway fields of a check-in answer.
func (c *Controller) gatewayFieldsLocked(resp *appliance.CheckinResponse) {
	resp.GatewayURL = c.gw.url
	resp.BotToken = string(c.gw.token)
	if c.gw.url != "" || c.gw.token != "" {
		resp.Intents = c.gw.intents
	}
}

// handoff is a resumable session released by from, on offer to the
// shard's next holder until at+ResumeTTL.
type handoff struct {
	from  *node
	state appliance.ResumeState
	at    time.Time
	crash bool // from from's last report when its lease lapsed (crashresume.go)
}

// resumable returns the hand-off a shard status offers, if any: a valid
// session with a valid sequence whose resume URL nodes can dial.
func resumable(s *appliance.ShardStatus) (appliance.ResumeState, bool) {
	if s.SessionID == "" || s.ResumeURL == "" || !s.SeqValid || s.State == appliance.ShardFatal {
		return appliance.ResumeState{}, false
	}
	dial, err := appliance.GatewayDialURL(s.ResumeURL)
	if err != nil {
		return appliance.ResumeState{}, false
	}
	return appliance.ResumeState{ShardID: s.ID, SessionID: s.SessionID, Seq: s.Seq, ResumeURL: dial}, true
}

// recordHandoffsLocked looks at the shards n holds outside its range (it
// is releasing them) and the statuses n reports for them in this check-in.
// A resumable session is recorded for the shard's next holder when ack
// (this check-in acknowledges the current generation, so it releases those
// shards and n has stopped them) or when the status says the shard is
// stopped (ASSIGNED): a node may report its released sessions in a
// check-in that acknowledges an older generation. On the acknowledging
// check-in, a shard without a resumable status keeps only a record n made
// itself; any other record is dropped, since n may have resumed and
// advanced or closed that session. Nothing is offered while n still
// holds the shard. It reports whether it recorded a new hand-off.
func (c *Controller) recordHandoffsLocked(t time.Time, n *node, reported []appliance.ShardStatus, ack bool) bool {
	recorded := false
	for _, s := range n.held {
		if n.plan.Contains(s) {
			continue
		}
		var st *appliance.ShardStatus
		for i := range reported {
			if reported[i].ID == s {
				st = &reported[i]
				break
			}
		}
		var rs appliance.ResumeState
		ok := false
		if st != nil && (ack || st.State == appliance.ShardAssigned) {
			rs, ok = resumable(st)
		}
		old := c.handoffs[s]
		if !ok {
			if ack && old != nil && (old.from != n || st != nil) {
				delete(c.handoffs, s)
			}
			continue
		}
		if old != nil && old.from == n && old.state == rs {
			continue // the same last word again: keep its time
		}
		if c.handoffs == nil {
			c.handoffs = map[uint32]*handoff{}
		}
		c.handoffs[s] = &handoff{from: n, state: rs, at: t}
		recorded = true
		shard := s
		c.eventLocked(t, EventResumeHandoff, n.id, &shard, fmt.Sprintf("released with a resumable session at seq %d", rs.Seq))
		c.log.Info("resume hand-off recorded", "shard", s, "from", n.id, "seq", rs.Seq)
	}
	return recorded
}

// settleHandoffsLocked drops the hand-offs the statuses n reports show it
// no longer needs: for a shard n holds, READY or FATAL, or a session other
// than the recorded one. Statuses of shards n holds outside its range
// count too: n may have resumed a shard that is now moving away.
func (c *Controller) settleHandoffsLocked(t time.Time, n *node, reported []appliance.ShardStatus) {
	for i := range reported {
		st := &reported[i]
		h := c.handoffs[st.ID]
		if h == nil || c.holder[st.ID] != n {
			continue
		}
		if st.SessionID != "" && st.SessionID != h.state.SessionID {
			c.noteGapLocked(t, n, st.ID, h)
		}
		if st.State == appliance.ShardReady || st.State == appliance.ShardFatal ||
			st.SessionID != "" && st.SessionID != h.state.SessionID {
			delete(c.handoffs, st.ID)
		}
	}
}

// resumeForLocked returns the hand-off on offer for shard s to its holder,
// which may start s now. A record older than ResumeTTL is dropped instead.
func (c *Controller) resumeForLocked(t time.Time, s uint32) (appliance.ResumeState, bool) {
	h := c.handoffs[s]
	if h == nil {
		return appliance.ResumeState{}, false
	}
	if t.Sub(h.at) > c.cfg.ResumeTTL {
		delete(c.handoffs, s)
		c.log.Info("resume hand-off expired unused", "shard", s, "from", h.from.id)
		return appliance.ResumeState{}, false
	}
	return h.state, true
}

// dropHandoffsLocked forgets the hand-offs of shards n held: called when
// n's lease expires, since n may have resumed and advanced those sessions.
func (c *Controller) dropHandoffsLocked(n *node) {
	if len(c.handoffs) == 0 {
		return
	}
	for _, s := range n.held {
		delete(c.handoffs, s)
	}
}

// pruneHandoffsLocked drops hand-offs older than ResumeTTL, including
// those of shards nobody was granted.
func (c *Controller) pruneHandoffsLocked(t time.Time) {
	for s, h := range c.handoffs {
		if t.Sub(h.at) > c.cfg.ResumeTTL {
			delete(c.handoffs, s)
		}
	}
}

// setBudgetLocked replaces the tracked budget and returns the stage
// sequence that makes it durable. The caller validated the figures.
func (c *Controller) setBudgetLocked(t time.Time, total, remaining int, resetAfter time.Duration, event bool) uint64 {
	c.budget = store.Budget{Total: total, Remaining: remaining, ResetAt: t.Add(resetAfter)}
	c.stage.budget = true
	if event {
		c.eventLocked(t, EventBudgetConfigured, "", nil, fmt.Sprintf("total %d remaining %d reset_after %v", total, remaining, resetAfter))
	}
	c.stage.seq++
	return c.stage.seq
}
