package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"
)

// BenchmarkLeaderFailover measures a controller failover with real
// processes: three `dpxe serve` replicas on one PostgreSQL database (the
// timings of TestReplicasSurviveFaults: leader lease 3 s, node lease 5 s)
// and four simulated nodes owning 16 shards. Each iteration SIGKILLs the
// leader and at once starts a fifth node (a new one each time), so the
// fleet needs a new plan; it reports the time from the SIGKILL until
// another replica says it leads (elect-ms) and until the plan generation
// in the database rises (plan-ms: the new leader's first plan change, at
// the first check-in after its takeover: it trusts the committed node
// lease deadlines, docs/ha.md, so it waits for no restart grace), and the p99 and max of the
// nodes' check-in round trips (retries across replicas within one round
// included) answered between the SIGKILL and that plan change, the longest
// a node went between two answered check-ins (checkin-gap-max-ms: what a
// node sees of the failover; its lease is 5 s), and the attempts that got
// no answer or a 503 (a node retries every 100 ms meanwhile). The killed
// replica is restarted between iterations. Run with DPXE_BENCH=1:
//
//	DPXE_BENCH=1 go test -run '^$' -bench LeaderFailover -benchtime 3x ./cmd/dpxe/
func BenchmarkLeaderFailover(b *testing.B) {
	if os.Getenv("DPXE_BENCH") != "1" {
		b.Skip("set DPXE_BENCH=1 to run the failover benchmark")
	}
	ctx := context.Background()
	_, dsn := haDatabase(b)
	c := newHACluster(b, dsn, 30)
	for i := range 3 {
		c.start(i)
	}
	lead, _ := c.leader(10 * haLeaderLease)
	hist := newHAHistory()
	var nodes []*haNode
	addNode := func(id string) *haNode { return c.addNode(c.urls()[lead], id, len(nodes), hist) }
	nodeCtx, stopNodes := context.WithCancel(ctx)
	var wg sync.WaitGroup
	run := func(n *haNode) {
		wg.Add(1)
		go func() { defer wg.Done(); n.run(nodeCtx) }()
	}
	for i := range haNodes {
		n := addNode(fmt.Sprintf("fo-node.%d", i))
		nodes = append(nodes, n)
		run(n)
	}
	defer func() { stopNodes(); wg.Wait() }()
	pg, err := sql.Open("pgx", dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer pg.Close()
	generation := func() uint64 {
		var g uint64
		pg.QueryRowContext(ctx, `SELECT generation FROM plan WHERE id = 1`).Scan(&g)
		return g
	}
	bound := 2*haLeaderLease + 3*haNodeLease + 10*time.Second
	waitOwned := func() {
		start := time.Now()
		_, term := c.leader(bound)
		for ownedShards(nodes) < haShards || minTerm(nodes) < term {
			if time.Since(start) > bound {
				b.Fatalf("%d of %d shards owned after %v\n%s", ownedShards(nodes), haShards, bound, c.logTail())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitOwned()
	var elect, plan, p99, worst, gaps []time.Duration
	failed := 0
	b.ResetTimer()
	for it := 0; it < b.N; it++ {
		lead, term := c.leader(bound)
		extra := addNode(fmt.Sprintf("fo-extra.%d", it))
		time.Sleep(haNodeLease) // a steady fleet before the kill
		gen := generation()
		hist.mu.Lock()
		from, noReply, before503 := len(hist.rtt), hist.noReply, hist.status[503]
		hist.maxGap = 0
		hist.mu.Unlock()
		killed := time.Now()
		c.kill(lead)
		nodes = append(nodes, extra)
		run(extra)
		var elected time.Duration
		for {
			if i, tm := c.leaderNow(); i >= 0 && tm > term {
				elected = time.Since(killed)
				break
			}
			if time.Since(killed) > bound {
				b.Fatalf("no new leader %v after the SIGKILL\n%s", bound, c.logTail())
			}
			time.Sleep(20 * time.Millisecond)
		}
		for generation() <= gen {
			if time.Since(killed) > bound {
				b.Fatalf("no plan change %v after the SIGKILL\n%s", bound, c.logTail())
			}
			time.Sleep(20 * time.Millisecond)
		}
		changed := time.Since(killed)
		hist.mu.Lock()
		window := slices.Clone(hist.rtt[from:])
		failed += hist.noReply - noReply + hist.status[503] - before503
		gap := hist.maxGap
		hist.mu.Unlock()
		gaps = append(gaps, gap)
		slices.Sort(window)
		elect, plan = append(elect, elected), append(plan, changed)
		if len(window) > 0 {
			p99 = append(p99, window[len(window)*99/100])
			worst = append(worst, window[len(window)-1])
		}
		b.Logf("iteration %d: new leader %v, plan change %v after the SIGKILL; %d check-ins answered meanwhile, round trip p99 %v, max %v; longest a node went between answered check-ins %v",
			it, elected.Round(time.Millisecond), changed.Round(time.Millisecond), len(window), p99[len(p99)-1], worst[len(worst)-1], gap.Round(time.Millisecond))
		c.start(lead)
		waitOwned()
	}
	b.StopTimer()
	mean := func(ds []time.Duration) float64 {
		var s time.Duration
		for _, d := range ds {
			s += d
		}
		return float64(s.Milliseconds()) / float64(max(len(ds), 1))
	}
	b.ReportMetric(mean(elect), "elect-ms")
	b.ReportMetric(mean(plan), "plan-ms")
	b.ReportMetric(mean(p99), "checkin-p99-ms")
	b.ReportMetric(mean(worst), "checkin-max-ms")
	b.ReportMetric(mean(gaps), "checkin-gap-max-ms")
	b.ReportMetric(float64(failed)/float64(b.N), "failed-attempts/failover")
}

// leaderNow is the replica that says it leads with the highest term now,
// or -1.
func (c *haCluster) leaderNow() (int, uint64) {
	found, term := -1, uint64(0)
	for i := range c.procs {
		if h, ok := c.health(i); ok && h.Role == "leader" && h.Term > term {
			found, term = i, h.Term
		}
	}
	return found, term
}
