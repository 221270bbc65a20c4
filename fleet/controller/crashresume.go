package controller

import (
	"context"
	"fmt"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// Crash resume (issue 19, docs/events.md "After a crash"). Every check-in
// of a node carries, for each shard it runs with a resumable Gateway
// session, the session ID, the resume URL and the sequence the shard would
// hand over from now (a kernel that publishes reports its acknowledged
// sequence there while later dispatches await their PubAck). The
// controller keeps the latest such report per shard, from the shard's
// holder only, in memory and in the store (store.ShardSession). When the
// holder's lease lapses (a crash, a power cut, a partition), each of its
// shards with a report becomes a resume hand-off, on offer to the shard's
// next holder for ResumeTTL like a released session's: the next owner
// Resumes from that sequence and Discord replays what came after, which
// the stream deduplicates by Nats-Msg-Id (session:seq). When the next
// holder starts the shard on another session instead (Discord refused the
// Resume with op 9, or it was not resumed in time), the dispatches of the
// old session after that sequence are lost: counted (Gateway().SessionGaps)
// and reported as a session_gap event. So is a session the holder itself
// reported and then did not resume (noteOwnGapLocked).

// EventSessionGap: a shard's hand-off was not resumed (its next holder
// runs a new session), or its holder's own reported session ended without
// a Resume: the old session's dispatches after the reported sequence were
// not delivered.
const EventSessionGap = "session_gap"

// EventCrashHandoff: a node's lease lapsed while it held a shard with a
// reported resumable session, now on offer to the shard's next holder.
const EventCrashHandoff = "crash_handoff"

// shardSession is a shard's resumable session as its holder last reported
// it; gen is the plan generation under which that holder was granted the
// shard (the store's fence).
type shardSession struct {
	node  *node
	gen   uint64
	state appliance.ResumeState
	at    time.Time
}

// noteSessionsLocked keeps the resumable sessions n reports for the shards
// it holds and runs (STARTING, READY, BACKOFF). A shard n runs and reports
// without one (a fresh Identify under way, FATAL) loses its record. Reports for shards n does not hold
// are ignored: a deposed holder never replaces the current holder's.
func (c *Controller) noteSessionsLocked(t time.Time, n *node, reported []appliance.ShardStatus) {
	for i := range reported {
		st := &reported[i]
		s := st.ID
		if c.holder[s] != n || st.State == appliance.ShardAssigned {
			// Not n's, or not running: an ASSIGNED status is a released
			// session's last word (recordHandoffsLocked), possibly of an
			// earlier grant, or a shard not started yet.
			continue
		}
		old := c.sessions[s]
		if old != nil && st.State != appliance.ShardFatal && st.SessionID != old.state.SessionID && c.ownRecordLocked(n, s, old) {
			// n runs s without the session it reported under this
			// grant: that session ended on n without a Resume.
			c.noteOwnGapLocked(t, n, s, old, fmt.Sprintf("it reports the shard %s %s", st.State, sessionWord(st.SessionID)), st.CloseCode)
			old = nil
		}
		rs, ok := resumable(st)
		if !ok {
			if old != nil && old.node == n {
				delete(c.sessions, s)
				c.stageSessionLocked(store.ShardSession{ShardID: s, NodeID: n.id, GrantGen: old.gen, Drop: true})
			}
			continue
		}
		if old != nil && old.node == n && old.gen == c.grantGen[s] && old.state == rs {
			continue
		}
		if c.sessions == nil {
			c.sessions = map[uint32]*shardSession{}
		}
		c.sessions[s] = &shardSession{node: n, gen: c.grantGen[s], state: rs, at: t}
		c.stageSessionLocked(store.ShardSession{ShardID: s, NodeID: n.id, GrantGen: c.grantGen[s], SessionID: rs.SessionID,
			Seq: rs.Seq, ResumeURL: rs.ResumeURL, ReportedAt: t})
	}
}

func (c *Controller) stageSessionLocked(x store.ShardSession) {
	if c.stage.sessions == nil {
		c.stage.sessions = map[uint32]store.ShardSession{}
	}
	c.stage.sessions[x.ShardID] = x
}

// crashHandoffsLocked runs when n's lease lapses: each shard n held with a
// session n reported under its current grant of the shard becomes a
// hand-off for the shard's next holder. The
// other shards n held lose their hand-offs (dropHandoffsLocked): n may have
// resumed and advanced those sessions. noCrashResume is a deliberate
// mutation for the tests.
func (c *Controller) crashHandoffsLocked(t time.Time, n *node) {
	c.dropHandoffsLocked(n)
	if c.noCrashResume {
		return
	}
	for _, s := range n.held {
		r := c.sessions[s]
		if r == nil || r.node != n || r.gen != c.grantGen[s] {
			continue // none, or n's report of an earlier grant of s
		}
		c.offerCrashHandoffLocked(t, s, r)
	}
}

// offerCrashHandoffLocked puts r on offer as shard s's hand-off from t.
func (c *Controller) offerCrashHandoffLocked(t time.Time, s uint32, r *shardSession) {
	if c.handoffs == nil {
		c.handoffs = map[uint32]*handoff{}
	}
	c.handoffs[s] = &handoff{from: r.node, state: r.state, at: t, crash: true}
	shard := s
	c.eventLocked(t, EventCrashHandoff, r.node.id, &shard, fmt.Sprintf("lease lapsed with a resumable session at seq %d (reported %s)",
		r.state.Seq, r.at.Format(time.RFC3339)))
	c.log.Info("resume hand-off after a lapsed lease", "shard", s, "from", r.node.id, "seq", r.state.Seq)
}

// noteGapLocked counts a hand-off of shard s that its holder n did not
// resume: n reports another session.
func (c *Controller) noteGapLocked(t time.Time, n *node, s uint32, h *handoff) {
	c.gw.sessionGaps++
	shard := s
	c.eventLocked(t, EventSessionGap, n.id, &shard, fmt.Sprintf("hand-off from %s at seq %d not resumed: a new session runs; the old session's dispatches after seq %d were not delivered",
		h.from.id, h.state.Seq, h.state.Seq))
	c.log.Warn("session gap: hand-off not resumed", "shard", s, "node", n.id, "from", h.from.id, "seq", h.state.Seq)
}

// ownRecordLocked reports whether r, shard s's session record, is n's own
// report under n's current grant of s: n has held s since it reported r,
// with no hand-off between (a hand-off's record names the previous holder
// or an earlier grant).
func (c *Controller) ownRecordLocked(n *node, s uint32, r *shardSession) bool {
	return r != nil && r.node == n && c.holder[s] == n && r.gen == c.grantGen[s]
}

// noteOwnGapLocked counts the end of a session n reported for shard s
// under its current grant and did not resume: Discord refused its own
// Resume after a drop (op 9, close 4007 or 4009) or the node lost it, and
// n now starts or runs another session (how says which evidence showed
// it: an Identify claim, or a check-in). The old session's dispatches
// after the reported sequence were not delivered. The record is dropped,
// so the same ending is counted once. A first Identify (no record), an
// Identify after a hand-off (the record is the previous holder's, whose
// gap settleHandoffsLocked counts) and a FATAL shard (its FATAL report
// dropped the record; only an operator's restart brings it back) are
// never counted here.
func (c *Controller) noteOwnGapLocked(t time.Time, n *node, s uint32, r *shardSession, how string, closeCode uint16) {
	c.gw.sessionGaps++
	shard := s
	code := ""
	if closeCode != 0 {
		code = fmt.Sprintf(", last close code %d", closeCode)
	}
	c.eventLocked(t, EventSessionGap, n.id, &shard, fmt.Sprintf("session on %s not resumed (%s%s): a new session runs; the old session's dispatches after seq %d were not delivered",
		n.id, how, code, r.state.Seq))
	c.log.Warn("session gap: own session not resumed", "shard", s, "node", n.id, "seq", r.state.Seq, "how", how, "close_code", closeCode)
	delete(c.sessions, s)
	c.stageSessionLocked(store.ShardSession{ShardID: s, NodeID: n.id, GrantGen: r.gen, Drop: true})
}

// sessionWord describes a reported session ID without naming it.
func sessionWord(id string) string {
	if id == "" {
		return "without a session"
	}
	return "with another session"
}

// loadSessionsLocked restores the stored sessions after a load: a holder's
// own record is kept as its latest report; a record of a shard nobody
// holds (its node's lease lapsed while no controller ran, or before a
// restart that lost the in-memory hand-off) is offered as a hand-off from
// one lease after its report, so it is dropped once that is older than
// ResumeTTL.
func (c *Controller) loadSessionsLocked(t time.Time, rows []store.ShardSession) {
	for _, x := range rows {
		n := c.nodes[x.NodeID]
		if n == nil || x.ShardID >= c.cfg.TotalShards {
			continue
		}
		dial, err := appliance.GatewayDialURL(x.ResumeURL)
		if err != nil || appliance.ValidateSessionID(x.SessionID) != nil {
			continue
		}
		r := &shardSession{node: n, gen: x.GrantGen, at: x.ReportedAt,
			state: appliance.ResumeState{ShardID: x.ShardID, SessionID: x.SessionID, Seq: x.Seq, ResumeURL: dial}}
		switch c.holder[x.ShardID] {
		case n:
			if c.sessions == nil {
				c.sessions = map[uint32]*shardSession{}
			}
			c.sessions[x.ShardID] = r
			c.grantGen[x.ShardID] = x.GrantGen
		case nil:
			if c.noCrashResume || c.handoffs[x.ShardID] != nil {
				continue
			}
			at := x.ReportedAt.Add(c.cfg.Lease)
			if t.Sub(at) > c.cfg.ResumeTTL {
				continue
			}
			c.offerCrashHandoffLocked(at, x.ShardID, r)
		}
	}
}

// loadSessions reads the stored sessions into a freshly loaded controller.
func (c *Controller) loadSessions(ctx context.Context, t time.Time) error {
	rows, err := c.st.ShardSessions(ctx)
	if err != nil {
		return err
	}
	c.loadSessionsLocked(t, rows)
	return nil
}

// forgetSessionsLocked drops what refers to n, a node deleted from the
// inventory (the store removed its rows): its session records, staged
// writes and hand-offs.
func (c *Controller) forgetSessionsLocked(n *node) {
	for s, r := range c.sessions {
		if r.node == n {
			delete(c.sessions, s)
		}
	}
	for s, x := range c.stage.sessions {
		if x.NodeID == n.id {
			delete(c.stage.sessions, s)
		}
	}
	for s, h := range c.handoffs {
		if h.from == n {
			delete(c.handoffs, s)
		}
	}
}

// DisableCrashResume is a deliberate mutation for the tests: a lapsed
// lease drops its shards' sessions as before crash resume, so the next
// owner Identifies afresh. Never in production.
func (c *Controller) DisableCrashResume() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.noCrashResume = true
}
