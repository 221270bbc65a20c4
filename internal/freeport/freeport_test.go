package freeport

import (
	"net"
	"strconv"
	"testing"
)

// TestPortsStayOutOfTheEphemeralRange takes many ports: each is below the
// kernel's ephemeral range (where ":0" binds and outgoing connections
// never land), none repeats, and each can be bound.
func TestPortsStayOutOfTheEphemeralRange(t *testing.T) {
	low := ephemeralLow()
	seen := map[int]bool{}
	for _, p := range Ports(t, 300) {
		if p < lowest || p >= low {
			t.Fatalf("port %d outside %d-%d", p, lowest, low-1)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
		l, err := net.Listen("tcp4", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("port %d: %v", p, err)
		}
		l.Close()
	}
}

// TestPortInUseIsSkipped holds the next candidate open: it is not handed out.
func TestPortInUseIsSkipped(t *testing.T) {
	Port(t) // initialise
	mu.Lock()
	held := next
	mu.Unlock()
	l, err := net.Listen("tcp4", "127.0.0.1:"+strconv.Itoa(held))
	if err != nil {
		t.Skipf("candidate %d already in use by someone else: %v", held, err)
	}
	defer l.Close()
	if p := Port(t); p == held {
		t.Fatalf("handed out port %d while it was in use", p)
	}
}
