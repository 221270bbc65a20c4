package appliance

import (
	"encoding/binary"
	"errors"
	"strings"
)

// NATSURL is a broker URL of a check-in answer as the kernel's NATS
// client (kernel/node/natsnode.inc, nn_parse_url) splits it.
type NATSURL struct {
	Host  string  // HOST alone: the name looked up (or the literal)
	Named bool    // HOST is a name, not an IPv4 literal
	Addr  [4]byte // the literal's address (Named false)
	Port  uint16  // NATSDefaultPort when absent
	TLS   bool    // tls://
}

// NATSDefaultPort is a broker URL's port when it names none.
const NATSDefaultPort = 4222

// MaxNATSURLLen is the longest broker URL the kernel takes (its buffer
// holds "tls://", a 253-byte name and ":65535" with room to spare); a
// longer one ends the kernel's reading of the answer's URLs.
const MaxNATSURLLen = 271

// Refusals of ParseNATSURL (the kernel only skips the URL).
var (
	ErrNATSURL         = errors.New("want nats://HOST[:PORT] or tls://HOST[:PORT]")
	ErrNATSURLLoopback = errors.New("a loopback or 0.0.0.0 address: not a broker a node can reach")
)

// ParseNATSURL is the kernel's nn_parse_url: "nats://" or "tls://" (lower
// case), then HOST[:PORT] by ParseDialURL's rules for a ws:// URL's host
// and port (HOST 1..253 bytes of A-Za-z0-9.-, an IPv4 literal when a
// dotted quad fills it, else a name; PORT 1..5 digits, 1..65535), with
// NATSDefaultPort when PORT is absent and nothing after it (no path, no
// user info). An IPv4 literal 127.x.x.x or 0.0.0.0 is ErrNATSURLLoopback:
// `dpxe serve` lists its loopback listener last for local clients, and a
// node cannot reach it. At most MaxNATSURLLen bytes.
func ParseNATSURL(u string) (NATSURL, error) {
	rest, ok := strings.CutPrefix(u, "nats://")
	tls := false
	if !ok {
		rest, ok = strings.CutPrefix(u, "tls://")
		tls = true
	}
	if !ok || len(u) > MaxNATSURLLen {
		return NATSURL{}, ErrNATSURL
	}
	d, err := ParseDialURL("ws://" + rest) // the kernel does the same: one host and port parser
	if err != nil || d.HostPort != rest {
		return NATSURL{}, ErrNATSURL // a path, a query, user info, a bad host or port
	}
	n := NATSURL{Host: d.Host, Named: d.Named, Addr: d.Addr, Port: d.Port, TLS: tls}
	if d.HostPort == d.Host {
		n.Port = NATSDefaultPort
	}
	if !n.Named && (n.Addr[0] == 127 || n.Addr == [4]byte{}) {
		return NATSURL{}, ErrNATSURLLoopback
	}
	return n, nil
}

// NATSURLCase is the "natsurl" digest's URL for a DialURLCase URL: its
// "ws://" becomes "nats://" and its "wss://" "tls://"; one without either
// stays as it is.
func NATSURLCase(dial string) string {
	if rest, ok := strings.CutPrefix(dial, "wss://"); ok {
		return "tls://" + rest
	}
	if rest, ok := strings.CutPrefix(dial, "ws://"); ok {
		return "nats://" + rest
	}
	return dial
}

// NATSURLDigest is the kernel's "selftest digest natsurl" for a seed: the
// 4096 URLs of the "gwurl" digest (DialURLCase) made broker URLs by
// NATSURLCase, through ParseNATSURL, folding 1 for a refusal, 2 for
// ErrNATSURLLoopback, else 0, the address (a little-endian load, 0 for a
// name), the port, 1 for a name, 1 for tls:// and the length of Host.
func NATSURLDigest(seed uint32) uint64 {
	rng := &splitmix64{state: uint64(seed)}
	d := newDigest()
	for i := 0; i < ChecksumDigestCases; i++ {
		u, err := ParseNATSURL(NATSURLCase(DialURLCase(rng.next(), rng.next)))
		switch err {
		case nil:
		case ErrNATSURLLoopback:
			d.add(2)
			continue
		default:
			d.add(1)
			continue
		}
		d.add(0)
		d.add(uint64(binary.LittleEndian.Uint32(u.Addr[:])))
		d.add(uint64(u.Port))
		d.add(b2u(u.Named))
		d.add(b2u(u.TLS))
		d.add(uint64(len(u.Host)))
	}
	return uint64(d)
}
