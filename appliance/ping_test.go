package appliance

import "testing"

func TestAckBoundMS(t *testing.T) {
	for _, c := range []struct{ interval, want uint32 }{
		{41250, PingSlowMS}, {2000, 1000}, {1000, 500}, {3, 1}, {1, 1}, {0, 1},
	} {
		if got := AckBoundMS(c.interval); got != c.want {
			t.Errorf("AckBoundMS(%d) = %d, want %d", c.interval, got, c.want)
		}
	}
}

func TestCyclesToMicros(t *testing.T) {
	const perMS = 2_500_000 // 2.5 GHz
	for _, c := range []struct {
		cycles, perMS uint64
		want          uint32
	}{
		{0, perMS, 0},
		{2500, perMS, 1},
		{2499, perMS, 0}, // rounded down, as tsc_cycles_to_us
		{perMS * 41, perMS, 41000},
		{1000, 0, 1},                           // uncalibrated: 1 GHz
		{perMS * 5_000_000, perMS, ^uint32(0)}, // 5000 s: over 32 bits of µs
		{^uint64(0), 1, ^uint32(0)},
	} {
		if got := CyclesToMicros(c.cycles, c.perMS); got != c.want {
			t.Errorf("CyclesToMicros(%d, %d) = %d, want %d", c.cycles, c.perMS, got, c.want)
		}
	}
}

func TestNotePingSummary(t *testing.T) {
	const perMS = 1_000_000
	s := ShardContext{HeartbeatMillis: 41250}
	if m, x := s.PingSummary(); m != 0 || x != 0 {
		t.Fatalf("no samples: summary %d %d", m, x)
	}
	for i, ms := range []uint64{20, 40, 30} {
		s.NotePing(ms*perMS, perMS)
		if s.PingLastMicros != uint32(ms*1000) || s.PingCount != uint32(i+1) {
			t.Fatalf("after %d ms: last %d count %d", ms, s.PingLastMicros, s.PingCount)
		}
	}
	if m, x := s.PingSummary(); m != 30000 || x != 40000 {
		t.Errorf("summary of 20, 40, 30 ms: mean %d max %d µs, want 30000 40000", m, x)
	}
	// Ten more of 10 ms: the window holds only the last 8.
	for range 10 {
		s.NotePing(10*perMS, perMS)
	}
	if m, x := s.PingSummary(); m != 10000 || x != 10000 {
		t.Errorf("after the window moved on: mean %d max %d", m, x)
	}
	if s.Flags&FlagAckSlow != 0 {
		t.Error("a 10 ms ping flagged slow")
	}
	s.NotePing(1001*perMS, perMS) // over PingSlowMS
	if s.Flags&FlagAckSlow == 0 {
		t.Error("a 1001 ms ping not flagged slow")
	}
	s.NotePing(1000*perMS, perMS) // at the bound: not over it
	if s.Flags&FlagAckSlow != 0 {
		t.Error("a ping at the bound still flagged slow")
	}
}

func TestCheckAckOverdue(t *testing.T) {
	const perMS = 1_000_000
	s := ShardContext{HeartbeatMillis: 1000, HeartbeatSent: 5 * perMS} // bound 500 ms
	if s.CheckAckOverdue(10*perMS, perMS) {
		t.Error("flagged while no ACK is awaited")
	}
	s.Flags |= FlagAwaitingAck
	if s.CheckAckOverdue(505*perMS, perMS) || s.Flags&FlagAckSlow != 0 {
		t.Error("flagged at the bound")
	}
	if !s.CheckAckOverdue(505*perMS+1, perMS) || s.Flags&FlagAckSlow == 0 {
		t.Error("not flagged past the bound")
	}
	if s.CheckAckOverdue(900*perMS, perMS) {
		t.Error("flagged twice: only the first time is news")
	}
	// The ACK comes late: still slow; the next one in time clears it.
	s.NotePing(700*perMS, perMS)
	s.NoteAck()
	if s.Flags&FlagAckSlow == 0 {
		t.Error("a 700 ms ACK cleared the slow flag")
	}
	s.NotePing(3*perMS, perMS)
	if s.Flags&FlagAckSlow != 0 {
		t.Error("a 3 ms ACK did not clear the slow flag")
	}
	s.Flags |= FlagAwaitingAck
	s.HeartbeatSent = 10 * perMS
	if s.CheckAckOverdue(9*perMS, perMS) {
		t.Error("a clock before the send counts as overdue")
	}
}
