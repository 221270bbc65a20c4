package main

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// The replica checker's history and assertions (TestReplicasSurviveFaults).
// Every fact comes from a simulated node's own view: when it started and
// stopped treating a shard as its own, when a granted Identify claim came
// back, what status each answer had.

// ownSpan is one node's ownership of one shard, [from, to); to is zero
// while it lasts.
type ownSpan struct {
	shard    uint32
	node     string
	from, to time.Time
}

// grantRec is one granted Identify claim as its node saw it.
type grantRec struct {
	bucket, shard uint32
	node          string
	sent, recv    time.Time
	used          bool // the node sent Identify (the answer came within use_within_ms)
}

// haHistory records what the simulated nodes saw; safe for concurrent use.
type haHistory struct {
	mu      sync.Mutex
	spans   []ownSpan
	open    map[string]int // node/shard → index of its open span
	grants  []grantRec
	status  map[int]int     // HTTP status → count
	bad     []string        // 5xx answers other than 503, with their bodies
	stale   int             // answers ignored for an older term or generation
	refused map[string]int  // Identify refusals by reason
	rtt     []time.Duration // per answered check-in: from its first attempt to its answer, retries included
	maxGap  time.Duration   // longest time a node went between the send times of two answered check-ins
	why503  map[string]int  // 503 answers by body
	noReply int             // requests with no answer within the timeout
}

func newHAHistory() *haHistory {
	return &haHistory{open: map[string]int{}, status: map[int]int{}, refused: map[string]int{}, why503: map[string]int{}}
}

func spanKey(node string, shard uint32) string { return fmt.Sprintf("%s/%d", node, shard) }

func (h *haHistory) start(node string, shard uint32, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.open[spanKey(node, shard)]; ok {
		return
	}
	h.open[spanKey(node, shard)] = len(h.spans)
	h.spans = append(h.spans, ownSpan{shard: shard, node: node, from: at})
}

func (h *haHistory) stop(node string, shard uint32, at time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	i, ok := h.open[spanKey(node, shard)]
	if !ok {
		return
	}
	delete(h.open, spanKey(node, shard))
	if at.Before(h.spans[i].from) {
		at = h.spans[i].from
	}
	h.spans[i].to = at
}

func (h *haHistory) grant(g grantRec) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.grants = append(h.grants, g)
}

func (h *haHistory) answer(code int, path, body string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.status[code]++
	if code == 503 && len(h.why503) < 20 {
		h.why503[path+": "+strings.TrimSpace(body)]++
	}
	if code >= 500 && code != 503 {
		h.bad = append(h.bad, fmt.Sprintf("%s: %d %s", path, code, strings.TrimSpace(body)))
	}
}

// rttQuantile returns the q-quantile of the check-in round trips.
func (h *haHistory) rttQuantile(q float64) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.rtt) == 0 {
		return 0
	}
	s := slices.Clone(h.rtt)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// check runs every assertion on the history up to end and returns the
// violations: two nodes owning one shard at once, two used Identify grants
// of one bucket closer than minSpacing, more grants than budget, and
// answers with a 5xx status other than 503 (a replica that does not lead
// and cannot reach the leader answers 503, and the node asks another).
func (h *haHistory) check(end time.Time, minSpacing time.Duration, budget int) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	byShard := map[uint32][]ownSpan{}
	for _, s := range h.spans {
		if s.to.IsZero() {
			s.to = end
		}
		byShard[s.shard] = append(byShard[s.shard], s)
	}
	for shard, spans := range byShard {
		slices.SortFunc(spans, func(a, b ownSpan) int { return a.from.Compare(b.from) })
		for i := 1; i < len(spans); i++ {
			for j := 0; j < i; j++ {
				if spans[j].node != spans[i].node && spans[j].to.After(spans[i].from) {
					out = append(out, fmt.Sprintf("shard %d owned by %s from %s and by %s until %s (overlap %v)",
						shard, spans[i].node, spans[i].from.Format("15:04:05.000"), spans[j].node,
						spans[j].to.Format("15:04:05.000"), spans[j].to.Sub(spans[i].from)))
				}
			}
		}
	}
	byBucket := map[uint32][]grantRec{}
	for _, g := range h.grants {
		if g.used {
			byBucket[g.bucket] = append(byBucket[g.bucket], g)
		}
	}
	for b, gs := range byBucket {
		slices.SortFunc(gs, func(x, y grantRec) int { return x.recv.Compare(y.recv) })
		for i := 1; i < len(gs); i++ {
			if d := gs[i].recv.Sub(gs[i-1].recv); d < minSpacing {
				out = append(out, fmt.Sprintf("bucket %d: Identify of shard %d (%s) %v after shard %d's (%s), under %v",
					b, gs[i].shard, gs[i].node, d, gs[i-1].shard, gs[i-1].node, minSpacing))
			}
		}
	}
	if len(h.grants) > budget {
		out = append(out, fmt.Sprintf("%d grants over a daily budget of %d", len(h.grants), budget))
	}
	for _, b := range h.bad {
		out = append(out, "server error: "+b)
	}
	slices.Sort(out)
	return out
}

// TestHACheckerCatchesViolations proves each assertion of the replica
// checker can fail: a clean history passes, and each deliberate mutation
// of it (an overlapping owner, an early second Identify in a bucket, one
// grant over the budget, a 500 answer) is reported.
func TestHACheckerCatchesViolations(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	clean := func() *haHistory {
		h := newHAHistory()
		h.start("a", 0, at(0))
		h.stop("a", 0, at(1000))
		h.start("b", 0, at(1000)) // hand-off at the very instant: no overlap
		h.grant(grantRec{bucket: 0, shard: 0, node: "a", recv: at(0), used: true})
		h.grant(grantRec{bucket: 0, shard: 0, node: "b", recv: at(1000), used: true})
		h.answer(200, "/v1/checkin", "")
		h.answer(503, "/v1/checkin", "no leader")
		return h
	}
	const spacing, budget = 900 * time.Millisecond, 2
	if v := clean().check(at(5000), spacing, budget); len(v) != 0 {
		t.Fatalf("clean history: %v", v)
	}
	mutations := map[string]func(h *haHistory){
		"owned by":     func(h *haHistory) { h.start("c", 0, at(1500)) },
		"bucket 0":     func(h *haHistory) { h.grants[1].recv = at(500) },
		"daily budget": func(h *haHistory) { h.grant(grantRec{bucket: 1, shard: 1, node: "c", recv: at(3000)}) }, // unused, still counted
		"server error": func(h *haHistory) { h.answer(500, "/v1/identify", "boom") },
	}
	for want, mutate := range mutations {
		h := clean()
		mutate(h)
		v := h.check(at(5000), spacing, budget)
		if len(v) != 1 || !strings.Contains(v[0], want) {
			t.Errorf("mutation %q: violations %v", want, v)
		}
	}
}

// stopsBetween is how many times a node stopped owning a shard within
// [from, to].
func (h *haHistory) stopsBetween(from, to time.Time) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, s := range h.spans {
		if !s.to.IsZero() && !s.to.Before(from) && !s.to.After(to) {
			n++
		}
	}
	return n
}
