package gatewayemu

import (
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Defaults used when the corresponding Options field is zero.
const (
	// DefaultToken is the bot token the emulator accepts unless Options.Token is set.
	DefaultToken = "emulator-token"
	// DefaultHeartbeatInterval is the interval Discord actually sends (research §1.5).
	DefaultHeartbeatInterval = 41250 * time.Millisecond
	// DefaultIdentifyWindow is Discord's per-bucket Identify window (research §1.11).
	DefaultIdentifyWindow = 5 * time.Second
	// DefaultIdentifyRejectDelay is how long a refused Identify waits before
	// op 9 (research §1.12: "after a few seconds").
	DefaultIdentifyRejectDelay = 2 * time.Second
	// DefaultBudgetPeriod is the session-start budget period (24 h).
	DefaultBudgetPeriod = 24 * time.Hour
	// DefaultResumeTimeout is how long a detached session stays resumable
	// (Discord: "timeout after a few minutes").
	DefaultResumeTimeout = 3 * time.Minute
	// DefaultReplayLimit is how many dispatches a session keeps for replay.
	DefaultReplayLimit = 1024
	// DefaultSendWindow is the window of the 120-event send limit.
	DefaultSendWindow = 60 * time.Second
	// DefaultReconnectGrace is how long a connection may stay open after op 7
	// before the emulator closes it (Discord "may close a few seconds after").
	DefaultReconnectGrace = 5 * time.Second
	// DefaultGuilds is the number of synthetic guilds.
	DefaultGuilds = 4
	// DefaultGuildMembers is the member count of a synthetic guild: the
	// bot and the author of the synthetic messages.
	DefaultGuildMembers = 2
	// DefaultMemberRequestWindow is Discord's window of the all-members
	// Request Guild Members limit (research §1.11: 1 per guild per 30 s).
	DefaultMemberRequestWindow = 30 * time.Second
	// MaxGuildCreateBytes bounds Options.GuildCreateBytes.
	MaxGuildCreateBytes = 64 << 20
	// MaxReadyUnavailableGuilds bounds Options.ReadyUnavailableGuilds.
	MaxReadyUnavailableGuilds = 1 << 20
	// MaxGuildMembers bounds Options.GuildMembers.
	MaxGuildMembers = 1 << 22
	// MinMessageBytes and MaxMessageBytes bound a non-zero
	// Options.MessageBytes: an unpadded synthetic MESSAGE_CREATE frame is
	// about 490 bytes, so a smaller size could not be met, and 64 KiB is
	// well above a real message's (4,000 characters of content and 6,000
	// of embeds).
	MinMessageBytes = 512
	MaxMessageBytes = 64 << 10
)

// ErrBadOptions wraps every option validation failure.
var ErrBadOptions = errors.New("gatewayemu: bad options")

// Options configure an Emulator. The zero value is a usable single-shard bot
// with Discord's real timings; tests shorten the durations.
type Options struct {
	// Token is the bot token without the "Bot " prefix. Identify accepts it
	// with or without the prefix; HTTP requires "Authorization: Bot <token>".
	Token string
	// Shards is the recommended shard count returned by /gateway/bot (default 1).
	Shards int
	// ShardMultiple, when > 1, is large-bot mode: num_shards in Identify must
	// be a multiple of it or Identify is closed with 4010.
	ShardMultiple int
	// MaxConcurrency is session_start_limit.max_concurrency (default 1).
	MaxConcurrency int
	// IdentifyWindow is the per-bucket Identify window (default 5 s).
	IdentifyWindow time.Duration
	// IdentifyRejectDelay is the delay before op 9 false for an Identify
	// refused by its bucket (default 2 s; negative means no delay).
	IdentifyRejectDelay time.Duration
	// SessionStarts is session_start_limit.total (default 1000).
	SessionStarts int
	// BudgetPeriod is how often the session-start budget resets (default 24 h).
	BudgetPeriod time.Duration
	// KeepTokenOnExhaust, if set, keeps the token valid after the budget is
	// exceeded. By default the token is revoked (old token → 4004) until the
	// budget resets or ResetBudget is called, as Discord resets the token.
	KeepTokenOnExhaust bool
	// HeartbeatInterval is sent in Hello (default 41250 ms).
	HeartbeatInterval time.Duration
	// HeartbeatGrace is added to the interval before a silent client is
	// closed with 4009 (default a quarter of the interval).
	HeartbeatGrace time.Duration
	// ApprovedIntents are the privileged intents enabled for the application;
	// any other privileged intent in Identify is closed with 4014.
	ApprovedIntents int64
	// Guilds is the number of synthetic guilds (default 4; ignored if GuildIDs is set).
	Guilds int
	// GuildIDs, if set, are the exact guild snowflakes of the bot.
	GuildIDs []uint64
	// MessagesPerSecond is the rate of synthetic MESSAGE_CREATE dispatches per
	// ready session (0 = none).
	MessagesPerSecond float64
	// MessageBytes, when not 0, pads each synthetic MESSAGE_CREATE's
	// content so that its op-0 frame ({"op":0,"d":{...},"s":N,"t":...},
	// the JSON text a client reads after inflating, which the kernel
	// publishes unchanged as the event's body) is MessageBytes long, give
	// or take the digits of its sequence number (the padding assumes a
	// 4-digit s: within 3 bytes while s < 10^7). A "!ping" (PingEvery)
	// keeps its content and is not padded. 0 keeps the unpadded frame
	// (about 490 bytes); otherwise MinMessageBytes..MaxMessageBytes.
	MessageBytes int
	// PingEvery makes every PingEvery-th synthetic MESSAGE_CREATE of a
	// session a guild message with content "!ping" (0 = none), recorded
	// in the REST record's pings.
	PingEvery int
	// RESTMessageLimit messages per RESTMessageWindow may be created in
	// one channel through REST (default 5 per 5 s); more get 429.
	RESTMessageLimit  int
	RESTMessageWindow time.Duration
	// ResumeTimeout is how long a detached session stays resumable (default 3 min).
	ResumeTimeout time.Duration
	// ReplayLimit is how many dispatches each session keeps at least for
	// replay (default 1024; up to twice as many are kept between trims).
	ReplayLimit int
	// SendLimit and SendWindow are the client send limit (default 120 per
	// 60 s). When HeartbeatInterval is shorter than Discord's 41.25 s and
	// SendWindow is zero, the window shrinks by the same ratio, so a client
	// that heartbeats at the interval uses the same share of the budget as
	// on Discord.
	SendLimit  int
	SendWindow time.Duration
	// ReconnectGrace is how long after an injected op 7 the emulator closes
	// the connection itself (default 5 s).
	ReconnectGrace time.Duration
	// AckDelay, if set, is how long the emulator holds the ACK of the n-th
	// heartbeat (from 1) of a connection of shard shard (-1 before
	// Identify), as a distant or loaded Gateway would; the connection is
	// read on meanwhile. 0 or less: at once.
	AckDelay func(shard, n int) time.Duration
	// RecordHeartbeats keeps every heartbeat's arrival and the writing of
	// its ACK (Emulator.Heartbeats), to compare a client's ping with.
	RecordHeartbeats bool
	// AllowUnknownFields accepts unknown top-level fields in Identify and
	// Resume `d` instead of closing with 4001.
	AllowUnknownFields bool
	// SkipBucketOrder disables the bucket_out_of_order violation.
	SkipBucketOrder bool
	// TLS serves https/wss with a CA generated at start instead of http/ws.
	TLS bool
	// PublicHost overrides the host:port written into the gateway URLs
	// (default: the listener's address). A host without a port keeps the
	// listener's port. A host name (gateway.discord.gg) makes the emulator
	// check the Host header of every gateway handshake (KindWrongHost).
	PublicHost string
	// ResumeHost, if set, is the host[:port] of resume_gateway_url
	// (gateway-us-east1-b.discord.gg style), without a path, as Discord
	// sends it; handshakes whose Host header names it are resume
	// connections. Without a port it keeps the listener's port. Default:
	// the main host with the path /resume.
	ResumeHost string
	// ResumeUnavailable answers this many WebSocket handshakes on the
	// resume URL with HTTP 503 from the start (the resume_unavailable
	// fault sets the same count later).
	ResumeUnavailable int

	// Seed makes every synthetic payload shape (member names, IDs) and
	// every fragment boundary deterministic; the same Seed and options
	// give the same bytes.
	Seed uint64
	// ReadyUnavailableGuilds adds this many guilds of the shard to every
	// READY as unavailable (an outage, as Discord lists them); they never
	// get a GUILD_CREATE. About 45 bytes each: 4,600 make a 200 KiB READY.
	ReadyUnavailableGuilds int
	// GuildCreateBytes sizes the GUILD_CREATEs of every session: the k-th
	// GUILD_CREATE after READY has a `d` of exactly GuildCreateBytes[k]
	// bytes, filled with the guild's members, channels and then threads.
	// Beyond the list, or for a size below the minimal guild, `d` is the
	// small default guild. At most MaxGuildCreateBytes each.
	GuildCreateBytes []int
	// GuildMembers is the member count of every synthetic guild (default
	// 2: the bot and one user). Request Guild Members answers from them.
	GuildMembers int
	// MemberRequestWindow is the window of the all-members Request Guild
	// Members limit: one per guild per window (default 30 s, Discord's).
	MemberRequestWindow time.Duration
	// FragmentFrames, if > 0, sends every server message as a fragmented
	// WebSocket message: 1..FragmentFrames data frames cut at boundaries
	// drawn from Seed, then an empty final frame. 0 sends one frame per
	// message.
	FragmentFrames int
	// Logger receives structured logs (default: discard).
	Logger *slog.Logger
	// Now is the clock used for time stamps and windows (default time.Now).
	Now func() time.Time
}

// withDefaults returns o with every zero field replaced by its default, or an
// error naming the first invalid field.
func (o Options) withDefaults() (Options, error) {
	if o.Token == "" {
		o.Token = DefaultToken
	}
	if o.Shards == 0 {
		o.Shards = 1
	}
	if o.MaxConcurrency == 0 {
		o.MaxConcurrency = 1
	}
	if o.IdentifyWindow == 0 {
		o.IdentifyWindow = DefaultIdentifyWindow
	}
	if o.IdentifyRejectDelay == 0 {
		o.IdentifyRejectDelay = DefaultIdentifyRejectDelay
	}
	if o.IdentifyRejectDelay < 0 {
		o.IdentifyRejectDelay = 0
	}
	if o.SessionStarts == 0 {
		o.SessionStarts = DefaultSessionStarts
	}
	if o.BudgetPeriod == 0 {
		o.BudgetPeriod = DefaultBudgetPeriod
	}
	if o.HeartbeatInterval == 0 {
		o.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if o.HeartbeatGrace == 0 {
		o.HeartbeatGrace = o.HeartbeatInterval / 4
	}
	if o.Guilds == 0 && len(o.GuildIDs) == 0 {
		o.Guilds = DefaultGuilds
	}
	if o.ResumeTimeout == 0 {
		o.ResumeTimeout = DefaultResumeTimeout
	}
	if o.ReplayLimit == 0 {
		o.ReplayLimit = DefaultReplayLimit
	}
	if o.SendLimit == 0 {
		o.SendLimit = SendLimitEvents
	}
	if o.SendWindow == 0 {
		o.SendWindow = DefaultSendWindow
		if o.HeartbeatInterval < DefaultHeartbeatInterval {
			// Keep Discord's ratio of heartbeats to the send budget when a
			// test shortens the interval, or honest heartbeating alone
			// would exceed 120 events per 60 s.
			o.SendWindow = time.Duration(float64(DefaultSendWindow) *
				float64(o.HeartbeatInterval) / float64(DefaultHeartbeatInterval))
		}
	}
	if o.RESTMessageLimit == 0 {
		o.RESTMessageLimit = DefaultRESTMessageLimit
	}
	if o.RESTMessageWindow == 0 {
		o.RESTMessageWindow = DefaultRESTMessageWindow
	}
	if o.GuildMembers == 0 {
		o.GuildMembers = DefaultGuildMembers
	}
	if o.MemberRequestWindow == 0 {
		o.MemberRequestWindow = DefaultMemberRequestWindow
	}
	if o.ReconnectGrace == 0 {
		o.ReconnectGrace = DefaultReconnectGrace
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	switch {
	case o.Shards < 1:
		return o, fmt.Errorf("%w: shards %d < 1", ErrBadOptions, o.Shards)
	case o.MaxConcurrency < 1:
		return o, fmt.Errorf("%w: max_concurrency %d < 1", ErrBadOptions, o.MaxConcurrency)
	case o.ShardMultiple < 0:
		return o, fmt.Errorf("%w: shard multiple %d < 0", ErrBadOptions, o.ShardMultiple)
	case o.IdentifyWindow < 0:
		return o, fmt.Errorf("%w: identify window %v < 0", ErrBadOptions, o.IdentifyWindow)
	case o.SessionStarts < 1:
		return o, fmt.Errorf("%w: session starts %d < 1", ErrBadOptions, o.SessionStarts)
	case o.BudgetPeriod < 0:
		return o, fmt.Errorf("%w: budget period %v < 0", ErrBadOptions, o.BudgetPeriod)
	case o.HeartbeatInterval < time.Millisecond:
		return o, fmt.Errorf("%w: heartbeat interval %v < 1ms", ErrBadOptions, o.HeartbeatInterval)
	case o.HeartbeatGrace < 0:
		return o, fmt.Errorf("%w: heartbeat grace %v < 0", ErrBadOptions, o.HeartbeatGrace)
	case o.Guilds < 0:
		return o, fmt.Errorf("%w: guilds %d < 0", ErrBadOptions, o.Guilds)
	case o.PingEvery < 0 || o.RESTMessageLimit < 1 || o.RESTMessageWindow < time.Millisecond:
		return o, fmt.Errorf("%w: ping every %d (0 or more), REST message limit %d per %v (at least 1 per 1ms)", ErrBadOptions, o.PingEvery, o.RESTMessageLimit, o.RESTMessageWindow)
	case o.MessagesPerSecond < 0:
		return o, fmt.Errorf("%w: messages per second %v < 0", ErrBadOptions, o.MessagesPerSecond)
	case o.MessageBytes != 0 && (o.MessageBytes < MinMessageBytes || o.MessageBytes > MaxMessageBytes):
		return o, fmt.Errorf("%w: message bytes %d: 0 (unpadded) or %d..%d", ErrBadOptions, o.MessageBytes, MinMessageBytes, MaxMessageBytes)
	case o.ResumeTimeout < 0 || o.ReconnectGrace < 0 || o.SendWindow < 0:
		return o, fmt.Errorf("%w: negative duration", ErrBadOptions)
	case o.ReplayLimit < 1 || o.SendLimit < 1:
		return o, fmt.Errorf("%w: replay limit and send limit must be >= 1", ErrBadOptions)
	case o.ReadyUnavailableGuilds < 0 || o.ReadyUnavailableGuilds > MaxReadyUnavailableGuilds:
		return o, fmt.Errorf("%w: ready unavailable guilds %d outside 0..%d", ErrBadOptions, o.ReadyUnavailableGuilds, MaxReadyUnavailableGuilds)
	case o.GuildMembers < DefaultGuildMembers || o.GuildMembers > MaxGuildMembers:
		return o, fmt.Errorf("%w: guild members %d outside %d..%d", ErrBadOptions, o.GuildMembers, DefaultGuildMembers, MaxGuildMembers)
	case o.MemberRequestWindow < 0:
		return o, fmt.Errorf("%w: member request window %v < 0", ErrBadOptions, o.MemberRequestWindow)
	case o.FragmentFrames < 0:
		return o, fmt.Errorf("%w: fragment frames %d < 0", ErrBadOptions, o.FragmentFrames)
	case o.ResumeUnavailable < 0:
		return o, fmt.Errorf("%w: resume unavailable %d < 0", ErrBadOptions, o.ResumeUnavailable)
	case o.ResumeHost != "" && o.PublicHost != "" && sameHostName(o.ResumeHost, o.PublicHost):
		return o, fmt.Errorf("%w: resume host %q has the public host's name %q", ErrBadOptions, o.ResumeHost, o.PublicHost)
	case o.ApprovedIntents&^PrivilegedIntents != 0:
		return o, fmt.Errorf("%w: approved intents %#x include non-privileged bits", ErrBadOptions, o.ApprovedIntents)
	}
	for k, n := range o.GuildCreateBytes {
		if n < 0 || n > MaxGuildCreateBytes {
			return o, fmt.Errorf("%w: guild create bytes[%d] %d outside 0..%d", ErrBadOptions, k, n, MaxGuildCreateBytes)
		}
	}
	o.GuildCreateBytes = append([]int(nil), o.GuildCreateBytes...)
	return o, nil
}

// guildIDs returns the bot's guild snowflakes: GuildIDs if set, otherwise
// Guilds synthetic IDs whose timestamps are consecutive milliseconds, so they
// spread evenly over any shard count.
func (o Options) guildIDs() []uint64 {
	if len(o.GuildIDs) > 0 {
		return append([]uint64(nil), o.GuildIDs...)
	}
	ids := make([]uint64, o.Guilds)
	const base = 300_000_000_000 // ms after the Discord epoch (2024)
	for i := range ids {
		ids[i] = uint64(base+i)<<22 | uint64(i&0xfff)
	}
	return ids
}
