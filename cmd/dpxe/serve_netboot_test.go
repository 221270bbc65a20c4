package main

import (
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"testing"
	"time"
)

// TestBootRouteDispatch: with a wildcard --listen, a connection made to
// the boot address reaches only the boot mux, and any other (loopback,
// a management address) only the operator mux: /boot/ is not served to
// the operator side, the dashboard and admin routes not to the boot side.
func TestBootRouteDispatch(t *testing.T) {
	op := http.NewServeMux()
	op.HandleFunc("GET /v1/nodes", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "operator") })
	op.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	boot := &bootRoute{ip: netip.MustParseAddr("127.0.0.2"), mux: http.NewServeMux()}
	boot.mux.HandleFunc("GET /boot/{name}", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "boot") })
	boot.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	app := &fleetApp{mux: op, boot: boot}
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: app.handler(), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	get := func(host, path string) int {
		t.Helper()
		c := &http.Client{Timeout: 5 * time.Second}
		resp, err := c.Get("http://" + net.JoinHostPort(host, strconv.Itoa(port)) + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, c := range []struct {
		host, path string
		want       int
	}{
		{"127.0.0.1", "/boot/52-54-00-00-00-01.ipxe", 404}, // loopback: no /boot/
		{"127.0.0.1", "/v1/nodes", 200},
		{"127.0.0.2", "/boot/52-54-00-00-00-01.ipxe", 200},
		{"127.0.0.2", "/v1/nodes", 404}, // the boot address: no operator route
		{"127.0.0.2", "/healthz", 200},
	} {
		if got := get(c.host, c.path); got != c.want {
			t.Errorf("GET %s%s: %d, want %d", c.host, c.path, got, c.want)
		}
	}
}

func TestListenCovers(t *testing.T) {
	ip := netip.MustParseAddr("10.0.0.1")
	for listen, want := range map[string]bool{"0.0.0.0:8080": true, ":8080": true, "[::]:8080": true,
		"127.0.0.1:8080": false, "10.0.0.1:8080": false, "10.0.0.2:8080": false} {
		if got := listenCovers(listen, ip); got != want {
			t.Errorf("listenCovers(%q) = %v, want %v", listen, got, want)
		}
	}
}
