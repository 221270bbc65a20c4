package appliance

import (
	"errors"
	"fmt"
)

// Guild routing (seed 000, DESIGN §5): Discord sends a guild's events to
// shard (guild_id >> 22) % num_shards, computed on the unsigned 64-bit
// snowflake. Events without a guild go to shard 0. The kernel's routing
// routine is tested against ShardForGuild and ParseGuildID.

// snowflakeTimestampShift is the number of low snowflake bits below the
// timestamp (worker, process and increment fields), per Discord's
// snowflake layout.
const snowflakeTimestampShift = 22

// maxSnowflakeDigits is the length of the largest uint64,
// 18446744073709551615.
const maxSnowflakeDigits = 20

// Errors of ParseGuildID.
var (
	// ErrGuildIDEmpty is returned for an empty guild ID.
	ErrGuildIDEmpty = errors.New("guild ID is empty")
	// ErrGuildIDSyntax is returned when a guild ID has a byte other than
	// a decimal digit, or a leading zero.
	ErrGuildIDSyntax = errors.New("guild ID is not an unsigned decimal number")
	// ErrGuildIDRange is returned for a guild ID above 2^64-1.
	ErrGuildIDRange = errors.New("guild ID is larger than 18446744073709551615")
)

// GuildIDError wraps one of the ParseGuildID errors with the offending byte
// position, when there is one.
type GuildIDError struct {
	Pos int   // byte offset at fault, -1 when the whole value is
	Err error // ErrGuildIDEmpty, ErrGuildIDSyntax or ErrGuildIDRange
}

func (e *GuildIDError) Error() string {
	if e.Pos >= 0 {
		return fmt.Sprintf("%v (byte %d)", e.Err, e.Pos)
	}
	return e.Err.Error()
}

func (e *GuildIDError) Unwrap() error { return e.Err }

// ParseGuildID parses a Discord snowflake as it appears in JSON strings and
// URLs: 1 to 20 ASCII decimal digits, no sign, no white space, no leading
// zero (except "0" itself), value at most 2^64-1. Anything else is an error
// wrapping ErrGuildIDEmpty, ErrGuildIDSyntax or ErrGuildIDRange.
func ParseGuildID(s string) (uint64, error) {
	if s == "" {
		return 0, &GuildIDError{Pos: -1, Err: ErrGuildIDEmpty}
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, &GuildIDError{Pos: i, Err: ErrGuildIDSyntax}
		}
	}
	if len(s) > 1 && s[0] == '0' {
		return 0, &GuildIDError{Pos: 0, Err: ErrGuildIDSyntax}
	}
	if len(s) > maxSnowflakeDigits {
		return 0, &GuildIDError{Pos: -1, Err: ErrGuildIDRange}
	}
	var n uint64
	for i := 0; i < len(s); i++ {
		d := uint64(s[i] - '0')
		if n > (1<<64-1-d)/10 {
			return 0, &GuildIDError{Pos: -1, Err: ErrGuildIDRange}
		}
		n = n*10 + d
	}
	return n, nil
}

// ShardForGuild returns the shard that receives guildID's events:
// (guildID >> 22) % totalShards on uint64. A totalShards of 0 is treated
// as 1, so the result is always a valid shard.
func ShardForGuild(guildID uint64, totalShards uint32) uint32 {
	return uint32((guildID >> snowflakeTimestampShift) % uint64(max(totalShards, 1)))
}
