package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/discord-pxe/dpxe/fleet/events/eventstest"
	"github.com/discord-pxe/dpxe/tools/gatewayemu"
)

// TestKernelEventsCallout: a kernel node running 2 shards publishes
// through an external three-server JetStream cluster (nats-server built
// from the module, in the test's namespace) that asks `dpxe serve
// --nats-callout-key` about every client: the node's check-in answer
// names the three servers (--nats-node-url) and its credentials, and the
// cluster lets it in with its shards' permissions. After 40 dispatches
// per session the server the node is connected to is killed (SIGKILL);
// the node connects to another (let in by the callout again) and sends
// again what was not acknowledged. Dispatches 1..120 of both sessions
// are then in the R3 stream exactly once, equal to the emulator's record,
// read by a worker the callout let in; no password is on the console.
func TestKernelEventsCallout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	const (
		subnet = "10.173.0"
		app    = "bot"
		want   = 120
		killAt = 40
	)
	l := newGWLabNoServe(t, ctx, subnet, gatewayemu.Options{HeartbeatInterval: 10 * time.Second, Shards: 2, MaxConcurrency: 2,
		MessagesPerSecond: 20, ReplayLimit: 100000})
	keys := eventstest.NewCalloutKeys(t)
	c := eventstest.StartCalloutIn(t, eventstest.BuildServer(t), "ce", keys, subnet+".1",
		func(name string, arg ...string) *exec.Cmd { return l.ns.Command(ctx, name, arg...) }, nsDialer{l.ns.Name})
	t.Logf("cluster %s up after %v", c.ClientURLs(), time.Since(start).Round(time.Millisecond))
	l.srvArgs = []string{"serve", "--db", filepath.Join(l.dir, "dpxe.db"), "--listen", subnet + ".1:8080",
		"--no-dashboard", "--gateway-api", l.gatewayAPI, "--bot-token-file", l.botToken,
		"--total-shards", "2", "--lease", "30s", "--nats-url", c.ClientURLs(), "--events-replicas", "3",
		"--nats-nkey", eventstest.SeedFile(t, l.dir, "serve.nk", keys.Serve),
		"--nats-callout-key", eventstest.SeedFile(t, l.dir, "issuer.nk", keys.Issuer),
		"--nats-system-nkey", eventstest.SeedFile(t, l.dir, "sys.nk", keys.System),
		"--nats-node-url", c.ClientURLs()}
	l.startServe()

	node := l.boot("ce-node", "virtio-net-pci", 2)
	connected := regexp.MustCompile(`nats: connected to (nats://[0-9.]+:\d+) as node-ce-node`)
	if node.serial.waitFor(connected, 120*time.Second) == nil {
		t.Fatalf("the node did not connect to the cluster:\n%s", grepLines(node.serial.String(), "nats"))
	}
	l.allSessionsAt(killAt, 90*time.Second)
	m := connected.FindAllStringSubmatch(node.serial.String(), -1)
	first := m[len(m)-1][1]
	killed := ""
	for i, u := range c.URLs {
		if u == first {
			killed = c.Names[i]
		}
	}
	if killed == "" || !c.Stop(killed) {
		t.Fatalf("the node's broker %s is none of the cluster's %v", first, c.URLs)
	}
	t.Logf("killed %s (%s), the node's broker, after %v", killed, first, time.Since(start).Round(time.Second))
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		m = connected.FindAllStringSubmatch(node.serial.String(), -1)
		if last := m[len(m)-1][1]; len(m) > 1 && last != first {
			t.Logf("the node connected to %s after %v", last, time.Since(start).Round(time.Second))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node did not connect to another server:\n%s", grepLines(node.serial.String(), "nats"))
		}
	}
	l.allSessionsAt(want, 90*time.Second)

	// A worker the callout lets in reads the stream from the survivors.
	nc, f, pass := l.connectWorkerTo(c.ClientURLs(), nats.MaxReconnects(-1))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	sessions := l.emu.Sessions()
	if len(sessions) != 2 {
		t.Fatalf("emulator sessions: %+v", sessions)
	}
	// A JetStream API request that reaches the survivors while they elect
	// new leaders can go unanswered (the client then waits its whole
	// context): ask with a short timeout until the stream answers.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
		st, err := js.Stream(rctx, "DPXE_EVENTS_"+app)
		if err == nil {
			_, err = st.Info(rctx)
		}
		rcancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stream does not answer the worker 30 s after the kill: %v", err)
		}
		t.Logf("stream info: %v (asking again)", err)
	}
	got := awaitStream(t, ctx, js, app, sessions, want, nil)
	checkRecord(t, l, got, sessions, app, "", want, nil, map[string]bool{"ce-node": true})
	if v := l.emu.Violations(); len(v) != 0 {
		t.Errorf("emulator violations: %s", violationReport(v))
	}
	con := node.serial.String()
	if strings.Contains(con, f.NodePassword("ce-node")) || strings.Contains(con, pass) {
		t.Error("a NATS password is on the node's console")
	}
	l.stopServe() // its log is complete (and no longer written)
	if strings.Contains(l.logs.String(), f.NodePassword("ce-node")) {
		t.Error("the node's NATS password is in serve's log")
	}
	t.Logf("test time %v", time.Since(start).Round(time.Second))
}
