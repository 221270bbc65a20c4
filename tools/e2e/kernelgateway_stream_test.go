package e2e

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/tools/gatewayemu"
)

// TestKernelGatewayLargeMessages: two nodes of one shard each against the
// emulator shaped like a large bot: a READY of about 200 KiB (4,600
// unavailable guilds) and a first GUILD_CREATE of 8 MiB, every message
// fragmented into up to 16 frames. Node 0 asks for compress=zlib-stream
// (the default), node 1 boots with zlib=0. Each shard must reach READY,
// take both messages through the streaming path, and keep heartbeating
// on the same connection; the sink's dispatch and byte counts printed by
// the kernel must equal the emulator's record for that connection. Then a
// corrupt zlib stream (the emulator's corrupt_zlib fault) must close the
// compressed shard with a reason, and it must Resume on a new compressed
// connection.
func TestKernelGatewayLargeMessages(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	gcBytes := 8 << 20 // DPXE_STREAM_GC_MIB=N for another size (the emulator allows up to 64)
	if v, err := strconv.Atoi(os.Getenv("DPXE_STREAM_GC_MIB")); err == nil && v > 0 && v <= 64 {
		gcBytes = v << 20
	}
	// A heartbeat's ACK waits behind the GUILD_CREATE on its connection,
	// and the emulator compresses it first: past 16 MiB, 2 s is too short
	// under TCG (Discord's interval is 41.25 s).
	beat := 2 * time.Second
	if gcBytes > 16<<20 {
		beat = 20 * time.Second
	}
	l := newGWLab(t, ctx, "10.97.0", gatewayemu.Options{
		HeartbeatInterval: beat, Shards: 2, MaxConcurrency: 2,
		GuildIDs:               []uint64{2 << 22, 3 << 22}, // one routed guild per shard: READY, then one GUILD_CREATE
		ReadyUnavailableGuilds: 4600, GuildCreateBytes: []int{gcBytes}, FragmentFrames: 16, Seed: 1,
	}, "--total-shards", "2", "--lease", "15s")
	l.nodeConfig = func(i int, c *appliance.BootConfig) { c.NoZlib = c.NodeID == "gw-plain" }
	// gw-plain first, and gw-zlib only once gw-plain holds shard 0: the
	// plan gives contiguous ranges in node-ID order, so gw-zlib then joins
	// with shard 1 and no shard moves. Booted together, gw-zlib could check
	// in alone first, take shard 0 and hand it to gw-plain a generation
	// later by Resume, which replays neither READY nor the GUILD_CREATE.
	plain := l.boot("gw-plain", "virtio-net-pci", 1)
	l.awaitRange("gw-plain", 0, 1, 60*time.Second)
	nodes := []*gwNode{l.boot("gw-zlib", "virtio-net-pci", 1), plain}

	// Both shards: READY, the GUILD_CREATE and 3 heartbeats after it.
	l.awaitEmu(150*time.Second+3*beat, "two shards with READY, an 8 MiB GUILD_CREATE and 3 heartbeats", func(s gatewayemu.State) bool {
		n := 0
		for _, c := range s.Connections {
			if c.Open && c.Shard != nil && c.Dispatches >= 2 && c.ClientEvents >= 4 { // Identify + 3 heartbeats
				n++
			}
		}
		return n == 2
	})
	t.Logf("both shards past their GUILD_CREATE after %v", time.Since(start).Round(time.Second))

	sink := regexp.MustCompile(`shard (\d+): sink: (\S+) of (\d+) bytes; connection: (\d+) dispatches, (\d+) bytes, (\d+) on the wire`)
	zlibShard := -1
	for i, n := range nodes {
		var last []string
		deadline := time.Now().Add(10*time.Second + time.Duration(gcBytes>>20)*time.Second)
		for last == nil || last[2] != "GUILD_CREATE" {
			all := sink.FindAllStringSubmatch(n.serial.String(), -1)
			if len(all) > 0 {
				last = all[len(all)-1]
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no sink line for the GUILD_CREATE (last %q)", n.id, last)
			}
			time.Sleep(100 * time.Millisecond)
		}
		shard, _ := strconv.Atoi(last[1])
		size, _ := strconv.ParseUint(last[3], 10, 64)
		events, _ := strconv.ParseUint(last[4], 10, 64)
		bytes, _ := strconv.ParseUint(last[5], 10, 64)
		var conn *gatewayemu.ConnStats
		st := l.emu.State()
		for k, c := range st.Connections {
			if c.Shard != nil && c.Shard[0] == shard {
				if conn != nil {
					t.Errorf("%s: shard %d had more than one connection", n.id, shard)
				}
				conn = &st.Connections[k]
			}
		}
		if conn == nil {
			t.Fatalf("%s: no emulator connection of shard %d", n.id, shard)
		}
		if conn.ZlibStream != (i == 0) {
			t.Errorf("%s: connection zlib_stream=%v, want %v", n.id, conn.ZlibStream, i == 0)
		}
		if i == 0 {
			zlibShard = shard
		}
		if size < uint64(gcBytes) || events != conn.Dispatches || bytes != conn.DispatchBytes {
			t.Errorf("%s shard %d: kernel sink %d dispatches, %d bytes (GUILD_CREATE %d bytes); emulator sent %d dispatches, %d bytes",
				n.id, shard, events, bytes, size, conn.Dispatches, conn.DispatchBytes)
		}
		t.Logf("%s shard %d: zlib-stream %v: %d dispatches, %d bytes of JSON as the emulator counts them, %d payload bytes on the wire (all %d messages: %d JSON bytes, %d wire bytes, %d frames)",
			n.id, shard, conn.ZlibStream, events, bytes, mustU(last[6]), conn.Messages, conn.PayloadBytes, conn.WireBytes, conn.Frames)
	}
	if v := l.emu.Violations(); len(v) != 0 {
		t.Errorf("emulator violations: %s", violationReport(v))
	}

	// A corrupt zlib stream: closed with a reason, then a Resume on a new
	// compressed connection, and heartbeats again.
	resumesBefore := l.emu.State().Counters.Resumes
	sh := zlibShard
	if _, err := l.emu.Inject(gatewayemu.Fault{Kind: gatewayemu.FaultCorruptZlib, Shard: &sh}); err != nil {
		t.Fatal(err)
	}
	why := regexp.MustCompile(fmt.Sprintf(`shard %d: zlib: block-type after \d+ compressed bytes`, sh))
	if nodes[0].serial.waitFor(why, 30*time.Second) == nil {
		t.Fatalf("no zlib refusal on the console of %s", nodes[0].id)
	}
	if nodes[0].serial.waitFor(regexp.MustCompile(fmt.Sprintf(`shard %d: READY \(resumed`, sh)), 60*time.Second) == nil {
		t.Fatalf("shard %d did not Resume after the corrupt stream", sh)
	}
	l.awaitEmu(30*time.Second+2*beat, "the resumed shard on a new compressed connection with 2 heartbeats", func(s gatewayemu.State) bool {
		if s.Counters.Resumes <= resumesBefore {
			return false
		}
		for _, c := range s.Connections {
			if c.Open && c.Shard != nil && c.Shard[0] == sh && c.ZlibStream && c.ClientEvents >= 3 { // Resume + 2 heartbeats
				return true
			}
		}
		return false
	})
	if v := l.emu.Violations(); len(v) != 0 {
		t.Errorf("emulator violations: %s", violationReport(v))
	}
	t.Logf("test time %v", time.Since(start).Round(time.Second))
}

func mustU(s string) uint64 {
	n, _ := strconv.ParseUint(s, 10, 64)
	return n
}
