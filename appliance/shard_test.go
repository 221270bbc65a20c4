package appliance

import "testing"

// Known answers from the seeds' worked examples (seeds 000 and 001).
func TestShardFormulasKnownAnswers(t *testing.T) {
	s := ShardContext{ID: 5}
	if got := s.AssignIdentifyBucket(2); got != 1 || s.IdentifyBucket != 1 {
		t.Errorf("bucket(5,2) = %d", got)
	}
	s.ID = 7
	if got := s.AssignIdentifyBucket(0); got != 0 {
		t.Errorf("bucket(7,0) = %d: zero concurrency must mean one bucket", got)
	}

	for _, tc := range []struct {
		id, interval uint32
		want         uint64
	}{
		{0, 41250, 2062}, {19, 41250, 41250}, {20, 41250, 2062}, {3, 10, 2}, {0, 10, 1}, {0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF * 16 / 20},
	} {
		if got := FirstHeartbeatDelayMillis(tc.id, tc.interval); got != tc.want {
			t.Errorf("first heartbeat delay(id %d, interval %d) = %d, want %d", tc.id, tc.interval, got, tc.want)
		}
	}
	h := ShardContext{ID: 1, HeartbeatMillis: 1000}
	if !h.ScheduleFirstHeartbeat(100, 3) || h.HeartbeatDeadline != 100+100*3 {
		t.Errorf("deadline = %d, want %d", h.HeartbeatDeadline, 100+100*3)
	}
	if h2 := (ShardContext{HeartbeatMillis: 1000}); h2.ScheduleFirstHeartbeat(5, 0) || h2.HeartbeatDeadline != 0 {
		t.Error("an uncalibrated TSC must not produce a deadline")
	}
	if h3 := (ShardContext{}); h3.ScheduleFirstHeartbeat(5, 1) {
		t.Error("interval 0 must not produce a deadline")
	}

	a := ShardContext{HeartbeatAcks: 4, Flags: FlagAwaitingAck | FlagReady, HeartbeatMisses: 3}
	a.NoteAck()
	if a.HeartbeatAcks != 5 || a.Flags != FlagReady || a.HeartbeatMisses != 0 {
		t.Errorf("after NoteAck: %+v", a)
	}
	r := ShardContext{State: KernelStateStarting}
	r.MarkReady()
	if r.State != KernelStateReady || r.Flags&FlagReady == 0 || r.SessionGeneration != 1 {
		t.Errorf("after MarkReady: %+v", r)
	}

	b := ShardContext{State: KernelStateReady}
	b.ScheduleBackoff(10, 1000)
	if b.State != KernelStateBackoff || b.Reconnects != 1 || b.ReconnectDeadline != 10+5000*1000 {
		t.Errorf("after backoff: %+v", b)
	}
	b.ScheduleBackoff(10, 0)
	if b.ReconnectDeadline != 0 || b.Reconnects != 2 {
		t.Errorf("uncalibrated backoff: %+v", b)
	}
}

// The zombie rule with its read-budget exception, case by case: the
// kernel's shard_beat_verdict must answer the same (self-test digest "beat").
func TestBeatVerdict(t *testing.T) {
	const owed = FlagAwaitingAck | FlagReady
	for _, tc := range []struct {
		name       string
		flags      uint32
		misses     uint32
		behind     bool
		want       BeatVerdict
		wantMisses uint32
	}{
		{"acknowledged", FlagReady, 0, false, BeatSend, 0},
		{"acknowledged keeps the streak", FlagReady, 7, true, BeatSend, 7},
		{"acknowledged at the wrap", FlagReady, 0xFFFFFFFF, false, BeatSend, 0xFFFFFFFF},
		{"owed, all read: zombie", owed, 0, false, BeatZombie, 1},
		{"owed, all read, mid-streak: zombie", owed, 2, false, BeatZombie, 3},
		{"owed, behind, first miss: logged", owed, 0, true, BeatOwedFirst, 1},
		{"owed, behind, second miss", owed, 1, true, BeatOwed, 2},
		{"owed, behind, at the bound", owed, BehindBeats - 1, true, BeatOwed, BehindBeats},
		{"owed, behind, one past the bound", owed, BehindBeats, true, BeatZombie, BehindBeats + 1},
		{"owed, behind, far past the bound", owed, 1000, true, BeatZombie, 1001},
		{"owed, behind, one before the wrap", owed, 0xFFFFFFFE, true, BeatZombie, 0xFFFFFFFF},
		{"owed, behind, wraps to 0: sent, not logged", owed, 0xFFFFFFFF, true, BeatOwed, 0},
		{"owed, all read, wraps to 0: zombie", owed, 0xFFFFFFFF, false, BeatZombie, 0},
	} {
		s := ShardContext{Flags: tc.flags, HeartbeatMisses: tc.misses}
		got := s.BeatVerdict(tc.behind)
		if got != tc.want || s.HeartbeatMisses != tc.wantMisses || s.Flags != tc.flags {
			t.Errorf("%s: verdict %d misses %d flags %#x, want %d %d %#x", tc.name, got, s.HeartbeatMisses, s.Flags, tc.want, tc.wantMisses, tc.flags)
		}
	}
}

// A shard behind on reading sends BehindBeats heartbeats with the ACK owed
// and is a zombie at the next; an ACK in between starts the streak again.
func TestBeatVerdictStreak(t *testing.T) {
	s := ShardContext{Flags: FlagAwaitingAck}
	want := []BeatVerdict{BeatOwedFirst, BeatOwed, BeatOwed, BeatZombie}
	for i, w := range want {
		if got := s.BeatVerdict(true); got != w {
			t.Fatalf("heartbeat %d behind: verdict %d, want %d", i+1, got, w)
		}
	}
	s.NoteAck()
	if got := s.BeatVerdict(true); got != BeatSend {
		t.Fatalf("after the ACK: verdict %d, want send", got)
	}
	s.Flags |= FlagAwaitingAck // the heartbeat just sent
	if got := s.BeatVerdict(true); got != BeatOwedFirst || s.HeartbeatMisses != 1 {
		t.Fatalf("new streak: verdict %d misses %d, want %d 1", got, s.HeartbeatMisses, BeatOwedFirst)
	}
}

func TestRestoreResumeStateNeedsBothConditions(t *testing.T) {
	for _, tc := range []struct {
		name          string
		session       bool
		valid         bool
		savedSeqValid bool
		wantSeq       uint32
		wantResume    bool
	}{
		{"no session", false, false, true, SeqNone, false},
		{"invalid session", true, false, true, SeqNone, false},
		{"valid session, sequence invalid", true, true, false, SeqNone, false},
		{"both valid", true, true, true, 42, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := ShardContext{Flags: FlagSeqValid, Sequence: 7}
			if tc.session {
				s.SessionPtr = 1
			}
			if tc.valid {
				s.Session.Valid = 1
			}
			var saved uint32
			if tc.savedSeqValid {
				saved = FlagSeqValid
			}
			s.RestoreResumeState(42, saved)
			if s.Sequence != tc.wantSeq || s.CanResume() != tc.wantResume {
				t.Fatalf("sequence %#x resume %v, want %#x %v", s.Sequence, s.CanResume(), tc.wantSeq, tc.wantResume)
			}
			if !tc.wantResume && s.Flags&FlagSeqValid != 0 {
				t.Fatal("SEQ_VALID left set beside the sentinel")
			}
		})
	}
}

func TestLeaseTick(t *testing.T) {
	rt := ShardRuntime{LeaseDeadline: 100, Shards: []ShardContext{
		{State: KernelStateReady, Flags: FlagReady | FlagAwaitingAck}, {State: KernelStateFatal}, {State: KernelStateAssigned},
		{State: KernelStateBackoff}, {State: KernelStateStarting},
	}}
	rt.LeaseTick(99)
	if rt.LeaseExpired {
		t.Fatal("expired before the deadline")
	}
	rt.LeaseTick(100)
	if !rt.LeaseExpired || rt.Stopped != 3 {
		t.Fatalf("expired %v stopped %d, want true 3", rt.LeaseExpired, rt.Stopped)
	}
	want := []uint32{KernelStateAssigned, KernelStateFatal, KernelStateAssigned, KernelStateAssigned, KernelStateAssigned}
	for i, s := range rt.Shards {
		if s.State != want[i] {
			t.Errorf("shard %d state %d, want %d", i, s.State, want[i])
		}
	}
	if rt.Shards[0].Flags != FlagLeaseStopped {
		t.Errorf("flags %#x, want only LEASE_STOPPED", rt.Shards[0].Flags)
	}
	off := ShardRuntime{Shards: []ShardContext{{State: KernelStateReady}}}
	off.LeaseTick(1 << 60)
	if off.LeaseExpired {
		t.Fatal("a zero deadline means enforcement is off")
	}
}

func TestSelfTestDigestsDeterministic(t *testing.T) {
	a, b := SelfTestDigests(9), SelfTestDigests(9)
	c := SelfTestDigests(10)
	for _, f := range SelfTestFormulas {
		if a[f] != b[f] {
			t.Errorf("%s: not deterministic", f)
		}
		if a[f] == c[f] {
			t.Errorf("%s: seeds 9 and 10 give the same digest", f)
		}
	}
}

func TestShardLayoutIsPacked(t *testing.T) {
	fields, size := ShardLayout()
	if fields[0].Offset != 0 || fields[len(fields)-1].Name != "ping_ring" {
		t.Fatalf("layout %+v", fields)
	}
	if size != 432 {
		t.Errorf("SHARD is %d bytes; the kernel's struc is 432 (update both together)", size)
	}
}

func TestParseSelfTestReport(t *testing.T) {
	log := "junk\r\nselftest: seed=12\r\nlayout SHARD size 296\r\nlayout SHARD.id 0\r\ncfgkeys node seed\r\n" +
		"selftest digest bucket cases=4096 value=00000000000000ff\r\ncfgcase 0 ok a|b\r\ncfgcase 1 reject 3 key=\r\nselftest: pass\r\n"
	r, err := ParseSelfTestReport(log)
	if err != nil {
		t.Fatal(err)
	}
	if r.Seed != 12 || r.Size != 296 || r.Layout["id"] != 0 || r.Digests["bucket"] != 0xff || !r.Passed ||
		len(r.CfgCases) != 2 || r.CfgCases[1] != "reject 3 key=" || len(r.CfgKeys) != 2 {
		t.Fatalf("parsed %+v", r)
	}
	if _, err := ParseSelfTestReport("cfgcase 1 ok x\n"); err == nil {
		t.Fatal("out-of-order case accepted")
	}
}
