package gatewayemu

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// Gateway opcodes (Discord docs, topics/opcodes-and-status-codes, "Gateway
// Opcodes"; research §1.3).
const (
	OpDispatch            = 0
	OpHeartbeat           = 1
	OpIdentify            = 2
	OpPresenceUpdate      = 3
	OpVoiceStateUpdate    = 4
	OpResume              = 6
	OpReconnect           = 7
	OpRequestGuildMembers = 8
	OpInvalidSession      = 9
	OpHello               = 10
	OpHeartbeatACK        = 11
	OpRequestSoundboard   = 31
	OpRequestChannelInfo  = 43
)

// Gateway close codes (research §1.9). The emulator uses every one of them.
const (
	CloseUnknownError         = 4000
	CloseUnknownOpcode        = 4001
	CloseDecodeError          = 4002
	CloseNotAuthenticated     = 4003
	CloseAuthenticationFailed = 4004
	CloseAlreadyAuthenticated = 4005
	CloseInvalidSeq           = 4007
	CloseRateLimited          = 4008
	CloseSessionTimedOut      = 4009
	CloseInvalidShard         = 4010
	CloseShardingRequired     = 4011
	CloseInvalidAPIVersion    = 4012
	CloseInvalidIntents       = 4013
	CloseDisallowedIntents    = 4014

	// CloseUnsupported is the standard WebSocket "unsupported data" code
	// (RFC 6455 §7.4.1). The emulator uses it, with a reason, to refuse
	// encoding=etf and compress=zstd-stream, which it does not implement.
	CloseUnsupported = 1003
)

// closeResumable reports whether a server-initiated close with code keeps
// the session resumable. It follows the "reconnect" column of research §1.9:
// 4004 and 4010–4014 are fatal, 4007 and 4009 demand a new session; all other
// codes (including 1000/1001 sent by the server, see JDA's observation in
// §1.9) leave the session resumable.
func closeResumable(code int) bool {
	switch code {
	case CloseAuthenticationFailed, CloseInvalidSeq, CloseSessionTimedOut,
		CloseInvalidShard, CloseShardingRequired, CloseInvalidAPIVersion,
		CloseInvalidIntents, CloseDisallowedIntents:
		return false
	}
	return true
}

// Gateway intents (Discord docs, events/gateway "List of Intents"; the same
// bits as bwmarrin/discordgo v0.29.0 structs.go). Bits 17–19, 22 and 23 are
// not assigned; sending them is invalid (close 4013).
const (
	IntentGuilds                      = 1 << 0
	IntentGuildMembers                = 1 << 1 // privileged
	IntentGuildModeration             = 1 << 2
	IntentGuildExpressions            = 1 << 3
	IntentGuildIntegrations           = 1 << 4
	IntentGuildWebhooks               = 1 << 5
	IntentGuildInvites                = 1 << 6
	IntentGuildVoiceStates            = 1 << 7
	IntentGuildPresences              = 1 << 8 // privileged
	IntentGuildMessages               = 1 << 9
	IntentGuildMessageReactions       = 1 << 10
	IntentGuildMessageTyping          = 1 << 11
	IntentDirectMessages              = 1 << 12
	IntentDirectMessageReactions      = 1 << 13
	IntentDirectMessageTyping         = 1 << 14
	IntentMessageContent              = 1 << 15 // privileged
	IntentGuildScheduledEvents        = 1 << 16
	IntentAutoModerationConfiguration = 1 << 20
	IntentAutoModerationExecution     = 1 << 21
	IntentGuildMessagePolls           = 1 << 24
	IntentDirectMessagePolls          = 1 << 25

	// ValidIntents is the union of every assigned intent bit.
	ValidIntents = IntentGuilds | IntentGuildMembers | IntentGuildModeration |
		IntentGuildExpressions | IntentGuildIntegrations | IntentGuildWebhooks |
		IntentGuildInvites | IntentGuildVoiceStates | IntentGuildPresences |
		IntentGuildMessages | IntentGuildMessageReactions | IntentGuildMessageTyping |
		IntentDirectMessages | IntentDirectMessageReactions | IntentDirectMessageTyping |
		IntentMessageContent | IntentGuildScheduledEvents |
		IntentAutoModerationConfiguration | IntentAutoModerationExecution |
		IntentGuildMessagePolls | IntentDirectMessagePolls

	// PrivilegedIntents must be enabled for the application (Options.ApprovedIntents)
	// or Identify is closed with 4014.
	PrivilegedIntents = IntentGuildMembers | IntentGuildPresences | IntentMessageContent
)

// Protocol limits (research §1.11, §1.14).
const (
	// MaxPayloadBytes is the largest client payload Discord accepts; larger → 4002.
	MaxPayloadBytes = 4096
	// SendLimitEvents client events are allowed per SendLimitWindow per connection; more → 4008.
	SendLimitEvents = 120
	// MaxGuildsPerShard is the hard cap of guilds on one shard; more → 4011.
	MaxGuildsPerShard = 2500
	// DefaultSessionStarts is the daily Identify budget of a normal bot.
	DefaultSessionStarts = 1000
	// discordEpochMillis is the first millisecond of 2015, the snowflake epoch.
	discordEpochMillis = 1420070400000
)

// Errors returned by payload decoding; the connection maps them to close codes.
var (
	// ErrDecode means the frame is not a JSON gateway payload (close 4002).
	ErrDecode = errors.New("gatewayemu: payload is not a valid JSON gateway payload")
	// ErrInvalidPayload means the JSON is well formed but `d` does not fit the
	// opcode's schema (close 4001).
	ErrInvalidPayload = errors.New("gatewayemu: invalid payload for opcode")
	// errMissingOp is wrapped with ErrDecode for an object without "op".
	errMissingOp = errors.New("missing \"op\"")
)

// payload is the gateway envelope (research §1.2). D stays raw so each opcode
// decodes it with its own strict schema.
type payload struct {
	Op *int            `json:"op"`
	D  json.RawMessage `json:"d"`
	S  *int64          `json:"s"`
	T  *string         `json:"t"`
}

// outPayload is what the emulator sends. S and T are always present (null
// unless op 0), as Discord sends them.
type outPayload struct {
	Op int     `json:"op"`
	D  any     `json:"d"`
	S  *int64  `json:"s"`
	T  *string `json:"t"`
}

// identifyData is Identify's `d` (research §1.6). Unknown top-level fields are
// rejected unless Options.AllowUnknownFields; `properties` and `presence` are
// decoded loosely because Discord accepts the deprecated `$os` style and
// libraries send legacy presence fields (discordgo sends `game`).
type identifyData struct {
	Token          *string                    `json:"token"`
	Properties     map[string]json.RawMessage `json:"properties"`
	Compress       *bool                      `json:"compress"`
	LargeThreshold *int                       `json:"large_threshold"`
	Shard          []int                      `json:"shard"`
	Presence       json.RawMessage            `json:"presence"`
	Intents        *int64                     `json:"intents"`
}

// resumeData is Resume's `d` (research §1.8).
type resumeData struct {
	Token     *string `json:"token"`
	SessionID *string `json:"session_id"`
	Seq       *int64  `json:"seq"`
}

// decodeEnvelope parses one client frame.
func decodeEnvelope(b []byte) (payload, error) {
	var p payload
	if err := json.Unmarshal(b, &p); err != nil {
		return p, fmt.Errorf("%w: %v", ErrDecode, err)
	}
	if p.Op == nil {
		return p, fmt.Errorf("%w: %w", ErrDecode, errMissingOp)
	}
	return p, nil
}

// decodeStrict decodes raw into v, rejecting unknown fields unless lenient.
func decodeStrict(raw json.RawMessage, v any, lenient bool) error {
	if len(raw) == 0 || string(raw) == "null" {
		return fmt.Errorf("%w: \"d\" is null", ErrInvalidPayload)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if !lenient {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidPayload, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: trailing data after \"d\"", ErrInvalidPayload)
	}
	return nil
}

// snowflake formats an ID the way Discord does: a decimal string.
func snowflake(id uint64) string { return fmt.Sprintf("%d", id) }

// ShardForGuild is Discord's routing formula (research §1.14):
// (guild_id >> 22) % num_shards on the unsigned snowflake.
func ShardForGuild(guildID uint64, numShards int) int {
	if numShards <= 1 {
		return 0
	}
	return int((guildID >> 22) % uint64(numShards))
}
