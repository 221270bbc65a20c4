package web

import (
	"testing"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/web/view"
)

// TestBuildShardDelivery: a shard's figures, and its lag (the received
// sequence, seq plus the dispatches in flight, minus the acknowledged
// one) only when the status carries what it needs.
func TestBuildShardDelivery(t *testing.T) {
	session := func(seq, acked, inFlight uint32) appliance.ShardStatus {
		return appliance.ShardStatus{ID: 3, State: appliance.ShardReady, SeqValid: true, SessionID: "0123456789abcdef",
			ResumeURL: "ws://gw/?v=10&encoding=json", Seq: seq, EventsPublished: 1234, EventsAckedSeq: acked, EventsInFlight: inFlight}
	}
	noSession := session(0, 40, 0)
	noSession.SessionID, noSession.ResumeURL = "", ""
	notValid := session(50, 40, 0)
	notValid.SeqValid = false
	lost := session(1200, 1195, 0)
	lost.EventsLost, lost.EventsSkipped = 5, 70
	for _, c := range []struct {
		name string
		st   appliance.ShardStatus
		lag  string // "" for none shown
	}{
		// Nothing in flight: seq is the last received.
		{"all acknowledged", session(1200, 1200, 0), "0"},
		{"the last ones lost", lost, "5"},
		// In flight: seq is the one before the first in flight.
		{"in flight", session(1196, 1196, 4), "4"},
		{"in flight from the session's first", session(0, 0, 9), "9"},
		{"in flight after lost ones", session(1198, 1196, 2), "4"},
		{"acknowledged above received: an older session's", session(3, 900, 0), ""},
		{"no resumable session", noSession, ""},
		{"sequence not valid", notValid, ""},
	} {
		d := BuildShardDelivery(c.st, true)
		if d == nil {
			t.Fatalf("%s: no delivery figures", c.name)
		}
		if d.Lag != c.lag || d.Lagging != (c.lag != "" && c.lag != "0") {
			t.Errorf("%s: lag %q (lagging %v), want %q", c.name, d.Lag, d.Lagging, c.lag)
		}
		if d.Published != "1,234" || d.AckedSeq != groupDigits(uint64(c.st.EventsAckedSeq)) || d.InFlight != groupDigits(uint64(c.st.EventsInFlight)) {
			t.Errorf("%s: figures %+v", c.name, d)
		}
	}
	if d := BuildShardDelivery(lost, true); d.Lost != "5" || !d.HasLost || d.Skipped != "70" {
		t.Errorf("lost and skipped: %+v", d)
	}
	if d := BuildShardDelivery(session(10, 10, 0), false); d != nil {
		t.Errorf("a node reporting no delivery shows %+v", d)
	}
}

// TestBuildNodeDelivery: the summary's numbers and rate; nothing for a
// node without delivery.
func TestBuildNodeDelivery(t *testing.T) {
	if v := BuildNodeDelivery(nil); v != nil {
		t.Fatalf("no delivery gives %+v", v)
	}
	v := BuildNodeDelivery(&controller.NodeDelivery{Published: 123456, InFlight: 3, Lost: 1, Skipped: 0, PublishRate: 12.345, RateWindowMS: 10000})
	want := view.NodeDelivery{Published: "123,456", InFlight: "3", Lost: "1", Skipped: "0", Rate: "12.3", Window: "10 s", RateValue: 12.345, HasLost: true}
	if *v != want {
		t.Fatalf("summary %+v, want %+v", *v, want)
	}
	v = BuildNodeDelivery(&controller.NodeDelivery{Published: 5})
	if v.Rate != "" || v.Window != "" || v.RateValue != -1 || v.HasLost {
		t.Fatalf("no rate yet: %+v", *v)
	}
	for r, want := range map[float64]string{0: "0.0", 0.04: "0.0", 12.56: "12.6", 99.94: "99.9", 100: "100", 1249.6: "1,250"} {
		if got := eventRate(r); got != want {
			t.Errorf("eventRate(%v) = %q, want %q", r, got, want)
		}
	}
}

// TestSortRowsByRate: the Events/s column orders by rate, nodes with an
// unknown rate below every rate and nodes without delivery below them.
func TestSortRowsByRate(t *testing.T) {
	rows := []view.NodeRow{
		{ID: "a"},
		{ID: "b", Delivery: &view.NodeDelivery{RateValue: 20}},
		{ID: "c", Delivery: &view.NodeDelivery{RateValue: -1}},
		{ID: "d", Delivery: &view.NodeDelivery{RateValue: 3}},
	}
	sortRows(rows, "rate", true)
	got := ""
	for _, r := range rows {
		got += r.ID
	}
	if got != "bdca" {
		t.Fatalf("by rate, descending: %s, want bdca", got)
	}
	if cols := BuildColumns("rate", true, false); !hasColumn(cols, "rate", "Events/s", "descending") {
		t.Fatalf("columns %+v", cols)
	}
}

func hasColumn(cols []view.Column, key, label, sort string) bool {
	for _, c := range cols {
		if c.Key == key {
			return c.Label == label && c.Sort == sort
		}
	}
	return false
}

func TestBuildBroker(t *testing.T) {
	if BuildBroker(nil) != nil {
		t.Fatal("no broker status gives a view")
	}
	v := BuildBroker(&appliance.BrokerStatus{State: appliance.BrokerUp, Connects: 1234, Drops: 2, Refused: 0})
	if want := (view.Broker{State: "up", Up: true, Connects: "1,234", Drops: "2", Refused: "0"}); *v != want {
		t.Fatalf("%+v, want %+v", *v, want)
	}
	if v := BuildBroker(&appliance.BrokerStatus{State: appliance.BrokerDown}); v.Up || v.State != "down" {
		t.Fatalf("down: %+v", *v)
	}
}
