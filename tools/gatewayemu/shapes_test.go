package gatewayemu

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// guildCreateShape is what the tests read back from a sized GUILD_CREATE.
type guildCreateShape struct {
	ID          string `json:"id"`
	Large       bool   `json:"large"`
	MemberCount int    `json:"member_count"`
	Members     []struct {
		User struct {
			ID       string `json:"id"`
			Username string `json:"username"`
		} `json:"user"`
	} `json:"members"`
	Channels    []struct{ ID, GuildID string } `json:"channels"`
	Threads     []struct{ ID string }          `json:"threads"`
	Description *string                        `json:"description"`
}

// TestSizedGuildCreate checks the generator on its own: `d` is valid JSON
// of exactly the asked size (the smallest guild below its minimum), lists
// members before channels before threads, never more members than the
// guild has nor more than 500 channels, and is a function of the seed.
func TestSizedGuildCreate(t *testing.T) {
	t.Parallel()
	joined := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	const g = uint64(300_000_000_000) << 22
	minimal := len(func() []byte { o := Options{GuildMembers: 2}; return o.sizedGuildCreate(g, joined, 1) }())
	for _, tc := range []struct {
		members, size int
	}{
		{2, 1}, {2, minimal}, {2, minimal + 1}, {2, minimal + 2}, {2, minimal + 3}, {2, minimal + 4}, {2, minimal + 5},
		{2, 4 << 10}, {2, 1 << 20}, {100, 64 << 10}, {60_000, 8 << 20}, {2, 8 << 20},
	} {
		t.Run(fmt.Sprintf("members=%d/size=%d", tc.members, tc.size), func(t *testing.T) {
			o := Options{GuildMembers: tc.members, Seed: 42}
			d := o.sizedGuildCreate(g, joined, tc.size)
			want := max(tc.size, minimal)
			if len(d) != want {
				t.Fatalf("d is %d bytes, want %d", len(d), want)
			}
			var s guildCreateShape
			if err := json.Unmarshal(d, &s); err != nil {
				t.Fatalf("d is not valid JSON: %v (%.200s)", err, d)
			}
			if s.MemberCount != tc.members || s.Large != (tc.members > 50) || len(s.Members) > tc.members {
				t.Fatalf("member_count %d large %v members %d, guild has %d", s.MemberCount, s.Large, len(s.Members), tc.members)
			}
			if len(s.Channels) < 1 || len(s.Channels) > channelsPerGuild {
				t.Fatalf("%d channels", len(s.Channels))
			}
			if len(s.Threads) > 0 && (len(s.Members) < tc.members || len(s.Channels) < channelsPerGuild) {
				t.Fatalf("threads before members (%d/%d) and channels (%d) ran out", len(s.Members), tc.members, len(s.Channels))
			}
			ids := map[string]bool{}
			for _, m := range s.Members {
				if ids[m.User.ID] {
					t.Fatalf("member ID %s twice", m.User.ID)
				}
				ids[m.User.ID] = true
			}
			if tc.size >= 1<<20 && len(s.Members)+len(s.Channels)+len(s.Threads) < tc.size/400 {
				t.Fatalf("%d bytes hold only %d objects: mostly padding", tc.size, len(s.Members)+len(s.Channels)+len(s.Threads))
			}
			if again := o.sizedGuildCreate(g, joined, tc.size); !bytes.Equal(d, again) {
				t.Fatal("same seed, different bytes")
			}
			if tc.members > 2 {
				o2 := o
				o2.Seed++
				if bytes.Equal(d, o2.sizedGuildCreate(g, joined, tc.size)) {
					t.Fatal("another seed, same bytes")
				}
			}
		})
	}
}

// TestOutageGuildsRoute checks that READY's extra unavailable guilds belong
// to the shard by Discord's formula and are not among the bot's guilds.
func TestOutageGuildsRoute(t *testing.T) {
	t.Parallel()
	bot := map[uint64]bool{}
	for _, g := range (Options{Guilds: 64}).guildIDs() {
		bot[g] = true
	}
	for _, num := range []int{1, 3, 16} {
		for id := 0; id < num; id++ {
			seen := map[uint64]bool{}
			for _, g := range outageGuilds(100, id, num) {
				if ShardForGuild(g, num) != id || bot[g] || seen[g] {
					t.Fatalf("outage guild %d: shard %d of %d (want %d), bot's %v, repeated %v", g, ShardForGuild(g, num), num, id, bot[g], seen[g])
				}
				seen[g] = true
			}
		}
	}
}

// TestLargeMessagesOnTheWire runs a shard whose READY is over 200 KiB and
// whose first GUILD_CREATE is 8 MiB, with and without zlib-stream, whole
// and fragmented, against the raw RFC 6455 client: every message arrives
// as one Gateway payload of the promised size, fragments follow RFC 6455
// (opcode 1/2 then 0, FIN on the last), zlib-stream messages end in
// 00 00 ff ff and inflate with one context, the connection's record
// matches what the client counted, and heartbeats still work after.
func TestLargeMessagesOnTheWire(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		zlib  bool
		frags int
	}{
		{"plain", false, 0},
		{"fragmented", false, 16},
		{"zlib", true, 0},
		{"zlib-fragmented", true, 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := fastOptions()
			o.Guilds = 2
			o.ReadyUnavailableGuilds = 4600
			o.GuildCreateBytes = []int{8 << 20, 3000}
			o.GuildMembers = 40_000
			o.FragmentFrames = tc.frags
			o.Seed = 99
			emu := startEmu(t, o)
			q := "/?v=10&encoding=json"
			if tc.zlib {
				q += "&compress=zlib-stream"
			}
			addr := strings.TrimPrefix(emu.URL(), "ws://")
			c, resp := rawDial(t, nil, addr, addr, q)
			if resp.StatusCode != 101 {
				t.Fatalf("handshake status %d", resp.StatusCode)
			}
			var frames, payload, wire, multi, dispatches, dispatchBytes int
			read := func() frame {
				t.Helper()
				m, f := c.expect()
				frames += len(m.frames)
				payload += len(m.json)
				wire += len(m.payload)
				if f.Op == OpDispatch {
					dispatches++
					dispatchBytes += len(m.json)
				}
				if len(m.frames) > 2 {
					multi++
				}
				if tc.frags == 0 && len(m.frames) != 1 {
					t.Fatalf("unfragmented mode sent a message in %d frames", len(m.frames))
				}
				if tc.frags > 0 && (len(m.frames) < 2 || len(m.frames) > tc.frags+1 || len(m.frames[len(m.frames)-1].payload) != 0) {
					t.Fatalf("message in %d frames (last %d bytes), want 2..%d ending in an empty FIN frame",
						len(m.frames), len(m.frames[len(m.frames)-1].payload), tc.frags+1)
				}
				return f
			}
			if f := read(); f.Op != OpHello {
				t.Fatalf("first payload %v", f)
			}
			c.send(OpIdentify, identifyPayload(emu, 0, 1))
			f := read()
			var r ready
			if err := json.Unmarshal(f.D, &r); err != nil || f.T == nil || *f.T != "READY" {
				t.Fatalf("READY: %v %v", f, err)
			}
			if len(r.Guilds) != 2+4600 || len(f.D) < 200<<10 {
				t.Fatalf("READY lists %d guilds in %d bytes", len(r.Guilds), len(f.D))
			}
			for k, want := range o.GuildCreateBytes {
				f := read()
				if f.T == nil || *f.T != "GUILD_CREATE" || len(f.D) != want {
					t.Fatalf("GUILD_CREATE %d: %v of %d bytes, want %d", k, f, len(f.D), want)
				}
			}
			c.send(OpHeartbeat, 3)
			if f := read(); f.Op != OpHeartbeatACK {
				t.Fatalf("after the large messages: %v, want ACK", f)
			}
			if tc.frags > 0 && multi == 0 {
				t.Fatal("no message was cut into more than one data frame")
			}
			st := awaitState(t, emu, "the ACK recorded", func(s State) bool {
				return len(s.Connections) == 1 && s.Connections[0].Messages == 5
			}).Connections[0]
			if st.Frames != uint64(frames) || st.PayloadBytes != uint64(payload) || st.WireBytes != uint64(wire) || st.ZlibStream != tc.zlib ||
				st.Dispatches != uint64(dispatches) || st.DispatchBytes != uint64(dispatchBytes) || dispatches != 3 {
				t.Fatalf("record %+v; client counted %d frames, %d payload bytes, %d wire bytes, %d dispatches of %d bytes",
					st, frames, payload, wire, dispatches, dispatchBytes)
			}
			if tc.zlib && st.WireBytes*4 > st.PayloadBytes {
				t.Fatalf("zlib-stream sent %d bytes for %d", st.WireBytes, st.PayloadBytes)
			}
			if st.ClientEvents != 2 || st.MaxEventsInWindow != 2 || st.Shard == nil || *st.Shard != [2]int{0, 1} {
				t.Fatalf("client side of the record: %+v", st)
			}
			noViolations(t, emu)
		})
	}
}

// TestFragmentCuts checks the boundaries of fragmented messages: ascending,
// distinct and strictly inside the message, at most max-1 of them, every
// count from 0 to max-1 drawn, the same for the same seed and connection,
// different for another seed.
func TestFragmentCuts(t *testing.T) {
	t.Parallel()
	const max = 6
	draw := func(seed uint64) string {
		c := &conn{id: 1, fragState: mix64(seed ^ mix64(1))}
		var out strings.Builder
		counts := map[int]bool{}
		for size := 1; size <= 2000; size++ {
			cuts := c.fragmentCuts(size, max)
			if len(cuts) > max-1 || len(cuts) > size-1 {
				t.Fatalf("size %d: %d cuts", size, len(cuts))
			}
			for i, cut := range cuts {
				if cut < 1 || cut > size-1 || i > 0 && cut <= cuts[i-1] {
					t.Fatalf("size %d: cuts %v", size, cuts)
				}
			}
			counts[len(cuts)] = true
			fmt.Fprint(&out, cuts)
		}
		if len(counts) != max {
			t.Fatalf("seed %d drew only these cut counts: %v", seed, counts)
		}
		return out.String()
	}
	a, b, other := draw(5), draw(5), draw(6)
	if a != b {
		t.Fatal("seed 5 cut differently twice")
	}
	if a == other {
		t.Fatal("seeds 5 and 6 cut alike")
	}
}

// TestCorruptZlibFault checks the corrupt_zlib fault: on a zlib-stream
// connection the next message still ends in 00 00 ff ff but does not
// inflate; the session stays resumable; a connection without zlib-stream
// is no target.
func TestCorruptZlibFault(t *testing.T) {
	t.Parallel()
	emu := startEmu(t, fastOptions())
	plain := connect(t, emu)
	plain.identify(emu, 0, 1)
	if _, err := emu.Inject(Fault{Kind: FaultCorruptZlib}); !errors.Is(err, ErrNoTarget) {
		t.Fatalf("corrupt_zlib without zlib-stream: %v", err)
	}
	plain.ws.CloseNow()
	addr := strings.TrimPrefix(emu.URL(), "ws://")
	c, _ := rawDial(t, nil, addr, addr, "/?v=10&encoding=json&compress=zlib-stream")
	c.expect() // Hello
	c.send(OpIdentify, identifyPayload(emu, 0, 2))
	for range 3 { // READY and the shard's GUILD_CREATEs
		c.expect()
	}
	if n, err := emu.Inject(Fault{Kind: FaultCorruptZlib, Shard: intp(0)}); n != 1 || err != nil {
		t.Fatalf("corrupt_zlib: %d %v", n, err)
	}
	m, err := c.next()
	if err == nil || !strings.Contains(err.Error(), "inflate") || len(m.payload) != len(corruptDeflate) {
		t.Fatalf("after corrupt_zlib: %v (message of %d bytes)", err, len(m.payload))
	}
	c.conn.Close()
	awaitState(t, emu, "the session detached", func(s State) bool {
		for _, sh := range s.Shards {
			if sh.Shard == [2]int{0, 2} {
				return sh.Sessions[0].State == SessionDetached
			}
		}
		return false
	})
}
