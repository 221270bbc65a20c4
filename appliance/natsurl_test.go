package appliance

import (
	"strconv"
	"strings"
	"testing"
)

func TestParseNATSURL(t *testing.T) {
	for _, tc := range []struct {
		u     string
		want  NATSURL
		error error
	}{
		{"nats://10.0.0.1:4222", NATSURL{Host: "10.0.0.1", Addr: [4]byte{10, 0, 0, 1}, Port: 4222}, nil},
		{"nats://10.0.0.1", NATSURL{Host: "10.0.0.1", Addr: [4]byte{10, 0, 0, 1}, Port: NATSDefaultPort}, nil},
		{"nats://broker.example.com:14222", NATSURL{Host: "broker.example.com", Named: true, Port: 14222}, nil},
		{"tls://Broker-1.lab", NATSURL{Host: "Broker-1.lab", Named: true, Port: NATSDefaultPort, TLS: true}, nil},
		{"tls://10.1.2.3:1", NATSURL{Host: "10.1.2.3", Addr: [4]byte{10, 1, 2, 3}, Port: 1, TLS: true}, nil},
		{"nats://1.2.3.256:4222", NATSURL{Host: "1.2.3.256", Named: true, Port: 4222}, nil}, // not a quad: a name
		{"nats://127.0.0.1:4222", NATSURL{}, ErrNATSURLLoopback},
		{"nats://0.0.0.0", NATSURL{}, ErrNATSURLLoopback},
		{"nats://localhost:4222", NATSURL{Host: "localhost", Named: true, Port: 4222}, nil}, // a name: whatever DNS says
		{"NATS://h:1", NATSURL{}, ErrNATSURL},
		{"nats://", NATSURL{}, ErrNATSURL},
		{"nats://h:", NATSURL{}, ErrNATSURL},
		{"nats://h:0", NATSURL{}, ErrNATSURL},
		{"nats://h:65536", NATSURL{}, ErrNATSURL},
		{"nats://h:123456", NATSURL{}, ErrNATSURL},
		{"nats://h/", NATSURL{}, ErrNATSURL},
		{"nats://h:1/x", NATSURL{}, ErrNATSURL},
		{"nats://u:p@h:1", NATSURL{}, ErrNATSURL},
		{"nats://h_1:1", NATSURL{}, ErrNATSURL},
		{"nats://[::1]:4222", NATSURL{}, ErrNATSURL},
		{"ws://h:1", NATSURL{}, ErrNATSURL},
		{"nats://" + strings.Repeat("a", 253) + ":4222", NATSURL{Host: strings.Repeat("a", 253), Named: true, Port: 4222}, nil},
		{"nats://" + strings.Repeat("a", 254), NATSURL{}, ErrNATSURL},
		{"tls://" + strings.Repeat("a", 253) + ":65535", NATSURL{Host: strings.Repeat("a", 253), Named: true, Port: 65535, TLS: true}, nil},
	} {
		got, err := ParseNATSURL(tc.u)
		if err != tc.error || got != tc.want {
			t.Errorf("ParseNATSURL(%.40q) = %+v, %v; want %+v, %v", tc.u, got, err, tc.want, tc.error)
		}
	}
}

// TestNATSAccessHostNames: the check-in answer's URLs may name the broker
// by host name, and every URL Validate takes is one the kernel parses.
func TestNATSAccessHostNames(t *testing.T) {
	a := NATSAccess{URLs: []string{"nats://broker.test:4222", "nats://10.0.0.1:4222", "nats://127.0.0.1:4222", "tls://broker.test:4443"}, User: "u", Password: "p", App: "bot"}
	if err := a.Validate(); err != nil {
		t.Fatal(err)
	}
	a.URLs = []string{"nats://" + strings.Repeat("a", 254) + ":4222"}
	if err := a.Validate(); err == nil {
		t.Error("a 254-byte host passed Validate")
	}
}

// TestNATSURLDigestCoverage: the digest's URLs reach names, tls:// and
// refusals. Like the "gwurl" digest's they almost never make a whole
// dotted quad: literals (and the loopback refusal) are TestParseNATSURL's
// and the end-to-end tests' (nats://10.x.0.1:4222, and 127.0.0.1 skipped
// in TestKernelEventsLoopbackBrokerSkipped).
func TestNATSURLDigestCoverage(t *testing.T) {
	rng := &splitmix64{state: 1}
	var ok, named, tls, refused, loop int
	for i := 0; i < ChecksumDigestCases; i++ {
		u, err := ParseNATSURL(NATSURLCase(DialURLCase(rng.next(), rng.next)))
		switch err {
		case nil:
			ok++
			if u.Named {
				named++
			}
			if u.TLS {
				tls++
			}
		case ErrNATSURLLoopback:
			loop++
		default:
			refused++
		}
	}
	t.Logf("%d parsed (%d names, %d tls://), %d loopback, %d refused", ok, named, tls, loop, refused)
	if ok < 100 || named < 20 || tls < 20 || refused < 100 {
		t.Errorf("poor coverage: %d parsed (%d names, %d tls://), %d loopback, %d refused", ok, named, tls, loop, refused)
	}
	if NATSURLDigest(1) == NATSURLDigest(2) {
		t.Error("the digest does not depend on the seed")
	}
}

// FuzzParseNATSURL: a URL the parser takes is rebuilt from its parts (the
// scheme, the host, the port when it was written) and parses the same.
func FuzzParseNATSURL(f *testing.F) {
	for _, s := range []string{"nats://10.0.0.1:4222", "tls://broker.lab", "nats://h:1/", "nats://127.0.0.1", "nats://1.2.3.256:00042"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, u string) {
		n, err := ParseNATSURL(u)
		if err != nil {
			return
		}
		if len(u) > MaxNATSURLLen || n.Port == 0 || n.Host == "" || len(n.Host) > DNSNameMax {
			t.Fatalf("%q: %+v", u, n)
		}
		scheme := "nats://"
		if n.TLS {
			scheme = "tls://"
		}
		rest, ok := strings.CutPrefix(u, scheme)
		if !ok || !strings.HasPrefix(rest, n.Host) {
			t.Fatalf("%q: scheme or host %+v", u, n)
		}
		if port := rest[len(n.Host):]; port == "" && n.Port != NATSDefaultPort {
			t.Fatalf("%q: port %d without one written", u, n.Port)
		} else if p, err := strconv.Atoi(strings.TrimPrefix(port, ":")); port != "" && (err != nil || p != int(n.Port)) {
			t.Fatalf("%q: port %d", u, n.Port)
		}
		if again, err := ParseNATSURL(scheme + n.Host + ":" + strconv.Itoa(int(n.Port))); err != nil || again != n {
			t.Fatalf("%q: rebuilt %+v, %v; want %+v", u, again, err, n)
		}
		if !n.Named && (n.Addr[0] == 127 || n.Addr == [4]byte{}) {
			t.Fatalf("%q: a loopback literal parsed", u)
		}
	})
}
