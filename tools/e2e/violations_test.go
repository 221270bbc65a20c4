package e2e

import (
	"strings"
	"testing"

	"github.com/discord-pxe/dpxe/tools/gatewayemu"
)

// TestViolationReport: only missed heartbeats that late emulator timers
// found are called an overloaded machine; anything else is reported as it is.
func TestViolationReport(t *testing.T) {
	late := gatewayemu.Violation{Kind: gatewayemu.KindMissedHeartbeat, TimerLateMS: 900}
	onTime := gatewayemu.Violation{Kind: gatewayemu.KindMissedHeartbeat, TimerLateMS: 3}
	early := gatewayemu.Violation{Kind: gatewayemu.KindIdentifyTooEarly}
	for _, c := range []struct {
		vs       []gatewayemu.Violation
		overload bool
	}{
		{[]gatewayemu.Violation{late, late}, true},
		{[]gatewayemu.Violation{late, onTime}, false},
		{[]gatewayemu.Violation{late, early}, false},
		{[]gatewayemu.Violation{early}, false},
	} {
		got := violationReport(c.vs)
		if strings.Contains(got, "overloaded") != c.overload {
			t.Errorf("%+v: report %q, overload claimed %v, want %v", c.vs, got, !c.overload, c.overload)
		}
		if !strings.Contains(got, string(c.vs[0].Kind)) {
			t.Errorf("report %q does not list the violation", got)
		}
	}
}
