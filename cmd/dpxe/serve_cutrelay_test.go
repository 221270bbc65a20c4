package main

import (
	"net"
	"sync"
	"testing"
)

// cutRelay is one replica's route to PostgreSQL in
// TestReplicasSurviveFaults: a TCP relay the test can cut and heal. While
// cut it is a partition as the replica sees one: bytes sent either way go
// nowhere (they are held, as TCP holds unacknowledged data, and delivered
// when the cut heals), a connection's close is not passed on, and new
// connections are accepted but reach the database only after the heal.
// No connection is reset, so the replica learns of the cut only through
// its own timeouts.
type cutRelay struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	healed chan struct{} // closed at the heal; replaced at each cut
	conns  []net.Conn
	closed bool
}

// newCutRelay listens on a free loopback port and relays to target until
// the test ends.
func newCutRelay(t testing.TB, target string) *cutRelay {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &cutRelay{ln: ln, target: target, healed: make(chan struct{})}
	close(r.healed)
	t.Cleanup(r.close)
	go r.accept()
	return r
}

func (r *cutRelay) addr() string { return r.ln.Addr().String() }

// wait returns once the relay is not cut (or is closed).
func (r *cutRelay) wait() {
	r.mu.Lock()
	ch := r.healed
	r.mu.Unlock()
	<-ch
}

// setCut cuts (true) or heals (false) the route.
func (r *cutRelay) setCut(cut bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cut == r.cut || r.closed {
		return
	}
	r.cut = cut
	if cut {
		r.healed = make(chan struct{})
	} else {
		close(r.healed)
	}
}

func (r *cutRelay) close() {
	r.setCut(false)
	r.mu.Lock()
	r.closed = true
	conns := r.conns
	r.conns = nil
	r.mu.Unlock()
	r.ln.Close()
	for _, c := range conns {
		c.Close()
	}
}

// track records c to close at the end; false when the relay is closed.
func (r *cutRelay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		c.Close()
		return false
	}
	r.conns = append(r.conns, c)
	return true
}

func (r *cutRelay) accept() {
	for {
		a, err := r.ln.Accept()
		if err != nil {
			return
		}
		if !r.track(a) {
			return
		}
		go func() {
			r.wait()
			b, err := net.Dial("tcp", r.target)
			if err != nil {
				a.Close()
				return
			}
			if !r.track(b) {
				a.Close()
				return
			}
			done := make(chan struct{}, 2)
			go func() { r.copy(a, b); done <- struct{}{} }()
			go func() { r.copy(b, a); done <- struct{}{} }()
			<-done
			a.Close()
			b.Close()
		}()
	}
}

// copy moves src's bytes to dst, each read held while the route is cut;
// src's end is passed on (by returning) only when the route is whole.
func (r *cutRelay) copy(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		r.wait()
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
