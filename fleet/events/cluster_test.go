package events

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/discord-pxe/dpxe/fleet/events/eventstest"
)

// TestClusterBrokerKilledMidStream publishes 200 dispatches of one session
// into an R3 stream on a three-server cluster, shuts the stream's leader
// down after 60, and then does what a shard does after a broker failure:
// replays from Acked (Discord's replay after a Resume) until Acked reaches
// the last sequence. The stream must then hold every sequence exactly
// once, read from a surviving server. PubAcks time out after 200 ms, far
// shorter than a leader election, so some dispatches of the second part
// are not acknowledged in time (stored or not), and the replay must fill
// the holes while the stream drops what it already has.
func TestClusterBrokerKilledMidStream(t *testing.T) {
	if testing.Short() {
		t.Skip("a three-server cluster takes seconds to elect leaders")
	}
	brokerKilledMidStream(t, eventstest.StartEmbedded(t, "n"))
}

// TestClusterBrokerKilledMidStreamDebian is the same against three
// nats-server processes of Debian's package (2.9.10), the leader killed
// with SIGKILL. It skips where the package is not installed.
func TestClusterBrokerKilledMidStreamDebian(t *testing.T) {
	if testing.Short() {
		t.Skip("a three-server cluster takes seconds to elect leaders")
	}
	brokerKilledMidStream(t, eventstest.StartProcesses(t, eventstest.DebianServer, "deb"))
}

func brokerKilledMidStream(t *testing.T, c *eventstest.Cluster) {
	nc, err := nats.Connect(c.ClientURLs(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	l := DefaultStreamLimits()
	l.Replicas = 3
	var st jetstream.Stream
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err = EnsureStream(ctx, js, "bot", l)
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("R3 stream on the cluster: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	p, err := NewPublisher(nc, PublisherConfig{App: "bot", Node: "sim-1", Window: 32, AckTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	sp, _ := p.Session(0, "sess", 0)
	ctx := context.Background()
	const last = 200
	for seq := uint64(1); seq <= 60; seq++ {
		if err := sp.Publish(ctx, dispatch(seq, 100)); err != nil {
			t.Fatal(err)
		}
	}
	ictx, cancel := context.WithTimeout(ctx, testDeadline)
	info, err := st.Info(ictx)
	cancel()
	if err != nil || info.Cluster == nil {
		t.Fatalf("stream info: %v", err)
	}
	leader := info.Cluster.Leader
	if !c.Stop(leader) {
		t.Fatalf("the stream's leader %q is none of %v", leader, c.Names)
	}
	// The rest goes out while the stream elects a new leader; some
	// PubAcks fail or time out.
	for seq := uint64(61); seq <= last; seq++ {
		if err := sp.Publish(ctx, dispatch(seq, 100)); err != nil {
			t.Fatal(err)
		}
	}
	flush(t, sp)
	before := sp.Stats()
	// Replay from Acked until everything is acknowledged.
	deadline = time.Now().Add(60 * time.Second)
	for sp.Acked() < last {
		if time.Now().After(deadline) {
			t.Fatalf("acked %d of %d: %+v", sp.Acked(), last, sp.Stats())
		}
		for seq := sp.Acked() + 1; seq <= last; seq++ {
			if err := sp.Publish(ctx, dispatch(seq, 100)); err != nil {
				t.Fatal(err)
			}
		}
		flush(t, sp)
	}
	after := sp.Stats()
	if before.Failed == 0 {
		t.Logf("no PubAck failed during the election this run: the replay was not needed")
	}
	t.Logf("leader %s stopped; before the replay: acked %d, %d failed; after: %+v", leader, before.Acked, before.Failed, after)
	seen := map[uint64]int{}
	ictx, cancel = context.WithTimeout(ctx, testDeadline)
	defer cancel()
	info, err = st.Info(ictx)
	if err != nil {
		t.Fatal(err)
	}
	for s := info.State.FirstSeq; s <= info.State.LastSeq; s++ {
		m, err := st.GetMsg(ictx, s)
		if err != nil {
			t.Fatalf("stream seq %d: %v", s, err)
		}
		meta, err := ParseHeader(m.Header)
		if err != nil {
			t.Fatal(err)
		}
		seen[meta.Seq]++
	}
	for seq := uint64(1); seq <= last; seq++ {
		if seen[seq] != 1 {
			t.Errorf("seq %d stored %d times", seq, seen[seq])
		}
	}
	if info.State.Msgs != last {
		t.Errorf("stream holds %d messages, want %d", info.State.Msgs, last)
	}
}
