package e2e

import (
	"context"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/events"
	"github.com/discord-pxe/dpxe/sdk/dpxe"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestKernelEventsDrain: TestKernelEventsHandOver's two nodes, one shard
// each, the emulator at 100 MESSAGE_CREATE/s per session. Once ev-node2
// has reported its shard's session, `dpxe drain ev-node2` runs while
// events flow: ev-node2 releases the shard handing over from its
// acknowledged sequence (not the last received: what it received and had
// not stored is dropped with the release and must come from Discord's
// replay; `dpxe serve` is throttled so that some are likely in flight),
// ev-node Resumes the same session (no new Identify), and the
// stream holds every dispatch of both sessions exactly once, in order,
// equal to the emulator's record, up to 100 past the drain. A worker
// (the SDK's Service, a durable pull consumer) reads the stream from the
// start and takes 3 ms per event before it acknowledges; it must read
// every one of those dispatches exactly once and never be delivered one
// twice, while the node publishes at the emulator's pace.
func TestKernelEventsDrain(t *testing.T) {
	kernelEventsSkip(t, "10.151.0", 300, 40, true, false, evRun{drain: true, rate: 100, slowAck: 3 * time.Millisecond})
}

// drainNode drains node through `dpxe drain` once it reported a READY
// shard (moveShard) and returns want raised to 100 dispatches past the
// sessions' sequence after the shard Resumed elsewhere, so that the
// comparison covers the drain.
func drainNode(t *testing.T, l *gwLab, node *gwNode, want uint64) uint64 {
	t.Helper()
	released := regexp.MustCompile(`released`)
	releases := len(released.FindAllString(node.serial.String(), -1))
	moveShard(t, l, node, 0, "draining", func() {
		// dpxe serve (and its broker) runs 20 ms in every 50 until the
		// node released the shard: PubAcks come late, so the release
		// likely finds dispatches in flight, the case the hand-over from
		// the acknowledged sequence is for (with nothing in flight the
		// acknowledged and the received sequence are the same).
		unthrottle := throttleServe(t, l, 30*time.Millisecond, 20*time.Millisecond)
		defer unthrottle()
		if out, err := l.ns.Run(l.ctx, l.bin, "drain", node.id, "--server", l.server, "--token-file", l.token); err != nil {
			t.Fatalf("dpxe drain %s: %v\n%s", node.id, err, out)
		}
		for deadline := time.Now().Add(60 * time.Second); len(released.FindAllString(node.serial.String(), -1)) <= releases; time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s did not release its shard within 60 s of the drain:\n%s", node.id, grepLines(node.serial.String(), "nats"))
			}
		}
	})
	con := node.serial.String()
	// Whether dispatches were in flight at the release (the case the
	// hand-over from the acknowledged sequence is for). Logged, not
	// required: the throttle makes it likely, not certain (3 runs of 5),
	// and the HPUBs in flight reach the broker on the old connection
	// anyway (docs/events.md, TestKernelEventsDrain).
	t.Logf("drain: dispatches in flight at the release: %v; %s", strings.Contains(con, "a shard with dispatches in flight was released"),
		grepLines(con, "acknowledged sequence"))
	var top int64
	for _, s := range l.emu.Sessions() {
		top = max(top, s.Seq)
	}
	if w := uint64(top) + 100; w > want {
		want = w
	}
	return want
}

// throttleServe stops `dpxe serve` (SIGSTOP) for stop and lets it run for
// run, over and over, until the returned function is called (which waits
// for the last SIGCONT); at most 2 minutes.
func throttleServe(t *testing.T, l *gwLab, stop, run time.Duration) func() {
	t.Helper()
	p := l.srv.Process
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		defer p.Signal(syscall.SIGCONT)
		for end := time.Now().Add(2 * time.Minute); time.Now().Before(end); {
			p.Signal(syscall.SIGSTOP)
			time.Sleep(stop)
			p.Signal(syscall.SIGCONT)
			select {
			case <-quit:
				return
			case <-time.After(run):
			}
		}
	}()
	return func() {
		select {
		case <-quit:
		default:
			close(quit)
		}
		<-done
	}
}

// slowConsumer is a worker that reads the app's events through the SDK's
// Service (a durable pull consumer from the stream's start) and sleeps
// its delay per event before the SDK acknowledges it.
type slowConsumer struct {
	mu          sync.Mutex
	seen        map[string]map[uint64]int // session -> seq -> deliveries
	redelivered int                       // events with Delivered > 1
	n           int
	maxBacklog  uint64 // the most events stored and not yet acknowledged, sampled every 250 ms
	err         error
	backlog     func() (uint64, error)
	stop        context.CancelFunc
	done        chan struct{}
}

func startSlowConsumer(t *testing.T, ctx context.Context, nc *nats.Conn, app string, delay time.Duration) *slowConsumer {
	t.Helper()
	svc, err := dpxe.NewService(ctx, nc, dpxe.Config{App: app, Service: "slow", FromStart: true, MaxAckPending: 64})
	if err != nil {
		t.Fatal(err)
	}
	c := &slowConsumer{seen: map[string]map[uint64]int{}, done: make(chan struct{})}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, _ := events.StreamName(app)
	c.backlog = func() (uint64, error) {
		cons, err := js.Consumer(ctx, stream, "slow")
		if err != nil {
			return 0, err
		}
		info, err := cons.Info(ctx)
		if err != nil {
			return 0, err
		}
		return info.NumPending + uint64(info.NumAckPending), nil
	}
	cctx, cancel := context.WithCancel(ctx)
	c.stop = cancel
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for cctx.Err() == nil {
			if n, err := c.backlog(); err == nil {
				c.mu.Lock()
				c.maxBacklog = max(c.maxBacklog, n)
				c.mu.Unlock()
			}
			select {
			case <-cctx.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-sampled })
	go func() {
		defer close(c.done)
		err := svc.Run(cctx, func(ctx context.Context, ev *dpxe.Event) error {
			time.Sleep(delay) // the worker's work, bounded
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.seen[ev.Session] == nil {
				c.seen[ev.Session] = map[uint64]int{}
			}
			c.seen[ev.Session][ev.Seq]++
			if ev.Delivered > 1 {
				c.redelivered++
			}
			c.n++
			return nil
		}, func(err error) { t.Errorf("slow consumer: bad event: %v", err) })
		c.mu.Lock()
		c.err = err
		c.mu.Unlock()
	}()
	t.Cleanup(func() { cancel(); <-c.done })
	return c
}

// check waits (60 s at most) until the worker read dispatches 1..want of
// every session (those not in skipped), then requires each read exactly
// once. It logs how far behind the worker was when the stream held them.
func (c *slowConsumer) check(t *testing.T, sessions []string, want uint64, skipped map[string]map[uint64]bool) {
	t.Helper()
	behind, err := c.backlog()
	if err != nil {
		t.Errorf("slow consumer: info: %v", err)
	}
	start := time.Now()
	complete := func() bool {
		for _, s := range sessions {
			for q := uint64(1); q <= want; q++ {
				if c.seen[s][q] == 0 && !skipped[s][q] {
					return false
				}
			}
		}
		return true
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		c.mu.Lock()
		ok, err := complete(), c.err
		c.mu.Unlock()
		if ok {
			break
		}
		if err != nil {
			t.Fatalf("slow consumer stopped: %v", err)
		}
		if time.Now().After(deadline) {
			c.mu.Lock()
			n := c.n
			c.mu.Unlock()
			t.Fatalf("the slow consumer did not read dispatches 1..%d of every session within 60 s of the stream holding them (%d read)", want, n)
		}
	}
	c.stop()
	<-c.done
	for _, s := range sessions {
		for q := uint64(1); q <= want; q++ {
			if n := c.seen[s][q]; n != 1 && !skipped[s][q] {
				t.Errorf("slow consumer: session %s seq %d read %d times", s, q, n)
			}
		}
	}
	if c.redelivered > 0 {
		t.Errorf("slow consumer: %d events delivered more than once", c.redelivered)
	}
	t.Logf("slow consumer: %d events read, at most %d stored and not yet acknowledged; when the stream held every dispatch it was %d behind and read them all %v later",
		c.n, c.maxBacklog, behind, time.Since(start).Round(100*time.Millisecond))
}
