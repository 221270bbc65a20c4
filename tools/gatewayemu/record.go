package gatewayemu

import (
	"time"
)

// Kind names a violation. The strings are part of the /debug/state format and
// never change meaning; docs/gateway-emulator.md defines each one.
type Kind string

// Violation kinds. Each is something a well-behaved client or fleet never does.
const (
	// KindDuplicateSession: a second live (connected, identified) session for
	// the same [shard_id, num_shards].
	KindDuplicateSession Kind = "duplicate_session"
	// KindIdentifyTooEarly: an Identify whose bucket (shard_id % max_concurrency)
	// had an accepted Identify less than the window ago. Refused with op 9 false.
	KindIdentifyTooEarly Kind = "identify_too_early"
	// KindIdentifyOverConcurrency: more than max_concurrency Identify attempts
	// (accepted or refused) within one trailing window.
	KindIdentifyOverConcurrency Kind = "identify_over_concurrency"
	// KindBucketOutOfOrder: an accepted Identify of shard s while some shard t
	// of an earlier start group (t/max_concurrency < s/max_concurrency) of the
	// same num_shards has never been identified.
	KindBucketOutOfOrder Kind = "bucket_out_of_order"
	// KindMissedHeartbeat: no heartbeat within interval + grace; closed 4009.
	KindMissedHeartbeat Kind = "missed_heartbeat"
	// KindOversizePayload: a client frame over 4096 bytes; closed 4002.
	KindOversizePayload Kind = "oversize_payload"
	// KindRateLimited: more than 120 client events in 60 s; closed 4008.
	KindRateLimited Kind = "rate_limited"
	// KindDecodeError: a frame that is not a JSON gateway payload; closed 4002.
	KindDecodeError Kind = "decode_error"
	// KindInvalidPayload: a `d` that does not fit its opcode; closed 4001.
	KindInvalidPayload Kind = "invalid_payload"
	// KindUnknownOpcode: an opcode the gateway does not accept; closed 4001.
	KindUnknownOpcode Kind = "unknown_opcode"
	// KindNotAuthenticated: a payload other than heartbeat/Identify/Resume
	// before Identify; closed 4003.
	KindNotAuthenticated Kind = "not_authenticated"
	// KindAlreadyAuthenticated: a second Identify on one connection; closed 4005.
	KindAlreadyAuthenticated Kind = "already_authenticated"
	// KindAuthenticationFailed: a wrong or revoked token; closed 4004.
	KindAuthenticationFailed Kind = "authentication_failed"
	// KindInvalidShard: a bad shard array; closed 4010.
	KindInvalidShard Kind = "invalid_shard"
	// KindShardingRequired: too many guilds for the shard; closed 4011.
	KindShardingRequired Kind = "sharding_required"
	// KindInvalidAPIVersion: a missing or unsupported v=; closed 4012.
	KindInvalidAPIVersion Kind = "invalid_api_version"
	// KindInvalidIntents: unassigned intent bits or no intents; closed 4013.
	KindInvalidIntents Kind = "invalid_intents"
	// KindDisallowedIntents: a privileged intent not approved; closed 4014.
	KindDisallowedIntents Kind = "disallowed_intents"
	// KindInvalidSeq: Resume with a seq the session never sent or can no
	// longer replay; closed 4007.
	KindInvalidSeq Kind = "invalid_seq"
	// KindResumeWrongURL: a Resume on the main gateway URL instead of
	// resume_gateway_url. The Resume still succeeds, as on Discord.
	KindResumeWrongURL Kind = "resume_wrong_url"
	// KindResumeVersionMismatch: a Resume on a connection whose v= differs
	// from the Identify's (Discord requires the same version and encoding).
	// The Resume still succeeds.
	KindResumeVersionMismatch Kind = "resume_version_mismatch"
	// KindWrongHost: a gateway handshake whose Host header names neither
	// the configured gateway host nor the resume host, checked only when
	// one of them is a host name. The connection goes on.
	KindWrongHost Kind = "wrong_host"
	// KindMembersWrongGuild: Request Guild Members (op 8) for a guild the
	// session's shard does not hold. Not answered; the connection goes on.
	KindMembersWrongGuild Kind = "members_wrong_guild"
	// KindMembersRateLimited: an all-members Request Guild Members for a
	// guild within MemberRequestWindow of the last one. Answered with a
	// RATE_LIMITED dispatch, as Discord does; the connection goes on.
	KindMembersRateLimited Kind = "members_rate_limited"
	// KindBudgetExhausted: an Identify after the session-start budget reached
	// zero; every session is closed (4004) and the token is revoked.
	KindBudgetExhausted Kind = "budget_exhausted"
)

// Violation is one entry of the violation record.
type Violation struct {
	Time time.Time `json:"time"`
	Kind Kind      `json:"kind"`
	// Shard is [shard_id, num_shards] when known (null before Identify).
	Shard *[2]int `json:"shard"`
	// Session is the session ID when one exists.
	Session string `json:"session,omitempty"`
	// Conn is the emulator's connection number (1, 2, ...).
	Conn uint64 `json:"conn,omitempty"`
	// CloseCode is the close code the emulator answered with, 0 if none.
	CloseCode int `json:"close_code,omitempty"`
	// Detail says why, for a human.
	Detail string `json:"detail"`
	// TimerLateMS is, for a violation a timer found (missed_heartbeat), how
	// long after its deadline the emulator's timer fired. Hundreds of
	// milliseconds mean the emulator itself was starved of CPU: the
	// machine was overloaded, and the client may not be at fault.
	TimerLateMS int64 `json:"timer_late_ms,omitempty"`
}

// IdentifyOutcome is what the emulator did with an Identify.
type IdentifyOutcome string

// Identify outcomes in IdentifyRecord.
const (
	IdentifyAccepted IdentifyOutcome = "accepted"
	IdentifyRefused  IdentifyOutcome = "refused" // bucket window: op 9 false, costs a start
	IdentifyClosed   IdentifyOutcome = "closed"  // validation failed: closed with a code
)

// IdentifyRecord is one Identify attempt, in arrival order.
type IdentifyRecord struct {
	Time    time.Time       `json:"time"`
	Conn    uint64          `json:"conn"`
	Shard   *[2]int         `json:"shard"`
	Bucket  int             `json:"bucket"` // shard_id % max_concurrency
	Outcome IdentifyOutcome `json:"outcome"`
	// Session is the new session ID when accepted.
	Session string `json:"session,omitempty"`
	// CloseCode is set when Outcome is "closed".
	CloseCode int `json:"close_code,omitempty"`
	// Reason explains a refusal or close.
	Reason string `json:"reason,omitempty"`
}

// SessionState is the lifecycle state of a session in SessionInfo.
type SessionState string

// Session states.
const (
	// SessionConnected: attached to an open connection ("live").
	SessionConnected SessionState = "connected"
	// SessionDetached: no connection, resumable until ResumableUntil.
	SessionDetached SessionState = "detached"
)

// SessionInfo describes one session that is live or still resumable.
type SessionInfo struct {
	ID    string       `json:"session_id"`
	Shard [2]int       `json:"shard"`
	State SessionState `json:"state"`
	// Seq is the last sequence number the session dispatched.
	Seq int64 `json:"seq"`
	// Conn is the attached connection number, 0 when detached.
	Conn           uint64     `json:"conn,omitempty"`
	CreatedAt      time.Time  `json:"created_at"`
	ResumableUntil *time.Time `json:"resumable_until,omitempty"`
	Resumes        int        `json:"resumes"`
	// Heartbeats and LastHeartbeat count heartbeats on the attached connection.
	Heartbeats    int64      `json:"heartbeats"`
	LastHeartbeat *time.Time `json:"last_heartbeat,omitempty"`
	// AckSuppressed is true while a stop_ack fault holds for the shard.
	AckSuppressed bool `json:"ack_suppressed,omitempty"`
}

// ShardSessions groups the sessions of one [shard_id, num_shards].
type ShardSessions struct {
	Shard    [2]int        `json:"shard"`
	Sessions []SessionInfo `json:"sessions"`
}

// FirstHeartbeat is a connection's first heartbeat, measured from Hello.
type FirstHeartbeat struct {
	Conn     uint64        `json:"conn"`
	After    time.Duration `json:"after"`
	Interval time.Duration `json:"interval"` // heartbeat_interval sent in Hello
}

// HeartbeatRecord is one client heartbeat and its ACK, as the emulator saw
// them (Options.RecordHeartbeats). Acked minus Received is the emulator's
// share of the client's ping: what the client measures should be that plus
// the network's round trip.
type HeartbeatRecord struct {
	Conn     uint64    `json:"conn"`
	Shard    int       `json:"shard"` // -1 before Identify
	N        int       `json:"n"`     // the connection's n-th heartbeat, from 1
	Received time.Time `json:"received"`
	// Acked is when the ACK was handed to the connection (the write
	// returned); zero while it is held or when a stop_ack fault ate it.
	Acked time.Time `json:"acked"`
}

// CommandRecord is one Gateway command (op 3, 4 or 8) a ready
// connection sent, in arrival order (at most maxCommandRecords are kept).
type CommandRecord struct {
	Conn     uint64    `json:"conn"`
	Shard    int       `json:"shard"`
	Op       int       `json:"op"`
	Bytes    int       `json:"bytes"`
	Received time.Time `json:"received"`
}

// maxCommandRecords bounds the command record; later commands are only
// counted (State.CommandsDropped).
const maxCommandRecords = 100000

// SessionStartLimit mirrors /gateway/bot's session_start_limit.
type SessionStartLimit struct {
	Total          int   `json:"total"`
	Remaining      int   `json:"remaining"`
	ResetAfter     int64 `json:"reset_after"`
	MaxConcurrency int   `json:"max_concurrency"`
}

// Counters are running totals since start.
type Counters struct {
	Connections        uint64 `json:"connections"`
	OpenConnections    int64  `json:"open_connections"`
	IdentifyAccepted   uint64 `json:"identify_accepted"`
	IdentifyRefused    uint64 `json:"identify_refused"`
	IdentifyClosed     uint64 `json:"identify_closed"`
	Resumes            uint64 `json:"resumes"`
	ResumesFailed      uint64 `json:"resumes_failed"`
	Heartbeats         uint64 `json:"heartbeats"`
	HeartbeatACKs      uint64 `json:"heartbeat_acks"`
	Dispatches         uint64 `json:"dispatches"`
	ReplayedDispatches uint64 `json:"replayed_dispatches"`
	// MaxTimerLateMS is the latest any heartbeat timer fired past its
	// deadline (see Violation.TimerLateMS).
	MaxTimerLateMS int64 `json:"max_timer_late_ms"`
	// PayloadBytes is the JSON bytes of every server message, before
	// compression; WireBytes the same messages as sent (after zlib).
	PayloadBytes uint64 `json:"payload_bytes"`
	WireBytes    uint64 `json:"wire_bytes"`
}

// State is the whole /debug/state document. Field order and names are stable.
type State struct {
	Time              time.Time         `json:"time"`
	GatewayURL        string            `json:"gateway_url"`
	ResumeGatewayURL  string            `json:"resume_gateway_url"`
	SessionStartLimit SessionStartLimit `json:"session_start_limit"`
	TokenRevoked      bool              `json:"token_revoked"`
	// AckSuppressed lists shard IDs under a stop_ack fault, ascending.
	AckSuppressed []int    `json:"ack_suppressed"`
	Counters      Counters `json:"counters"`
	// Shards lists live and resumable sessions, sorted by shard then session ID.
	Shards []ShardSessions `json:"shards"`
	// Identifies lists every Identify attempt in arrival order.
	Identifies []IdentifyRecord `json:"identifies"`
	// Violations lists every violation in the order recorded.
	Violations []Violation `json:"violations"`
	// MalformedClientFrames counts malformed client frames by reason.
	MalformedClientFrames map[string]uint64 `json:"malformed_client_frames"`
	// Connections is the record of every open and recent closed connection.
	Connections []ConnStats `json:"connections"`
	// Commands lists the Gateway commands (ops 3, 4, 8) ready connections
	// sent, in arrival order; CommandsDropped counts those past the
	// record's bound.
	Commands        []CommandRecord `json:"commands"`
	CommandsDropped uint64          `json:"commands_dropped"`
	// REST is the record of messages created through REST and of the
	// synthetic "!ping"s.
	REST RESTRecord `json:"rest"`
}

func shardPtr(id, num int) *[2]int { s := [2]int{id, num}; return &s }
