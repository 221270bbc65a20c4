package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/api"
	"github.com/discord-pxe/dpxe/fleet/store/pgtest"
	"github.com/discord-pxe/dpxe/tools/gatewayemu"
)

// Timings of TestKernelReplicasFailover.
const (
	khaShards    = 16
	khaNodeLease = 15 * time.Second // --lease: a node moves on after a third of it
	// khaLeaderLease (--leader-lease) is longer than the node lease: the
	// dead leader's row runs 18 to 27 s after the kill, so the nodes go
	// longer than their lease without a leader and keep their leases only
	// through the follower's renewals.
	khaLeaderLease = 27 * time.Second
)

// khaReplica is one `dpxe serve` replica of the kernel failover test.
type khaReplica struct {
	name string
	url  string
	cmd  *exec.Cmd
	logs *nodeSerial // a goroutine-safe buffer
	done chan struct{}
}

// TestKernelReplicasFailover is issue 20's kernel end to end: two QEMU
// nodes with 8 shards each against two `dpxe serve` replicas on one
// PostgreSQL and the Gateway emulator, the nodes booted with controller=
// naming both. With all 16 shards READY the leader is SIGKILLed. The
// nodes move to the follower after a third of their lease, and the
// follower, which cannot reach a leader, answers their check-ins itself
// (renewals without a leader, docs/ha.md) until the dead leader's row
// runs out, longer than a node lease after the kill; then it takes the
// leader lease with a higher term. From the emulator's record: no session
// closed or replaced, no new Identify, every shard READY and heartbeating
// throughout, no violation, but for one session the emulator ends (op 9,
// not resumable) while no replica leads: its shard must be identified
// again before r1 leads, through r1's grant as a follower; the new leader sees both nodes check in with
// its plan generation acknowledged, each node's console says it moved to
// r1 and applied r1's term, no node's lease lapses, and r1's log says it
// answered renewals.
//
// DPXE_KHA_MUTATION: no-follower-renewal builds dpxe with followers
// answering 503 to check-ins no leader answers, as before: the nodes'
// leases lapse and the test fails. no-follower-grants, with followers
// answering 503 to claims only: the ended session's shard identifies
// only once r1 leads, and the test fails. short-lease gives the replicas a node
// lease of 3 s, which the follower's renewals cover too (the test passes;
// before them it failed). leader-only boots the nodes with the leader's
// URL only: the test still passes, since the nodes learn r1 from the
// answers' controllers list, and then wants the console line that says so.
func TestKernelReplicasFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("boots two QEMU nodes and starts PostgreSQL")
	}
	mutation := os.Getenv("DPXE_KHA_MUTATION")
	nodeLease, leaderLease := khaNodeLease, khaLeaderLease
	if mutation == "short-lease" {
		nodeLease = 3 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	pg, err := pgtest.Start(ctx)
	if errors.Is(err, pgtest.ErrNotInstalled) {
		t.Skipf("skipping: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Stop() })
	dbURL, err := pg.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	// The replicas run in the namespace: they reach PostgreSQL through
	// its Unix socket.
	dsn := pg.SocketURL(path.Base(u.Path))

	const subnet = "10.98.0"
	l := newGWLabNoServe(t, ctx, subnet, gatewayemu.Options{HeartbeatInterval: 2 * time.Second, Shards: khaShards, MaxConcurrency: khaShards})
	bin := l.bin
	if mutation == "no-follower-renewal" || mutation == "no-follower-grants" {
		bin = filepath.Join(t.TempDir(), "dpxe")
		if out, err := exec.Command("go", "build", "-ldflags", "-X main.haTestMutation="+mutation, "-o", bin,
			"github.com/discord-pxe/dpxe/cmd/dpxe").CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
	}
	replicaArgs := func(i int) []string {
		return []string{"serve", "--db", dsn, "--listen", fmt.Sprintf("%s.1:%d", subnet, 8080+i),
			"--replica-id", fmt.Sprintf("r%d", i), "--advertise-url", fmt.Sprintf("http://%s.1:%d", subnet, 8080+i),
			"--leader-lease", leaderLease.String(), "--lease", nodeLease.String(),
			"--total-shards", fmt.Sprint(khaShards), "--max-concurrency", fmt.Sprint(khaShards),
			"--no-dashboard", "--no-events", "--gateway-api", l.gatewayAPI, "--bot-token-file", l.botToken,
			"--admin-token-file", l.token, "--metrics-token-file", filepath.Join(l.dir, fmt.Sprintf("metrics-r%d.token", i))}
	}
	replicas := make([]*khaReplica, 2)
	for i := range replicas {
		r := &khaReplica{name: fmt.Sprintf("r%d", i), url: fmt.Sprintf("http://%s.1:%d", subnet, 8080+i), logs: &nodeSerial{}, done: make(chan struct{})}
		r.cmd = l.ns.Command(ctx, bin, replicaArgs(i)...)
		r.cmd.Stdout, r.cmd.Stderr = r.logs, r.logs
		if err := r.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { r.cmd.Wait(); close(r.done) }()
		replicas[i] = r
		t.Cleanup(func() {
			r.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-r.done:
			case <-time.After(15 * time.Second):
				r.cmd.Process.Kill()
				<-r.done
			}
			if t.Failed() {
				t.Logf("%s log:\n%s", r.name, r.logs.String())
			}
		})
		// The first replica leads (alone); the second follows.
		want := "leader"
		if i > 0 {
			want = "follower"
		}
		if _, err := khaAwaitRole(l, r, want, 0, 30*time.Second); err != nil {
			t.Fatalf("%s: %v\n%s", r.name, err, r.logs.String())
		}
	}
	lead, err := khaAwaitRole(l, replicas[0], "leader", 0, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("r0 leads, term %d, generation %d; r1 follows", lead.Term, lead.Generation)

	l.server = replicas[0].url
	l.nodeController = replicas[0].url + "," + replicas[1].url
	if mutation == "leader-only" {
		l.nodeController = replicas[0].url
	}
	l.nodeConfig = func(i int, c *appliance.BootConfig) { c.Capacity, c.HasCapacity = khaShards/2, true }
	// kha-a first: the plan's ranges follow node-ID order, so kha-b then
	// joins with the upper half and no shard moves before the kill.
	nodes := []*gwNode{l.boot("kha-a", "e1000", khaShards/2)}
	l.awaitRange("kha-a", 0, khaShards/2, 60*time.Second)
	nodes = append(nodes, l.boot("kha-b", "virtio-net-pci", khaShards/2))
	l.awaitEmu(90*time.Second+2*khaShards*gatewayemu.DefaultIdentifyWindow, "16 READY shards with 2 heartbeats each", func(s gatewayemu.State) bool {
		return len(readySessions(s, 2)) == khaShards
	})
	// Both nodes hold 8 shards under r0's plan and have acknowledged it.
	lastSeen := map[string]time.Time{}
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range nodes {
		for {
			d, err := l.nodeDetail(n.id)
			h, herr := khaHealth(l, replicas[0])
			if err == nil && herr == nil && d.RangeCount == khaShards/2 && d.Pending == 0 && d.AckedGeneration == h.Generation && len(d.Shards) == khaShards/2 {
				lastSeen[n.id] = d.LastSeen
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s did not settle on 8 shards of r0's plan: %+v %v", n.id, d, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	// Both nodes know both replicas from r0's answers (r0 reads the
	// replicas table every third of the leader lease).
	both := regexp.MustCompile(`checkin: replicas from the controller: \S*` + regexp.QuoteMeta(replicas[1].url))
	for _, n := range nodes {
		if n.serial.waitFor(both, khaLeaderLease/3+2*khaNodeLease/3+5*time.Second) == nil {
			t.Fatalf("%s did not learn r1 from r0's answers", n.id)
		}
	}
	before := l.liveSessions()
	identifies := l.acceptedIdentifies()
	if len(before) != khaShards || identifies != khaShards {
		t.Fatalf("before the kill: %d live sessions and %d Identifies, want %d of each", len(before), identifies, khaShards)
	}

	// SIGKILL the leader.
	killed := time.Now()
	replicas[0].cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-replicas[0].done:
	case <-time.After(10 * time.Second):
		t.Fatal("r0 survived SIGKILL")
	}
	t.Logf("r0 (leader, term %d) SIGKILLed", lead.Term)
	surv := replicas[1]
	l.server = surv.url

	// Watch, every 200 ms, until both nodes have checked in twice with the
	// new leader and a node lease has passed since the kill (a lapse would
	// show by then): every shard keeps its session, connected.
	var newLead api.HealthResponse
	var leaderAt time.Time
	firstCheckin, checkins := map[string]time.Time{}, map[string]int{}
	beats := map[int]int64{}
	for sh, ses := range before {
		beats[sh] = ses.Heartbeats
	}
	// Once the nodes have moved to r1, with no leader, Discord ends one
	// session (op 9, not resumable): its node claims an Identify, which
	// only r1, a follower then, can grant (docs/ha.md, Identify claims
	// without a leader).
	const ended = 3
	var endedAt, reidentAt time.Time
	watchEnd := time.Now().Add(90 * time.Second)
	for {
		now := l.liveSessions()
		if endedAt.IsZero() && leaderAt.IsZero() && time.Since(killed) > nodeLease/3+2*time.Second {
			sh := ended
			if _, err := l.emu.Inject(gatewayemu.Fault{Kind: gatewayemu.FaultInvalidSession, Shard: &sh}); err != nil {
				t.Fatal(err)
			}
			endedAt = time.Now()
			t.Logf("shard %d's session invalidated %v after the kill", ended, endedAt.Sub(killed).Round(time.Millisecond))
		}
		if a, ok := now[ended]; ok && !endedAt.IsZero() && reidentAt.IsZero() && a.ID != before[ended].ID {
			reidentAt = time.Now()
			t.Logf("shard %d identified again %v after its session ended, %v after the kill (r1 leading: %v)", ended,
				reidentAt.Sub(endedAt).Round(time.Millisecond), reidentAt.Sub(killed).Round(time.Millisecond), !leaderAt.IsZero())
		}
		for sh, b := range before {
			if sh == ended && !endedAt.IsZero() {
				continue
			}
			if a, ok := now[sh]; !ok || a.ID != b.ID || a.Conn != b.Conn {
				t.Fatalf("%v after the kill shard %d's session changed: %s conn %d -> %+v (connected: %v)",
					time.Since(killed).Round(time.Millisecond), sh, b.ID, b.Conn, a, ok)
			}
			beats[sh] = now[sh].Heartbeats
		}
		if leaderAt.IsZero() {
			if h, err := khaAwaitRole(l, surv, "leader", lead.Term+1, 0); err == nil {
				newLead, leaderAt = h, time.Now()
				t.Logf("r1 leads, term %d, %v after the kill", h.Term, leaderAt.Sub(killed).Round(time.Millisecond))
			}
		}
		if !leaderAt.IsZero() {
			for _, n := range nodes {
				d, err := l.nodeDetail(n.id)
				// Check-ins r1 answered as a follower are not recorded:
				// the first it records is after it leads.
				if err != nil || !d.LastSeen.After(lastSeen[n.id]) || d.LastSeen.Before(leaderAt.Add(-time.Second)) {
					continue
				}
				if firstCheckin[n.id].IsZero() {
					firstCheckin[n.id] = d.LastSeen
					t.Logf("%s: first check-in answered by r1 as leader %v after the kill",
						n.id, d.LastSeen.Sub(killed).Round(time.Millisecond))
				}
				lastSeen[n.id] = d.LastSeen
				checkins[n.id]++
			}
		}
		if checkins["kha-a"] >= 2 && checkins["kha-b"] >= 2 && time.Since(killed) > nodeLease+2*time.Second && !reidentAt.IsZero() {
			break
		}
		if time.Now().After(watchEnd) {
			t.Fatalf("no failover within %v: new leader at %v, check-ins with it %v", watchEnd.Sub(killed).Round(time.Second), leaderAt, checkins)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The nodes went longer than their lease without a leader: only the
	// follower's renewals kept them.
	if leaderAt.Sub(killed) <= nodeLease {
		t.Errorf("r1 led %v after the kill, within a node lease (%v): the follower's renewals were not needed",
			leaderAt.Sub(killed).Round(time.Millisecond), nodeLease)
	}
	if !strings.Contains(surv.logs.String(), "answering renewals and Identify claims here") {
		t.Errorf("r1 does not say it answered the nodes' renewals while no leader did")
	}
	// The ended session's shard was identified again while r1 followed,
	// through its grant.
	if endedAt.IsZero() || !reidentAt.Before(leaderAt) {
		t.Errorf("shard %d's session ended %v after the kill and was identified again %v after the kill, r1 leading %v after the kill: want it identified before r1 led",
			ended, endedAt.Sub(killed).Round(time.Millisecond), reidentAt.Sub(killed).Round(time.Millisecond), leaderAt.Sub(killed).Round(time.Millisecond))
	}
	if h, err := khaHealth(l, surv); err != nil || h.FollowerGrants != 1 {
		t.Errorf("r1's /healthz counts %d Identify claims it granted as a follower (%v), want 1", h.FollowerGrants, err)
	}
	// Heartbeats went on through the failover on every other session.
	for sh, b := range before {
		if sh == ended {
			continue
		}
		if beats[sh] <= b.Heartbeats {
			t.Errorf("shard %d: no heartbeat since the kill (%d)", sh, b.Heartbeats)
		}
	}
	if got := l.acceptedIdentifies(); got != identifies+1 {
		t.Errorf("the failover cost %d Identifies, want 1 (the ended session's)", got-identifies)
	}
	if n := len(readySessions(l.emu.State(), 1)); n != khaShards {
		t.Errorf("%d shards READY after the failover, want %d", n, khaShards)
	}
	// The new leader's plan: both nodes acknowledge its generation.
	h, err := khaHealth(l, surv)
	if err != nil || h.Role != "leader" || h.Term != newLead.Term {
		t.Errorf("r1 after the failover: %+v %v", h, err)
	}
	for _, n := range nodes {
		d, err := l.nodeDetail(n.id)
		if err != nil || !d.Live || d.AckedGeneration != h.Generation || d.RangeCount != khaShards/2 || len(d.Shards) != khaShards/2 {
			t.Errorf("%s under r1 (term %d): %+v %v", n.id, newLead.Term, d, err)
		}
		for _, s := range d.Shards {
			if s.State != appliance.ShardReady {
				t.Errorf("%s: shard %d %s under r1", n.id, s.ID, s.State)
			}
		}
	}
	// The nodes' own view: each moved to r1 after a third of its lease,
	// and no lease lapsed.
	moved := regexp.MustCompile(`checkin: controller ` + regexp.QuoteMeta(replicas[0].url) + ` silent for (\d+) ms \(a third of the lease\): trying ` + regexp.QuoteMeta(surv.url))
	for _, n := range nodes {
		if m := n.serial.waitFor(moved, 5*time.Second); m == nil {
			t.Errorf("%s did not say it moved to %s", n.id, surv.url)
		} else {
			t.Logf("%s: %s", n.id, m[0])
		}
		// The node applied r1's answers: it says the term rose to r1's.
		term := regexp.MustCompile(fmt.Sprintf(`checkin: controller term %d \(was %d\)`, newLead.Term, lead.Term))
		if m := n.serial.waitFor(term, 5*time.Second); m == nil {
			t.Errorf("%s did not apply an answer of r1's term %d", n.id, newLead.Term)
		} else {
			t.Logf("%s: %s", n.id, m[0])
		}
		if mutation == "leader-only" {
			learnt := regexp.MustCompile(`checkin: replicas from the controller: \S*` + regexp.QuoteMeta(surv.url))
			if m := n.serial.waitFor(learnt, time.Second); m == nil {
				t.Errorf("%s booted with r0 only did not learn r1 from the answers", n.id)
			} else {
				t.Logf("%s: %s", n.id, m[0])
			}
		}
		if strings.Contains(n.serial.String(), "lease: expired") {
			t.Errorf("%s's lease lapsed during the failover", n.id)
		}
	}
	if v := l.emu.Violations(); len(v) != 0 {
		t.Errorf("emulator violations: %s", violationReport(v))
	}
	delete(beats, ended) // a session of its own since
	last := firstCheckin["kha-a"]
	if firstCheckin["kha-b"].After(last) {
		last = firstCheckin["kha-b"]
	}
	t.Logf("failover: SIGKILL to r1 leading %v, to both nodes' first check-in answered by r1 %v (node lease %v, leader lease %v); "+
		"%d of %d sessions kept, %d heartbeats since the kill at least per shard; shard %d's ended session identified again %v before r1 led",
		leaderAt.Sub(killed).Round(time.Millisecond), last.Sub(killed).Round(time.Millisecond), nodeLease, leaderLease, khaShards-1, khaShards,
		minBeats(beats, before), ended, leaderAt.Sub(reidentAt).Round(time.Millisecond))
}

// minBeats is the fewest heartbeats any shard of now sent since before.
func minBeats(now map[int]int64, before map[int]gatewayemu.SessionInfo) int64 {
	m := int64(-1)
	for sh, n := range now {
		if d := n - before[sh].Heartbeats; m < 0 || d < m {
			m = d
		}
	}
	return m
}

// khaAwaitRole waits up to within (one look when 0) for replica r's
// /healthz to say role with a term of at least minTerm.
func khaAwaitRole(l *gwLab, r *khaReplica, role string, minTerm uint64, within time.Duration) (api.HealthResponse, error) {
	end := time.Now().Add(within)
	for {
		h, err := khaHealth(l, r)
		if err == nil && h.Role == role && h.Term >= minTerm {
			return h, nil
		}
		if !time.Now().Before(end) {
			return h, fmt.Errorf("not %s (term >= %d) within %v: %+v %v", role, minTerm, within, h, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// khaHealth is GET /healthz of replica r.
func khaHealth(l *gwLab, r *khaReplica) (api.HealthResponse, error) {
	var h api.HealthResponse
	out, err := l.ns.Run(l.ctx, "curl", "-fsS", "--max-time", "2", r.url+"/healthz")
	if err != nil {
		return h, fmt.Errorf("GET %s/healthz: %v %s", r.url, err, out)
	}
	return h, json.Unmarshal([]byte(out), &h)
}
