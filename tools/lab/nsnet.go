package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

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
type forwarder struct {
	ln     net.Listener
	target string
	dial   func(ctx context.Context, network, addr string) (net.Conn, error)
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// listenForward listens on host (failing at once if the port is taken).
func listenForward(host string) (*forwarder, error) {
	ln, err := net.Listen("tcp", host)
	if err != nil {
		return nil, err
	}
	return &forwarder{ln: ln, conns: map[net.Conn]struct{}{}}, nil
}

// Addr is the host address actually listened on (port 0 resolved).
func (f *forwarder) Addr() string { return f.ln.Addr().String() }

// serve relays connections to target until Close.
func (f *forwarder) serve(target string, dial func(ctx context.Context, network, addr string) (net.Conn, error)) {
	f.target, f.dial = target, dial
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			c, err := f.ln.Accept()
			if err != nil {
				return
			}
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				f.relay(c)
			}()
		}
	}()
}

func (f *forwarder) track(c net.Conn, add bool) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if add {
		if f.closed {
			return false
		}
		f.conns[c] = struct{}{}
	} else {
		delete(f.conns, c)
	}
	return true
}

func (f *forwarder) relay(c net.Conn) {
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	up, err := f.dial(ctx, "tcp", f.target)
	cancel()
	if err != nil {
		return
	}
	defer up.Close()
	if !f.track(c, true) || !f.track(up, true) {
		return
	}
	defer f.track(c, false)
	defer f.track(up, false)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
	<-done
}

// Close stops listening and cuts every relayed connection.
func (f *forwarder) Close() error {
	err := f.ln.Close()
	f.mu.Lock()
	f.closed = true
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
