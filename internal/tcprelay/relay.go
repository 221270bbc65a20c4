// Package tcprelay joins TCP connections accepted on one address, byte for
// byte, to new connections to a fixed target. `dpxe serve` uses it to relay
// loopback to the embedded NATS server's one client listener; the lab uses
// it to show services inside its network namespace on the host.
package tcprelay

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// dialTimeout bounds each connection to the target.
const dialTimeout = 5 * time.Second

// DialFunc opens a connection to the target (net.Dialer.DialContext by
// default; the lab dials from inside its namespace).
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// Relay accepts on one address and joins each connection to a target.
type Relay struct {
	ln     net.Listener
	target string
	dial   DialFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// Listen listens on addr (failing at once if the port is taken); Serve
// starts relaying.
func Listen(addr string) (*Relay, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &Relay{ln: ln, conns: map[net.Conn]struct{}{}}, nil
}

// Addr is the address listened on (port 0 resolved).
func (r *Relay) Addr() net.Addr { return r.ln.Addr() }

// Serve relays every connection to target, dialled with dial (nil: a
// plain TCP dial), until Close.
func (r *Relay) Serve(target string, dial DialFunc) {
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	r.target, r.dial = target, dial
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			c, err := r.ln.Accept()
			if err != nil {
				return
			}
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				r.join(c)
			}()
		}
	}()
}

// track adds or removes a connection; adding after Close refuses.
func (r *Relay) track(c net.Conn, add bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !add {
		delete(r.conns, c)
		return true
	}
	if r.closed {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

// join copies both ways between a client and a new connection to the
// target until both directions end. A target that cannot be reached
// closes the client's connection, as a server going down would.
func (r *Relay) join(c net.Conn) {
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	up, err := r.dial(ctx, "tcp", r.target)
	cancel()
	if err != nil {
		return
	}
	defer up.Close()
	if !r.track(c, true) || !r.track(up, true) {
		return
	}
	defer r.track(c, false)
	defer r.track(up, false)
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

// Close stops accepting, cuts every relayed connection and waits for the
// relay's goroutines.
func (r *Relay) Close() error {
	err := r.ln.Close()
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
