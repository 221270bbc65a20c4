package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/internal/freeport"
	"github.com/discord-pxe/dpxe/tools/netns"
)

// ipCmd runs `ip args...`.
func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// tcpRelay accepts on ln and copies each connection to and from target
// until either side ends. It stands for the route between the database
// and the namespace: PostgreSQL itself listens on loopback only.
func tcpRelay(t *testing.T, ln net.Listener, target string) {
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			a, err := ln.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", target)
			if err != nil {
				a.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, a, b)
			mu.Unlock()
			go func() {
				defer a.Close()
				defer b.Close()
				done := make(chan struct{}, 2)
				go func() { io.Copy(a, b); done <- struct{}{} }()
				go func() { io.Copy(b, a); done <- struct{}{} }()
				<-done
			}()
		}
	}()
}

// dropSession marks one identified shard of n as not identified, as if
// Discord had invalidated its session: n claims an Identify for it at its
// next check-in. ok is false if n has none.
func (n *haNode) dropSession() (shard uint32, ok bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for s := range n.owned {
		if n.identified[s] {
			n.identified[s] = false
			return s, true
		}
	}
	return 0, false
}

// healthRole is replica i's role and term on /healthz, if it answers.
func (c *haCluster) healthRole(i int) (string, uint64, bool) {
	h, ok := c.health(i)
	return h.Role, h.Term, ok
}

// TestReplicaPartitionedFromDatabase runs three `dpxe serve` replicas on
// one PostgreSQL database with four simulated nodes. Replica r0 runs in a
// network namespace and reaches the database over one veth pair and the
// other replicas and the nodes over another. While r0 leads, the test
// first sets the other veth down for two node leases: r0 keeps leading,
// the followers renew the nodes' leases themselves, no node stops a
// shard, and a session invalidated on each node (once a follower answers
// the nodes) identifies again through a follower's grant
// (DPXE_HA_MUTATION=no-follower-renewal, followers answering 503 as
// before, fails there; =no-follower-grants, followers answering 503 to
// claims only, too). Then it sets the database veth down (a partition:
// packets vanish, connections stay half-open). It asserts that r0 stops saying it leads within its
// leader lease and logs that it lost the lease, that another replica
// leads with a higher term, that the nodes see no double owner, no
// Identify grants closer than the window, no budget overrun, no 5xx but
// 503 and every shard owned again (the same checker as
// TestReplicasSurviveFaults); then it sets the veth up again and asserts
// that r0 rejoins as a follower of the new term while the new leader
// keeps leading, and checks the nodes' history again. About 55 s.
//
// DPXE_HA_MUTATION=partition-keeps-lead gives the replicas a leader lease
// of two minutes: the partitioned leader then keeps saying it leads past
// the bound (the short lease plus a second), and the test fails.
func TestReplicaPartitionedFromDatabase(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, a network namespace and three dpxe processes")
	}
	if err := netns.Available(); err != nil {
		t.Skipf("skipping: %v", err)
	}
	ctx := context.Background()
	_, dsn := haDatabase(t)
	ns, err := netns.New(ctx, netip.MustParsePrefix("10.77.0.1/24"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })

	// Two veth pairs between the host and the namespace, with addresses
	// unlikely to meet another test's: db for PostgreSQL, web for HTTP.
	x := os.Getpid() % 250
	tag := strconv.Itoa(os.Getpid() % 100000)
	dbHost, dbNS, webHost, webNS := "pdb"+tag+"h", "pdb"+tag+"n", "pwb"+tag+"h", "pwb"+tag+"n"
	hostDB, nsDB := fmt.Sprintf("10.231.%d.1", x), fmt.Sprintf("10.231.%d.2", x)
	hostWeb, nsWeb := fmt.Sprintf("10.231.%d.5", x), fmt.Sprintf("10.231.%d.6", x)
	for _, v := range [][4]string{{dbHost, dbNS, hostDB, nsDB}, {webHost, webNS, hostWeb, nsWeb}} {
		ipCmd(t, "link", "add", v[0], "type", "veth", "peer", "name", v[1], "netns", ns.Name)
		t.Cleanup(func() { exec.Command("ip", "link", "del", v[0]).Run() })
		ipCmd(t, "addr", "add", v[2]+"/30", "dev", v[0])
		ipCmd(t, "link", "set", v[0], "up")
		ipCmd(t, "-n", ns.Name, "addr", "add", v[3]+"/30", "dev", v[1])
		ipCmd(t, "-n", ns.Name, "link", "set", v[1], "up")
	}
	relayPort, err := freeport.Get()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(hostDB, strconv.Itoa(relayPort)))
	if err != nil {
		t.Fatal(err)
	}
	pgAddr := strings.SplitN(strings.TrimPrefix(dsn, "postgres://postgres@"), "/", 2)[0]
	tcpRelay(t, ln, pgAddr)
	nsDSN := strings.Replace(dsn, pgAddr, net.JoinHostPort(hostDB, strconv.Itoa(relayPort)), 1)

	c := newHACluster(t, dsn, 40)
	wrapper := filepath.Join(c.dir, "dpxe-in-ns")
	if err := os.WriteFile(wrapper, []byte("#!/bin/sh\nexec ip netns exec "+ns.Name+" "+c.bin+" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	c.bins[0], c.dsns[0] = wrapper, nsDSN
	ports := freeport.Ports(t, 3)
	c.addr[0] = net.JoinHostPort(nsWeb, strconv.Itoa(ports[0]))
	c.addr[1] = net.JoinHostPort(hostWeb, strconv.Itoa(ports[1]))
	c.addr[2] = net.JoinHostPort(hostWeb, strconv.Itoa(ports[2]))
	if os.Getenv("DPXE_HA_MUTATION") == "partition-keeps-lead" {
		c.leaderLease = 2 * time.Minute
	}
	// r0 first, so that it leads when the partition comes.
	c.start(0)
	if lead, term := c.leader(10 * haLeaderLease); lead != 0 {
		t.Fatalf("r%d leads (term %d), want r0", lead, term)
	}
	c.start(1)
	c.start(2)
	lead, term := c.leader(10 * haLeaderLease)
	t.Logf("replica r%d leads, term %d", lead, term)

	hist := newHAHistory()
	nodes := make([]*haNode, haNodes)
	for i := range nodes {
		nodes[i] = c.addNode(c.urls()[lead], fmt.Sprintf("part-node.%d", i), i, hist)
	}
	nodeCtx, stopNodes := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Add(1)
		go func() { defer wg.Done(); n.run(nodeCtx) }()
	}
	defer func() { stopNodes(); wg.Wait() }()
	bound := 2*haLeaderLease + 3*haNodeLease + 3*time.Second
	settle := func(what string) uint64 {
		t.Helper()
		start := time.Now()
		_, term := c.leader(bound)
		for ownedShards(nodes) < haShards || minTerm(nodes) < term {
			if time.Since(start) > bound {
				t.Fatalf("after %s: %d of %d shards owned, lowest node term %d of %d, %v later\n%s",
					what, ownedShards(nodes), haShards, minTerm(nodes), term, bound, c.logTail())
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Logf("after %s: term %d, every node on it and every shard owned in %v", what, term, time.Since(start).Round(time.Millisecond))
		if v := hist.check(time.Now(), haWindow-appliance.GrantUseWithin(haWindow), haBudget); len(v) > 0 {
			t.Fatalf("after %s: %d violations:\n%s\n%s", what, len(v), strings.Join(v, "\n"), c.logTail())
		}
		return term
	}
	term = settle("start")
	if lead, _ := c.leader(bound); lead != 0 {
		t.Fatalf("r%d leads before the partition, want r0", lead)
	}

	// The leader cut off from the nodes and the other replicas, not from
	// its database: r0 keeps leading, no check-in reaches it, and for two
	// node leases the followers answer the nodes' renewals themselves
	// (renewals without a leader, docs/ha.md). No node may lose a shard,
	// and r0 must not expire the nodes it no longer hears from.
	// A steady fleet: every shard identified, so no node is busy with
	// claims no replica can grant while r0 is cut off, and every node
	// knows the three replicas from the answers' controllers (the leader
	// refreshes that list every third of the leader lease: 40 s with
	// DPXE_HA_MUTATION=partition-keeps-lead).
	for start := time.Now(); identifiedShards(nodes) < haShards || !knowAll(nodes, 3); time.Sleep(50 * time.Millisecond) {
		if time.Since(start) > bound+time.Duration(c.leaderLease) {
			t.Fatalf("%d of %d shards identified, every node knows 3 replicas %v, %v after the start",
				identifiedShards(nodes), haShards, knowAll(nodes, 3), time.Since(start).Round(time.Millisecond))
		}
	}
	// The namespace's end goes down: the host's route to r0 stays, so
	// packets to r0 vanish in the veth (the host's end down would send
	// them to the host's default route, out of the test's networks, and
	// take the followers' address on it away). The database's partition
	// below is cut the same way.
	t.Logf("partition: %s down, r0 leads term %d and keeps its database", webNS, term)
	webCut := time.Now()
	ipCmd(t, "-n", ns.Name, "link", "set", webNS, "down")
	// Once a follower answers the nodes, Discord invalidates one session
	// on every node: each claims an Identify, and only a follower can
	// grant it.
	c.await(haNodeLease, "a follower answering a check-in after the leader was cut off from the nodes", func() bool {
		h1, _ := c.health(1)
		h2, _ := c.health(2)
		return h1.FollowerCheckins+h2.FollowerCheckins > 0
	})
	dropped := 0
	for _, n := range nodes {
		if _, ok := n.dropSession(); ok {
			dropped++
		}
	}
	time.Sleep(time.Until(webCut.Add(2*haNodeLease + time.Second))) // the partition's own length: two node leases
	webHeal := time.Now()
	if n := hist.stopsBetween(webCut, webHeal); n > 0 || ownedShards(nodes) < haShards {
		hist.mu.Lock()
		why := fmt.Sprint(hist.status, " no answer ", hist.noReply, " 503s ", hist.why503)
		hist.mu.Unlock()
		t.Fatalf("with the leader cut off from them, the nodes stopped %d shards (%d of %d owned); answers %s\n%s",
			n, ownedShards(nodes), haShards, why, c.logTail())
	}
	for i := 1; i < 3; i++ {
		if role, tm, ok := c.healthRole(i); !ok || role != "follower" || tm != term {
			t.Fatalf("r%d says %s term %d (answered %v) with r0 cut off from it; want a follower of term %d", i, role, tm, ok, term)
		}
	}
	var renewed, granted []uint64
	for i := 1; i < 3; i++ {
		h, _ := c.health(i)
		renewed, granted = append(renewed, h.FollowerCheckins), append(granted, h.FollowerGrants)
	}
	if renewed[0]+renewed[1] == 0 {
		t.Fatalf("no follower's /healthz counts check-ins it answered itself\n%s", c.logTail())
	}
	if got := identifiedShards(nodes); got < haShards || granted[0]+granted[1] < uint64(dropped) {
		t.Fatalf("with the leader cut off, %d of %d shards identified again after %d sessions were invalidated; the followers granted %v\n%s",
			got, haShards, dropped, granted, c.logTail())
	}
	t.Logf("check-ins r1 and r2 answered themselves: %v; Identify claims they granted: %v (%d sessions invalidated)", renewed, granted, dropped)
	ipCmd(t, "-n", ns.Name, "link", "set", webNS, "up")
	if lead, tm := c.leader(bound); lead != 0 || tm != term {
		t.Fatalf("after the leader's partition from the nodes r%d leads term %d; want r0, term %d", lead, tm, term)
	}
	settle("the leader's partition from the nodes")
	t.Logf("the followers renewed the nodes' leases for %v without the leader", webHeal.Sub(webCut).Round(time.Millisecond))

	// The partition: r0 (leading) loses its database; the nodes and the
	// other replicas still reach it.
	t.Logf("partition: %s down, r0 leads term %d", dbNS, term)
	cut := time.Now()
	ipCmd(t, "-n", ns.Name, "link", "set", dbNS, "down")
	for {
		role, _, ok := c.healthRole(0)
		if ok && role != "leader" {
			t.Logf("r0 says %s %v after the cut", role, time.Since(cut).Round(time.Millisecond))
			break
		}
		if time.Since(cut) > haLeaderLease+time.Second {
			t.Fatalf("r0 still leads %v after losing its database (leader lease %v)\n%s", time.Since(cut).Round(time.Millisecond), haLeaderLease, c.logTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
	newLead, newTerm := c.leader(bound)
	if newLead == 0 || newTerm <= term {
		t.Fatalf("after the partition r%d leads term %d (was r0, term %d)", newLead, newTerm, term)
	}
	t.Logf("r%d leads term %d %v after the cut", newLead, newTerm, time.Since(cut).Round(time.Millisecond))
	settle("the partition")
	// Its log says so once a campaign fails past its trust deadline.
	c.mu.Lock()
	p0 := c.procs[0]
	c.mu.Unlock()
	for end := time.Now().Add(3 * haLeaderLease); !strings.Contains(p0.logs(), "role=follower"); {
		if time.Now().After(end) {
			t.Fatalf("r0's log does not say it stopped leading:\n%s", c.logTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(haNodeLease) // the fleet runs on the other side of the partition

	// Heal: r0 reaches the database again and follows the new leader.
	ipCmd(t, "-n", ns.Name, "link", "set", dbNS, "up")
	healed := time.Now()
	for {
		role, tm, ok := c.healthRole(0)
		if ok && role == "follower" && tm >= newTerm {
			t.Logf("r0 follows term %d %v after the heal", tm, time.Since(healed).Round(time.Millisecond))
			break
		}
		if time.Since(healed) > bound {
			t.Fatalf("r0 did not rejoin as a follower within %v (role %q term %d)\n%s", bound, role, tm, c.logTail())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if lead, tm := c.leader(bound); lead != newLead || tm != newTerm {
		t.Fatalf("after the heal r%d leads term %d; want r%d term %d", lead, tm, newLead, newTerm)
	}
	settle("the heal")
	time.Sleep(haNodeLease)
	stopNodes()
	wg.Wait()
	if v := hist.check(time.Now(), haWindow-appliance.GrantUseWithin(haWindow), haBudget); len(v) > 0 {
		t.Fatalf("%d violations:\n%s\n%s", len(v), strings.Join(v, "\n"), c.logTail())
	}
	hist.mu.Lock()
	t.Logf("answers by status %v, no answer %d, stale answers ignored %d, grants %d, ownership spans %d, 503s %v",
		hist.status, hist.noReply, hist.stale, len(hist.grants), len(hist.spans), hist.why503)
	hist.mu.Unlock()
}
