package gatewayemu

import (
	"context"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestHeartbeatsWhileALargeMessageWaits: a client that reads slowly keeps
// the emulator's writer busy with an 8 MiB GUILD_CREATE for seconds, and
// meanwhile sends its heartbeats on time. Discord reads them whatever it
// is writing; so must the emulator: no missed_heartbeat, and every
// heartbeat gets its ACK once the client reads again. (The emulator once
// wrote each ACK from its read loop, so the loop waited behind the large
// message and the next heartbeat, on time, was counted as missed: the
// kernel's large-message test failed that way on a loaded machine.)
// Meanwhile the test reads the emulator's State as the end-to-end tests'
// Await does, every 20 ms: the session's lock was held across the write,
// State took it under the emulator's lock, and every read loop, which
// takes that lock for each payload, waited behind the blocked write (the
// kernel's flood test saw heartbeats that reached the host on time read
// up to 3.8 s late).
func TestHeartbeatsWhileALargeMessageWaits(t *testing.T) {
	o := fastOptions()
	// A deadline of 1.5 s + the grace: a heartbeat every 200 ms keeps it with
	// a wide margin on a loaded machine (a 400 ms interval failed under load
	// when the test's own sends were delayed by 300 ms).
	o.HeartbeatInterval = 1500 * time.Millisecond
	o.Guilds = 1
	o.GuildCreateBytes = []int{8 << 20}
	o.GuildMembers = 40_000
	o.Seed = 7
	emu := startEmu(t, o)
	// A small receive buffer, so the emulator's write of the large
	// message blocks for as long as this client does not read.
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 16<<10) })
		if err != nil {
			return err
		}
		return serr
	}}
	dial := func(network, addr string) (net.Conn, error) {
		return d.DialContext(context.Background(), network, addr)
	}
	addr := strings.TrimPrefix(emu.URL(), "ws://")
	c, resp := rawDial(t, dial, addr, addr, "/?v=10&encoding=json")
	if resp.StatusCode != 101 {
		t.Fatalf("handshake status %d", resp.StatusCode)
	}
	if _, f := c.expect(); f.Op != OpHello {
		t.Fatalf("first payload %v", f)
	}
	c.send(OpHeartbeat, nil)
	c.send(OpIdentify, identifyPayload(emu, 0, 1))
	for {
		_, f := c.expect()
		if f.Op == OpHeartbeatACK {
			continue
		}
		if f.T == nil || *f.T != "READY" {
			t.Fatalf("want READY, got %v", f)
		}
		break
	}
	// Not reading: 25 heartbeats, 200 ms apart (5 s, three deadlines),
	// while the GUILD_CREATE waits in the emulator's writer.
	const beats = 25
	stop := make(chan struct{})
	type polls struct {
		n       int
		longest time.Duration
	}
	polled := make(chan polls)
	go func() {
		var p polls
		defer func() { polled <- p }()
		poll := time.NewTicker(20 * time.Millisecond)
		defer poll.Stop()
		for {
			select {
			case <-stop:
				return
			case <-poll.C:
			}
			t0 := time.Now()
			emu.State()
			p.n++
			p.longest = max(p.longest, time.Since(t0))
		}
	}()
	tick := time.NewTicker(200 * time.Millisecond)
	for i := range beats {
		c.send(OpHeartbeat, 1)
		if i < beats-1 {
			<-tick.C
		}
	}
	tick.Stop()
	close(stop)
	p := <-polled
	t.Logf("State read %d times while the large message waited, the longest read took %v", p.n, p.longest)
	if v := emu.Violations(); len(v) != 0 {
		t.Fatalf("heartbeats sent on time while a large message waited counted as violations: %+v", v)
	}
	// Read again: the GUILD_CREATE whole and an ACK for every heartbeat,
	// in whatever order the writer took them.
	acks, guild := 0, false
	for acks < beats || !guild {
		_, f := c.expect()
		switch {
		case f.Op == OpHeartbeatACK:
			acks++
		case f.T != nil && *f.T == "GUILD_CREATE" && len(f.D) == 8<<20:
			guild = true
		default:
			t.Fatalf("unexpected payload %v (after %d ACKs, GUILD_CREATE %v)", f, acks, guild)
		}
	}
	noViolations(t, emu)
}
