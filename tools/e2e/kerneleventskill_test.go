package e2e

import (
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/tools/gatewayemu"
)

// killNode is TestKernelEventsNodeKilled's middle (kernelEventsSkip with
// killAt): it waits until node runs a shard READY, has reported that
// shard's session to the controller (the crash hand-off is built from that
// report) and both emulator sessions sent killAt dispatches, then kills
// node's QEMU (SIGKILL through its context) and waits until the shard's
// session is connected again with the same session ID: Resumed by the
// other node, not Identified afresh. A third session fails the test.
func killNode(t *testing.T, l *gwLab, node *gwNode, killAt int64) {
	t.Helper()
	moveShard(t, l, node, killAt, "killing", func() { close(node.quit) })
}

// moveShard waits until node runs a shard READY and has reported its
// session and acknowledged events to the controller, and both emulator
// sessions sent at dispatches; then it calls move (what: "killing",
// "draining") and waits until that shard's session is connected again
// with the same session ID, Resumed by another node: a third emulator
// session (a new Identify) fails the test. It returns the shard.
func moveShard(t *testing.T, l *gwLab, node *gwNode, at int64, what string, move func()) uint32 {
	t.Helper()
	var shard uint32
	var session string
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		d, err := l.nodeDetail(node.id)
		found := false
		if err == nil {
			for _, sh := range d.Shards {
				if sh.State == "READY" && sh.SessionID != "" && sh.EventsAckedSeq > 0 {
					shard, session, found = sh.ID, sh.SessionID, true
				}
			}
		}
		if found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never reported a READY shard with its session and acknowledged events: %+v (%v)", node.id, d.Shards, err)
		}
	}
	if at > 0 {
		l.allSessionsAt(at, 90*time.Second)
	}
	before, ok := l.shardSession(int(shard))
	if !ok || before.ID != session {
		t.Fatalf("shard %d: the emulator's connected session %+v is not the one %s reported", shard, before, node.id)
	}
	d, _ := l.nodeDetail(node.id)
	for _, sh := range d.Shards {
		if sh.ID == shard {
			t.Logf("%s %s: shard %d at emulator seq %d, last reported hand-over seq %d, events_acked_seq %d, in flight %d",
				what, node.id, shard, before.Seq, sh.Seq, sh.EventsAckedSeq, sh.EventsInFlight)
		}
	}
	move()
	moved := time.Now()
	l.awaitEmu(120*time.Second, "the "+what+" node's shard Resumed by the other node", func(s gatewayemu.State) bool {
		now, ok := l.shardSession(int(shard))
		return ok && now.ID == session && now.Resumes > before.Resumes
	})
	if n := len(l.emu.Sessions()); n != 2 {
		t.Fatalf("%d emulator sessions after the takeover: a shard Identified afresh", n)
	}
	t.Logf("shard %d Resumed on the other node %v after %s %s", shard, time.Since(moved).Round(100*time.Millisecond), what, node.id)
	return shard
}
