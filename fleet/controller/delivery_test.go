package controller

import (
	"context"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
)

// pub is a shard status with delivery figures.
func pub(id, published, inFlight uint32) appliance.ShardStatus {
	return appliance.ShardStatus{ID: id, State: appliance.ShardReady, SeqValid: true,
		EventsPublished: published, EventsAckedSeq: published, EventsInFlight: inFlight}
}

// TestPublishedSince: the events published between two check-ins, shard
// by shard; a counter that starts again adds what it counted since, a
// shard that arrived or left adds nothing, and nothing is ever negative.
func TestPublishedSince(t *testing.T) {
	for _, c := range []struct {
		name      string
		prev, cur []appliance.ShardStatus
		want      uint64
	}{
		{"steady", []appliance.ShardStatus{pub(0, 100, 0), pub(1, 50, 0)}, []appliance.ShardStatus{pub(1, 80, 0), pub(0, 130, 2)}, 60},
		{"no change", []appliance.ShardStatus{pub(0, 100, 0)}, []appliance.ShardStatus{pub(0, 100, 0)}, 0},
		{"node restarted: counters from 0", []appliance.ShardStatus{pub(0, 1000, 0), pub(1, 900, 0)}, []appliance.ShardStatus{pub(0, 7, 0), pub(1, 3, 0)}, 10},
		{"one slot restarted, one went on", []appliance.ShardStatus{pub(0, 1000, 0), pub(1, 900, 0)}, []appliance.ShardStatus{pub(0, 5, 0), pub(1, 950, 0)}, 55},
		{"shard left", []appliance.ShardStatus{pub(0, 100, 0), pub(1, 5000, 0)}, []appliance.ShardStatus{pub(0, 110, 0)}, 10},
		{"shard arrived into a slot with counts", []appliance.ShardStatus{pub(0, 100, 0)}, []appliance.ShardStatus{pub(0, 120, 0), pub(9, 7000, 0)}, 20},
		{"saturated counter", []appliance.ShardStatus{pub(0, 1<<32-2, 0)}, []appliance.ShardStatus{pub(0, 1<<32-1, 0)}, 1},
		{"nothing before", nil, []appliance.ShardStatus{pub(0, 100, 0)}, 0},
	} {
		if got := publishedSince(c.prev, c.cur); got != c.want {
			t.Errorf("%s: publishedSince = %d, want %d", c.name, got, c.want)
		}
	}
}

// TestNodeDeliveryRate drives one node's check-ins through the controller
// with a fake clock: no delivery figures, no Delivery; the first report
// gives totals and no rate; the next gives the rate over the interval; a
// node restart (counters from 0) gives a positive rate, never a negative
// one; a check-in without statuses keeps the last figures; a report
// without delivery (delivery turned off) clears them; a lapse of the
// lease clears them and the rate needs two reports again.
func TestNodeDeliveryRate(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 2})
	h.add("a")
	gen := h.checkin("a", 2, 0).Generation
	report := func(shards ...appliance.ShardStatus) *NodeDelivery {
		t.Helper()
		req := &appliance.CheckinRequest{NodeID: "a", Capacity: 2, Generation: gen, Shards: shards}
		for _, s := range shards {
			if s.State == appliance.ShardReady {
				req.ReadyShards++
			}
		}
		if _, err := h.c.Checkin(context.Background(), req, "127.0.0.1"); err != nil {
			t.Fatal(err)
		}
		d, err := h.c.Node(context.Background(), "a")
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range h.c.Nodes() {
			if n.ID == "a" && (n.Delivery == nil) != (d.Delivery == nil) {
				t.Fatalf("Nodes and Node disagree: %+v, %+v", n.Delivery, d.Delivery)
			}
		}
		return d.Delivery
	}
	ready := func(id uint32) appliance.ShardStatus {
		return appliance.ShardStatus{ID: id, State: appliance.ShardReady, SeqValid: true, HeartbeatAcks: 4}
	}
	if d := report(ready(0), ready(1)); d != nil {
		t.Fatalf("a node reporting no delivery has delivery %+v", d)
	}
	h.clock.Advance(10 * time.Second)
	x0, x1 := pub(0, 1000, 3), pub(1, 500, 0)
	x1.EventsLost, x1.EventsSkipped = 2, 40
	d := report(x0, x1)
	if d == nil || d.Published != 1500 || d.InFlight != 3 || d.Lost != 2 || d.Skipped != 40 || d.RateWindowMS != 0 || d.PublishRate != 0 {
		t.Fatalf("first report with delivery: %+v, want totals 1500/3/2/40 and no rate (the check-in before carried none)", d)
	}
	h.clock.Advance(10 * time.Second)
	if d = report(pub(0, 1800, 1), pub(1, 700, 0)); d == nil || d.RateWindowMS != 10000 || d.PublishRate != 100 || d.Published != 2500 {
		t.Fatalf("second report: %+v, want 1,000 events over 10 s: 100/s", d)
	}
	h.clock.Advance(5 * time.Second)
	if _, err := h.c.Checkin(context.Background(), &appliance.CheckinRequest{NodeID: "a", Capacity: 2, Generation: gen, ReadyShards: 2}, "127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	if n, _ := h.c.Node(context.Background(), "a"); n.Delivery == nil || n.Delivery.PublishRate != 100 {
		t.Fatalf("a check-in with counts only changed the figures: %+v", n.Delivery)
	}
	// The node rebooted: its counters began again from 0.
	h.clock.Advance(10 * time.Second)
	if d = report(pub(0, 30, 0), pub(1, 20, 0)); d == nil || d.PublishRate != 50.0/15 || d.RateWindowMS != 15000 {
		t.Fatalf("after a restart of the node's counters: %+v, want 50 events over 15 s", d)
	}
	h.clock.Advance(10 * time.Second)
	if d = report(ready(0), ready(1)); d != nil {
		t.Fatalf("delivery turned off, still %+v", d)
	}
	h.clock.Advance(10 * time.Second)
	if d = report(pub(0, 40, 0), pub(1, 20, 0)); d == nil || d.RateWindowMS != 0 {
		t.Fatalf("first report after delivery came back: %+v, want no rate", d)
	}
	h.clock.Advance(h.c.Config().Lease + time.Second)
	if n := h.c.Nodes(); n[0].Live || n[0].Delivery != nil {
		t.Fatalf("after the lease lapsed: live %v, delivery %+v", n[0].Live, n[0].Delivery)
	}
	gen = h.checkin("a", 2, 0).Generation
	if n, _ := h.c.Node(context.Background(), "a"); !n.Live || n.Delivery != nil {
		t.Fatalf("back after a lapse, before any report: live %v, delivery %+v (from before the lapse)", n.Live, n.Delivery)
	}
	if d = report(pub(0, 50, 0), pub(1, 20, 0)); d == nil || d.RateWindowMS != 0 {
		t.Fatalf("first report after a lapse: %+v, want no rate", d)
	}
	h.clock.Advance(2 * time.Second)
	if d = report(pub(0, 60, 0), pub(1, 30, 0)); d == nil || d.PublishRate != 10 {
		t.Fatalf("second report after a lapse: %+v, want 20 events over 2 s", d)
	}
}

// TestNodeBrokerStatus: the node's broker connection is what its latest
// check-in said, gone with a check-in without it and with the lease.
func TestNodeBrokerStatus(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 2})
	h.add("a")
	gen := h.checkin("a", 2, 0).Generation
	nats := func(b *appliance.BrokerStatus) *appliance.BrokerStatus {
		t.Helper()
		if _, err := h.c.Checkin(context.Background(), &appliance.CheckinRequest{NodeID: "a", Capacity: 2, Generation: gen, NATS: b}, "127.0.0.1"); err != nil {
			t.Fatal(err)
		}
		n, err := h.c.Node(context.Background(), "a")
		if err != nil {
			t.Fatal(err)
		}
		if b != nil && n.NATS == b {
			t.Fatal("the view shares the request's broker status")
		}
		return n.NATS
	}
	if got := nats(nil); got != nil {
		t.Fatalf("no nats reported, view has %+v", got)
	}
	down := appliance.BrokerStatus{State: appliance.BrokerDown, Connects: 3, Drops: 3, Refused: 1}
	if got := nats(&down); got == nil || *got != down {
		t.Fatalf("view %+v, want %+v", got, down)
	}
	if got := nats(&appliance.BrokerStatus{State: appliance.BrokerUp, Connects: 4, Drops: 3}); got == nil || got.State != appliance.BrokerUp || got.Connects != 4 {
		t.Fatalf("view %+v after the reconnect", got)
	}
	if got := nats(nil); got != nil {
		t.Fatalf("broker access gone, view still has %+v", got)
	}
	nats(&down)
	h.clock.Advance(h.c.Config().Lease + time.Second)
	if n, _ := h.c.Node(context.Background(), "a"); n.Live || n.NATS != nil {
		t.Fatalf("after the lease lapsed: live %v, nats %+v", n.Live, n.NATS)
	}
}
