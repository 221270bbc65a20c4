package dpxe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
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
	// Timeout bounds a send, its retries included, when ctx has no
	// deadline (default 5 s).
	Timeout time.Duration
	// NoRetry returns every refusal at once. By default a command that
	// was refused and not sent because no node runs the shard's session
	// now (not_owner, no node subscribed, not_ready) is sent again after a
	// short backoff until ctx ends: the shard is moving or (re)starting.
	NoRetry bool
	// RetryRateLimited also sends a rate_limited command again after its
	// retry-after, when that comes before ctx ends (off by default: a
	// worker that floods a shard usually wants to know).
	RetryRateLimited bool
	// OnRetry, when set, is called with each refusal the Commander is
	// about to send again (for logs and metrics), from the sending
	// goroutine; it must not block.
	OnRetry func(err error)
}

// The backoff between attempts of a refused command: from retryMin,
// doubling, at most retryMax, each wait cut by up to a quarter at random
// so that many workers refused together do not come back together.
const (
	retryMin = 20 * time.Millisecond
	retryMax = 500 * time.Millisecond
)

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
//
// A refusal that says no node runs the shard's session now (not_owner
// from a node that let the shard go, no node subscribed to the shard's
// subject, not_ready from a node still starting or resuming it) is sent
// again with a short backoff until the owner answers or ctx ends (unless
// CommandConfig.NoRetry): a refused command was never sent, so sending it
// again cannot send it twice, and a command sent while its shard moves
// reaches the new owner. When ctx ends first, the error wraps both the
// last refusal (errors.As gives the *CommandError) and ctx's error. A
// request that got no answer at all (ctx ended while waiting) is never
// sent again: the node may have sent it.
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
	var last error // the last refusal retried
	backoff := retryMin
	for attempt := 1; ; attempt++ {
		err := c.request(ctx, shard, subj, body)
		wait, retry := c.retryWait(ctx, err, backoff)
		if !retry {
			if last != nil && err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
				return fmt.Errorf("command for shard %d: no answer after %d refusals (last: %w): %w", shard, attempt-1, last, err)
			}
			return err
		}
		if c.cfg.OnRetry != nil {
			c.cfg.OnRetry(err)
		}
		last = err
		backoff = min(2*backoff, retryMax)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("command for shard %d: not sent: %d attempts refused until the context ended (last: %w): %w", shard, attempt, last, ctx.Err())
		case <-t.C:
		}
	}
}

// request sends one attempt and returns nil for ok, a *CommandError for
// a refusal, or another error.
func (c *Commander) request(ctx context.Context, shard uint32, subj string, body []byte) error {
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

// retryWait says whether err, the answer to an attempt, is a refusal to
// retry, and how long to wait first: backoff (cut by up to a quarter) for
// not_owner and not_ready, the retry-after for rate_limited when
// RetryRateLimited is set and it ends before ctx does.
func (c *Commander) retryWait(ctx context.Context, err error, backoff time.Duration) (time.Duration, bool) {
	var ce *CommandError
	if c.cfg.NoRetry || !errors.As(err, &ce) {
		return 0, false
	}
	switch ce.Code {
	case events.CodeNotOwner, events.CodeNotReady:
		return backoff - rand.N(backoff/4+1), true
	case events.CodeRateLimited:
		if !c.cfg.RetryRateLimited {
			return 0, false
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= ce.RetryAfter {
			return 0, false // no room before ctx ends: say so now
		}
		return max(ce.RetryAfter, retryMin), true
	}
	return 0, false
}
