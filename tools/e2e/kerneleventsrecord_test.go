package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/discord-pxe/dpxe/fleet/events"
	"github.com/discord-pxe/dpxe/tools/gatewayemu"
)

// The stream checks of the kernel event tests (kernelEventsSkip,
// TestKernelEventsCallout): wait until the stream holds a prefix of every
// session, then compare it event by event with the emulator's record.

// awaitStream waits (60 s at most) until the app's stream holds
// dispatches 1..want of every session but those in skipped, and returns
// the stream's messages.
func awaitStream(t *testing.T, ctx context.Context, js jetstream.JetStream, app string, sessions []gatewayemu.SessionInfo,
	want uint64, skipped map[string]map[uint64]bool) []streamEvent {
	t.Helper()
	var got []streamEvent
	complete := func() bool {
		have := map[string]map[uint64]bool{}
		for _, ev := range got {
			if have[ev.meta.Session] == nil {
				have[ev.meta.Session] = map[uint64]bool{}
			}
			have[ev.meta.Session][ev.meta.Seq] = true
		}
		for _, s := range sessions {
			for q := uint64(1); q <= want; q++ {
				if !have[s.ID][q] && !skipped[s.ID][q] {
					return false
				}
			}
		}
		return true
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(time.Second) {
		var err error
		if got, err = readEventStream(ctx, js, app); err != nil {
			t.Fatal(err)
		}
		if complete() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stream does not hold dispatches 1..%d of both sessions after 60 s (%d messages)", want, len(got))
		}
	}
	return got
}

// checkRecord compares got, the stream, with the emulator's record of
// every session: each dispatch 1..want (but those of type skip, listed in
// skipped) once, in
// order, with its subject, Nats-Msg-Id, Dpxe-* headers (from one of
// nodes) and the record's bytes; no dispatch the emulator never sent
// (RESUMED aside).
func checkRecord(t *testing.T, l *gwLab, got []streamEvent, sessions []gatewayemu.SessionInfo, app, skip string,
	want uint64, skipped map[string]map[uint64]bool, nodes map[string]bool) {
	t.Helper()
	// Event by event against the emulator's record.
	for _, s := range sessions {
		recs, ok := l.emu.Dispatched(s.ID)
		if !ok {
			t.Fatalf("session %s: no record", s.ID)
		}
		bySeq := map[uint64][]byte{}
		for _, r := range recs {
			bySeq[uint64(r.Seq)] = r.Frame
		}
		if len(recs) == 0 || recs[0].Seq != 1 {
			t.Fatalf("session %s: the record does not start at 1", s.ID)
		}
		seen := map[uint64]int{}
		var last uint64
		resumed := 0
		for _, ev := range got {
			if ev.meta.Session != s.ID {
				continue
			}
			q := ev.meta.Seq
			seen[q]++
			if q <= last {
				t.Errorf("session %s: stream message %d has seq %d after seq %d", s.ID, ev.streamSeq, q, last)
			}
			last = q
			frame, ok := bySeq[q]
			if !ok {
				// The emulator gives RESUMED a sequence and keeps it out
				// of the replay record: the node publishes it like any dispatch.
				var rs struct {
					T string `json:"t"`
					S uint64 `json:"s"`
				}
				if json.Unmarshal(ev.body, &rs) == nil && rs.T == "RESUMED" && rs.S == q {
					resumed++
					continue
				}
				t.Errorf("session %s: stream message %d: seq %d was never sent", s.ID, ev.streamSeq, q)
				continue
			}
			var head struct {
				T string `json:"t"`
			}
			if err := json.Unmarshal(frame, &head); err != nil {
				t.Fatal(err)
			}
			subj, _ := events.EventSubject(app, uint32(s.Shard[0]), head.T)
			switch {
			case skip != "" && head.T == skip:
				t.Errorf("session %s seq %d: a %s (skipped type) is in the stream", s.ID, q, head.T)
			case ev.subject != subj:
				t.Errorf("session %s seq %d: subject %q, want %q", s.ID, q, ev.subject, subj)
			case ev.msgID != s.ID+":"+strconv.FormatUint(q, 10):
				t.Errorf("session %s seq %d: Nats-Msg-Id %q", s.ID, q, ev.msgID)
			case ev.meta.Shard != uint32(s.Shard[0]) || !nodes[ev.meta.Node]:
				t.Errorf("session %s seq %d: headers %+v", s.ID, q, ev.meta)
			case !bytes.Equal(ev.body, frame):
				t.Errorf("session %s seq %d: body differs:\n got %.200q\nwant %.200q", s.ID, q, ev.body, frame)
			case ev.meta.Received.Before(s.CreatedAt.Add(-time.Hour)) || ev.meta.Received.After(time.Now().Add(time.Hour)):
				t.Errorf("session %s seq %d: Dpxe-Received %v far from now", s.ID, q, ev.meta.Received)
			}
		}
		for q := uint64(1); q <= want; q++ {
			if skipped[s.ID][q] {
				continue // checked above: none of the type in the stream
			}
			if seen[q] != 1 {
				t.Errorf("session %s (shard %d): seq %d is in the stream %d times", s.ID, s.Shard[0], q, seen[q])
			}
		}
		t.Logf("shard %d session %s: %d dispatches in the stream (up to seq %d, %d of them RESUMED), the emulator's record holds %d", s.Shard[0], s.ID, len(seen), last, resumed, len(recs))
	}
}
