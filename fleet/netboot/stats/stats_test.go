package stats

import (
	"slices"
	"testing"
)

// TestCounters: counts land on their service and reason, a reason a
// service does not list counts as other, errors add their bytes, and a
// nil *Counters counts nothing without failing.
func TestCounters(t *testing.T) {
	c := New()
	c.Request(TFTP)
	c.Request(TFTP)
	c.Answer(TFTP, 100)
	c.Error(TFTP, 20)
	c.Refuse(TFTP, Write)
	c.Refuse(TFTP, Misdirected) // an HTTP reason: other for TFTP
	c.Refuse(HTTP, Misdirected)
	var nilc *Counters
	nilc.Request(DHCP)
	nilc.Answer(DHCP, 1)
	nilc.Refuse(DHCP, Invalid)
	nilc.Error(DHCP, 1)
	snap := c.Snapshot()
	tf := snap[TFTP]
	if tf.Service != TFTP || tf.Requests != 2 || tf.Answers != 1 || tf.Errors != 1 || tf.Bytes != 120 {
		t.Fatalf("tftp %+v", tf)
	}
	want := make([]uint64, len(Reasons[TFTP]))
	want[slices.Index(Reasons[TFTP], Write)] = 1
	want[slices.Index(Reasons[TFTP], Other)] = 1
	if !slices.Equal(tf.Refusals, want) {
		t.Fatalf("tftp refusals %v, want %v (%v)", tf.Refusals, want, Reasons[TFTP])
	}
	if h := snap[HTTP]; h.Refusals[slices.Index(Reasons[HTTP], Misdirected)] != 1 || h.Requests != 0 {
		t.Fatalf("http %+v", h)
	}
	for _, s := range Services {
		if Reasons[s][len(Reasons[s])-1] != Other {
			t.Errorf("%s: reasons do not end with other", s)
		}
	}
}
