package appliance

import (
	"encoding/json"
	"testing"
	"time"
)

func TestGrantUsable(t *testing.T) {
	for _, c := range []struct {
		elapsed time.Duration
		within  uint32
		want    bool
	}{
		{0, 0, true},
		{250 * time.Millisecond, 0, true}, // absent: 250 ms, inclusive
		{250*time.Millisecond + 1, 0, false},
		{time.Second, 0, false},
		{999 * time.Millisecond, 1000, true},
		{1000 * time.Millisecond, 1000, true},
		{1001 * time.Millisecond, 1000, false},
		{2 * time.Millisecond, 1, false},
	} {
		if got := GrantUsable(c.elapsed, c.within); got != c.want {
			t.Errorf("GrantUsable(%v, %d) = %v, want %v", c.elapsed, c.within, got, c.want)
		}
	}
}

func TestGrantUsableTSC(t *testing.T) {
	const ghz2 = 2_000_000 // 2 GHz: cycles per ms
	for _, c := range []struct {
		cycles, perMS uint64
		within        uint32
		want          bool
	}{
		{250 * ghz2, ghz2, 0, true},
		{250*ghz2 + 1, ghz2, 0, false},
		{250 * TSCGuessCyclesPerMS, 0, 0, true}, // uncalibrated: the 1 GHz guess
		{250*TSCGuessCyclesPerMS + 1, 0, 0, false},
		{^uint64(0), ^uint64(0), 2, true}, // the limit overflows 64 bits: always within
		{^uint64(0), 1 << 62, 4, true},    // 4 x 2^62 = 2^64
		{^uint64(0), 1 << 62, 3, false},
		{^uint64(0), 1 << 40, 1000, false},
	} {
		if got := GrantUsableTSC(c.cycles, c.perMS, c.within); got != c.want {
			t.Errorf("GrantUsableTSC(%d, %d, %d) = %v, want %v", c.cycles, c.perMS, c.within, got, c.want)
		}
	}
	// The two forms agree wherever a cycle count is a whole number of
	// nanoseconds.
	for ms := uint32(1); ms < 400; ms += 7 {
		for _, ns := range []int64{-1, 0, 1} {
			elapsed := time.Duration(ms)*time.Millisecond + time.Duration(ns)
			if GrantUsable(elapsed, ms) != GrantUsableTSC(uint64(elapsed.Nanoseconds()), 1_000_000, ms) {
				t.Fatalf("GrantUsable and GrantUsableTSC disagree at %v, limit %d ms", elapsed, ms)
			}
		}
	}
}

func TestIdentifyResponseUseWithin(t *testing.T) {
	var r IdentifyResponse
	if err := json.Unmarshal([]byte(`{"granted":true,"shard_id":3,"bucket":0,"use_within_ms":400}`), &r); err != nil || r.UseWithinMS != 400 {
		t.Fatalf("use_within_ms: %+v %v", r, err)
	}
	b, _ := json.Marshal(IdentifyResponse{Granted: true})
	if string(b) != `{"granted":true,"shard_id":0,"bucket":0}` {
		t.Errorf("an answer without a limit is %s: use_within_ms must be omitted (the node then uses %d ms)", b, DefaultGrantUseWithinMS)
	}
}
