package appliance

import "math/bits"

// This file is the Go reference of a shard's heartbeat-to-ACK latency
// (issue 18: what Discord libraries call ping), kept by the kernel's
// shard_note_ping, shard_ack_overdue and shard_ping_summary
// (kernel/shard/shard.inc) and compared by the self-test digest "ping".
//
// The kernel measures on the TSC from the moment a heartbeat is handed to
// TCP (ShardContext.HeartbeatSent) to the main-loop pass that reads its ACK
// (op 11). It keeps the last latency and the last PingWindow ones, reported
// in the check-in as ping_ms, ping_avg_ms and ping_max_ms. A heartbeat whose
// ACK takes longer than AckBoundMS flags the shard (FlagAckSlow, reported
// as ack_slow) before the zombie rule ends the connection: that happens only
// when the next heartbeat is due, a whole interval after the last one.

// PingWindow is how many latencies the moving summary covers.
const PingWindow = 8

// PingSlowMS is the most an ACK may take before a shard is flagged slow,
// whatever the heartbeat interval. Discord's interval is 41.25 s and a
// healthy ping tens of milliseconds: a second is far out, and far short of
// the zombie.
const PingSlowMS = 1000

// AckBoundMS is the latency over which a shard's heartbeat ACK is late:
// half the heartbeat interval, at most PingSlowMS, at least 1 ms. Half the
// interval leaves the other half for the flag to be seen before the zombie
// rule applies.
func AckBoundMS(heartbeatMS uint32) uint32 {
	return max(1, min(PingSlowMS, heartbeatMS/2))
}

// MaxPingMS is the largest latency a check-in can report, in milliseconds:
// the kernel keeps microseconds in 32 bits.
const MaxPingMS = float64(^uint32(0)) / 1000

// cyclesPerMSOrGuess is the kernel's TSC rate: calibrated, or the 1 GHz
// guess when calibration failed.
func cyclesPerMSOrGuess(cyclesPerMS uint64) uint64 {
	if cyclesPerMS == 0 {
		return TSCGuessCyclesPerMS
	}
	return cyclesPerMS
}

// CyclesToMicros converts a TSC interval to microseconds as the kernel does
// (tsc_cycles_to_us, then saturated to 32 bits).
func CyclesToMicros(cycles, cyclesPerMS uint64) uint32 {
	perMS := cyclesPerMSOrGuess(cyclesPerMS)
	hi, lo := bits.Mul64(cycles, 1000)
	if hi >= perMS {
		return ^uint32(0)
	}
	q, _ := bits.Div64(hi, lo, perMS)
	if q > uint64(^uint32(0)) {
		return ^uint32(0)
	}
	return uint32(q)
}

// msToCycles is milliseconds in TSC cycles, all ones when it does not fit.
func msToCycles(ms uint32, cyclesPerMS uint64) uint64 {
	hi, lo := bits.Mul64(uint64(ms), cyclesPerMSOrGuess(cyclesPerMS))
	if hi != 0 {
		return ^uint64(0)
	}
	return lo
}

// NotePing records the latency of one heartbeat (TSC cycles from its send
// to its ACK): the last value, the next entry of the window, the count; and
// the slow flag, set when the latency is over AckBoundMS, cleared otherwise.
func (s *ShardContext) NotePing(cycles, cyclesPerMS uint64) {
	us := CyclesToMicros(cycles, cyclesPerMS)
	s.PingLastMicros = us
	s.PingRing[s.PingCount%PingWindow] = us
	s.PingCount++
	if cycles > msToCycles(AckBoundMS(s.HeartbeatMillis), cyclesPerMS) {
		s.Flags |= FlagAckSlow
	} else {
		s.Flags &^= FlagAckSlow
	}
}

// CheckAckOverdue flags the shard slow while the ACK of its last heartbeat
// is awaited longer than AckBoundMS, and reports whether it set the flag
// just now (the kernel prints a line then). now before HeartbeatSent counts
// as no time at all.
func (s *ShardContext) CheckAckOverdue(nowTSC, cyclesPerMS uint64) bool {
	if s.Flags&FlagAwaitingAck == 0 || s.Flags&FlagAckSlow != 0 {
		return false
	}
	var waited uint64
	if nowTSC > s.HeartbeatSent {
		waited = nowTSC - s.HeartbeatSent
	}
	if waited <= msToCycles(AckBoundMS(s.HeartbeatMillis), cyclesPerMS) {
		return false
	}
	s.Flags |= FlagAckSlow
	return true
}

// PingSummary returns the mean (rounded down) and the largest of the
// latencies in the window, in microseconds; 0, 0 before the first.
func (s *ShardContext) PingSummary() (mean, most uint32) {
	n := min(s.PingCount, PingWindow)
	if n == 0 {
		return 0, 0
	}
	var sum uint64
	for _, us := range s.PingRing[:n] {
		sum += uint64(us)
		most = max(most, us)
	}
	return uint32(sum / uint64(n)), most
}
