package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/tools/gatewayemu"
)

// TestKernelHeartbeatsUnderFlood: one QEMU node with hbFloodShards shards,
// each session flooded with 1 KiB MESSAGE_CREATEs far beyond what the node
// can read (the node is the limit: TCP's windows push back on the
// emulator). The node must keep every heartbeat on time anyway: the
// emulator, with a grace of hbFloodGrace instead of a quarter of the
// interval, records no violation (a heartbeat later than interval + grace
// is missed_heartbeat), no shard Identifies twice, no shard is reset, and
// the node's own figure of its latest heartbeat (beat_late_max_ms) stays
// under the grace. Before gw_tick sent due heartbeats ahead of event work
// and bounded a pass's reads (kernel/gateway/session.inc), one pass read
// up to 24 KiB of every shard, and the heartbeats waited for the pass.
func TestKernelHeartbeatsUnderFlood(t *testing.T) {
	const (
		shards   = hbFloodShards
		interval = 2 * time.Second
		beats    = 5 // heartbeats each shard's connection sends under the flood
	)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	eo := gatewayemu.Options{HeartbeatInterval: interval, HeartbeatGrace: hbFloodGrace, Shards: shards,
		MaxConcurrency: shards, MessagesPerSecond: hbFloodRate, MessageBytes: hbFloodBytes, Guilds: shards,
		ReplayLimit: 1024, RecordHeartbeats: true}
	l := newGWLab(t, ctx, "10.201.0", eo, "--total-shards", fmt.Sprint(shards),
		"--max-concurrency", fmt.Sprint(shards), "--lease", "30s")
	node := l.boot("hb-flood", "virtio-net-pci", shards)
	l.sessionsAt(shards, 200, 90*time.Second)
	t0 := time.Now()
	// Every shard's connection sends beats heartbeats after t0 (observable
	// in the emulator's record; a shard reset starts a new connection, which
	// the checks below catch).
	l.awaitEmu(30*time.Second, fmt.Sprintf("%d heartbeats per shard under the flood", beats), func(gatewayemu.State) bool {
		per := map[uint64]int{}
		for _, b := range l.emu.Heartbeats() {
			if b.Shard >= 0 && b.Received.After(t0) {
				per[b.Conn]++
			}
		}
		n := 0
		for _, c := range per {
			if c >= beats {
				n++
			}
		}
		return n >= shards
	})
	con := node.serial.String()
	var worst time.Duration
	last := map[uint64]time.Time{}
	for _, b := range l.emu.Heartbeats() {
		if p, ok := last[b.Conn]; ok && b.Received.After(t0) {
			worst = max(worst, b.Received.Sub(p)-interval)
		}
		last[b.Conn] = b.Received
	}
	late := regexp.MustCompile(`beat_late_max_ms=(\d+)`).FindAllStringSubmatch(con, -1)
	nodeWorst := 0
	for _, m := range late {
		var v int
		fmt.Sscan(m[1], &v)
		nodeWorst = max(nodeWorst, v)
	}
	t.Logf("%d shards flooded at %.0f/s per session: %d dispatches sent; the latest heartbeat came %v after its interval (emulator), %d ms after its deadline (node); node line: %s",
		shards, hbFloodRate, l.emu.State().Counters.Dispatches, worst.Round(time.Millisecond), nodeWorst, lastLine(con, "node: "))
	if v := l.emu.Violations(); len(v) != 0 {
		t.Errorf("%d emulator violations: %s", len(v), violationReport(v))
		for _, x := range v {
			var at []string
			for _, b := range l.emu.Heartbeats() {
				if b.Conn == x.Conn {
					at = append(at, fmt.Sprintf("%d@%v", b.N, b.Received.Sub(t0).Round(time.Millisecond)))
				}
			}
			t.Logf("connection %d's heartbeats (n@since the flood window): %s", x.Conn, strings.Join(at, " "))
		}
	}
	if worst > hbFloodGap {
		t.Errorf("the emulator saw a heartbeat %v after the %v interval, over %v", worst.Round(time.Millisecond), interval, hbFloodGap)
	}
	if got := l.acceptedIdentifies(); got != shards {
		t.Errorf("%d accepted Identifies for %d shards: a session was lost", got, shards)
	}
	if strings.Contains(con, "zombie connection") || strings.Contains(con, "BACKOFF") {
		t.Errorf("a shard was reset under the flood:\n%s", grepLines(con, "BACKOFF"))
	}
	if len(late) == 0 {
		t.Error("no node line with beat_late_max_ms")
	} else if time.Duration(nodeWorst)*time.Millisecond > hbFloodLate {
		t.Errorf("the node sent a heartbeat %d ms after its deadline, over %v", nodeWorst, hbFloodLate)
	}
}

const (
	hbFloodShards = 32
	hbFloodRate   = 1000.0                 // MESSAGE_CREATE/s asked per session: far above the node's ceiling
	hbFloodGrace  = 2 * time.Second        // the emulator's grace after the interval: packets the loaded host drops cost a retransmission
	hbFloodLate   = 250 * time.Millisecond // how late after its deadline the node may send a heartbeat
	hbFloodGap    = time.Second            // how late after the interval the emulator may see one (a retransmitted segment included)
	hbFloodBytes  = 1024
)
