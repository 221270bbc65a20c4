package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/events"
	"github.com/discord-pxe/dpxe/fleet/events/natsauth"
	"github.com/discord-pxe/dpxe/tools/gatewayemu"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// nsDialer opens NATS client connections inside a test's namespace.
type nsDialer struct{ ns string }

func (d nsDialer) Dial(network, address string) (net.Conn, error) {
	var c net.Conn
	err := inNetns(d.ns, func() (err error) {
		c, err = net.DialTimeout(network, address, 5*time.Second)
		return err
	})
	return c, err
}

// streamEvent is one message of the events stream as the test reads it.
type streamEvent struct {
	streamSeq uint64
	subject   string
	msgID     string
	meta      events.Meta
	body      []byte
}

// readEventStream reads every message of the app's stream, in stream order.
func readEventStream(ctx context.Context, js jetstream.JetStream, app string) ([]streamEvent, error) {
	name, err := events.StreamName(app)
	if err != nil {
		return nil, err
	}
	s, err := js.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, err
	}
	var out []streamEvent
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			return nil, fmt.Errorf("stream message %d: %w", seq, err)
		}
		ev := streamEvent{streamSeq: seq, subject: m.Subject, msgID: m.Header.Get("Nats-Msg-Id"), body: m.Data}
		if ev.meta, err = events.ParseHeader(m.Header); err != nil {
			return nil, fmt.Errorf("stream message %d (%s): headers: %w", seq, m.Subject, err)
		}
		out = append(out, ev)
	}
	return out, nil
}

// TestKernelEventsToJetStream: a kernel node running 2 shards of the
// emulator (20 MESSAGE_CREATE/s per session, zlib-stream) gets broker
// access with its check-in answer from `dpxe serve --nats-auth` and
// publishes every dispatch to the embedded JetStream. After 150 dispatches
// per session, every dispatch the emulator sent (READY, GUILD_CREATEs,
// messages: its record) must be in the stream exactly once, in order per
// shard, compared event by event: subject, Nats-Msg-Id, the Dpxe-* headers
// and the body's bytes. The node's console says nothing was lost and never
// shows its NATS password.
func TestKernelEventsToJetStream(t *testing.T) {
	kernelEvents(t, "10.123.0", 150, 0, false, false)
}

// TestKernelEventsHandOver: node ev-node runs both shards; after 60
// dispatches per session a second node, ev-node2, boots, the controller
// gives it one shard, ev-node releases it (Close 4000, its session and
// last sequence reported) and ev-node2 Resumes it and publishes with its
// own credentials. Dispatches 1..200 of both sessions are in the stream
// exactly once (Dpxe-Node telling which node received each).
func TestKernelEventsHandOver(t *testing.T) {
	kernelEvents(t, "10.127.0", 200, 60, true, false)
}

// TestKernelEventsBrokerRestart is TestKernelEventsToJetStream with the
// broker failing twice: `dpxe serve` (and its embedded broker) frozen
// with SIGSTOP for 8 s after 30 dispatches per session (PubAcks stop, the
// node drops the connection after 5 s, its next one gets no INFO), then,
// after 150, stopped with SIGTERM and started again on the same store 3 s
// later. The node reconnects each time and sends every dispatch not
// acknowledged again; dispatches 1..300 of both sessions are in the stream
// exactly once, equal to the emulator's record.
func TestKernelEventsBrokerRestart(t *testing.T) {
	kernelEvents(t, "10.124.0", 300, 150, false, false)
}

// TestKernelEventsBurst: the emulator at 200 messages/s per session and
// the broker frozen for 8 s after 400 dispatches per session: the shards
// stop reading (window full), the Gateway backlog piles up and is taken
// when the broker answers again; 1..3000 of both sessions are in the
// stream exactly once. A shard that takes more of the backlog in one pass
// than its ring holds Resumes from the last dispatch it staged (console:
// "not staged ... closing to Resume"); the test logs whether that
// happened but cannot force it (in the runs so far the backlog fitted the
// 512-entry ring).
func TestKernelEventsBurst(t *testing.T) {
	kernelEvents(t, "10.128.0", 3000, 800, false, true)
}

// allSessionsAt waits until both emulator sessions sent n dispatches.
func (l *gwLab) allSessionsAt(n int64, within time.Duration) {
	l.t.Helper()
	l.sessionsAt(2, n, within)
}

// sessionsAt waits until k emulator sessions sent n dispatches each.
func (l *gwLab) sessionsAt(k int, n int64, within time.Duration) {
	l.t.Helper()
	l.awaitEmu(within, fmt.Sprintf("%d sessions with %d dispatches each", k, n), func(s gatewayemu.State) bool {
		got := 0
		for _, sh := range s.Shards {
			for _, ss := range sh.Sessions {
				if ss.Seq >= n {
					got++
				}
			}
		}
		return got >= k
	})
}

// TestKernelEventsSkip: TestKernelEventsToJetStream with `dpxe serve
// --events-skip GUILD_CREATE`: the check-in answer's nats.skip names it, so
// the node publishes no GUILD_CREATE and every other dispatch exactly once;
// its events_acked_seq still reaches the last sequence (a skipped dispatch
// counts as acknowledged) and events_skipped equals the GUILD_CREATEs the
// emulator sent on that shard's session.
func TestKernelEventsSkip(t *testing.T) {
	kernelEventsSkip(t, "10.141.0", 150, 0, false, false, evRun{skip: "GUILD_CREATE"})
}

// TestKernelEventsNodeKilled: TestKernelEventsHandOver's two nodes, one
// shard each (dpxe serve with a 10 s lease); once ev-node2 has reported
// its shard's session to the controller and the sessions reach 120
// dispatches, ev-node2's QEMU is killed (SIGKILL): whatever it received
// and had not stored is gone with it. Its lease lapses, the controller
// hands the shard to ev-node from the sequence ev-node2 last reported
// (its acknowledged one), and ev-node Resumes the same session: the
// emulator never sees a third session (no new Identify), and dispatches
// 1..240 of both sessions are in the stream exactly once, in order, equal
// to the emulator's record.
func TestKernelEventsNodeKilled(t *testing.T) {
	kernelEventsSkip(t, "10.142.0", 240, 40, true, false, evRun{killAt: 120})
}

// connectWorker adds the worker "tester" to serve's NATS credentials and
// connects it to the lab's broker (subnet.1:4222) from inside the
// namespace; the connection is closed when the test ends. It returns the
// credentials file and the worker's password too (neither may reach a
// node's console).
func (l *gwLab) connectWorker(subnet string) (*nats.Conn, *natsauth.File, string) {
	return l.connectWorkerTo("nats://"+subnet+".1:4222", nats.NoReconnect())
}

// connectWorkerTo is connectWorker to the broker URLs urls (comma
// separated), with more client options.
func (l *gwLab) connectWorkerTo(urls string, more ...nats.Option) (*nats.Conn, *natsauth.File, string) {
	t := l.t
	t.Helper()
	f, err := natsauth.Open(filepath.Join(l.dir, natsauth.FileName))
	if err != nil {
		t.Fatal(err)
	}
	pass, err := f.AddWorker("tester")
	if err != nil {
		t.Fatal(err)
	}
	var nc *nats.Conn
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		opts := append([]nats.Option{nats.UserInfo("worker-tester", pass), nats.SetCustomDialer(nsDialer{l.ns.Name})}, more...)
		nc, err = nats.Connect(urls, opts...)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("worker connect: %v", err)
		}
	}
	t.Cleanup(nc.Close)
	return nc, f, pass
}

func kernelEvents(t *testing.T, subnet string, want uint64, restartAt int64, handOver, burst bool) {
	kernelEventsSkip(t, subnet, want, restartAt, handOver, burst, evRun{})
}

// evRun is what a kernelEventsSkip run adds to kernelEvents.
type evRun struct {
	// skip is an event type given to --events-skip ("" for none).
	skip string
	// killAt: with handOver, the second node is killed once both
	// sessions sent killAt dispatches (0: never).
	killAt int64
	// drain: with handOver, the second node is drained through `dpxe
	// drain` once it reported its shard's session (drainNode).
	drain bool
	// rate overrides the emulator's MESSAGE_CREATEs per second per session.
	rate float64
	// slowAck, when set, runs a worker (the SDK's Service, a durable pull
	// consumer) from the start that takes slowAck per event before it
	// acknowledges; it must read every dispatch once (slowConsumer).
	slowAck time.Duration
}

// kernelEventsSkip is kernelEvents with the faults and checks of o.
func kernelEventsSkip(t *testing.T, subnet string, want uint64, restartAt int64, handOver, burst bool, o evRun) {
	skip, killAt := o.skip, o.killAt
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	start := time.Now()
	const app = "bot"
	beat := 2 * time.Second
	if restartAt > 0 {
		beat = 10 * time.Second // the shards stop reading while the broker is away
	}
	if killAt > 0 {
		// The emulator, like Discord as far as the research tells, closes a
		// connection that stops heartbeating with 4009 after the interval
		// and a quarter, and the session ends with it: the killed node's
		// session can be Resumed only before then. 30 s leaves room for the
		// 10 s lease, the survivor's next check-in and its Resume
		// (docs/events.md "After a crash": Discord's 41.25 s and the default
		// 30 s lease).
		beat = 30 * time.Second
	}
	rate := 20.0
	if burst {
		rate = 200
	}
	if o.rate > 0 {
		rate = o.rate
	}
	lease := "30s"
	if killAt > 0 {
		lease = "10s" // the takeover waits for the killed node's lease
	}
	args := []string{"--total-shards", "2", "--lease", lease, "--nats-auth", "--nats-listen", subnet + ".1:4222"}
	if skip != "" {
		args = append(args, "--events-skip", skip)
	}
	l := newGWLab(t, ctx, subnet, gatewayemu.Options{HeartbeatInterval: beat, Shards: 2, MaxConcurrency: 2,
		MessagesPerSecond: rate, ReplayLimit: 100000}, args...)
	node := l.boot("ev-node", "virtio-net-pci", 2)
	if node.serial.waitFor(regexp.MustCompile(`nats: connected to nats://`+regexp.QuoteMeta(subnet)+`\.1:4222 as node-ev-node`), 120*time.Second) == nil {
		t.Fatal("the node did not connect to the broker")
	}
	// The worker's connection: made at the end, after the broker's
	// restarts (it does not reconnect), or at once for a slow consumer.
	var nc *nats.Conn
	var pass string
	var f *natsauth.File
	connect := func() { nc, f, pass = l.connectWorker(subnet) }
	var slow *slowConsumer
	if o.slowAck > 0 {
		connect()
		slow = startSlowConsumer(t, ctx, nc, app, o.slowAck)
	}
	nodes := map[string]bool{"ev-node": true}
	if handOver {
		l.allSessionsAt(restartAt, 90*time.Second)
		node2 := l.boot("ev-node2", "virtio-net-pci", 2)
		nodes["ev-node2"] = true
		if node2.serial.waitFor(regexp.MustCompile(`nats: connected to`), 120*time.Second) == nil {
			t.Fatal("the second node did not connect to the broker")
		}
		if node.serial.waitFor(regexp.MustCompile(`released`), 60*time.Second) == nil {
			t.Fatal("the first node released no shard")
		}
		defer func() {
			if t.Failed() {
				t.Logf("ev-node2 nats lines:\n%s", grepLines(node2.serial.String(), "nats"))
			}
		}()
		if killAt > 0 {
			killNode(t, l, node2, killAt)
		}
		if o.drain {
			want = drainNode(t, l, node2, want)
		}
	} else if restartAt > 0 {
		// First the broker stops answering: frozen for 8 s, so PubAcks
		// are missing, the node gives the connection up (5 s) and its
		// next one gets no INFO; then a clean restart.
		connects := regexp.MustCompile(`nats: connected to`)
		connected := func(n int) {
			t.Helper()
			for deadline := time.Now().Add(60 * time.Second); len(connects.FindAllString(node.serial.String(), -1)) < n; time.Sleep(200 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the node did not connect to the broker again (%d connections wanted)", n)
				}
			}
		}
		l.allSessionsAt(restartAt/2, 90*time.Second)
		if err := l.srv.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		t.Logf("dpxe serve frozen after %v", time.Since(start).Round(time.Second))
		time.Sleep(8 * time.Second)
		if err := l.srv.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		connected(2)
		if burst {
			restartAt = 0 // no restart
		}
	}
	if restartAt > 0 && !handOver {
		l.allSessionsAt(restartAt, 90*time.Second)
		l.stopServe()
		t.Logf("dpxe serve stopped after %v", time.Since(start).Round(time.Second))
		time.Sleep(3 * time.Second)
		l.startServe()
		if node.serial.waitFor(regexp.MustCompile(`(?s:nats: connected to.*){3}`), 60*time.Second) == nil {
			t.Fatal("the node did not connect to the restarted broker")
		}
	}
	l.allSessionsAt(int64(want), 90*time.Second)
	if nc == nil {
		connect()
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}

	sessions := l.emu.Sessions()
	if len(sessions) != 2 {
		t.Fatalf("emulator sessions: %+v", sessions)
	}
	// skipped[session][seq]: the dispatches of the skipped type, which the
	// stream must not hold; skippedN[shard] counts them.
	skipped := map[string]map[uint64]bool{}
	skippedN := map[uint32]uint32{}
	for _, s := range sessions {
		skipped[s.ID] = map[uint64]bool{}
		recs, _ := l.emu.Dispatched(s.ID)
		for _, r := range recs {
			var head struct {
				T string `json:"t"`
			}
			if skip != "" && json.Unmarshal(r.Frame, &head) == nil && head.T == skip {
				skipped[s.ID][uint64(r.Seq)] = true
				skippedN[uint32(s.Shard[0])]++
			}
		}
		if skip != "" && skippedN[uint32(s.Shard[0])] == 0 {
			t.Fatalf("session %s: the emulator sent no %s to skip", s.ID, skip)
		}
	}
	got := awaitStream(t, ctx, js, app, sessions, want, skipped)
	if slow != nil {
		ids := make([]string, len(sessions))
		for i, s := range sessions {
			ids[i] = s.ID
		}
		slow.check(t, ids, want, skipped)
	}

	checkRecord(t, l, got, sessions, app, skip, want, skipped, nodes)
	if v := l.emu.Violations(); len(v) != 0 {
		t.Errorf("emulator violations: %s", violationReport(v))
	}
	// The check-in status carries each slot's figures (the controller's view).
	for deadline := time.Now().Add(30 * time.Second); !handOver; time.Sleep(500 * time.Millisecond) {
		var d controller.NodeDetail
		err := l.adminGet("/v1/nodes/ev-node", &d)
		ok := err == nil && len(d.Shards) == 2
		for _, sh := range d.Shards {
			ok = ok && uint64(sh.EventsAckedSeq) >= want && uint64(sh.EventsPublished)+uint64(sh.EventsSkipped) >= want && sh.EventsLost == 0 &&
				sh.EventsSkipped == skippedN[sh.ID]
		}
		if ok {
			for _, sh := range d.Shards {
				t.Logf("check-in status of shard %d: events_published %d, events_acked_seq %d, events_in_flight %d, events_lost %d, events_skipped %d (the emulator sent %d %s)",
					sh.ID, sh.EventsPublished, sh.EventsAckedSeq, sh.EventsInFlight, sh.EventsLost, sh.EventsSkipped, skippedN[sh.ID], skip)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node's check-in status does not show %d acknowledged dispatches per shard (and %v skipped): %+v (%v)", want, skippedN, d.Shards, err)
		}
	}
	con := node.serial.String()
	if strings.Contains(con, pass) || strings.Contains(con, f.NodePassword("ev-node")) {
		t.Error("a NATS password is on the node's console")
	}
	if burst {
		t.Logf("a shard Resumed for dispatches it could not stage: %v", strings.Contains(con, "not staged"))
	}
	if strings.Contains(con, "not published") {
		t.Errorf("the node did not publish some dispatches:\n%s", grepLines(con, "not published"))
	}
	for _, line := range strings.Split(grepLines(con, "nats: "), "\n") {
		if !strings.Contains(line, "nats: up") && !strings.Contains(line, "nats: down") {
			t.Logf("console: %s", line)
		}
	}
	t.Logf("last nats line: %s; test time %v", lastLine(con, "nats: up"), time.Since(start).Round(time.Second))
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func lastLine(s, sub string) string {
	lines := strings.Split(grepLines(s, sub), "\n")
	return lines[len(lines)-1]
}

// BenchmarkKernelEventsDelivery: one QEMU node with 2 shards of an emulator
// asked for 4000 MESSAGE_CREATE/s per session (about 490-byte frames,
// zlib-stream); the emulator's writes block when the node does not read,
// so the sessions' sequence growth over 15 s (after 5 s of warm-up) is what
// the node took. Once with delivery on (dpxe serve --nats-auth: every
// dispatch published to the embedded JetStream and acknowledged), once off
// (no broker access: counted and dropped); reports both rates and their
// ratio. With delivery on it also reports the latency from the emulator's
// send of each dispatch in the window (DispatchRecord.Sent) to the time
// the stream stored it (the JetStream message timestamp, same host
// clock), p50 and p99: at saturation (ms-p50-sat, ms-p99-sat: includes the
// socket buffers' queue) and in a third run at 100/s per session (ms-p50,
// ms-p99).
func BenchmarkKernelEventsDelivery(b *testing.B) {
	if os.Getenv("DPXE_BENCH") != "1" {
		b.Skip("set DPXE_BENCH=1 (make bench)")
	}
	for i := 0; i < b.N; i++ {
		off := deliveryRate(b, deliveryRun{subnet: "10.125.0", rate: 4000})
		on := deliveryRate(b, deliveryRun{subnet: "10.126.0", on: true, rate: 4000})
		light := deliveryRate(b, deliveryRun{subnet: "10.152.0", on: true, rate: 100})
		reportDelivery(b, off, on, light)
	}
}

// BenchmarkKernelEventsDelivery128 is issue 19's figure at scale: one QEMU
// node (TCG) with 128 shards (capacity 128, --total-shards 128,
// max_concurrency 16 in the emulator and in serve: a cold start of 8
// Identify windows), one synthetic guild per shard (guild i's ID is
// (base+i)<<22, so (id>>22) % 128 gives every shard exactly one, checked
// before the boot), MESSAGE_CREATEs padded to 1 KiB frames
// (gatewayemu.Options.MessageBytes 1024: the op-0 frame as the node reads
// it after zlib-stream, which it publishes unchanged as the event's body).
//
// The emulator is asked for 15 MESSAGE_CREATE/s per session, 1,920/s per
// node (DPXE_BENCH_RATE; see docs/events.md "Figures" for the measured
// runs: 15/s is sustained since heartbeats go ahead of event work, 40/s
// is not). Each session's generator is one
// goroutine with a ticker, and a
// write the node does not take blocks it (ticks meanwhile are dropped), so
// the emulator makes only what the node reads: it does not burn the
// host's CPU on messages nobody takes, as 128 sessions at thousands per
// second each would. A session whose write is blocked for the emulator's
// write timeout is closed; the benchmark fails if any shard Identified
// twice, since the rate would then not be sustained.
//
// Reported: events/s per node with delivery off and on and their ratio
// (the target is 0.8 or more); the latency from the emulator's
// send of each dispatch in the window to its PubAck (the stream's
// timestamp), p50 and p99, at saturation (-sat, queueing included) and
// in a third boot at 2/s per session (256 events/s, unsaturated); and the
// node's memory per shard: the banner's "memory per shard" (a shard's
// private memory, the same with or without delivery) off, plus delivery's
// publish pool, which is node-wide (kernel/node/natsnode.inc: NN_CHUNKS x
// NN_CHUNK, reserved whether or not it is used) divided by the node's
// shards, on; and the pool's use in the saturated run, per shard
// (bytes/shard-pool-peak: from the lowest pool_free of the node's
// "nats: up" lines, sampled every 5 s). The rest of the delivery state
// (per-slot counters, broker buffers) is not printed by the kernel and not
// counted.
//
// DPXE_BENCH_SHARDS=N (1..128) runs the same at N shards (max_concurrency
// min(N, 16)), for a quick check that the benchmark works.
func BenchmarkKernelEventsDelivery128(b *testing.B) {
	if os.Getenv("DPXE_BENCH") != "1" {
		b.Skip("set DPXE_BENCH=1 (make bench)")
	}
	shards := 128
	if v := os.Getenv("DPXE_BENCH_SHARDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 128 {
			b.Fatalf("DPXE_BENCH_SHARDS=%q: want 1..128", v)
		}
		shards = n
	}
	// MESSAGE_CREATE/s asked per session. At 40/s (5,120/s per node) the
	// first READY shards' messages starved the rest of the cold start
	// (2026-12-02); since the kernel's read budget the cold start completes
	// but sessions are still lost (2026-12-03). DPXE_BENCH_RATE=N asks for
	// another rate.
	perSession := 15.0
	if v := os.Getenv("DPXE_BENCH_RATE"); v != "" {
		r, err := strconv.ParseFloat(v, 64)
		if err != nil || r <= 0 || r > 4000 {
			b.Fatalf("DPXE_BENCH_RATE=%q: want a rate in (0, 4000] per session", v)
		}
		perSession = r
	}
	const (
		light = 2    // per session, for the unsaturated latency
		frame = 1024 // bytes of each MESSAGE_CREATE's op-0 frame
	)
	chunks, chunk := kernelEquate(b, "NN_CHUNKS"), kernelEquate(b, "NN_CHUNK")
	pool := chunks * chunk
	for i := 0; i < b.N; i++ {
		run := deliveryRun{rate: perSession, shards: shards, bytes: frame}
		run.subnet = "10.197.0"
		off := deliveryRate(b, run)
		run.subnet, run.on = "10.198.0", true
		on := deliveryRate(b, run)
		run.subnet, run.rate = "10.199.0", light
		lat := deliveryRate(b, run)
		reportDelivery(b, off, on, lat)
		perShard, _ := shardMemory(b, off.console, shards)
		b.ReportMetric(perShard, "bytes/shard-off")
		b.ReportMetric(perShard+float64(pool)/float64(shards), "bytes/shard-on")
		if peak := poolPeak(on.console, chunks); peak >= 0 {
			b.ReportMetric(float64(peak*chunk)/float64(shards), "bytes/shard-pool-peak")
			b.Logf("delivery's pool: %d bytes node-wide (%d per shard of %d); at most %d of its %d chunks in use in the saturated run's samples", pool, pool/shards, shards, peak, chunks)
		} else {
			b.Error("no \"nats: up\" line in the delivery run's console")
		}
	}
}

// reportDelivery reports a delivery benchmark's rates, their ratio and the
// send-to-stored latency at saturation (on, -sat) and unsaturated (light).
func reportDelivery(b *testing.B, off, on, light deliveryFigures) {
	b.ReportMetric(on.rate, "events/s-on")
	b.ReportMetric(off.rate, "events/s-off")
	if off.rate > 0 {
		b.ReportMetric(on.rate/off.rate, "ratio")
	}
	for _, q := range []struct {
		d    []time.Duration
		unit string
	}{{on.lat, "-sat"}, {light.lat, ""}} {
		if len(q.d) == 0 {
			continue
		}
		p50, p99 := q.d[len(q.d)/2], q.d[len(q.d)*99/100]
		b.ReportMetric(float64(p50.Microseconds())/1000, "ms-p50"+q.unit)
		b.ReportMetric(float64(p99.Microseconds())/1000, "ms-p99"+q.unit)
		b.Logf("send to PubAck%s: %d dispatches, p50 %v p99 %v max %v", q.unit, len(q.d), p50, p99, q.d[len(q.d)-1])
	}
}

// kernelEquate reads a numeric `NAME equ N` of the kernel's event
// publisher (kernel/node/natsnode.inc), the source the image under test
// was built from.
func kernelEquate(b *testing.B, name string) int {
	b.Helper()
	src, err := os.ReadFile("../../kernel/node/natsnode.inc")
	if err != nil {
		b.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + name + `\s+equ\s+(\d+)\b`).FindSubmatch(src)
	if m == nil {
		b.Fatalf("no %s equate in kernel/node/natsnode.inc", name)
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// poolPeak is the most of the publish pool's chunks the node had in use
// in its "nats: up" lines (every 5 s: a sample, not a true peak): chunks
// less the lowest pool_free; -1 without such a line.
func poolPeak(console string, chunks int) int {
	lo := -1
	for _, m := range regexp.MustCompile(`nats: up .* pool_free (\d+)`).FindAllStringSubmatch(console, -1) {
		n, _ := strconv.Atoi(m[1])
		if lo < 0 || n < lo {
			lo = n
		}
	}
	if lo < 0 {
		return -1
	}
	return chunks - lo
}

// deliveryRun is one boot of deliveryRate: the node's shards and what the
// emulator sends them.
type deliveryRun struct {
	subnet string
	on     bool    // delivery on: dpxe serve --nats-auth hands the node broker access
	rate   float64 // MESSAGE_CREATE/s asked of the emulator per session
	shards int     // shards of the one node (0: 2); max_concurrency min(shards, 16)
	bytes  int     // gatewayemu.Options.MessageBytes (0: unpadded, about 490-byte frames)
}

// deliveryFigures are what a deliveryRun measured.
type deliveryFigures struct {
	rate    float64         // events/s the node took over the window
	lat     []time.Duration // with delivery on: sendToStored's latencies, sorted
	console string          // the node's console after the window
}

// deliveryRate boots one node with r.shards shards against the emulator at
// r.rate per session and returns the events/s the node took over a 15 s
// window (once every session sent 50 dispatches, and 5 s more) and, with
// delivery on, the sorted send-to-stored latencies of the window's
// dispatches (sendToStored). A shard that Identified twice fails the
// benchmark: its rate was not sustained.
func deliveryRate(b *testing.B, r deliveryRun) deliveryFigures {
	shards := r.shards
	if shards == 0 {
		shards = 2
	}
	mc := min(shards, 16)
	windows := time.Duration((shards+mc-1)/mc) * controller.DefaultIdentifyWindow
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute+windows)
	defer cancel()
	args := []string{"--total-shards", fmt.Sprint(shards), "--lease", "30s"}
	if r.shards != 0 {
		args = append(args, "--max-concurrency", fmt.Sprint(mc)) // the 2-shard runs keep serve's default
	}
	if r.on {
		args = append(args, "--nats-auth", "--nats-listen", r.subnet+".1:4222")
	}
	eo := gatewayemu.Options{HeartbeatInterval: 5 * time.Second, Shards: shards, MaxConcurrency: mc,
		MessagesPerSecond: r.rate, MessageBytes: r.bytes, ReplayLimit: 200000}
	if r.shards != 0 {
		// One guild per shard; the window's dispatches stay replayable
		// for sendToStored (20 s at the rate) without keeping a whole
		// run's frames of every session.
		eo.Guilds, eo.ReplayLimit = shards, max(1024, int(25*r.rate))
	}
	l := newGWLab(b, ctx, r.subnet, eo, args...)
	for s := 0; s < shards && r.shards != 0; s++ {
		if len(l.emu.GuildsForShard(s, shards)) == 0 {
			b.Fatalf("shard %d of %d has no synthetic guild: it would get no MESSAGE_CREATE", s, shards)
		}
	}
	node := l.boot("ev-bench", "virtio-net-pci", uint32(shards))
	l.sessionsAt(shards, 50, 90*time.Second+windows+windows/4)
	time.Sleep(5 * time.Second)
	seqs := func() map[string]int64 {
		m := map[string]int64{}
		for _, s := range l.emu.Sessions() {
			m[s.ID] = s.Seq
		}
		return m
	}
	s0, t0 := seqs(), time.Now()
	time.Sleep(15 * time.Second)
	s1, t1 := seqs(), time.Now()
	var n int64
	lo, hi := int64(-1), int64(0)
	for id, v := range s1 {
		d := v - s0[id]
		n += d
		if lo < 0 || d < lo {
			lo = d
		}
		hi = max(hi, d)
	}
	rate := float64(n) / t1.Sub(t0).Seconds()
	con := node.serial.String()
	idle := regexp.MustCompile(`idle=\d+%`).FindAllString(con, -1)
	if len(idle) > 0 {
		idle = idle[len(idle)-1:] // the node's share of passes with nothing to do: near 0 when it is the limit
	}
	frames := "unpadded (about 490-byte)"
	if r.bytes > 0 {
		frames = fmt.Sprintf("%d-byte", r.bytes)
	}
	b.Logf("delivery on=%v, %d shards at %.0f/s per session, %s frames: %.0f events/s per node (%d in %v; per session %d..%d), node %v; %s",
		r.on, shards, r.rate, frames, rate, n, t1.Sub(t0).Round(time.Millisecond), lo, hi, idle, lastLine(con, "nats: up"))
	if strings.Contains(con, "not published") || strings.Contains(con, "not staged") {
		b.Logf("%s", grepLines(con, "not "))
	}
	if got := l.acceptedIdentifies(); got != shards {
		b.Errorf("%d accepted Identifies for %d shards: a session was lost during the run", got, shards)
	}
	f := deliveryFigures{rate: rate, console: con}
	if r.on {
		f.lat = sendToStored(b, ctx, l, t0, t1)
	}
	return f
}

// sendToStored reads the stream's messages stored from t0 on (an ordered
// consumer) and, for each dispatch the emulator sent in [t0, t1], the time
// from its send (DispatchRecord.Sent) to its JetStream timestamp, sorted.
func sendToStored(b *testing.B, ctx context.Context, l *gwLab, t0, t1 time.Time) []time.Duration {
	b.Helper()
	sent := map[string]time.Time{} // session:seq, the Nats-Msg-Id
	want := 0
	for _, s := range l.emu.Sessions() {
		recs, _ := l.emu.Dispatched(s.ID)
		for _, r := range recs {
			if !r.Sent.Before(t0) && !r.Sent.After(t1) {
				sent[s.ID+":"+strconv.FormatInt(r.Seq, 10)] = r.Sent
				want++
			}
		}
	}
	nc, _, _ := l.connectWorker(l.subnet)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	name, _ := events.StreamName("bot")
	start := t0.Add(-time.Second) // the server's clock is the host's: a margin for the timestamps' rounding
	cons, err := js.OrderedConsumer(ctx, name, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &start})
	if err != nil {
		b.Fatal(err)
	}
	var out []time.Duration
	// The node goes on publishing after t1: stop at the first message
	// stored storedAfter past it (a window's dispatch lost with its session
	// is never found, and waiting for it read the live stream for minutes).
	const storedAfter = 30 * time.Second
	past := false
	for seen, tries := 0, 0; seen < want && tries < 1000 && !past; tries++ {
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			if err != nil {
				continue
			}
			if at, ok := sent[m.Headers().Get("Nats-Msg-Id")]; ok {
				out = append(out, md.Timestamp.Sub(at))
				seen++
			}
			if md.Timestamp.After(t1.Add(storedAfter)) {
				past = true
			}
		}
		if n == 0 {
			break // nothing more stored
		}
	}
	slices.Sort(out)
	if len(out) < want {
		b.Logf("send to stored: %d of the window's %d dispatches found in the stream", len(out), want)
	}
	return out
}

// TestKernelEventsLoopbackBrokerSkipped: `dpxe serve --nats-auth` with
// its broker on loopback (the lab's setting) hands nodes
// nats://127.0.0.1:PORT, which a node cannot reach: the kernel skips such
// a URL, gets no broker access and runs its shards as without delivery
// (no "nats:" line, both shards READY, heartbeats acknowledged).
func TestKernelEventsLoopbackBrokerSkipped(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l := newGWLab(t, ctx, "10.129.0", gatewayemu.Options{HeartbeatInterval: time.Second, Shards: 2, MaxConcurrency: 2,
		MessagesPerSecond: 20}, "--total-shards", "2", "--lease", "15s", "--nats-auth", "--nats-listen", "127.0.0.1:0")
	node := l.boot("ev-loop", "virtio-net-pci", 2)
	l.allSessionsAt(100, 90*time.Second)
	if !strings.Contains(l.logs.String(), "nats=nats://127.0.0.1:") {
		t.Fatalf("serve's broker is not on loopback:\n%s", grepLines(l.logs.String(), "msg=events"))
	}
	if con := node.serial.String(); strings.Contains(con, "nats: ") {
		t.Errorf("the node took a loopback broker URL:\n%s", grepLines(con, "nats: "))
	}
	if node.serial.waitFor(regexp.MustCompile(`ready=2`), 30*time.Second) == nil {
		t.Error("the node's shards are not both READY")
	}
}
