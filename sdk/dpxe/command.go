package dpxe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/events"
)

// Gateway commands a worker may send (docs/events.md, "Commands").
const (
	OpPresenceUpdate      = events.OpPresenceUpdate
	OpVoiceStateUpdate    = events.OpVoiceStateUpdate
	OpRequestGuildMembers = events.OpRequestGuildMembers
)

// CommandError is a refused command: Code is one of the events.Code*
// error codes (rate_limited, not_ready, not_owner, bad_op, too_large,
// bad_json, wrong_shard), RetryAfter is set with rate_limited, and
// Retryable says whether the same command may succeed later.
type CommandError = events.CommandError

// CommandConfig configures a Commander.
type CommandConfig struct {
	App string // the app name in subjects (dpxe serve --events-app)
	// Shards is the bot's shard count, which routes a guild to its shard:
	// (guild_id >> 22) % Shards, as Discord does.
	Shards uint32
	// Timeout bounds one request when ctx has no earlier deadline
	// (default 5 s).
	Timeout time.Duration
}

// Commander sends Gateway commands to the shards that hold a guild.
// Safe for concurrent use.
type Commander struct {
	nc  *nats.Conn
	cfg CommandConfig
}

// NewCommander sends through nc (which it does not close).
func NewCommander(nc *nats.Conn, cfg CommandConfig) (*Commander, error) {
	if err := events.ValidateApp(cfg.App); err != nil {
		return nil, fmt.Errorf("%w: app: %v", ErrBadConfig, err)
	}
	if cfg.Shards == 0 {
		return nil, fmt.Errorf("%w: shards: the bot's shard count, at least 1", ErrBadConfig)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.Timeout < 10*time.Millisecond {
		return nil, fmt.Errorf("%w: timeout %v: at least 10ms", ErrBadConfig, cfg.Timeout)
	}
	return &Commander{nc: nc, cfg: cfg}, nil
}

// ShardOf is the shard that holds guildID: (guildID >> 22) % Shards.
func (c *Commander) ShardOf(guildID uint64) uint32 {
	return appliance.ShardForGuild(guildID, c.cfg.Shards)
}

// SendCommand sends op with payload d (marshalled as the frame's "d") on
// the shard that holds guildID, and returns once the node sent it to
// Discord (nil) or refused it (a *CommandError). Ops 4 and 8 name the
// guild in d.guild_id too; the node checks that it routes to its shard.
func (c *Commander) SendCommand(ctx context.Context, guildID uint64, op int, d any) error {
	return c.SendToShard(ctx, c.ShardOf(guildID), op, d)
}

// SendToShard sends op with payload d on shard (presence updates, op 3,
// are per connection: send one to each shard whose presence should
// change).
func (c *Commander) SendToShard(ctx context.Context, shard uint32, op int, d any) error {
	refuse := func(code, reason string) error {
		return &CommandError{Code: code, Reason: reason + " (refused before sending)", Shard: shard}
	}
	if op != OpPresenceUpdate && op != OpVoiceStateUpdate && op != OpRequestGuildMembers {
		return refuse(events.CodeBadOp, fmt.Sprintf("op %d: only 3, 4 and 8", op))
	}
	if shard >= c.cfg.Shards {
		return fmt.Errorf("%w: shard %d of %d", ErrBadConfig, shard, c.cfg.Shards)
	}
	body, err := json.Marshal(struct {
		Op int `json:"op"`
		D  any `json:"d"`
	}{op, d})
	if err != nil {
		return refuse(events.CodeBadJSON, err.Error())
	}
	if len(body) > events.MaxCommandBytes {
		return refuse(events.CodeTooLarge, fmt.Sprintf("%d bytes, at most %d", len(body), events.MaxCommandBytes))
	}
	subj, err := events.CommandSubject(c.cfg.App, shard)
	if err != nil {
		return err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.Timeout)
		defer cancel()
	}
	m, err := c.nc.RequestWithContext(ctx, subj, body)
	if errors.Is(err, nats.ErrNoResponders) {
		return &CommandError{Code: events.CodeNotOwner, Reason: "no node holds the shard now", Shard: shard}
	}
	if err != nil {
		return fmt.Errorf("command for shard %d: %w", shard, err)
	}
	var r events.CommandReply
	if err := json.Unmarshal(m.Data, &r); err != nil || r.Status == "" {
		return fmt.Errorf("command for shard %d: the node's reply is not a command reply: %.100q", shard, m.Data)
	}
	return r.Err()
}
