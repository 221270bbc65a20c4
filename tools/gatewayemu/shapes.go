package gatewayemu

import (
	"encoding/json"
	"net"
	"strconv"
	"strings"
	"time"
)

// Payload shapes of a real bot's Gateway (research tls-and-real-gateway.md
// §5.2): READY listing thousands of unavailable guilds, GUILD_CREATEs of
// kilobytes to megabytes, member lists. Everything here is a pure function
// of the guild, the index and Options.Seed, so a test can rebuild what the
// emulator sent.

// Synthetic identities of the generated payloads.
const (
	// memberIDBase is the snowflake timestamp (ms after the Discord epoch)
	// of the first synthetic member; members count up from it.
	memberIDBase = 310_000_000_000
	// outageIDBase is the snowflake timestamp of the first guild that
	// READY lists as unavailable (Options.ReadyUnavailableGuilds).
	outageIDBase = 320_000_000_000
	// channelsPerGuild is Discord's cap of channels in a guild; a sized
	// GUILD_CREATE lists at most this many before it fills with threads.
	channelsPerGuild = 500
)

// memberNames are the username stems of synthetic members; a member's
// username is a stem, a dash and its index, so a query by prefix has
// predictable answers.
var memberNames = [...]string{
	"alder", "birch", "cedar", "dogwood", "elm", "fir", "ginkgo", "hazel",
	"ivy", "juniper", "kapok", "larch", "maple", "nutmeg", "oak", "pine",
}

// mix64 is splitmix64's finaliser: a well-spread 64-bit hash.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// memberUser returns the user ID and username of member i of guild g.
// Member 0 is the bot and member 1 the author of the synthetic messages.
func (o *Options) memberUser(g uint64, i int) (uint64, string) {
	switch i {
	case 0:
		return applicationID, botUsername
	case 1:
		return authorID, "someone"
	}
	h := mix64(o.Seed ^ mix64(g) ^ uint64(i))
	id := uint64(memberIDBase+i)<<22 | h&0x3fffff
	return id, memberNames[h>>60] + "-" + strconv.Itoa(i)
}

// appendMember appends the guild member object of member i of guild g.
func (o *Options) appendMember(b []byte, g uint64, i int, joined string) []byte {
	id, name := o.memberUser(g, i)
	b = append(b, `{"user":{"id":"`...)
	b = strconv.AppendUint(b, id, 10)
	b = append(b, `","username":"`...)
	b = append(b, name...)
	b = append(b, `","discriminator":"0","global_name":null,"avatar":null,"bot":`...)
	b = strconv.AppendBool(b, i == 0)
	b = append(b, `},"nick":null,"avatar":null,"roles":[],"joined_at":"`...)
	b = append(b, joined...)
	b = append(b, `","premium_since":null,"deaf":false,"mute":false,"flags":0,"pending":false}`...)
	return b
}

// appendChannel appends text channel k of guild g (k from 1; channel 0 is
// "general", the ID g+1 the synthetic messages use).
func appendChannel(b []byte, g uint64, k int) []byte {
	b = append(b, `{"id":"`...)
	b = strconv.AppendUint(b, g+uint64(k)+1, 10)
	b = append(b, `","type":0,"name":"channel-`...)
	b = strconv.AppendInt(b, int64(k), 10)
	b = append(b, `","position":`...)
	b = strconv.AppendInt(b, int64(k), 10)
	b = append(b, `,"guild_id":"`...)
	b = strconv.AppendUint(b, g, 10)
	b = append(b, `","topic":null,"nsfw":false,"last_message_id":null,"rate_limit_per_user":0,"parent_id":null,"permission_overwrites":[]}`...)
	return b
}

// appendThread appends active thread k of guild g, a child of "general".
func appendThread(b []byte, g uint64, k int, joined string) []byte {
	b = append(b, `{"id":"`...)
	b = strconv.AppendUint(b, g+channelsPerGuild+uint64(k)+1, 10)
	b = append(b, `","type":11,"guild_id":"`...)
	b = strconv.AppendUint(b, g, 10)
	b = append(b, `","parent_id":"`...)
	b = strconv.AppendUint(b, g+1, 10)
	b = append(b, `","owner_id":"`...)
	b = strconv.AppendUint(b, authorID, 10)
	b = append(b, `","name":"thread-`...)
	b = strconv.AppendInt(b, int64(k), 10)
	b = append(b, `","last_message_id":null,"message_count":0,"member_count":1,"rate_limit_per_user":0,"flags":0,"total_message_sent":0,"thread_metadata":{"archived":false,"auto_archive_duration":1440,"archive_timestamp":"`...)
	b = append(b, joined...)
	b = append(b, `","locked":false}}`...)
	return b
}

// sizedGuildCreate builds the `d` of a GUILD_CREATE for guild g of exactly
// size bytes: the fixed fields of the small guild, then as many of the
// guild's members as fit, then channels (up to Discord's 500), then
// threads, and the rest as the padding of "description". A size below what
// the fixed fields need gives the smallest guild (no padding).
func (o *Options) sizedGuildCreate(g uint64, joinedAt time.Time, size int) json.RawMessage {
	joined := joinedAt.UTC().Format(time.RFC3339Nano)
	id := snowflake(g)
	b := make([]byte, 0, size+256)
	b = append(b, `{"id":"`+id+`","name":"guild `+id+`","icon":null,"owner_id":"`+snowflake(authorID)+`","unavailable":false,"large":`...)
	b = strconv.AppendBool(b, o.GuildMembers > 50) // Identify's default large_threshold
	b = append(b, `,"member_count":`...)
	b = strconv.AppendInt(b, int64(o.GuildMembers), 10)
	b = append(b, `,"joined_at":"`+joined+`","features":[],"roles":[{"id":"`+id+`","name":"@everyone","permissions":"0","position":0,"color":0,"hoist":false,"managed":false,"mentionable":false}],"emojis":[],"stickers":[],"presences":[],"voice_states":[],"stage_instances":[],"guild_scheduled_events":[],"soundboard_sounds":[]`...)
	// What must follow the elements of each section: the rest of the
	// sections when empty (the "general" channel always), then
	// `],"description":""}` at least.
	general := `{"id":"` + snowflake(g+1) + `","type":0,"name":"general","position":0,"guild_id":"` + id + `","permission_overwrites":[]}`
	const tail = len(`],"description":""}`)
	type section struct {
		name  string
		limit int
		after int // bytes that must follow this section's elements
		elem  func([]byte, int) []byte
	}
	sections := []section{
		{"members", o.GuildMembers, len(`],"channels":[`+general+`],"threads":[`) + tail,
			func(b []byte, i int) []byte { return o.appendMember(b, g, i, joined) }},
		{"channels", channelsPerGuild, len(`],"threads":[`) + tail,
			func(b []byte, k int) []byte { return appendChannel(b, g, k) }},
		{"threads", -1, tail,
			func(b []byte, k int) []byte { return appendThread(b, g, k, joined) }},
	}
	var scratch []byte
	for _, sec := range sections {
		b = append(b, `,"`+sec.name+`":[`...)
		first := 0
		if sec.name == "channels" {
			b = append(b, general...) // a guild always has "general"
			first = 1
		}
		for k := first; sec.limit < 0 || k < sec.limit; k++ {
			scratch = sec.elem(scratch[:0], k)
			sep := 0
			if b[len(b)-1] != '[' {
				sep = 1
			}
			if len(b)+sep+len(scratch)+sec.after > size {
				break
			}
			if sep == 1 {
				b = append(b, ',')
			}
			b = append(b, scratch...)
		}
		b = append(b, ']')
	}
	b = append(b, `,"description":`...)
	switch pad := size - len(b) - 1; {
	case pad >= 2:
		b = append(b, '"')
		for i := 0; i < pad-2; i++ {
			b = append(b, "abcdefghijklmnopqrstuvwxyz"[i%26])
		}
		b = append(b, '"')
	default:
		b = append(b, "null"...)
	}
	return append(b, '}')
}

// outageGuilds returns n guild IDs that route to shard id of num and that
// the bot's guild list does not hold: the guilds READY lists as unavailable.
func outageGuilds(n, id, num int) []uint64 {
	out := make([]uint64, n)
	base := uint64(outageIDBase) / uint64(num) * uint64(num)
	for k := range out {
		out[k] = (base + uint64(k)*uint64(num) + uint64(id)) << 22
	}
	return out
}

// sameHostName reports whether two host[:port] strings name the same host.
func sameHostName(a, b string) bool { return strings.EqualFold(hostName(a), hostName(b)) }

// hostName returns the host of a host[:port], without brackets.
func hostName(hp string) string {
	if h, _, err := net.SplitHostPort(hp); err == nil {
		return h
	}
	return strings.Trim(hp, "[]")
}

// isHostName reports whether hp names a host by name, not by an IP literal.
func isHostName(hp string) bool {
	h := hostName(hp)
	return h != "" && net.ParseIP(h) == nil
}
