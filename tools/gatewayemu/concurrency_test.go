package gatewayemu

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestConcurrentShardStorm connects 256 shards at once with max_concurrency
// 16: every shard Identifies immediately. The record must show each refused
// Identify with its reason, consistent with the bucket rule; then the refused
// shards retry on their own connections one per bucket per window and all
// 256 sessions end up live, one per shard.
func TestConcurrentShardStorm(t *testing.T) {
	t.Parallel()
	const (
		shards = 256
		mc     = 16
		window = 200 * time.Millisecond
	)
	o := Options{
		Shards:              shards,
		MaxConcurrency:      mc,
		Guilds:              512,
		IdentifyWindow:      window,
		IdentifyRejectDelay: 20 * time.Millisecond,
		HeartbeatInterval:   time.Minute, // nobody needs to heartbeat during the test
	}
	emu := startEmu(t, o)

	clients := make([]*wsClient, shards)
	refused := make([]bool, shards)
	var wg sync.WaitGroup
	errs := make(chan error, shards)
	start := make(chan struct{})
	for i := 0; i < shards; i++ {
		wg.Add(1)
		go func(id int) {
			defer wg.Done()
			c := dial(t, emu, "/?v=10&encoding=json")
			clients[id] = c
			if f, err := c.read(); err != nil || f.Op != OpHello {
				errs <- fmt.Errorf("shard %d hello: %v %v", id, f, err)
				return
			}
			<-start
			c.send(OpIdentify, identifyPayload(emu, id, shards))
			f, err := c.read()
			switch {
			case err != nil:
				errs <- fmt.Errorf("shard %d: %v", id, err)
			case f.Op == OpInvalidSession && string(f.D) == "false":
				refused[id] = true
			case f.Op == OpDispatch && *f.T == "READY":
			default:
				errs <- fmt.Errorf("shard %d: unexpected %v", id, f)
			}
		}(i)
	}
	// Every client has its Hello before the storm starts.
	awaitState(t, emu, "256 connections", func(s State) bool { return s.Counters.OpenConnections == shards })
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	ids := emu.Identifies()
	if len(ids) != shards {
		t.Fatalf("%d Identify records, want %d", len(ids), shards)
	}
	nRefused := 0
	for _, r := range refused {
		if r {
			nRefused++
		}
	}
	// The first Identify of each bucket is accepted; how many more fit
	// depends on how fast 256 clients get through on this machine.
	if nRefused < mc || nRefused > shards-mc {
		t.Fatalf("%d refused of %d", nRefused, shards)
	}
	checkIdentifyRecord(t, emu, ids, refused, mc, window)
	tooEarly := emu.ViolationsOf(KindIdentifyTooEarly)
	if len(tooEarly) != nRefused {
		t.Fatalf("%d identify_too_early violations for %d refusals", len(tooEarly), nRefused)
	}
	for _, v := range tooEarly {
		if !refused[v.Shard[0]] {
			t.Fatalf("violation for shard %d, which was not refused: %+v", v.Shard[0], v)
		}
	}
	if ssl := emu.SessionStartLimit(); ssl.Remaining != DefaultSessionStarts-shards {
		t.Fatalf("remaining %d: refused Identifies must cost a start too", ssl.Remaining)
	}

	// The refused shards retry properly: per bucket, one Identify per window,
	// on the same connection (allowed after op 9).
	before := len(emu.Violations())
	var wg2 sync.WaitGroup
	for b := 0; b < mc; b++ {
		wg2.Add(1)
		go func(bucket int) {
			defer wg2.Done()
			// The bucket's previous Identify was accepted before its READY
			// arrived, so a window after READY is always late enough.
			next := time.Now().Add(window)
			for id := bucket; id < shards; id += mc {
				if !refused[id] {
					continue
				}
				wait := time.NewTimer(time.Until(next))
				<-wait.C
				c := clients[id]
				c.send(OpIdentify, identifyPayload(emu, id, shards))
				if f, err := c.read(); err != nil || f.Op != OpDispatch || *f.T != "READY" {
					errs2 := fmt.Sprintf("shard %d retry: %v %v", id, f, err)
					t.Error(errs2)
					return
				}
				next = time.Now().Add(window)
			}
		}(b)
	}
	wg2.Wait()
	if t.Failed() {
		t.FailNow()
	}
	st := awaitState(t, emu, "256 live sessions", func(s State) bool { return len(s.Shards) == shards })
	for i, sh := range st.Shards {
		if sh.Shard != [2]int{i, shards} || len(sh.Sessions) != 1 || sh.Sessions[0].State != SessionConnected {
			t.Fatalf("shard %d: %+v", i, sh)
		}
	}
	for _, v := range emu.Violations()[before:] {
		if v.Kind != KindBucketOutOfOrder {
			t.Errorf("paced retry caused %+v", v)
		}
	}
}

// checkIdentifyRecord recomputes the bucket rule from the Identify log and
// compares it with the outcomes the clients saw and the reasons recorded.
func checkIdentifyRecord(t *testing.T, emu *Emulator, ids []IdentifyRecord, refused []bool, mc int, window time.Duration) {
	t.Helper()
	last := map[int]time.Time{}
	for _, r := range ids {
		id := r.Shard[0]
		if r.Bucket != id%mc {
			t.Fatalf("record %+v: bucket %d, want %d", r, r.Bucket, id%mc)
		}
		prev, seen := last[r.Bucket]
		early := seen && r.Time.Sub(prev) < window
		switch r.Outcome {
		case IdentifyAccepted:
			if early || refused[id] {
				t.Fatalf("shard %d accepted %v after the previous Identify of bucket %d", id, r.Time.Sub(prev), r.Bucket)
			}
			last[r.Bucket] = r.Time
		case IdentifyRefused:
			if !early || !refused[id] {
				t.Fatalf("shard %d refused without cause: %+v", id, r)
			}
			if !strings.Contains(r.Reason, fmt.Sprintf("bucket %d ", r.Bucket)) || !strings.Contains(r.Reason, "opens in") {
				t.Fatalf("refusal reason %q", r.Reason)
			}
		default:
			t.Fatalf("unexpected outcome %+v", r)
		}
	}
	// Attempts beyond max_concurrency in a trailing window.
	wantOver := 0
	for i, r := range ids {
		n := 0
		for _, p := range ids[:i+1] {
			if r.Time.Sub(p.Time) < window {
				n++
			}
		}
		if n > mc {
			wantOver++
		}
	}
	if got := len(emu.ViolationsOf(KindIdentifyOverConcurrency)); got != wantOver || wantOver == 0 {
		t.Fatalf("%d identify_over_concurrency violations, recomputed %d", got, wantOver)
	}
	// Start order: recompute which accepted Identifies jumped a group.
	started := map[int]bool{}
	lowest := 0
	wantOOO := 0
	for _, r := range ids {
		if r.Outcome != IdentifyAccepted {
			continue
		}
		id := r.Shard[0]
		if lowest < id/mc*mc {
			wantOOO++
		}
		started[id] = true
		for started[lowest] {
			lowest++
		}
	}
	if got := len(emu.ViolationsOf(KindBucketOutOfOrder)); got != wantOOO {
		t.Fatalf("%d bucket_out_of_order violations, recomputed %d", got, wantOOO)
	}
}

// TestPacedFleetHasNoViolations starts 64 shards the way the docs ask: start
// group by start group, max_concurrency at a time, one window apart, each
// heartbeating. The record must stay empty.
func TestPacedFleetHasNoViolations(t *testing.T) {
	t.Parallel()
	const (
		shards = 64
		mc     = 16
		window = 150 * time.Millisecond
	)
	o := Options{
		Shards: shards, MaxConcurrency: mc, Guilds: 128,
		IdentifyWindow: window, HeartbeatInterval: time.Second,
		HeartbeatGrace: 2 * time.Second, // other test packages share the 2 cores
	}
	emu := startEmu(t, o)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	ready := make(chan int, shards)
	deadline := time.NewTimer(testTimeout)
	defer deadline.Stop()
	for group := 0; group < shards/mc; group++ {
		for id := group * mc; id < (group+1)*mc; id++ {
			wg.Add(1)
			go func(id int) {
				defer wg.Done()
				c := connect(t, emu)
				c.identify(emu, id, shards)
				ready <- id
				beat := time.NewTicker(o.HeartbeatInterval / 2)
				defer beat.Stop()
				for {
					select {
					case <-stop:
						c.ws.Close(1000, "test over")
						return
					case <-beat.C:
					}
					c.send(OpHeartbeat, c.lastS)
					c.expectOp(OpHeartbeatACK)
				}
			}(id)
		}
		// The client's scheduler: the next start group goes one window
		// after this group's last READY (every Identify of the group was
		// accepted before its READY).
		for i := 0; i < mc; i++ {
			select {
			case <-ready:
			case <-deadline.C:
				close(stop)
				t.Fatalf("group %d: only %d of %d shards got READY", group, i, mc)
			}
		}
		pause := time.NewTimer(window)
		<-pause.C
	}
	// Hold the fleet for a few heartbeat intervals.
	awaitState(t, emu, "heartbeats", func(s State) bool { return s.Counters.Heartbeats >= 2*shards })
	st := emu.State()
	close(stop)
	wg.Wait()
	if len(st.Shards) != shards || st.Counters.IdentifyAccepted != shards || st.Counters.HeartbeatACKs != st.Counters.Heartbeats {
		t.Fatalf("state: %d shards, counters %+v", len(st.Shards), st.Counters)
	}
	noViolations(t, emu)
}
