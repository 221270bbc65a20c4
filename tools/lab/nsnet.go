package lab

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/discord-pxe/dpxe/internal/tcprelay"
	"golang.org/x/sys/unix"
)

// nsDialer opens TCP connections inside a network namespace from this
// process, which stays in the host's namespace. One goroutine locks itself
// to an OS thread, moves that thread into the namespace with setns(2) and
// creates every socket there; a socket belongs to the namespace it was
// created in, so the rest of the process reads and writes it as usual.
// The goroutine never unlocks its thread: when it ends, Go ends the thread
// too, so no other goroutine ever runs in the namespace by accident.
type nsDialer struct {
	reqs chan dialReq
	stop chan struct{}
	once sync.Once
}

type dialReq struct {
	addr  string
	reply chan dialResult
}

type dialResult struct {
	conn net.Conn
	err  error
}

// newNSDialer starts a dialer for the namespace named ns (under /run/netns).
func newNSDialer(ns string) (*nsDialer, error) {
	f, err := os.Open(filepath.Join("/run/netns", ns))
	if err != nil {
		return nil, err
	}
	d := &nsDialer{reqs: make(chan dialReq), stop: make(chan struct{})}
	ready := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked, see above
		err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
		f.Close()
		ready <- err
		if err != nil {
			return
		}
		for {
			select {
			case <-d.stop:
				return
			case r := <-d.reqs:
				c, err := net.DialTimeout("tcp", r.addr, 5*time.Second)
				r.reply <- dialResult{c, err}
			}
		}
	}()
	if err := <-ready; err != nil {
		return nil, fmt.Errorf("entering namespace %s: %w", ns, err)
	}
	return d, nil
}

// DialContext connects to addr inside the namespace.
func (d *nsDialer) DialContext(ctx context.Context, _, addr string) (net.Conn, error) {
	r := dialReq{addr: addr, reply: make(chan dialResult, 1)}
	select {
	case d.reqs <- r:
	case <-d.stop:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case res := <-r.reply:
		return res.conn, res.err
	case <-ctx.Done():
		go func() { // the dial finishes on its own; do not leak its socket
			if res := <-r.reply; res.conn != nil {
				res.conn.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// Close ends the dialer's goroutine and thread.
func (d *nsDialer) Close() { d.once.Do(func() { close(d.stop) }) }

// forwarder accepts TCP connections on a host address and relays each to a
// fixed address inside the lab's namespace: this is how the dashboard and
// the API of a `dpxe serve` running in the namespace appear on the host's
// 127.0.0.1:8080. It lives in the lab process and ends with it.
type forwarder struct{ *tcprelay.Relay }

// listenForward listens on host (failing at once if the port is taken).
func listenForward(host string) (*forwarder, error) {
	r, err := tcprelay.Listen(host)
	if err != nil {
		return nil, err
	}
	return &forwarder{r}, nil
}

// Addr is the host address actually listened on (port 0 resolved).
func (f *forwarder) Addr() string { return f.Relay.Addr().String() }

// serve relays connections to target, dialled with dial (from inside the
// namespace), until Close.
func (f *forwarder) serve(target string, dial func(ctx context.Context, network, addr string) (net.Conn, error)) {
	f.Serve(target, dial)
}
