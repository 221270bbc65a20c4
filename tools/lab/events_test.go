package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/discord-pxe/dpxe/fleet/events"
)

// emulatorSessions is the emulator's record of each session: the last
// sequence it dispatched, by session ID.
func emulatorSessions(t *testing.T, l *Lab) (map[string]int64, uint64) {
	t.Helper()
	var st struct {
		Counters struct {
			Dispatches         uint64 `json:"dispatches"`
			ReplayedDispatches uint64 `json:"replayed_dispatches"`
		} `json:"counters"`
		Shards []struct {
			Sessions []struct {
				ID  string `json:"session_id"`
				Seq int64  `json:"seq"`
			} `json:"sessions"`
		} `json:"shards"`
	}
	if err := mustGateway(t, l).do(context.Background(), "GET", "/debug/state", nil, &st); err != nil {
		t.Fatalf("emulator record: %v", err)
	}
	out := map[string]int64{}
	for _, sh := range st.Shards {
		for _, s := range sh.Sessions {
			out[s.ID] = s.Seq
		}
	}
	return out, st.Counters.Dispatches
}

// storedEvent is one message of the stream as the test reads it.
type storedEvent struct {
	meta  events.Meta
	event string
	frame struct {
		T string `json:"t"`
		S uint64 `json:"s"`
	}
}

// readStream reads every message of the lab's event stream.
func readStream(t *testing.T, js jetstream.JetStream) []storedEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name, _ := events.StreamName(labEventsApp)
	st, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []storedEvent
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("stream seq %d: %v", seq, err)
		}
		var e storedEvent
		subj, err := events.ParseSubject(m.Subject)
		if err != nil {
			t.Fatalf("stream seq %d: %v", seq, err)
		}
		e.event = subj.Event
		if e.meta, err = events.ParseHeader(m.Header); err != nil {
			t.Fatalf("stream seq %d: %v", seq, err)
		}
		if err := json.Unmarshal(m.Data, &e.frame); err != nil {
			t.Fatalf("stream seq %d: frame: %v", seq, err)
		}
		out = append(out, e)
	}
	return out
}

// TestLabSimulatedEvents runs the simulated lab with the emulator sending
// MESSAGE_CREATEs and checks the emulator's record against the stream:
// every dispatch of every session the emulator holds (sequences 1 to its
// last) is in the stream exactly once, under its session's Msg-Id, with
// the frame unchanged (its t and s agree with the subject and headers),
// and the stream holds nothing the emulator did not send.
func TestLabSimulatedEvents(t *testing.T) {
	cfg, log := testConfig(t, 2)
	cfg.Simulate = true
	cfg.MessageRate = 20
	l, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("start: %v\n%s", err, log.String())
	}
	defer func() {
		l.Stop()
		if t.Failed() {
			t.Logf("lab log:\n%s\nserve log:\n%s", log.String(), tail(filepath.Join(cfg.Var, "serve.log"), 40))
		}
	}()
	if l.NATSURL == "" {
		t.Fatal("the lab found no NATS server in serve's log")
	}
	waitUntil(t, 40*time.Second, "every shard READY", func() string {
		rep, err := l.Status(context.Background())
		if err != nil {
			return err.Error()
		}
		return allReady(rep, cfg.Shards)
	})
	nc, err := nats.Connect(l.NATSURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// Let messages flow, then take the emulator's record and wait until
	// the stream holds at least that much of every session.
	waitUntil(t, 30*time.Second, "100 dispatches sent", func() string {
		if _, n := emulatorSessions(t, l); n < 100 {
			return fmt.Sprintf("%d sent", n)
		}
		return ""
	})
	sent, _ := emulatorSessions(t, l)
	var stored []storedEvent
	waitUntil(t, 30*time.Second, "the stream catches up with the emulator's record", func() string {
		stored = readStream(t, js)
		max := map[string]uint64{}
		for _, e := range stored {
			max[e.meta.Session] = maxU(max[e.meta.Session], e.meta.Seq)
		}
		for id, seq := range sent {
			if max[id] < uint64(seq) {
				return fmt.Sprintf("session %s: stream up to %d, emulator sent %d", id, max[id], seq)
			}
		}
		return ""
	})
	after, _ := emulatorSessions(t, l)
	seen := map[string]map[uint64]int{}
	for _, e := range stored {
		if e.frame.T != e.event || e.frame.S != e.meta.Seq {
			t.Errorf("message of %s seq %d: frame says t=%s s=%d", e.event, e.meta.Seq, e.frame.T, e.frame.S)
		}
		if seen[e.meta.Session] == nil {
			seen[e.meta.Session] = map[uint64]int{}
		}
		seen[e.meta.Session][e.meta.Seq]++
	}
	total := 0
	for id, seqs := range seen {
		last, ok := after[id]
		if !ok {
			t.Errorf("session %s is in the stream but not in the emulator's record", id)
			continue
		}
		for seq, n := range seqs {
			if n != 1 {
				t.Errorf("session %s seq %d stored %d times", id, seq, n)
			}
			if seq > uint64(last) {
				t.Errorf("session %s seq %d stored, emulator sent up to %d", id, seq, last)
			}
		}
		total += len(seqs)
	}
	for id, last := range sent {
		for seq := uint64(1); seq <= uint64(last); seq++ {
			if seen[id][seq] != 1 {
				t.Errorf("session %s seq %d: stored %d times, want once", id, seq, seen[id][seq])
			}
		}
	}
	if len(sent) != cfg.Shards {
		t.Errorf("emulator holds %d sessions, want %d", len(sent), cfg.Shards)
	}
	t.Logf("%d sessions, %d dispatches compared, %d messages in the stream", len(sent), total, len(stored))
}

func maxU(a, b uint64) uint64 {
	if a > b {
		return a
	}
	return b
}
