package appliance

import (
	"bytes"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// dnsMsg builds a response to query 0x1234 for name with Go's own DNS
// message builder (golang.org/x/net/dns/dnsmessage), so the parser is
// checked against messages a real library writes, compression included.
func dnsMsg(t testing.TB, h dnsmessage.Header, name string, answers func(b *dnsmessage.Builder) error) []byte {
	t.Helper()
	h.ID, h.Response = 0x1234, true
	b := dnsmessage.NewBuilder(nil, h)
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		t.Fatal(err)
	}
	n := dnsmessage.MustNewName(name + ".")
	if err := b.Question(dnsmessage.Question{Name: n, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}); err != nil {
		t.Fatal(err)
	}
	if err := b.StartAnswers(); err != nil {
		t.Fatal(err)
	}
	if answers != nil {
		if err := answers(&b); err != nil {
			t.Fatal(err)
		}
	}
	m, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func rh(name string, ttl uint32) dnsmessage.ResourceHeader {
	return dnsmessage.ResourceHeader{Name: dnsmessage.MustNewName(name + "."), Class: dnsmessage.ClassINET, TTL: ttl}
}

// TestParseDNSAnswerLibraryMessages parses responses written by
// dnsmessage: the address and TTL of the first A record after CNAMEs and
// other types, and each refusal by its verdict.
func TestParseDNSAnswerLibraryMessages(t *testing.T) {
	const name = "gateway-us-east1-b.discord.gg"
	a := func(ip [4]byte, ttl uint32) func(b *dnsmessage.Builder) error {
		return func(b *dnsmessage.Builder) error { return b.AResource(rh(name, ttl), dnsmessage.AResource{A: ip}) }
	}
	cases := []struct {
		what string
		msg  []byte
		want DNSResult
	}{
		{"one A", dnsMsg(t, dnsmessage.Header{RecursionAvailable: true}, name, a([4]byte{162, 159, 135, 234}, 300)),
			DNSResult{Verdict: DNSAnswer, Addr: [4]byte{162, 159, 135, 234}, TTL: 300}},
		{"CNAME, AAAA, then two A", dnsMsg(t, dnsmessage.Header{}, name, func(b *dnsmessage.Builder) error {
			if err := b.CNAMEResource(rh(name, 60), dnsmessage.CNAMEResource{CNAME: dnsmessage.MustNewName("edge.discord.gg.")}); err != nil {
				return err
			}
			if err := b.AAAAResource(rh("edge.discord.gg", 60), dnsmessage.AAAAResource{AAAA: [16]byte{0x20, 1}}); err != nil {
				return err
			}
			if err := b.AResource(rh("edge.discord.gg", 42), dnsmessage.AResource{A: [4]byte{10, 1, 2, 3}}); err != nil {
				return err
			}
			return b.AResource(rh("edge.discord.gg", 43), dnsmessage.AResource{A: [4]byte{10, 1, 2, 4}})
		}), DNSResult{Verdict: DNSAnswer, Addr: [4]byte{10, 1, 2, 3}, TTL: 42}},
		{"TTL with the top bit", dnsMsg(t, dnsmessage.Header{}, name, a([4]byte{1, 2, 3, 4}, 0x80000001)),
			DNSResult{Verdict: DNSAnswer, Addr: [4]byte{1, 2, 3, 4}, TTL: 0x80000001}},
		{"NXDOMAIN", dnsMsg(t, dnsmessage.Header{RCode: dnsmessage.RCodeNameError}, name, nil), DNSResult{Verdict: DNSRcode, Rcode: 3}},
		{"SERVFAIL", dnsMsg(t, dnsmessage.Header{RCode: dnsmessage.RCodeServerFailure}, name, nil), DNSResult{Verdict: DNSRcode, Rcode: 2}},
		{"REFUSED", dnsMsg(t, dnsmessage.Header{RCode: dnsmessage.RCodeRefused}, name, nil), DNSResult{Verdict: DNSRcode, Rcode: 5}},
		{"truncated", dnsMsg(t, dnsmessage.Header{Truncated: true}, name, nil), DNSResult{Verdict: DNSTruncated}},
		{"no answers", dnsMsg(t, dnsmessage.Header{}, name, nil), DNSResult{Verdict: DNSNoA}},
		{"AAAA only", dnsMsg(t, dnsmessage.Header{}, name, func(b *dnsmessage.Builder) error {
			return b.AAAAResource(rh(name, 60), dnsmessage.AAAAResource{})
		}), DNSResult{Verdict: DNSNoA}},
		{"A of class CH", dnsMsg(t, dnsmessage.Header{}, name, func(b *dnsmessage.Builder) error {
			h := rh(name, 60)
			h.Class = dnsmessage.ClassCHAOS
			return b.AResource(h, dnsmessage.AResource{A: [4]byte{9, 9, 9, 9}})
		}), DNSResult{Verdict: DNSNoA}},
	}
	for _, c := range cases {
		if got := ParseDNSAnswer(c.msg, 0x1234); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.what, got, c.want)
		}
		if got := ParseDNSAnswer(c.msg, 0x1235); got.Verdict != DNSOtherID {
			t.Errorf("%s, another ID: %+v", c.what, got)
		}
		// Every cut short of the whole message is refused, never a panic;
		// a cut inside the header is malformed.
		for n := 0; n < len(c.msg); n++ {
			got := ParseDNSAnswer(c.msg[:n], 0x1234)
			if n < 12 && got.Verdict != DNSMalformed {
				t.Errorf("%s cut to %d: %+v", c.what, n, got)
			}
			if c.want.Verdict == DNSAnswer && got.Verdict == DNSAnswer && got != c.want {
				t.Errorf("%s cut to %d: a different answer %+v", c.what, n, got)
			}
		}
	}
	query := dnsMsg(t, dnsmessage.Header{}, name, nil)
	query[2] &^= 0x80 // QR clear: a query
	if got := ParseDNSAnswer(query, 0x1234); got.Verdict != DNSMalformed {
		t.Errorf("a query: %+v", got)
	}
	notify := dnsMsg(t, dnsmessage.Header{OpCode: 4}, name, nil)
	if got := ParseDNSAnswer(notify, 0x1234); got.Verdict != DNSMalformed {
		t.Errorf("opcode 4: %+v", got)
	}
}

// TestParseDNSAnswerHostile covers what a library would not write: loops,
// forward pointers, reserved label types, lengths past the end, an A
// record of 5 bytes, 129 labels.
func TestParseDNSAnswerHostile(t *testing.T) {
	hdr := func(an byte) []byte { return []byte{0x12, 0x34, 0x81, 0x80, 0, 1, 0, an, 0, 0, 0, 0} }
	q := []byte{1, 'a', 1, 'b', 0, 0, 1, 0, 1} // at offset 12
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	longName := bytes.Repeat([]byte{1, 'x'}, 129)
	cases := []struct {
		what string
		msg  []byte
		want DNSVerdict
	}{
		{"self pointer", cat(hdr(1), q, []byte{0xC0, 21, 0, 1, 0, 1, 0, 0, 0, 1, 0, 4, 1, 2, 3, 4}), DNSMalformed},
		{"forward pointer", cat(hdr(1), q, []byte{0xC0, 40, 0, 1, 0, 1, 0, 0, 0, 1, 0, 4, 1, 2, 3, 4}), DNSMalformed},
		{"RDLENGTH past the end", cat(hdr(1), q, []byte{0xC0, 12, 0, 1, 0, 1, 0, 0, 0, 1, 0, 40, 1, 2, 3, 4}), DNSMalformed},
		{"A of 5 bytes", cat(hdr(1), q, []byte{0xC0, 12, 0, 1, 0, 1, 0, 0, 0, 1, 0, 5, 1, 2, 3, 4, 5}), DNSMalformed},
		{"label type 0x40", cat(hdr(1), q, []byte{0x40, 0, 1, 0, 1, 0, 0, 0, 1, 0, 4, 1, 2, 3, 4}), DNSMalformed},
		{"label type 0x80", cat(hdr(1), q, []byte{0x80, 0, 1, 0, 1, 0, 0, 0, 1, 0, 4, 1, 2, 3, 4}), DNSMalformed},
		{"one answer announced, none there", cat(hdr(1), q), DNSMalformed},
		{"pointer's second byte missing", cat(hdr(1), q, []byte{0xC0}), DNSMalformed},
		{"128 labels", cat(hdr(1), []byte{1, 'a', 1, 'b', 0, 0, 1, 0, 1}, longName[:254], []byte{0, 0, 1, 0, 1, 0, 0, 0, 1, 0, 4, 1, 2, 3, 4}), DNSAnswer},
		{"129 labels", cat(hdr(1), []byte{1, 'a', 1, 'b', 0, 0, 1, 0, 1}, longName, []byte{0, 0, 1, 0, 1, 0, 0, 0, 1, 0, 4, 1, 2, 3, 4}), DNSMalformed},
		{"the template", dnsTemplate, DNSAnswer},
	}
	for _, c := range cases {
		if got := ParseDNSAnswer(c.msg, 0x1234); got.Verdict != c.want {
			t.Errorf("%s: %+v, want verdict %d", c.what, got, c.want)
		}
	}
}

// TestDNSRules checks the TTL clamp and the retry delays at their edges.
func TestDNSRules(t *testing.T) {
	for ttl, want := range map[uint32]uint32{0: 5, 4: 5, 5: 5, 6: 6, 300: 300, 86400: 86400, 86401: 86400, 0x7FFFFFFF: 86400, 0x80000000: 5, 0xFFFFFFFF: 5} {
		if got := DNSTTLClamp(ttl); got != want {
			t.Errorf("DNSTTLClamp(%d) = %d, want %d", ttl, got, want)
		}
	}
	for f, want := range map[uint32]uint32{0: 1000, 1: 1000, 2: 2000, 3: 4000, 4: 8000, 5: 16000, 6: 30000, 7: 30000, 40: 30000, 0x80000001: 30000, 0xFFFFFFFF: 30000} {
		if got := DNSRetryDelayMS(f); got != want {
			t.Errorf("DNSRetryDelayMS(%d) = %d, want %d", f, got, want)
		}
	}
}

// TestParseDialURL checks the dial URL parser case by case.
func TestParseDialURL(t *testing.T) {
	long := strings.Repeat("a", 253)
	ok := []struct {
		u    string
		want DialURL
	}{
		{"ws://gateway.discord.gg/?v=10&encoding=json", DialURL{Host: "gateway.discord.gg", HostPort: "gateway.discord.gg", Named: true, Port: 80, Path: "/?v=10&encoding=json"}},
		{"ws://gateway-us-east1-b.discord.gg:7878", DialURL{Host: "gateway-us-east1-b.discord.gg", HostPort: "gateway-us-east1-b.discord.gg:7878", Named: true, Port: 7878, Path: "/"}},
		{"ws://10.79.0.1:7878/resume?v=10", DialURL{Host: "10.79.0.1", HostPort: "10.79.0.1:7878", Addr: [4]byte{10, 79, 0, 1}, Port: 7878, Path: "/resume?v=10"}},
		{"ws://1.2.3.256/", DialURL{Host: "1.2.3.256", HostPort: "1.2.3.256", Named: true, Port: 80, Path: "/"}},
		{"ws://01.2.3.4/", DialURL{Host: "01.2.3.4", HostPort: "01.2.3.4", Named: true, Port: 80, Path: "/"}},
		{"ws://1.2.3.4.5/", DialURL{Host: "1.2.3.4.5", HostPort: "1.2.3.4.5", Named: true, Port: 80, Path: "/"}},
		{"ws://GATEWAY.Discord.GG:00443/", DialURL{Host: "GATEWAY.Discord.GG", HostPort: "GATEWAY.Discord.GG:00443", Named: true, Port: 443, Path: "/"}},
		{"ws://h:65535", DialURL{Host: "h", HostPort: "h:65535", Named: true, Port: 65535, Path: "/"}},
		{"wss://gateway.discord.gg/?v=10", DialURL{Host: "gateway.discord.gg", HostPort: "gateway.discord.gg", Named: true, Port: 443, TLS: true, Path: "/?v=10"}},
		{"wss://10.0.0.1:7878", DialURL{Host: "10.0.0.1", HostPort: "10.0.0.1:7878", Addr: [4]byte{10, 0, 0, 1}, Port: 7878, TLS: true, Path: "/"}},
		{"ws://" + long, DialURL{Host: long, HostPort: long, Named: true, Port: 80, Path: "/"}},
		{"ws://h/" + strings.Repeat("p", 229), DialURL{Host: "h", HostPort: "h", Named: true, Port: 80, Path: "/" + strings.Repeat("p", 229)}},
	}
	for _, c := range ok {
		got, err := ParseDialURL(c.u)
		if err != nil || got != c.want {
			t.Errorf("ParseDialURL(%q) = %+v, %v; want %+v", c.u, got, err, c.want)
		}
	}
	for _, u := range []string{"", "ws://", "wss://", "wss:/h/", "WSS://h/", "WS://h/", "http://h/", "ws://h:/", "ws://h:0/", "ws://h:65536/",
		"ws://h:123456/", "ws://h:80x", "ws://h?v=10", "ws://h_x/", "ws://user@h/", "ws://[::1]/", "ws://:80/", "ws://" + long + "a",
		"ws://h/" + strings.Repeat("p", 230), "ws://h\x00/", "ws://h x/"} {
		if got, err := ParseDialURL(u); err == nil {
			t.Errorf("ParseDialURL(%q) = %+v, want a refusal", u, got)
		}
	}
	// What the controller hands out (GatewayDialURL of a host-name URL)
	// always parses, with the name kept for Host and SNI.
	for _, base := range []string{"ws://gateway.discord.gg", "ws://gateway-us-east1-b.discord.gg:8080/x?y", "ws://10.0.0.1:1"} {
		d, err := GatewayDialURL(base)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ParseDialURL(d); err != nil {
			t.Errorf("GatewayDialURL(%q) = %q does not parse", base, d)
		}
	}
}

// checkDialURL holds what every accepted URL must satisfy.
func checkDialURL(t *testing.T, u string, d DialURL) {
	t.Helper()
	if d.HostPort != d.Host && d.HostPort[:len(d.Host)+1] != d.Host+":" {
		t.Fatalf("%q: HostPort %q does not start with Host %q", u, d.HostPort, d.Host)
	}
	if len(d.Host) == 0 || len(d.Host) > DNSNameMax || d.Port == 0 || d.Path == "" || d.Path[0] != '/' {
		t.Fatalf("%q: %+v", u, d)
	}
	if a, err := netip.ParseAddr(d.Host); err == nil && a.Is4() && d.Named {
		t.Fatalf("%q: an IPv4 address taken as a name", u)
	}
	if !d.Named && netip.AddrFrom4(d.Addr).String() != d.Host {
		t.Fatalf("%q: literal %v is not the host %q", u, d.Addr, d.Host)
	}
	if port, _ := strconv.Atoi(strings.TrimPrefix(d.HostPort[len(d.Host):], ":")); d.HostPort != d.Host && port != int(d.Port) {
		t.Fatalf("%q: port %d, HostPort %q", u, d.Port, d.HostPort)
	}
	if len(u) <= MaxDialURLLen {
		if err := validateGatewayURL(u, MaxDialURLLen); err != nil {
			t.Fatalf("%q parses for dialling but ValidateGatewayURL refuses it: %v", u, err)
		}
	}
}

func FuzzParseDialURL(f *testing.F) {
	for _, s := range []string{"ws://gateway.discord.gg/?v=10&encoding=json", "ws://10.0.0.1:7878/resume", "ws://h:65535", "ws://1.2.3.256/", "ws://a..b:0/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, u string) {
		d, err := ParseDialURL(u)
		if err != nil {
			return
		}
		checkDialURL(t, u, d)
	})
}

func FuzzParseDNSAnswer(f *testing.F) {
	f.Add(dnsTemplate, uint16(0x1234))
	f.Add([]byte{0x12, 0x34, 0x81, 0x83, 0, 1, 0, 0, 0, 0, 0, 0}, uint16(0x1234))
	f.Fuzz(func(t *testing.T, m []byte, id uint16) {
		r := ParseDNSAnswer(m, id)
		if r.Verdict > DNSNoA {
			t.Fatalf("verdict %d", r.Verdict)
		}
		if r.Verdict != DNSAnswer && (r.Addr != [4]byte{} || r.TTL != 0) || r.Verdict != DNSRcode && r.Rcode != 0 {
			t.Fatalf("fields beside verdict %d: %+v", r.Verdict, r)
		}
		if r.Verdict == DNSRcode && (r.Rcode == 0 || r.Rcode > 15) {
			t.Fatalf("RCODE %d", r.Rcode)
		}
		if r.Verdict == DNSAnswer {
			// The address is four bytes of the message, after a header.
			if len(m) < 12+4 || !bytes.Contains(m[12:], r.Addr[:]) {
				t.Fatalf("address %v not in the message", r.Addr)
			}
		}
	})
}

// TestDNSDigestsStable pins nothing but that the digests run and differ
// between seeds (the kernel comparison is TestKernelNetSelfTest).
func TestDNSDigestsStable(t *testing.T) {
	if DNSDigest(1) == DNSDigest(2) || DialURLDigest(1) == DialURLDigest(2) {
		t.Error("digests do not depend on the seed")
	}
	if DNSDigest(7) != DNSDigest(7) || DialURLDigest(7) != DialURLDigest(7) {
		t.Error("digests are not deterministic")
	}
}

// TestControllerList checks controller= with replicas and the rule that
// moves a node to the next one.
func TestControllerList(t *testing.T) {
	for v, ok := range map[string]bool{
		"http://a":                                      true,
		"http://a,http://b:8080/x":                      true,
		"http://a,http://b,http://c,http://d":           true,
		"http://a,http://b,http://c,http://d,http://e":  false,
		"http://a,":                                     false,
		",http://a":                                     false,
		"http://a,,http://b":                            false,
		"http://a,https://b":                            false,
		"http://a,http://b:0":                           false,
		"http://a:1,http://" + strings.Repeat("a", 182): true,
		"http://a:1,http://" + strings.Repeat("a", 183): false,
	} {
		if err := validateControllerList(v); (err == nil) != ok {
			t.Errorf("controller=%q: %v, want ok %v", v, err, ok)
		}
	}
	c, err := ParseBootConfig([]byte("node=n controller=http://10.0.0.9:8080,http://controller.test:8080/x"))
	if err != nil || len(c.ControllerURLs()) != 2 || c.ControllerURLs()[1] != "http://controller.test:8080/x" {
		t.Errorf("ControllerURLs: %q, %v", c.ControllerURLs(), err)
	}
	for _, c := range []struct {
		since, lease uint32
		want         bool
	}{{9999, 0, false}, {10000, 0, true}, {4999, 15000, false}, {5000, 15000, true}, {0, 1, true}, {0, 2, true}, {0, 3, false}, {1, 3, true}, {4294967295, 4294967295, true}} {
		if got := ControllerSwitchDue(c.since, c.lease); got != c.want {
			t.Errorf("ControllerSwitchDue(%d, %d) = %v, want %v", c.since, c.lease, got, c.want)
		}
	}
	for _, c := range []struct {
		term, applied uint64
		has, want     bool
	}{{0, 0, false, true}, {0, 9, false, true}, {7, 0, true, true}, {7, 7, true, true}, {8, 7, true, true}, {3, 7, true, false}, {0, 1, true, false}} {
		if got := CheckinTermAccepted(c.term, c.applied, c.has); got != c.want {
			t.Errorf("CheckinTermAccepted(%d, %d, %v) = %v, want %v", c.term, c.applied, c.has, got, c.want)
		}
	}
}

// TestTakeControllers checks how an answer's replica list replaces the
// node's.
func TestTakeControllers(t *testing.T) {
	const ours = "http://10.0.0.9:8080,http://controller.test:8081"
	for _, c := range []struct {
		current string
		list    []string
		want    string
		index   int
		took    bool
	}{
		{"http://controller.test:8081", nil, ours, 1, false},
		{"http://controller.test:8081", []string{}, ours, 1, false},
		{"http://controller.test:8081", []string{"http://10.0.0.9:8080", "http://controller.test:8081"}, ours, 1, false},
		{"http://controller.test:8081", []string{"http://10.96.0.1:8081"}, "http://10.96.0.1:8081", 0, true},
		{"http://controller.test:8081", []string{"http://a", "http://controller.test:8081"}, "http://a,http://controller.test:8081", 1, true},
		{"http://controller.test:8081", []string{"https://a"}, ours, 1, false},
		{"http://controller.test:8081", []string{"http://a", "http://b", "http://c", "http://d", "http://e"}, ours, 1, false},
		{"http://controller.test:8081", []string{"http://a,http://b"}, "http://a,http://b", 0, true},
	} {
		got, i, took := TakeControllers(ours, c.current, c.list)
		if got != c.want || i != c.index || took != c.took {
			t.Errorf("TakeControllers(%q) = %q, %d, %v; want %q, %d, %v", c.list, got, i, took, c.want, c.index, c.took)
		}
	}
}
