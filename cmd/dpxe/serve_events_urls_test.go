package main

import (
	"net/netip"
	"slices"
	"testing"
)

// TestNATSURLsOnHost: a broker listening on every interface is named to
// nodes with the boot interface's address first, the other IPv4 addresses
// next, loopback last, no IPv6, at most MaxNATSURLs; and a broker on
// loopback only is reported as out of the nodes' reach.
func TestNATSURLsOnHost(t *testing.T) {
	a := netip.MustParseAddr
	lo, eth, boot, docker := a("127.0.0.1"), a("192.168.1.5"), a("10.213.0.1"), a("172.17.0.1")
	for _, tc := range []struct {
		name  string
		boot  netip.Addr
		addrs []netip.Addr
		want  []string
	}{
		{"boot interface first", boot, []netip.Addr{lo, eth, docker, boot},
			[]string{"nats://10.213.0.1:4222", "nats://192.168.1.5:4222", "nats://172.17.0.1:4222", "nats://127.0.0.1:4222"}},
		{"no netboot: interface order, loopback last", netip.Addr{}, []netip.Addr{lo, eth, boot, a("::1"), a("fe80::1")},
			[]string{"nats://192.168.1.5:4222", "nats://10.213.0.1:4222", "nats://127.0.0.1:4222"}},
		{"only loopback", netip.Addr{}, []netip.Addr{lo}, []string{"nats://127.0.0.1:4222"}},
		{"capped", boot, []netip.Addr{a("10.0.0.1"), a("10.0.0.2"), a("10.0.0.3"), a("10.0.0.4"), a("10.0.0.5"),
			a("10.0.0.6"), a("10.0.0.7"), a("10.0.0.8"), lo},
			[]string{"nats://10.213.0.1:4222", "nats://10.0.0.1:4222", "nats://10.0.0.2:4222", "nats://10.0.0.3:4222",
				"nats://10.0.0.4:4222", "nats://10.0.0.5:4222", "nats://10.0.0.6:4222", "nats://10.0.0.7:4222"}},
	} {
		if got := natsURLsOnHost(4222, tc.boot, tc.addrs); !slices.Equal(got, tc.want) {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
	for _, tc := range []struct {
		urls        []string
		unreachable bool
	}{
		{[]string{"nats://127.0.0.1:4222"}, true},
		{[]string{"nats://127.0.0.1:4222", "nats://127.0.0.2:4222"}, true},
		{[]string{"nats://10.213.0.1:4222", "nats://127.0.0.1:4222"}, false},
		{[]string{"nats://broker.lan:4222"}, false},
		{nil, false},
	} {
		if got := natsUnreachable(tc.urls, "127.0.0.1:4222") != ""; got != tc.unreachable {
			t.Errorf("natsUnreachable(%q) = %v, want %v", tc.urls, got, tc.unreachable)
		}
	}
}

// TestNATSListen: the embedded server listens where --nats-listen says;
// by default on loopback, and with netboot and --nats-auth on the boot
// interface's address with loopback relayed to it.
func TestNATSListen(t *testing.T) {
	boot := netip.MustParseAddr("10.213.0.1")
	for _, tc := range []struct {
		given  string
		auth   bool
		boot   netip.Addr
		listen string
		relay  []string
	}{
		{"", false, netip.Addr{}, "127.0.0.1:4222", nil},
		{"", true, netip.Addr{}, "127.0.0.1:4222", nil},
		{"", false, boot, "127.0.0.1:4222", nil},
		{"", true, boot, "10.213.0.1:4222", []string{"127.0.0.1:4222"}},
		{"0.0.0.0:4222", true, boot, "0.0.0.0:4222", nil},
		{"127.0.0.1:0", true, boot, "127.0.0.1:0", nil},
	} {
		listen, relay := natsListen(tc.given, tc.auth, tc.boot)
		if listen != tc.listen || !slices.Equal(relay, tc.relay) {
			t.Errorf("natsListen(%q, auth %v, boot %v) = %q %q, want %q %q", tc.given, tc.auth, tc.boot, listen, relay, tc.listen, tc.relay)
		}
	}
}
