// Package freeport hands out loopback ports to tests that must tell a
// server its port before the server starts: NATS route ports (each server
// of a cluster lists the others), Prometheus, PostgreSQL, a second
// listener on the same port as another.
//
// The usual trick, listen on ":0", read the port, close, hand it on, is a
// race: the kernel picks ":0" ports and the source ports of outgoing
// connections from its ephemeral range (net.ipv4.ip_local_port_range,
// 32768-60999 by default), so between the close and the server's bind the
// port can be taken by anything that asks for a port, the server itself
// included (nats-server binds its client listener on ":0" before its
// route listener). TestClusterBrokerKilledMidStream failed in CI exactly
// so: "cluster server n1 not ready".
//
// This package picks ports below the ephemeral range instead, where only
// an explicit bind to that number lands, and never hands the same port out
// twice in one process. Each process starts at its own random offset, so
// two test binaries running at once meet only by chance, and a port found
// in use is skipped.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// lowest is the smallest port handed out: above the well-known and the
// commonly configured ones (8080, 9090...).
const lowest = 20000

var (
	mu   sync.Mutex
	next int // the next candidate; 0 before the first call
	top  int // one past the largest candidate
)

// ephemeralLow reads the start of the kernel's ephemeral range.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				return n
			}
		}
	}
	return 32768
}

// take returns a port that is not in the ephemeral range, was never
// returned before in this process, and is free on 127.0.0.1 for TCP and
// UDP now.
func take() (int, error) {
	mu.Lock()
	defer mu.Unlock()
	if next == 0 {
		top = ephemeralLow()
		if top-lowest < 1000 {
			return 0, fmt.Errorf("freeport: the ephemeral range starts at %d, too low to keep ports below it", top)
		}
		next = lowest + rand.IntN(top-lowest)
	}
	for range top - lowest {
		p := next
		next++
		if next == top {
			next = lowest
		}
		if free(p) {
			return p, nil
		}
	}
	return 0, fmt.Errorf("freeport: no free port in %d-%d", lowest, top-1)
}

func free(p int) bool {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
	l, err := net.Listen("tcp4", addr)
	if err != nil {
		return false
	}
	defer l.Close()
	c, err := net.ListenPacket("udp4", addr)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// Port returns a loopback port for a server to bind (TCP or UDP), or
// fails the test.
func Port(t testing.TB) int {
	t.Helper()
	p, err := take()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Ports returns n distinct loopback ports, or fails the test.
func Ports(t testing.TB, n int) []int {
	t.Helper()
	ps := make([]int, n)
	for i := range ps {
		ps[i] = Port(t)
	}
	return ps
}

// Addr returns "127.0.0.1:PORT" for a fresh port, or fails the test.
func Addr(t testing.TB) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(Port(t)))
}

// Get is Port for code without a testing.TB (a helper that returns errors).
func Get() (int, error) { return take() }
