package appliance

import (
	"encoding/binary"
	"fmt"
	"reflect"
	"strconv"
	"strings"
)

// This file is the Go reference of the shard kernel's runtime core
// (kernel/shard/shard.inc), following seeds 000 and 001. Every formula the
// kernel computes has one function here; the self-test boots the kernel and
// compares digests over thousands of cases (SelfTestDigests), and a layout
// test compares ShardContext's offsets with the kernel's struc SHARD.

// Kernel shard states as numbers (SHARD.state). On the wire the kernel
// sends their names, the ShardState strings.
const (
	KernelStateIdle     uint32 = 0 // slot not in use
	KernelStateAssigned uint32 = 1
	KernelStateStarting uint32 = 2
	KernelStateReady    uint32 = 3
	KernelStateBackoff  uint32 = 4
	KernelStateFatal    uint32 = 5
)

// Shard flags (SHARD.flags).
const (
	FlagAwaitingAck  uint32 = 1 << 0 // heartbeat sent, ACK not yet seen
	FlagReady        uint32 = 1 << 1 // READY observed on this session
	FlagSeqValid     uint32 = 1 << 2 // Sequence is meaningful
	FlagIdentified   uint32 = 1 << 3 // Identify sent on this connection
	FlagLeaseStopped uint32 = 1 << 4 // stopped because the node's lease lapsed
	FlagPending      uint32 = 1 << 5 // assigned, but the previous owner has not released it
	FlagHeld         uint32 = 1 << 6 // assigned, but beyond the node's capacity: not started (CapacityCut)
	FlagAckSlow      uint32 = 1 << 7 // the heartbeat ACK came, or is overdue, later than AckBoundMS
)

// Runtime constants from the seeds.
const (
	SeqNone                 uint32 = 0xFFFFFFFF // no usable sequence
	HeartbeatJitterSlots           = 20         // seed 000: 20 deterministic first-heartbeat slots
	ReconnectBackoffMillis         = 5000       // seed 001: fixed reconnect delay
	maxLeaseStoppableStates        = KernelStateBackoff
)

// Session mirrors the kernel's struc SESSION: a Gateway session that may be
// resumed.
type Session struct {
	Valid     uint32    `kernel:"valid"`
	IDLen     uint32    `kernel:"id_len"`
	ID        [64]byte  `kernel:"id"`
	ResumeURL [224]byte `kernel:"resume_url"`
}

// ShardContext mirrors the kernel's struc SHARD field for field; the field
// order and sizes are the kernel's, so unsafe-free reflection gives the same
// offsets (checked by the layout test against a booted kernel).
type ShardContext struct {
	ID                uint32  `kernel:"id"`
	Total             uint32  `kernel:"total"`
	State             uint32  `kernel:"state"`
	Flags             uint32  `kernel:"flags"`
	Sequence          uint32  `kernel:"sequence"`
	HeartbeatMillis   uint32  `kernel:"heartbeat_ms"`
	HeartbeatMisses   uint32  `kernel:"heartbeat_misses"`
	IdentifyBucket    uint32  `kernel:"identify_bucket"`
	LastError         uint32  `kernel:"last_error"`
	LeaseGeneration   uint32  `kernel:"lease_generation"`
	HeartbeatDeadline uint64  `kernel:"heartbeat_deadline"`
	HeartbeatSent     uint64  `kernel:"heartbeat_sent"`
	HeartbeatAcks     uint64  `kernel:"heartbeat_acks"`
	SessionPtr        uint64  `kernel:"session_ptr"` // nonzero when Session exists
	Reconnects        uint64  `kernel:"reconnects"`
	ReconnectDeadline uint64  `kernel:"reconnect_deadline"`
	SessionGeneration uint64  `kernel:"session_generation"`
	Session           Session `kernel:"session"`
	// The heartbeat-to-ACK latency (ping.go): the last one and the last
	// PingWindow, in microseconds, and how many were measured on the slot.
	PingLastMicros uint32             `kernel:"ping_last_us"`
	PingCount      uint32             `kernel:"ping_count"`
	PingRing       [PingWindow]uint32 `kernel:"ping_ring"`
}

// LayoutField is one field of a kernel structure.
type LayoutField struct {
	Name   string
	Offset uintptr
}

// ShardLayout returns the offsets of ShardContext's fields under their
// kernel names, and the structure's size.
func ShardLayout() ([]LayoutField, uintptr) {
	t := reflect.TypeOf(ShardContext{})
	out := make([]LayoutField, t.NumField())
	for i := range out {
		f := t.Field(i)
		out[i] = LayoutField{Name: f.Tag.Get("kernel"), Offset: f.Offset}
	}
	return out, t.Size()
}

// AssignIdentifyBucket stores and returns shard_id % max(max_concurrency, 1).
func (s *ShardContext) AssignIdentifyBucket(maxConcurrency uint32) uint32 {
	s.IdentifyBucket = IdentifyBucket(s.ID, maxConcurrency)
	return s.IdentifyBucket
}

// FirstHeartbeatDelayMillis is the first-heartbeat delay of seed 000:
// max(1, interval * ((id % 20) + 1) / 20), computed without overflow.
func FirstHeartbeatDelayMillis(shardID, intervalMillis uint32) uint64 {
	factor := uint64(shardID%HeartbeatJitterSlots) + 1
	d := uint64(intervalMillis) * factor / HeartbeatJitterSlots
	return max(d, 1)
}

// ScheduleFirstHeartbeat sets HeartbeatDeadline to now plus the first
// heartbeat delay in TSC cycles. It refuses (returns false, deadline
// untouched) when the interval or the TSC calibration is zero.
func (s *ShardContext) ScheduleFirstHeartbeat(nowTSC, cyclesPerMilli uint64) bool {
	if s.HeartbeatMillis == 0 || cyclesPerMilli == 0 {
		return false
	}
	s.HeartbeatDeadline = nowTSC + FirstHeartbeatDelayMillis(s.ID, s.HeartbeatMillis)*cyclesPerMilli
	return true
}

// NoteAck records a heartbeat ACK: count it, clear AWAITING_ACK, reset misses.
func (s *ShardContext) NoteAck() {
	s.HeartbeatAcks++
	s.Flags &^= FlagAwaitingAck
	s.HeartbeatMisses = 0
}

// BehindBeats is how many heartbeats in a row a shard that was behind on
// reading may send with an ACK owed before the zombie rule applies
// (kernel GW_BEHIND_BEATS).
const BehindBeats = 3

// BeatVerdict is what a due heartbeat does under the zombie rule (kernel
// BEAT_*, shard_beat_verdict).
type BeatVerdict uint32

// The verdicts, numbered as the kernel's.
const (
	BeatSend      BeatVerdict = 0 // the last heartbeat was acknowledged: send
	BeatOwed      BeatVerdict = 1 // ACK owed, the shard behind on reading: send, the rule put off
	BeatOwedFirst BeatVerdict = 2 // the same on the streak's first miss (the kernel logs it)
	BeatZombie    BeatVerdict = 3 // ACK owed and not excused: close the connection
)

// BeatVerdict is the zombie rule of seed 000 with the kernel's read-budget
// exception, for a heartbeat that is due (gw_heartbeat_tick). Without
// FlagAwaitingAck it is BeatSend and the miss streak is kept. With it the
// streak grows by one; the connection is a zombie unless behind (the read
// budget or delivery's full window left the connection's bytes unread
// since the last heartbeat, so its ACK may be queued behind them) and the
// streak is at most BehindBeats, in which case the heartbeat is sent anyway
// (BeatOwedFirst on the first miss). Flags are not changed.
//
// HeartbeatMisses is a uint32 that wraps as the kernel's INC does: after
// 0xFFFFFFFF it is 0, which a behind shard sends as BeatOwed (0 is neither
// over the bound nor the first miss). That takes 2^32 heartbeats without
// an ACK, each past the bound resetting the connection, so it does not
// happen; the two sides agree on it anyway.
func (s *ShardContext) BeatVerdict(behind bool) BeatVerdict {
	if s.Flags&FlagAwaitingAck == 0 {
		return BeatSend
	}
	s.HeartbeatMisses++
	switch {
	case !behind || s.HeartbeatMisses > BehindBeats:
		return BeatZombie
	case s.HeartbeatMisses == 1:
		return BeatOwedFirst
	}
	return BeatOwed
}

// MarkReady records READY: state READY, the READY flag, the next session generation.
func (s *ShardContext) MarkReady() {
	s.State = KernelStateReady
	s.Flags |= FlagReady
	s.SessionGeneration++
}

// ScheduleBackoff moves the shard to BACKOFF after a transport failure,
// counts the reconnect and sets the retry deadline 5000 ms ahead; without a
// calibrated TSC the deadline is 0 ("schedule the normal backoff now").
func (s *ShardContext) ScheduleBackoff(nowTSC, cyclesPerMilli uint64) {
	s.State = KernelStateBackoff
	s.Reconnects++
	if cyclesPerMilli == 0 {
		s.ReconnectDeadline = 0
		return
	}
	s.ReconnectDeadline = nowTSC + cyclesPerMilli*ReconnectBackoffMillis
}

// RestoreResumeState keeps the saved sequence after a transport reset only
// when the session is valid and the saved flags had SEQ_VALID (seed 001);
// otherwise the sequence becomes SeqNone and SEQ_VALID is cleared, so the
// shard Identifies afresh. (The seed's fragment leaves the flag as the reset
// left it; clearing it keeps flag and sentinel consistent.)
func (s *ShardContext) RestoreResumeState(savedSequence, savedFlags uint32) {
	if s.SessionPtr != 0 && s.Session.Valid == 1 && savedFlags&FlagSeqValid != 0 {
		s.Sequence = savedSequence
		s.Flags |= FlagSeqValid
		return
	}
	s.Sequence = SeqNone
	s.Flags &^= FlagSeqValid
}

// CanResume reports whether a reconnect should Resume rather than Identify:
// a valid session and a valid sequence.
func (s *ShardContext) CanResume() bool {
	return s.SessionPtr != 0 && s.Session.Valid == 1 && s.Flags&FlagSeqValid != 0
}

// ShardRuntime mirrors the kernel's struc SHARDRT for lease gating.
type ShardRuntime struct {
	Shards        []ShardContext
	LeaseExpired  bool
	LeaseDeadline uint64 // TSC; 0 = lease enforcement off
	Stopped       uint32 // shards stopped by the last expiry
}

// LeaseTick expires the lease once now reaches the deadline (seed 001):
// nothing when already expired or when the deadline is 0.
func (r *ShardRuntime) LeaseTick(nowTSC uint64) {
	if r.LeaseExpired || r.LeaseDeadline == 0 {
		return
	}
	if nowTSC >= r.LeaseDeadline {
		r.ExpireLease()
	}
}

// ExpireLease marks the lease lapsed and stops every starting, ready or
// backing-off shard (back to ASSIGNED, LEASE_STOPPED set); FATAL stays FATAL.
func (r *ShardRuntime) ExpireLease() {
	r.LeaseExpired = true
	r.Stopped = 0
	for i := range r.Shards {
		s := &r.Shards[i]
		if s.State >= KernelStateStarting && s.State <= maxLeaseStoppableStates {
			s.State = KernelStateAssigned
			s.Flags &^= FlagAwaitingAck | FlagReady
			s.Flags |= FlagLeaseStopped
			r.Stopped++
		}
	}
}

// SelfTestCases is how many pseudo-random cases the kernel self-test runs
// per formula.
const SelfTestCases = 4096

// SelfTestFormulas names the digests in the order the kernel prints them.
var SelfTestFormulas = []string{"bucket", "heartbeat", "ack", "ready", "backoff", "resume", "lease", "route", "grant", "capacity", "ping", "budget", "tsccal", "ctlswitch", "rfc3339", "ttime", "handover", "beat"}

// splitmix64 is the PRNG both sides implement (Steele, Lea, Flood 2014).
type splitmix64 struct{ state uint64 }

func (p *splitmix64) next() uint64 {
	p.state += 0x9E3779B97F4A7C15
	z := p.state
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// digest folds 64-bit words FNV-1a style: d = (d ^ w) * prime.
type digest uint64

func newDigest() digest          { return 0xCBF29CE484222325 }
func (d *digest) add(w uint64)   { *d = digest((uint64(*d) ^ w) * 0x100000001B3) }
func (d *digest) add32(w uint32) { d.add(uint64(w)) }

// SelfTestDigests computes, for a seed, the digest of every formula over
// SelfTestCases cases generated exactly as kernel/selftest/selftest.inc
// generates them. The kernel prints the same values on a correct build.
func SelfTestDigests(seed uint32) map[string]uint64 {
	rng := &splitmix64{state: uint64(seed)}
	out := map[string]uint64{}
	run := func(name string, one func(d *digest)) {
		d := newDigest()
		for i := 0; i < SelfTestCases; i++ {
			one(&d)
		}
		out[name] = uint64(d)
	}
	run("bucket", func(d *digest) {
		r := rng.next()
		s := ShardContext{ID: uint32(r)}
		d.add32(s.AssignIdentifyBucket(uint32(r>>32) % 70))
	})
	run("heartbeat", func(d *digest) {
		r1, r2, r3 := rng.next(), rng.next(), rng.next()
		s := ShardContext{ID: uint32(r1), HeartbeatMillis: uint32(r1>>32) >> (r2 & 31)}
		var cycles uint64
		if (r2>>5)&7 != 0 {
			cycles = r2 >> 40
		}
		ok := s.ScheduleFirstHeartbeat(r3, cycles)
		d.add(b2u(ok))
		d.add(s.HeartbeatDeadline)
	})
	run("ack", func(d *digest) {
		r1, r2 := rng.next(), rng.next()
		s := ShardContext{HeartbeatAcks: r1, Flags: uint32(r2), HeartbeatMisses: uint32(r2 >> 32)}
		s.NoteAck()
		d.add(s.HeartbeatAcks)
		d.add32(s.Flags)
		d.add32(s.HeartbeatMisses)
	})
	run("ready", func(d *digest) {
		r1, r2 := rng.next(), rng.next()
		s := ShardContext{State: uint32(r1), Flags: uint32(r1 >> 32), SessionGeneration: r2}
		s.MarkReady()
		d.add32(s.State)
		d.add32(s.Flags)
		d.add(s.SessionGeneration)
	})
	run("backoff", func(d *digest) {
		r1, r2, r3 := rng.next(), rng.next(), rng.next()
		s := ShardContext{State: uint32(r1), Reconnects: r2}
		var cycles uint64
		if (r1>>32)&3 != 0 {
			cycles = r1 >> 40
		}
		s.ScheduleBackoff(r3, cycles)
		d.add32(s.State)
		d.add(s.Reconnects)
		d.add(s.ReconnectDeadline)
	})
	run("resume", func(d *digest) {
		r1, r2, r3 := rng.next(), rng.next(), rng.next()
		s := ShardContext{Flags: uint32(r3), Sequence: uint32(r3 >> 32)}
		switch r1 % 3 {
		case 1:
			s.SessionPtr = 1
		case 2:
			s.SessionPtr = 1
			s.Session.Valid = 1
		}
		s.RestoreResumeState(uint32(r2), uint32(r2>>32))
		d.add32(s.Sequence)
		d.add32(s.Flags)
	})
	run("lease", func(d *digest) {
		r1, r2, r3 := rng.next(), rng.next(), rng.next()
		rt := ShardRuntime{LeaseExpired: r1&7 == 0}
		if (r1>>3)&3 != 0 {
			rt.LeaseDeadline = r2
		}
		rt.Shards = make([]ShardContext, (r1>>8)%5)
		for j := range rt.Shards {
			s := rng.next()
			rt.Shards[j].State = uint32(s) % 6
			rt.Shards[j].Flags = uint32(s >> 32)
		}
		rt.LeaseTick(r3)
		d.add(b2u(rt.LeaseExpired))
		d.add32(rt.Stopped)
		for _, s := range rt.Shards {
			d.add32(s.State)
			d.add32(s.Flags)
		}
	})
	run("route", func(d *digest) {
		guild, r2 := rng.next(), rng.next()
		total := uint32(r2) % 300000
		if total == 0 { // the kernel refuses a zero total (CF set)
			d.add(^uint64(0))
			return
		}
		d.add32(ShardForGuild(guild, total))
	})
	run("grant", func(d *digest) {
		r1, r2 := rng.next(), rng.next()
		within := uint32(r2>>8) & 0x3FF // 0: the default
		var perMS uint64
		if (r2>>20)&3 != 0 {
			perMS = r2 >> 24
		}
		limit := grantLimitTSC(perMS, within)
		elapsed := r1 >> (r2 & 63)
		if (r2>>40)&3 == 0 { // at the boundary: limit-1 .. limit+2
			elapsed = limit - 1 + r1&3
		}
		d.add(b2u(GrantUsableTSC(elapsed, perMS, within)))
		d.add(limit)
	})
	run("capacity", func(d *digest) {
		r1 := rng.next()
		n := uint32(r1) % 129
		capacity := int(uint32(r1>>32) % 131)
		ids, kinds := make([]uint32, n), make([]uint8, n)
		for j := range ids {
			e := rng.next()
			ids[j] = uint32(e) % 200
			kinds[j] = uint8(e>>32) & 3
		}
		d.add(uint64(CapacityCut(ids, kinds, capacity)))
		for _, k := range kinds {
			d.add(uint64(k))
		}
	})
	run("ping", func(d *digest) {
		r1, r2, r3, r4 := rng.next(), rng.next(), rng.next(), rng.next()
		s := ShardContext{HeartbeatMillis: uint32(r1) >> ((r1 >> 32) & 31), Flags: uint32(r2), PingCount: uint32(r2>>32) % 20}
		for j := range s.PingRing {
			s.PingRing[j] = uint32(rng.next())
		}
		s.HeartbeatSent = r1
		var perMS uint64
		if r4&3 != 0 {
			perMS = r4 >> 40
		}
		now := r1 + r3>>((r3>>6)&63)
		flagged := s.CheckAckOverdue(now, perMS)
		s.NotePing(r3>>(r3&63), perMS)
		mean, most := s.PingSummary()
		d.add(b2u(flagged))
		d.add32(s.Flags)
		d.add32(s.PingLastMicros)
		d.add32(s.PingCount)
		d.add32(mean)
		d.add32(most)
	})
	run("budget", func(d *digest) {
		r1, r2 := rng.next(), rng.next()
		var l SendLog
		interval := uint32(r1) % 70000
		var perMS uint64
		if (r1>>32)&3 != 0 {
			perMS = 1_000_000 + (r1>>40)&0xFFFFF
		}
		now := r2 >> 8
		for n := (r1 >> 17) % 160; n > 0; n-- {
			e := rng.next()
			now += ((e >> 33) & 0x7FFFFFFF) >> ((e >> 2) & 15)
			if e&3 == 0 { // a heartbeat: always sent
				l.Note(now)
				continue
			}
			ok, wait := l.Allows(now, perMS, interval)
			d.add(b2u(ok))
			d.add(wait)
			if ok {
				l.Note(now)
			}
		}
		d.add32(l.Count)
		d.add32(l.Head)
		d.add32(l.InWindow(now, perMS))
	})
	run("tsccal", func(d *digest) {
		r1, r2, r3 := rng.next(), rng.next(), rng.next()
		span := r1 >> (r3 & 63)
		ticks := (r2 & 0xFFFFF) >> ((r3 >> 6) & 15)
		brackets := (r2 >> 20) >> ((r3 >> 12) & 63)
		num, den := uint64(FemtosecondsPerMS), (r3>>19)&0x7FFFFFF // an HPET
		if (r3>>18)&1 != 0 {
			num, den = PITHz, 1000 // the PIT
		}
		perMS, ok := TSCCalResult(span, ticks, brackets, num, den)
		d.add(b2u(ok))
		d.add(perMS)
		d.add(Median3(r1, r2, r3))
	})
	run("ctlswitch", func(d *digest) {
		r := rng.next()
		since := uint32(r) >> ((r >> 32) & 31)
		lease := uint32(r>>37) >> ((r >> 59) & 15)
		if (r>>36)&1 != 0 { // near the boundary
			since = lease/3 - 1 + uint32(r>>33)&3
		}
		if (r>>35)&1 != 0 {
			lease = 0
		}
		d.add(b2u(ControllerSwitchDue(since, lease)))
	})
	run("rfc3339", func(d *digest) {
		r := rng.next()
		var buf [32]byte
		copy(buf[:], RFC3339Micro(int64(r%253402300800), uint32((r>>40)%1000000)))
		for i := 0; i < 32; i += 8 {
			d.add(binary.LittleEndian.Uint64(buf[i:]))
		}
	})
	run("ttime", func(d *digest) {
		r1, r2, r3 := rng.next(), rng.next(), rng.next()
		timeMS := r1 % (TrustedTimeMSMax + 1)
		cycles := r2 >> (r3 & 63)
		perMS := r3 >> 40
		if (r3>>6)&1 != 0 {
			perMS = 0 // uncalibrated
		}
		d.add(TrustedNowSeconds(timeMS, cycles, perMS))
	})
	run("handover", func(d *digest) {
		r1, r2 := rng.next(), rng.next()
		received := uint32(r1) >> ((r2 >> 16) & 31)
		k := uint32(r2>>8) & 0xFF
		var first uint32
		switch (r2 >> 1) & 3 {
		case 0:
			first = uint32(r1 >> 32)
		case 1: // at or below the sequence received
			first = received + 1 - k
		case 2: // the session's first dispatch, or 0
			first = uint32(r2>>10) & 1
		case 3: // above it (an older session's)
			first = received + 1 + k
		}
		d.add32(HandoverSeq(received, r2&1 != 0, first))
	})
	run("beat", func(d *digest) {
		r1, r2 := rng.next(), rng.next()
		s := ShardContext{Flags: uint32(r1)}
		k := uint32(r2>>34) & 7
		switch (r2 >> 32) & 3 {
		case 0:
			s.HeartbeatMisses = uint32(r1 >> 32)
		case 2: // at the wrap
			s.HeartbeatMisses = ^(k & 3)
		default: // around the bound
			s.HeartbeatMisses = k
		}
		var behind uint32
		if (r2>>40)&1 != 0 {
			behind = uint32(r2) >> ((r2 >> 41) & 31)
		}
		d.add32(uint32(s.BeatVerdict(behind != 0)))
		d.add32(s.HeartbeatMisses)
		d.add32(s.Flags)
	})
	return out
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// SelfTestReport is what a kernel self-test run printed, parsed.
type SelfTestReport struct {
	Seed     uint32
	Digests  map[string]uint64
	Layout   map[string]uintptr // field name -> offset
	Size     uintptr            // SHARD size
	CfgKeys  []string
	CfgCases []string // "ok ...", "reject OFFSET key=K" or "toolong", by case number
	Passed   bool
}

// ParseSelfTestReport reads the kernel's self-test lines from a serial log.
// It ignores every other line; a malformed self-test line is an error.
func ParseSelfTestReport(serial string) (*SelfTestReport, error) {
	r := &SelfTestReport{Digests: map[string]uint64{}, Layout: map[string]uintptr{}}
	for _, line := range strings.Split(serial, "\n") {
		line = strings.TrimRight(line, "\r")
		f := strings.Fields(line)
		switch {
		case strings.HasPrefix(line, "selftest: seed="):
			n, err := strconv.ParseUint(strings.TrimPrefix(line, "selftest: seed="), 10, 32)
			if err != nil {
				return nil, fmt.Errorf("self-test seed line %q: %v", line, err)
			}
			r.Seed = uint32(n)
		case line == "selftest: pass":
			r.Passed = true
		case len(f) == 5 && f[0] == "selftest" && f[1] == "digest":
			v, err := strconv.ParseUint(strings.TrimPrefix(f[4], "value="), 16, 64)
			if err != nil {
				return nil, fmt.Errorf("digest line %q: %v", line, err)
			}
			r.Digests[f[2]] = v
		case len(f) == 4 && f[0] == "layout" && f[1] == "SHARD" && f[2] == "size":
			n, err := strconv.ParseUint(f[3], 10, 32)
			if err != nil {
				return nil, fmt.Errorf("layout line %q: %v", line, err)
			}
			r.Size = uintptr(n)
		case len(f) == 3 && f[0] == "layout" && strings.HasPrefix(f[1], "SHARD."):
			n, err := strconv.ParseUint(f[2], 10, 32)
			if err != nil {
				return nil, fmt.Errorf("layout line %q: %v", line, err)
			}
			r.Layout[strings.TrimPrefix(f[1], "SHARD.")] = uintptr(n)
		case len(f) >= 1 && f[0] == "cfgkeys":
			r.CfgKeys = f[1:]
		case len(f) >= 3 && f[0] == "cfgcase":
			n, err := strconv.Atoi(f[1])
			if err != nil || n != len(r.CfgCases) {
				return nil, fmt.Errorf("config case line %q out of order", line)
			}
			r.CfgCases = append(r.CfgCases, strings.Join(f[2:], " "))
		}
	}
	return r, nil
}

// KernelConfigVerdict formats ParseBootConfig's verdict on text the way the
// kernel's self-test prints it, so the two can be compared as strings.
func KernelConfigVerdict(text []byte) string {
	c, err := ParseBootConfig(text)
	if err == ErrConfigTooLong {
		return "toolong"
	}
	if ce, ok := err.(*ConfigError); ok {
		return fmt.Sprintf("reject %d key=%s", ce.Offset, ce.rawKey)
	}
	if err != nil {
		return "error " + err.Error()
	}
	has := 0
	if c.HasShards {
		has |= 1
	}
	if c.HasTotalShards {
		has |= 2
	}
	if c.HasCapacity {
		has |= 4
	}
	if c.HasSeed {
		has |= 8
	}
	return fmt.Sprintf("ok %s|%s|%s|%d|%d|%d|%d|%d|%d", c.NodeID, c.Controller, c.Credential,
		c.Shards, c.TotalShards, c.Capacity, b2u(c.SelfTest), c.Seed, has)
}
