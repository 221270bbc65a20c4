package events

import (
	"encoding/binary"
	"encoding/json"
	"math/rand"
	"strings"

	"github.com/discord-pxe/dpxe/appliance"
)

// The kernel's mirror of CheckCommand (kernel/node/natscmd.inc, cmd_check)
// is compared with it case by case: tools/e2e's TestKernelCommandCheck
// boots the kernel with selftest=1 and a module section CommandModuleTag
// holding CommandSection(CommandCorpus(seed)); the kernel prints one line
// per case,
//
//	cmdck case N <the reply JSON>
//
// and every line must equal CommandLine of the case: the JSON a node
// publishes as the reply, byte for byte.

// CommandModuleTag tags the self-test module's command cases.
const CommandModuleTag = "CMDCK001"

// CommandCase is one body and the shard as the node sees it.
type CommandCase struct {
	Shard, Total uint32
	Owned, Ready bool
	HasLog       bool     // a connection (a send log) exists
	Log          []uint64 // TSCs noted in the send log, in order
	NowTSC       uint64
	CyclesPerMS  uint64
	HeartbeatMS  uint32
	Node         string // [A-Za-z0-9._-], at most 63 bytes
	Body         []byte
}

// view is c as CheckCommand takes it.
func (c CommandCase) view() ShardView {
	v := ShardView{Shard: c.Shard, TotalShards: c.Total, Owned: c.Owned, Ready: c.Ready, Node: c.Node,
		NowTSC: c.NowTSC, CyclesPerMS: c.CyclesPerMS, HeartbeatMS: c.HeartbeatMS}
	if c.HasLog {
		v.Log = &appliance.SendLog{}
		for _, t := range c.Log {
			v.Log.Note(t)
		}
	}
	return v
}

// CommandReplyJSON is the reply a node publishes for body: CheckCommand's
// reply, JSON-encoded as ServeCommands encodes it.
func CommandReplyJSON(body []byte, v ShardView) []byte {
	_, r := CheckCommand(body, v)
	b, _ := json.Marshal(r)
	return b
}

// CommandLine is what the kernel must print for c (after "cmdck case N ").
func CommandLine(c CommandCase) string { return string(CommandReplyJSON(c.Body, c.view())) }

// CommandSection encodes cases for the module: u32 count, then per case
// u32 shard, u32 total, u32 flags (1 owned, 2 ready, 4 has a log), u32
// heartbeat ms, u64 cycles per ms, u64 now, u32 log entries, u32 node
// length, the node, u64 per log entry, u32 body length, the body; all
// little-endian.
func CommandSection(cases []CommandCase) []byte {
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(cases)))
	for _, c := range cases {
		flags := uint32(0)
		if c.Owned {
			flags |= 1
		}
		if c.Ready {
			flags |= 2
		}
		if c.HasLog {
			flags |= 4
		}
		for _, x := range []uint32{c.Shard, c.Total, flags, c.HeartbeatMS} {
			b = binary.LittleEndian.AppendUint32(b, x)
		}
		b = binary.LittleEndian.AppendUint64(b, c.CyclesPerMS)
		b = binary.LittleEndian.AppendUint64(b, c.NowTSC)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(c.Log)))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(c.Node)))
		b = append(b, c.Node...)
		for _, t := range c.Log {
			b = binary.LittleEndian.AppendUint64(b, t)
		}
		b = binary.LittleEndian.AppendUint32(b, uint32(len(c.Body)))
		b = append(b, c.Body...)
	}
	return b
}

// commandSeeds are bodies every corpus has: each rule's edge.
func commandSeeds() []string {
	on1 := guildOnShard(1, 4)
	on2 := guildOnShard(2, 4)
	return []string{
		`{"op":3,"d":{"since":null,"activities":[],"status":"online","afk":false}}`,
		` { "d" : {} , "op" : 3 } `,
		"\t\r\n{\"op\":3,\"d\":{}}\n",
		`{"op":4,"d":{"guild_id":"` + on1 + `","channel_id":null,"self_mute":false,"self_deaf":false}}`,
		`{"op":8,"d":{"guild_id":"` + on1 + `","query":"","limit":0}}`,
		`{"op":8,"d":{"guild_id":"` + on2 + `"}}`,
		`{"op":8,"d":{"query":""}}`,
		`{"op":4,"d":{"guild_id":` + on1 + `}}`,
		`{"op":8,"d":{"guild_id":"12a"}}`,
		`{"op":8,"d":{"guild_id":""}}`,
		`{"op":8,"d":{"guild_id":"0"}}`,
		`{"op":8,"d":{"guild_id":"007"}}`,
		`{"op":8,"d":{"guild_id":"18446744073709551615"}}`,
		`{"op":8,"d":{"guild_id":"18446744073709551616"}}`,
		`{"op":8,"d":{"guild_id":"123456789012345678901"}}`,
		`{"op":8,"d":{"guild_id":"1\u0032"}}`,
		`{"op":8,"d":{"guild_id":"` + on1 + `","guild_id":"` + on1 + `"}}`,
		`{"op":8,"d":{"x":{"guild_id":"1"},"guild_id":"` + on1 + `"}}`,
		`{"op":3,"d":{`,
		`[3,{}]`,
		`"op"`,
		`{}`,
		`{"op":3,"op":2,"d":{}}`,
		`{"op":3,"d":{},"d":{}}`,
		`{"op":3,"d":{},"s":null}`,
		`{"\u006fp":3,"d":{}}`,
		`{"d":{}}`,
		`{"op":3}`,
		`{"op":"3","d":{}}`,
		`{"op":3.0,"d":{}}`,
		`{"op":-3,"d":{}}`,
		`{"op":03,"d":{}}`,
		`{"op":0,"d":{}}`,
		`{"op":1000,"d":{}}`,
		`{"op":3e0,"d":{}}`,
		`{"op":3,"d":null}`,
		`{"op":3,"d":[]}`,
		`{"op":2,"d":{"token":"x"}}`,
		`{"op":6,"d":{}}`,
		`{"op":1,"d":{}}`,
		`{"op":999,"d":{}}`,
		`{"op":3,"d":{"a":"\ud83d\ude00 \"x\" \\ \/ \b\f\n\r\t"}}`,
		`{"op":3,"d":{"a":"` + "\x01" + `"}}`,
		`{"op":3,"d":{"a":"\x"}}`,
		`{"op":3,"d":{"a":"\u12g4"}}`,
		`{"op":3,"d":{"a":-0.5e+10,"b":[1,2.25,-0,1E-2,true,false,null,[[]],{}]}}`,
		`{"op":3,"d":{"a":01}}`,
		`{"op":3,"d":{"a":1.}}`,
		`{"op":3,"d":{"a":.5}}`,
		`{"op":3,"d":{"a":1e}}`,
		`{"op":3,"d":{"a":-}}`,
		`{"op":3,"d":{"a":tru}}`,
		`{"op":3,"d":{"a":nul}}`,
		`{"op":3,"d":{"a":[1,]}}`,
		`{"op":3,"d":{"a":1,}}`,
		`{"op":3,"d":{"a" 1}}`,
		`{"op":3,"d":{1:1}}`,
		`{"op":3,"d":{}} x`,
		`{"op":3,"d":{}}{}`,
		`{"op":3,"d":{"a":[}]}}`,
		`{"op":3,"d":{"a":{]}}`,
		`{"op":3 "d":{}}`,
		`{"op":3,,"d":{}}`,
		`{,"op":3,"d":{}}`,
		"{\"op\":3,\"d\":{\"a\":\"\xff\xfe\"}}",
		`{"op":3,"d":{"a":"` + strings.Repeat("[", 3000) + `"}}`,
		`{"op":3,"d":` + strings.Repeat("[", 2000) + strings.Repeat("]", 2000) + `}`,
		`{"op":3,"d":{"a":` + strings.Repeat("[", 2000) + strings.Repeat("]", 2000) + `}}`,
		`{"op":3,"d":{"a":` + strings.Repeat("[", 2000) + strings.Repeat("]", 1999) + `}}`,
		`{"op":3,"d":{"s":"` + strings.Repeat("x", MaxCommandBytes-21) + `"}}`,
		`{"op":3,"d":{"s":"` + strings.Repeat("x", MaxCommandBytes-20) + `"}}`,
		``,
		` `,
		`3`,
		`null`,
	}
}

// guildOnShard is a guild ID (decimal) that routes to shard of total.
func guildOnShard(shard, total uint32) string {
	for g := uint64(1) << 22; ; g += 1 << 22 {
		if appliance.ShardForGuild(g, total) == shard {
			b, _ := json.Marshal(g)
			return string(b)
		}
	}
}

// CommandCorpus is the seeds under several shard views, then mutations
// of them (bytes flipped, dropped, inserted, cut) drawn from seed.
func CommandCorpus(seed int64) []CommandCase {
	rng := rand.New(rand.NewSource(seed))
	const ms = 1_000_000 // cycles per ms in the views below
	ready := CommandCase{Shard: 1, Total: 4, Owned: true, Ready: true, HasLog: true,
		NowTSC: 1e12, CyclesPerMS: ms, HeartbeatMS: 41250, Node: "node-a"}
	full := ready // 120 events in the last second: rate_limited
	for i := 0; i < 120; i++ {
		full.Log = append(full.Log, 1e12-ms*1000+uint64(i)*ms)
	}
	edge := ready // exactly the room (120 - 4 reserve - 1 = 115 in the window)
	for i := 0; i < 115; i++ {
		edge.Log = append(edge.Log, 1e12-uint64(115-i)*ms*100)
	}
	over := edge
	over.Log = append(append([]uint64(nil), edge.Log...), 1e12-ms)
	future := ready // stamped after now: a whole window from now
	future.Log = nil
	for i := 0; i < 116; i++ {
		future.Log = append(future.Log, 1e12+uint64(i))
	}
	views := []CommandCase{ready, full, edge, over, future}
	notOwned := ready
	notOwned.Owned, notOwned.Node = false, "n.1_X"
	notReady := ready
	notReady.Ready = false
	noLog := ready
	noLog.HasLog = false
	beforeHello := ready
	beforeHello.HeartbeatMS = 0
	fastBeats := ready
	fastBeats.HeartbeatMS = 400 // 150 + 1 + 2 reserve: never
	noRoute := ready
	noRoute.Total, noRoute.Node = 0, ""
	guessRate := full
	guessRate.CyclesPerMS = 0
	views = append(views, notOwned, notReady, noLog, beforeHello, fastBeats, noRoute, guessRate)

	var out []CommandCase
	seeds := commandSeeds()
	for _, s := range seeds {
		c := ready
		c.Body = []byte(s)
		out = append(out, c)
	}
	for _, v := range views[1:] {
		for _, s := range []string{seeds[0], seeds[3], seeds[5], `{"op":2,"d":{}}`, `{"op":3`} {
			c := v
			c.Body = []byte(s)
			out = append(out, c)
		}
	}
	big := ready
	big.Body = []byte(`{"op":3,"d":{"s":"` + strings.Repeat("y", 5000) + `"}}`)
	out = append(out, big)
	const alphabet = `{}[]":,\ 0123456789-+.eEtrufalsn` + "\t\n\x00\x7f\x80"
	for i := 0; i < 400; i++ {
		b := []byte(seeds[rng.Intn(len(seeds))])
		for k := 1 + rng.Intn(3); k > 0; k-- {
			switch op := rng.Intn(4); {
			case len(b) == 0 || op == 0:
				p := rng.Intn(len(b) + 1)
				b = append(b[:p], append([]byte{alphabet[rng.Intn(len(alphabet))]}, b[p:]...)...)
			case op == 1:
				b[rng.Intn(len(b))] = alphabet[rng.Intn(len(alphabet))]
			case op == 2:
				p := rng.Intn(len(b))
				b = append(b[:p], b[p+1:]...)
			default:
				b = b[:rng.Intn(len(b))]
			}
		}
		c := ready
		c.Body = b
		out = append(out, c)
	}
	return out
}
