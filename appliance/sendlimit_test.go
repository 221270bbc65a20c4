package appliance

import (
	"math/rand/v2"
	"testing"
)

func TestSendReserve(t *testing.T) {
	for _, c := range []struct{ interval, want uint32 }{
		{41250, 1 + 1 + SendSpareBeats}, // Discord: 60/41.25 rounds down to 1
		{30000, 2 + 1 + SendSpareBeats},
		{1000, 60 + 1 + SendSpareBeats},
		{0, SendLimitEvents},
	} {
		if got := SendReserve(c.interval); got != c.want {
			t.Errorf("SendReserve(%d) = %d, want %d", c.interval, got, c.want)
		}
	}
}

func TestSendLogAllows(t *testing.T) {
	const perMS = 1_000_000
	var l SendLog
	const interval = 41250
	room := SendLimitEvents - 1 - SendReserve(interval) // 115 commands in a window
	now := uint64(100 * perMS)
	l.Note(now) // the Identify
	sent := 1
	for i := 0; ; i++ {
		ok, _ := l.Allows(now, perMS, interval)
		if !ok {
			break
		}
		l.Note(now)
		sent++
		now += perMS // one command per ms
	}
	if sent != int(room)+1 {
		t.Fatalf("%d events before the budget refused, want %d (the Identify and %d commands)", sent, room+1, room)
	}
	ok, wait := l.Allows(now, perMS, interval)
	// The oldest event in the window (the Identify, at 100 ms) must leave
	// it first: at 60.1 s, now is 100 + 115 ms.
	if ok || wait != SendLimitWindowMS-uint64(room) {
		t.Errorf("refused: %v, wait %d ms, want false, %d", ok, wait, SendLimitWindowMS-uint64(room))
	}
	if ok, _ := l.Allows(now+wait*perMS, perMS, interval); !ok {
		t.Errorf("still refused after the wait")
	}
	if ok, wait := l.Allows(now, perMS, 400); ok || wait != ^uint64(0) {
		t.Errorf("a 400 ms interval leaves no room, got %v %d", ok, wait)
	}
}

// TestSendLimitNeverExceeded drives the budget the way a shard would: a
// heartbeat every interval, up to SendSpareBeats requested heartbeats per
// window, the connection's Identify, and commands tried as often as
// possible. No 60 s window may hold more than 120 events.
func TestSendLimitNeverExceeded(t *testing.T) {
	const perMS = 1_000_000
	rng := rand.New(rand.NewPCG(1, 2))
	for run := 0; run < 200; run++ {
		interval := uint32(500 + rng.IntN(60000))
		var l SendLog
		var events []uint64
		note := func(at uint64) { l.Note(at); events = append(events, at) }
		now := uint64(rng.IntN(1000)) * perMS
		note(now) // Identify
		nextBeat := now + uint64(rng.IntN(int(interval)))*perMS
		var requested []uint64
		end := now + 10*SendLimitWindowMS*perMS
		for now < end {
			now += uint64(1+rng.IntN(2000)) * perMS / 10 // 0.1-200 ms on
			if now >= nextBeat {
				note(now)
				nextBeat = now + uint64(interval)*perMS
			}
			// The Gateway asks for a heartbeat now and then, never more
			// than SendSpareBeats in a window; it resets the schedule.
			recent := 0
			for _, r := range requested {
				if now-r < SendLimitWindowMS*perMS {
					recent++
				}
			}
			if recent < SendSpareBeats && rng.IntN(500) == 0 {
				note(now)
				requested = append(requested, now)
				nextBeat = now + uint64(interval)*perMS
			}
			if ok, _ := l.Allows(now, perMS, interval); ok {
				note(now)
			}
		}
		window := uint64(SendLimitWindowMS * perMS)
		for i, end := range events {
			n := 0
			for j := i; j >= 0 && end-events[j] < window; j-- {
				n++
			}
			if n > SendLimitEvents {
				t.Fatalf("run %d (interval %d ms): %d events in the 60 s up to event %d", run, interval, n, i)
			}
		}
	}
}
