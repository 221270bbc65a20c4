package events

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/discord-pxe/dpxe/appliance"
)

// Commands back to a shard (issue 19). A worker sends a Gateway command
// as a NATS request to dpxe.<app>.commands.<shard>; the body is the frame
// it wants sent, {"op":3,"d":{...}}. The node running the shard checks it
// with CheckCommand, writes it unchanged on the shard's connection and
// notes it in the connection's send log, then replies with a
// CommandReply: {"status":"ok"} or an error code and a reason.
// CheckCommand is the reference of the rule and of the reply's bytes: the
// kernel's cmd_check (kernel/node/natscmd.inc) mirrors it, compared case by
// case with CommandCorpus (command_corpus.go).
//
// The rule, in the order the checks are made (the first that fails
// names the reply):
//
//  1. not_owner: the node does not hold the shard (it moved, or is
//     being released).
//  2. too_large: the body is over MaxCommandBytes, Discord's limit on a
//     client payload (a larger one closes the connection with 4002).
//  3. bad_json: the body is not one JSON object whose only members are
//     "op" and "d", each once, with "op" a non-negative integer written
//     in digits and "d" an object.
//  4. bad_op: op is not 3 (presence update), 4 (voice state update) or 8
//     (request guild members). Identify, Resume and Heartbeat belong to
//     the node, never to a worker.
//  5. wrong_shard: for ops 4 and 8, d.guild_id is missing, not a
//     snowflake string, or routes to another shard
//     ((guild_id >> 22) % total_shards).
//  6. not_ready: the shard has no READY (or RESUMED) session to send on.
//  7. rate_limited: sending it now would break the connection's send
//     budget (appliance.SendLog.Allows: 120 events in 60 s with room
//     kept for heartbeats); the reply says when to retry.

// Command reply codes.
const (
	CodeOK          = "ok"
	CodeNotOwner    = "not_owner"
	CodeTooLarge    = "too_large"
	CodeBadJSON     = "bad_json"
	CodeBadOp       = "bad_op"
	CodeWrongShard  = "wrong_shard"
	CodeNotReady    = "not_ready"
	CodeRateLimited = "rate_limited"
)

// Gateway opcodes a worker may send.
const (
	OpPresenceUpdate      = 3
	OpVoiceStateUpdate    = 4
	OpRequestGuildMembers = 8
)

// MaxCommandBytes is the largest command body: Discord closes a
// connection whose client payload exceeds 4096 bytes (code 4002).
const MaxCommandBytes = 4096

// CommandReply is the node's answer to a command request, JSON-encoded.
type CommandReply struct {
	Status string `json:"status"`           // CodeOK or an error code
	Reason string `json:"reason,omitempty"` // what was wrong, for people
	// RetryAfterMS is set with rate_limited: when the budget has room
	// again (all ones: never, at this heartbeat interval).
	RetryAfterMS uint64 `json:"retry_after_ms,omitempty"`
	Shard        uint32 `json:"shard"`
	Node         string `json:"node,omitempty"`
}

// Err returns nil for ok, else a *CommandError.
func (r CommandReply) Err() error {
	if r.Status == CodeOK {
		return nil
	}
	return &CommandError{Code: r.Status, Reason: r.Reason, RetryAfter: retryAfter(r.RetryAfterMS), Shard: r.Shard, Node: r.Node}
}

func retryAfter(ms uint64) time.Duration {
	if ms > uint64(1<<63-1)/uint64(time.Millisecond) {
		return time.Duration(1<<63 - 1)
	}
	return time.Duration(ms) * time.Millisecond
}

// CommandError is a refused command.
type CommandError struct {
	Code       string        // one of the Code* error codes
	Reason     string        // what was wrong
	RetryAfter time.Duration // with rate_limited
	Shard      uint32
	Node       string // the node that answered, if one did
}

func (e *CommandError) Error() string {
	s := fmt.Sprintf("command for shard %d: %s", e.Shard, e.Code)
	if e.Reason != "" {
		s += ": " + e.Reason
	}
	if e.Code == CodeRateLimited {
		s += fmt.Sprintf(" (retry after %v)", e.RetryAfter)
	}
	return s
}

// Retryable reports whether the same command may succeed later:
// rate_limited (after RetryAfter), not_ready and not_owner (the shard is
// starting or moving).
func (e *CommandError) Retryable() bool {
	return e.Code == CodeRateLimited || e.Code == CodeNotReady || e.Code == CodeNotOwner
}

// ErrCommandRefused is what every *CommandError matches with errors.Is.
var ErrCommandRefused = errors.New("command refused")

// Is makes errors.Is(err, ErrCommandRefused) true for a CommandError.
func (e *CommandError) Is(target error) bool { return target == ErrCommandRefused }

// ShardView is what CheckCommand needs to know of the shard the command
// is for, as the node sees it when the command arrives.
type ShardView struct {
	Shard       uint32 // the shard the subject names
	TotalShards uint32 // the bot's shard count (0: guild routing unchecked)
	Owned       bool   // the node holds the shard
	Node        string // the node's name, for the reply ("" leaves it out)
	Ready       bool   // a READY or RESUMED session is up
	// Log is the connection's send log (every Identify, Resume,
	// heartbeat and command it sent); NowTSC, CyclesPerMS and
	// HeartbeatMS are as appliance.SendLog.Allows takes them.
	Log         *appliance.SendLog
	NowTSC      uint64
	CyclesPerMS uint64
	HeartbeatMS uint32
}

// Command is a checked command: its opcode and the frame to send,
// the body unchanged.
type Command struct {
	Op    int
	Frame []byte
}

// CheckCommand applies the rule above to a command body for the shard v
// describes. On success the reply is ok and the caller sends cmd.Frame
// and notes it in v.Log (holding whatever lock keeps the log and the
// connection's writes together); otherwise nothing may be sent.
func CheckCommand(body []byte, v ShardView) (cmd Command, reply CommandReply) {
	reply.Shard, reply.Node = v.Shard, v.Node
	refuse := func(code, reason string) (Command, CommandReply) {
		reply.Status, reply.Reason = code, reason
		return Command{}, reply
	}
	if !v.Owned {
		return refuse(CodeNotOwner, "this node does not hold the shard")
	}
	if len(body) > MaxCommandBytes {
		return refuse(CodeTooLarge, fmt.Sprintf("%d bytes, at most %d", len(body), MaxCommandBytes))
	}
	op, d, why := parseCommandFrame(body)
	if why != "" {
		return refuse(CodeBadJSON, why)
	}
	switch op {
	case OpPresenceUpdate:
	case OpVoiceStateUpdate, OpRequestGuildMembers:
		if why := checkGuild(d, v.Shard, v.TotalShards); why != "" {
			return refuse(CodeWrongShard, why)
		}
	default:
		return refuse(CodeBadOp, fmt.Sprintf("op %d: workers may send only 3 (presence), 4 (voice state) and 8 (request guild members)", op))
	}
	if !v.Ready || v.Log == nil {
		return refuse(CodeNotReady, "the shard has no ready session")
	}
	if ok, wait := v.Log.Allows(v.NowTSC, v.CyclesPerMS, v.HeartbeatMS); !ok {
		reply.RetryAfterMS = wait
		return refuse(CodeRateLimited, "the connection's send budget (120 events per 60 s, heartbeats kept) is spent")
	}
	reply.Status = CodeOK
	return Command{Op: op, Frame: body}, reply
}

// parseCommandFrame reads {"op":N,"d":{...}} strictly: one object, the
// members op and d once each and nothing else, op in digits, d an
// object. Member names are compared as written, byte for byte: a name
// spelt with escapes ("\u006fp") is an unexpected member, which is
// stricter than encoding/json and what the kernel's mirror
// (kernel/node/natscmd.inc, cmd_check) can do without decoding strings.
// The problems are found in the order the bytes come, and the reasons are
// fixed sentences, so the kernel answers byte for byte the same. It
// returns why not, or "".
func parseCommandFrame(body []byte) (op int, d []byte, why string) {
	if !json.Valid(body) {
		return 0, nil, "not valid JSON"
	}
	i := skipSpace(body, 0)
	if body[i] != '{' {
		return 0, nil, "not a JSON object"
	}
	var opRaw []byte
	i = skipSpace(body, i+1)
	for body[i] != '}' {
		kEnd := skipValue(body, i) // the name, quotes included
		key := body[i+1 : kEnd-1]
		i = skipSpace(body, kEnd)
		i = skipSpace(body, i+1) // past ':'
		vEnd := skipValue(body, i)
		val := body[i:vEnd]
		switch string(key) {
		case "op":
			if opRaw != nil {
				return 0, nil, `"op" twice`
			}
			opRaw = val
		case "d":
			if d != nil {
				return 0, nil, `"d" twice`
			}
			d = val
		default:
			return 0, nil, `unexpected member (only "op" and "d")`
		}
		i = skipSpace(body, vEnd)
		if body[i] == ',' {
			i = skipSpace(body, i+1)
		}
	}
	if opRaw == nil {
		return 0, nil, `no "op"`
	}
	if d == nil {
		return 0, nil, `no "d"`
	}
	if len(opRaw) > 3 || (len(opRaw) > 1 && opRaw[0] == '0') {
		return 0, nil, `"op" is not a small non-negative integer`
	}
	for _, c := range opRaw {
		if c < '0' || c > '9' {
			return 0, nil, `"op" is not a small non-negative integer`
		}
		op = op*10 + int(c-'0')
	}
	if d[0] != '{' {
		return 0, nil, `"d" is not an object`
	}
	return op, d, ""
}

// skipSpace returns the index of the first byte at or after i that is not
// JSON white space.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

// skipValue returns the index just past the value that starts at b[i],
// for b already known to be valid JSON.
func skipValue(b []byte, i int) int {
	depth := 0
	for ; i < len(b); i++ {
		switch c := b[i]; c {
		case '"':
			for i++; b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
			if depth == 0 {
				return i + 1
			}
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return i + 1
			}
		default:
			if depth == 0 { // a number or a literal: up to a delimiter
				for i < len(b) && !strings.ContainsRune(",}] \t\r\n", rune(b[i])) {
					i++
				}
				return i
			}
		}
	}
	return i
}

// checkGuild checks that d.guild_id is a snowflake string that routes to
// shard; total 0 skips the routing (but not the syntax). Like member
// names in parseCommandFrame, "guild_id" is matched as written, and the
// string's bytes are read as they are (an escape is not a digit).
func checkGuild(d []byte, shard, total uint32) string {
	var id []byte
	found := false
	i := skipSpace(d, 1)
	for d[i] != '}' {
		kEnd := skipValue(d, i)
		key := d[i+1 : kEnd-1]
		i = skipSpace(d, kEnd)
		i = skipSpace(d, i+1)
		vEnd := skipValue(d, i)
		if string(key) == "guild_id" {
			if found {
				return `d.guild_id: twice`
			}
			found = true
			if d[i] == '"' {
				id = d[i+1 : vEnd-1]
			}
		}
		i = skipSpace(d, vEnd)
		if d[i] == ',' {
			i = skipSpace(d, i+1)
		}
	}
	if id == nil {
		return `d.guild_id: missing or not a string`
	}
	g, err := appliance.ParseGuildID(string(id))
	if err != nil {
		return "d.guild_id: " + err.Error()
	}
	if total > 0 {
		if want := appliance.ShardForGuild(g, total); want != shard {
			return fmt.Sprintf("guild %d is on shard %d of %d, not %d", g, want, total, shard)
		}
	}
	return ""
}

// SendBudget is a connection's send log on the wall clock, for Go node
// code (the lab's simulated nodes): appliance.SendLog counts in TSC
// cycles; here a "cycle" is a nanosecond since the connection opened,
// scaled so that Window counts as Discord's 60 s (tests that shorten the
// heartbeat interval shorten the window by the same ratio, as the
// Gateway emulator does). Not safe for concurrent use: the caller holds
// the connection's write lock.
type SendBudget struct {
	Log         appliance.SendLog
	start       time.Time
	cyclesPerMS uint64
	scale       float64 // wall ms → budget ms
}

// NewSendBudget starts a connection's budget; window 0 means Discord's
// 60 s.
func NewSendBudget(window time.Duration) *SendBudget {
	if window <= 0 {
		window = appliance.SendLimitWindowMS * time.Millisecond
	}
	per := uint64(window) / appliance.SendLimitWindowMS
	return &SendBudget{start: time.Now(), cyclesPerMS: max(per, 1),
		scale: float64(appliance.SendLimitWindowMS) / (float64(window) / float64(time.Millisecond))}
}

func (b *SendBudget) now() uint64 { return uint64(time.Since(b.start)) }

// Note records an event sent now (every Identify, Resume, heartbeat and
// command).
func (b *SendBudget) Note() { b.Log.Note(b.now()) }

// Check is CheckCommand with v's budget fields filled from b for a
// connection heartbeating every interval; a rate_limited reply's
// RetryAfterMS is in wall milliseconds.
func (b *SendBudget) Check(body []byte, v ShardView, interval time.Duration) (Command, CommandReply) {
	v.Log, v.NowTSC, v.CyclesPerMS = &b.Log, b.now(), b.cyclesPerMS
	ms := float64(interval) / float64(time.Millisecond) * b.scale
	v.HeartbeatMS = uint32(min(max(ms, 1), float64(^uint32(0))))
	cmd, r := CheckCommand(body, v)
	if r.Status == CodeRateLimited && r.RetryAfterMS != ^uint64(0) {
		r.RetryAfterMS = uint64(float64(r.RetryAfterMS)/b.scale) + 1
	}
	return cmd, r
}

// CommandHandler answers one command body for a shard.
type CommandHandler func(body []byte) CommandReply

// ServeCommands subscribes nc to app's command subject of shard and
// answers every request with h's reply, JSON-encoded (a message without
// a reply subject is dropped unanswered: a command is only sent when its
// sender can learn the outcome). Unsubscribe the returned subscription
// when the node releases the shard.
func ServeCommands(nc *nats.Conn, app string, shard uint32, h CommandHandler) (*nats.Subscription, error) {
	subj, err := CommandSubject(app, shard)
	if err != nil {
		return nil, err
	}
	return nc.Subscribe(subj, func(m *nats.Msg) {
		if m.Reply == "" {
			return
		}
		r := h(m.Data)
		r.Shard = shard
		b, _ := json.Marshal(r)
		m.Respond(b)
	})
}
