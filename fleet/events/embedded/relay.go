package embedded

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// The NATS server has one client listener. `dpxe serve` puts it on the boot
// interface's address, where nodes reach it, and relays loopback to it for
// workers beside serve (ServerConfig.Relay): each connection accepted on a
// relay address is joined byte for byte to a new connection to the
// listener. The server then sees such a client as coming from the
// listener's own address.

// relayDialTimeout bounds the relay's connection to the server's listener.
const relayDialTimeout = 5 * time.Second

// relay accepts on one address and joins each connection to target.
type relay struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// listenRelay listens on addr and relays every connection to target
// until close.
func listenRelay(addr, target string) (*relay, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	r := &relay{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			c, err := ln.Accept()
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
	return r, nil
}

// track adds or removes a connection; adding after close refuses.
func (r *relay) track(c net.Conn, add bool) bool {
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
// server until either side ends.
func (r *relay) join(c net.Conn) {
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), relayDialTimeout)
	var d net.Dialer
	up, err := d.DialContext(ctx, "tcp", r.target)
	cancel()
	if err != nil {
		return // the client sees its connection closed, as by a server going down
	}
	defer up.Close()
	if !r.track(c, true) {
		return
	}
	defer r.track(c, false)
	if !r.track(up, true) {
		return
	}
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

// close stops accepting, cuts every relayed connection and waits for the
// relay's goroutines.
func (r *relay) close() error {
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
