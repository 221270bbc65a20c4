package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/controller"
)

// TestForwardedForSignature: what a follower signs, a replica with the
// same key accepts, taking the client's address; a change of the key,
// time, method, URI, address, route or body, or a missing or malformed
// header, is refused and leaves the connection's address. A client's own
// forwarded-for headers never survive the follower.
func TestForwardedForSignature(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	fol, lead := &replica{forwardKey: key}, &replica{forwardKey: key}
	const body = `{"node_id":"n1","capacity":1,"generation":0}`
	signed := func() *http.Request {
		req := httptest.NewRequest("POST", "http://leader/v1/checkin?x=1", strings.NewReader(body))
		req.RemoteAddr = "10.1.2.3:4567"
		req.Header.Set(forwardedForHeader, "192.0.2.9:1") // the client's own attempt
		req.Header.Set(forwardedAuthHeader, "v1 1 00")
		req.Header.Set(forwardedViaHeader, "https")
		fol.signForwarded(req, controller.RouteBootHTTP)
		req.RemoteAddr = "127.0.0.1:999" // as the leader sees the follower
		return req
	}
	req := signed()
	if got := req.Header.Get(forwardedForHeader); got != "10.1.2.3:4567" {
		t.Fatalf("the follower sent %s %q, want the connection's address", forwardedForHeader, got)
	}
	if via, err := lead.verifyForwarded(req); err != nil || req.RemoteAddr != "10.1.2.3:4567" || via != controller.RouteBootHTTP {
		t.Fatalf("verify: %v, RemoteAddr %q, route %q", err, req.RemoteAddr, via)
	}
	if b, _ := io.ReadAll(req.Body); string(b) != body {
		t.Fatalf("the body after verifying: %q", b)
	}
	if req.Header.Get(forwardedForHeader) != "" || req.Header.Get(forwardedAuthHeader) != "" || req.Header.Get(forwardedViaHeader) != "" {
		t.Fatal("the headers survive verification")
	}
	// Unsigned requests pass untouched.
	plain := httptest.NewRequest("POST", "http://leader/v1/checkin", strings.NewReader(body))
	if _, err := lead.verifyForwarded(plain); err != nil || plain.RemoteAddr != "192.0.2.1:1234" {
		t.Fatalf("unsigned: %v, %q", err, plain.RemoteAddr)
	}
	for _, tc := range []struct {
		name   string
		leader *replica
		change func(*http.Request)
	}{
		{"other key", &replica{forwardKey: bytes.Repeat([]byte{8}, 32)}, func(*http.Request) {}},
		{"no key", &replica{}, func(*http.Request) {}},
		{"address", lead, func(r *http.Request) { r.Header.Set(forwardedForHeader, "10.1.2.4:4567") }},
		{"address not HOST:PORT", lead, func(r *http.Request) { r.Header.Set(forwardedForHeader, "10.1.2.3") }},
		{"route", lead, func(r *http.Request) { r.Header.Set(forwardedViaHeader, "boot-https") }},
		{"no route", lead, func(r *http.Request) { r.Header.Del(forwardedViaHeader) }},
		{"unknown route", lead, func(r *http.Request) { r.Header.Set(forwardedViaHeader, "ftp") }},
		{"method", lead, func(r *http.Request) { r.Method = "PUT" }},
		{"URI", lead, func(r *http.Request) { r.URL.RawQuery = "x=2" }},
		{"body", lead, func(r *http.Request) { r.Body = io.NopCloser(strings.NewReader(strings.Replace(body, "1", "2", 1))) }},
		{"MAC", lead, func(r *http.Request) {
			f := strings.Fields(r.Header.Get(forwardedAuthHeader))
			mac, _ := hex.DecodeString(f[2])
			mac[0] ^= 1
			r.Header.Set(forwardedAuthHeader, f[0]+" "+f[1]+" "+hex.EncodeToString(mac))
		}},
		{"time", lead, func(r *http.Request) {
			f := strings.Fields(r.Header.Get(forwardedAuthHeader))
			at, _ := strconv.ParseInt(f[1], 10, 64)
			r.Header.Set(forwardedAuthHeader, f[0]+" "+strconv.FormatInt(at+1, 10)+" "+f[2])
		}},
		{"old", lead, func(r *http.Request) {
			at := time.Now().Add(-2 * forwardSkew).UnixMilli()
			r.Header.Set(forwardedAuthHeader, fmt.Sprintf("v2 %d %x", at, forwardMAC(key, at, r.Method, r.URL.RequestURI(), "10.1.2.3:4567", controller.RouteBootHTTP, []byte(body))))
		}},
		{"no auth", lead, func(r *http.Request) { r.Header.Del(forwardedAuthHeader) }},
		{"other version", lead, func(r *http.Request) {
			r.Header.Set(forwardedAuthHeader, strings.Replace(r.Header.Get(forwardedAuthHeader), "v2", "v1", 1))
		}},
	} {
		req := signed()
		tc.change(req)
		via, err := tc.leader.verifyForwarded(req)
		if !errors.Is(err, errForwardedFor) || req.RemoteAddr != "127.0.0.1:999" || via != "" {
			t.Errorf("%s changed: verify %v, RemoteAddr %q, route %q; want refused, the follower's address", tc.name, err, req.RemoteAddr, via)
		}
	}
}

// checkForwardedFor, the second half of TestFollowerDashboardActions
// (which has two replicas running, lead leading and the other following
// its term): a node's check-in sent to a follower
// reaches the leader with the node's own address, so the leader records
// that address (as it binds a network enrollment to it), not the
// follower's. The node's connections come from 127.0.0.2, the replicas'
// from 127.0.0.1. A client that forges the headers, to the leader
// directly or through the follower, is recorded at its own address.
//
// Mutations: without signForwarded in replica.forward, the leader records
// 127.0.0.1 (the follower) and the test fails; with verifyForwarded
// taking the header without checking its MAC, the forger to the leader
// is recorded at the address it claims and the test fails.
func checkForwardedFor(t *testing.T, c *haCluster, lead int) {
	urls := c.urls()
	leader, follower := urls[lead], urls[1-lead]
	out, err := exec.Command(c.bin, "nodes", "--server", leader, "--token-file", c.tokenFile, "add", "fwd.1").CombinedOutput()
	if err != nil {
		t.Fatalf("dpxe nodes add: %v\n%s", err, out)
	}
	cred := strings.TrimSpace(strings.Split(string(out), "\n")[1])
	tok, err := os.ReadFile(c.tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	admin := strings.TrimSpace(string(tok))

	from := func(ip string) *http.Client {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
		return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				return d.DialContext(ctx, network, addr)
			},
		}}
	}
	checkin := func(cl *http.Client, server string, forged bool) {
		t.Helper()
		req, _ := http.NewRequest("POST", server+"/v1/checkin", strings.NewReader(`{"node_id":"fwd.1","capacity":1,"generation":0}`))
		req.Header.Set("Authorization", "Bearer "+cred)
		if forged {
			req.Header.Set(forwardedForHeader, "10.9.9.9:1")
			req.Header.Set(forwardedAuthHeader, fmt.Sprintf("v1 %d %s", time.Now().UnixMilli(), strings.Repeat("00", 32)))
		}
		resp, err := cl.Do(req)
		if err != nil {
			t.Fatalf("check-in at %s: %v", server, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("check-in at %s: %d %s\n%s", server, resp.StatusCode, b, c.logTail())
		}
	}
	address := func() string {
		t.Helper()
		req, _ := http.NewRequest("GET", leader+"/v1/nodes/fwd.1", nil)
		req.Header.Set("Authorization", "Bearer "+admin)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var n struct {
			Address string `json:"address"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&n); err != nil || resp.StatusCode != 200 {
			t.Fatalf("GET /v1/nodes/fwd.1 on the leader: %d %v", resp.StatusCode, err)
		}
		return n.Address
	}
	for _, step := range []struct {
		name, ip, server string
		forged           bool
	}{
		{"through the follower", "127.0.0.2", follower, false},
		{"forged, to the leader", "127.0.0.3", leader, true},
		{"forged, through the follower", "127.0.0.4", follower, true},
		{"through the follower again", "127.0.0.2", follower, false},
	} {
		checkin(from(step.ip), step.server, step.forged)
		if got := address(); got != step.ip {
			t.Errorf("check-in %s from %s: the leader records the node at %q", step.name, step.ip, got)
		}
	}
	if !strings.Contains(c.procs[lead].logs(), "forwarded request's client address refused") {
		t.Errorf("the leader did not log the forged forwarded-for\n%s", c.logTail())
	}
}
