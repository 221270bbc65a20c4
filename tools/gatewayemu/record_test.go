package gatewayemu

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestRecordMalformedFrames sends one malformed frame of each kind on its
// own connection and checks the counts by reason, emulator-wide, per
// connection and in /debug/state, and the largest client frame.
func TestRecordMalformedFrames(t *testing.T) {
	t.Parallel()
	emu := startEmu(t, fastOptions())
	big := `{"op":1,"d":null,"pad":"` + strings.Repeat("x", MaxPayloadBytes) + `"}`
	cases := []struct {
		reason string
		send   func(c *wsClient)
	}{
		{FrameOversize, func(c *wsClient) { c.sendRaw(big) }},
		{FrameBinary, func(c *wsClient) { c.ws.Write(t.Context(), websocket.MessageBinary, []byte(`{"op":1,"d":null}`)) }},
		{FrameNotJSON, func(c *wsClient) { c.sendRaw("{op") }},
		{FrameMissingOp, func(c *wsClient) { c.sendRaw(`{"d":null}`) }},
		{FrameInvalidD, func(c *wsClient) { c.sendRaw(`{"op":1,"d":"x"}`) }},
		{FrameUnknownOpcode, func(c *wsClient) { c.send(5, nil) }},
	}
	conns := map[uint64]string{}
	for i, tc := range cases {
		c := connect(t, emu)
		tc.send(c)
		c.expectClose(map[bool]int{true: CloseUnknownOpcode, false: CloseDecodeError}[tc.reason == FrameInvalidD || tc.reason == FrameUnknownOpcode])
		conns[uint64(i+1)] = tc.reason
	}
	st := awaitState(t, emu, "every connection closed", func(s State) bool { return s.Counters.OpenConnections == 0 })
	want := map[string]uint64{}
	for _, tc := range cases {
		want[tc.reason] = 1
	}
	if fmt.Sprint(st.MalformedClientFrames) != fmt.Sprint(want) || fmt.Sprint(emu.MalformedClientFrames()) != fmt.Sprint(want) {
		t.Fatalf("malformed frames %v, want %v", st.MalformedClientFrames, want)
	}
	if len(st.Connections) != len(cases) {
		t.Fatalf("%d connection records", len(st.Connections))
	}
	for _, cs := range st.Connections {
		reason := conns[cs.Conn]
		if cs.Open || len(cs.MalformedFrames) != 1 || cs.MalformedFrames[reason] != 1 {
			t.Fatalf("conn %d (%s): %+v", cs.Conn, reason, cs)
		}
		if (reason == FrameOversize) != (cs.MaxClientFrameBytes > MaxPayloadBytes) {
			t.Fatalf("conn %d (%s): largest frame %d", cs.Conn, reason, cs.MaxClientFrameBytes)
		}
	}
}

// TestRecordSendLimitUse checks the record of the send limit: the most
// client events inside any window, as windows slide, and the event that
// broke the limit.
func TestRecordSendLimitUse(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	o := fastOptions()
	o.Now = clock.Now
	o.SendLimit = 10
	o.SendWindow = time.Minute
	emu := startEmu(t, o)
	beats := func(c *wsClient, n int) {
		for range n {
			c.send(OpHeartbeat, nil)
			c.expectOp(OpHeartbeatACK)
		}
	}
	stats := func(conn uint64) ConnStats {
		for _, cs := range emu.ConnStats() {
			if cs.Conn == conn {
				return cs
			}
		}
		t.Fatalf("no record of conn %d", conn)
		return ConnStats{}
	}
	c := connect(t, emu)
	beats(c, 4)
	clock.Advance(30 * time.Second)
	beats(c, 3) // 7 in the window
	clock.Advance(30 * time.Second)
	beats(c, 2) // the first 4 left it: 5
	if cs := stats(1); cs.ClientEvents != 9 || cs.MaxEventsInWindow != 7 || cs.SendLimit != 10 || !cs.Open {
		t.Fatalf("record %+v, want 9 events, at most 7 in a window", cs)
	}
	c2 := connect(t, emu)
	beats(c2, 10) // the whole budget: fine
	if cs := stats(2); cs.MaxEventsInWindow != 10 {
		t.Fatalf("record %+v, want 10 in a window", cs)
	}
	noViolations(t, emu)
	c2.send(OpHeartbeat, nil)
	c2.expectClose(CloseRateLimited)
	cs := stats(2)
	if cs.ClientEvents != 11 || cs.MaxEventsInWindow != 11 {
		t.Fatalf("record %+v, want the 11th event in the window", cs)
	}
	if k := violationKinds(emu); len(k) != 1 || k[0] != KindRateLimited {
		t.Fatalf("violations %v", k)
	}
}
