package appliance

import (
	"encoding/binary"
	"errors"
	"strings"
)

// This file is the Go reference of the kernel's host-name handling (issue
// 18): the DNS answer parser and the resolver's TTL and retry rules
// (kernel/net/dns.inc), and the parser of the URLs a shard dials
// (kernel/gateway/settings.inc gw_parse_url). The kernel's self-test prints
// the digests "dns" and "gwurl"; DNSDigest and DialURLDigest compute them.

// DNSVerdict is what the kernel's dns_parse_answer says of a response.
type DNSVerdict uint32

// The verdicts, numbered as the kernel's DNSV_* constants.
const (
	DNSAnswer    DNSVerdict = 0 // an IN A record: the address and its TTL
	DNSMalformed DNSVerdict = 1 // breaks RFC 1035's layout: the kernel drops it and waits on
	DNSOtherID   DNSVerdict = 2 // not the ID that was asked
	DNSTruncated DNSVerdict = 3 // TC set: the answer needs TCP
	DNSRcode     DNSVerdict = 4 // an error RCODE (NXDOMAIN, SERVFAIL, REFUSED...)
	DNSNoA       DNSVerdict = 5 // well-formed, without an IN A record
)

// Resolver limits (kernel/net/dns.inc).
const (
	DNSTTLMin          = 5     // seconds an answer is kept at least
	DNSTTLMax          = 86400 // ... and at most
	DNSRetryMinMS      = 1000  // a failed name is asked again after 1 s,
	DNSRetryMaxMS      = 30000 // doubling per consecutive failure, at most 30 s
	dnsNameSteps       = 128   // labels and pointers one name may take
	dnsHeaderLen       = 12
	DNSNameMax         = 253 // a host name in text form (RFC 1035 §2.3.4)
	dialURLPathMax     = 230 // gw_parse_url: GW_URL_MAX - 2
	dialURLPortDigits  = 5
	dnsTypeA, dnsClass = 1, 1
)

// DNSResult is a parsed response.
type DNSResult struct {
	Verdict DNSVerdict
	Addr    [4]byte // DNSAnswer: the first IN A record's address
	TTL     uint32  // DNSAnswer: its TTL as sent
	Rcode   uint8   // DNSRcode: the RCODE
}

// dnsSkipName steps over a possibly compressed name at off, as
// dns_skip_name does: labels of 0..63 bytes, pointers (0xC0) only
// backwards, the 0x40 and 0x80 label types refused, at most 128 steps.
func dnsSkipName(m []byte, off int) (int, bool) {
	resume := -1
	for steps := 0; ; steps++ {
		if steps == dnsNameSteps || off >= len(m) {
			return 0, false
		}
		l := int(m[off])
		switch {
		case l == 0:
			if resume >= 0 {
				return resume, true
			}
			return off + 1, true
		case l&0xC0 == 0xC0:
			if off+1 >= len(m) {
				return 0, false
			}
			if resume < 0 {
				resume = off + 2
			}
			target := (l&0x3F)<<8 | int(m[off+1])
			if target >= off {
				return 0, false // only backwards: a forward pointer can loop
			}
			off = target
		case l&0xC0 != 0:
			return 0, false // reserved label types (RFC 6891 §5)
		default:
			off += l + 1
		}
	}
}

// ParseDNSAnswer is the kernel's dns_parse_answer: the first IN A record
// of a response to the query with the given ID, with its checks in the
// kernel's order: shorter than a header (malformed); another ID; not a
// response, or an opcode other than 0 (malformed); TC (truncated); a
// non-zero RCODE; then every question and every answer record read within
// the message (malformed otherwise; an IN A record must be 4 bytes), and
// without an IN A record, no A.
func ParseDNSAnswer(m []byte, id uint16) DNSResult {
	if len(m) < dnsHeaderLen {
		return DNSResult{Verdict: DNSMalformed}
	}
	if binary.BigEndian.Uint16(m) != id {
		return DNSResult{Verdict: DNSOtherID}
	}
	f := m[2]
	if f&0x80 == 0 || f&0x78 != 0 {
		return DNSResult{Verdict: DNSMalformed}
	}
	if f&0x02 != 0 {
		return DNSResult{Verdict: DNSTruncated}
	}
	if rc := m[3] & 0x0F; rc != 0 {
		return DNSResult{Verdict: DNSRcode, Rcode: rc}
	}
	qd, an := int(binary.BigEndian.Uint16(m[4:])), int(binary.BigEndian.Uint16(m[6:]))
	off := dnsHeaderLen
	for ; qd > 0; qd-- {
		var ok bool
		if off, ok = dnsSkipName(m, off); !ok {
			return DNSResult{Verdict: DNSMalformed}
		}
		if off += 4; off > len(m) {
			return DNSResult{Verdict: DNSMalformed}
		}
	}
	for ; an > 0; an-- {
		var ok bool
		if off, ok = dnsSkipName(m, off); !ok {
			return DNSResult{Verdict: DNSMalformed}
		}
		if off+10 > len(m) {
			return DNSResult{Verdict: DNSMalformed}
		}
		rdlen := int(binary.BigEndian.Uint16(m[off+8:]))
		end := off + 10 + rdlen
		if end > len(m) {
			return DNSResult{Verdict: DNSMalformed}
		}
		if binary.BigEndian.Uint16(m[off:]) == dnsTypeA && binary.BigEndian.Uint16(m[off+2:]) == dnsClass {
			if rdlen != 4 {
				return DNSResult{Verdict: DNSMalformed} // an A record is 4 bytes (RFC 1035 §3.4.1)
			}
			r := DNSResult{Verdict: DNSAnswer, TTL: binary.BigEndian.Uint32(m[off+4:])}
			copy(r.Addr[:], m[off+10:end])
			return r
		}
		off = end // CNAME and others: skipped
	}
	return DNSResult{Verdict: DNSNoA}
}

// DNSTTLClamp is how long the kernel keeps an answer, in seconds: a TTL
// with its top bit set counts as 0 (RFC 2181 §8), then at least DNSTTLMin
// and at most DNSTTLMax.
func DNSTTLClamp(ttl uint32) uint32 {
	if ttl&0x80000000 != 0 || ttl < DNSTTLMin {
		return DNSTTLMin
	}
	return min(ttl, DNSTTLMax)
}

// DNSRetryDelayMS is how long the kernel remembers a failed lookup before
// it asks the server again, after the given number of consecutive failures
// of the name (0 counts as 1): 1 s, doubled per further failure, at most
// 30 s. Every caller asking for the name meanwhile gets the failure's
// reason at once.
func DNSRetryDelayMS(failures uint32) uint32 {
	shift := uint32(0)
	if failures > 1 {
		shift = failures - 1
	}
	if shift >= 5 {
		return DNSRetryMaxMS
	}
	return min(uint32(DNSRetryMinMS)<<shift, DNSRetryMaxMS)
}

// DialURL is a URL a shard dials, as the kernel's gw_parse_url splits it.
type DialURL struct {
	Host     string  // HOST alone: the name looked up, the TLS SNI
	HostPort string  // HOST[:PORT] as written: the Host header
	Named    bool    // HOST is a name, not an IPv4 literal
	Addr     [4]byte // the literal's address (Named false)
	Port     uint16  // 80 (ws://) or 443 (wss://) when absent
	TLS      bool    // wss://: TLS 1.3 between the WebSocket and TCP
	Path     string  // "/" when absent; with the query
}

// ErrDialURL is every refusal of ParseDialURL (the kernel says only "no").
var ErrDialURL = errors.New("not a dialable ws:// or wss:// URL")

// ParseDialURL is the kernel's gw_parse_url: "ws://" or "wss://" (lower
// case; wss:// sets TLS and makes 443 the default port), HOST of
// 1..253 bytes of A-Za-z0-9.- ending at ':', '/' or the end, then
// optionally ':' and 1..5 digits with a value of 1..65535, then nothing or
// a path that starts with '/' and is at most 230 bytes (query included) of
// visible ASCII other than '"', '\' and '#' (ValidateGatewayURL's path
// bytes: the path goes into the request line).
// HOST is an IPv4 literal when a dotted quad of the boot config's rules (no
// leading zeros, octets up to 255) fills it, a name otherwise (so
// "1.2.3.256" is a name, which DNS will not find). It is stricter than
// ValidateGatewayURL in one place: '?' may not follow the host directly;
// GatewayDialURL always puts a '/' there.
func ParseDialURL(u string) (DialURL, error) {
	rest, ok := strings.CutPrefix(u, "ws://")
	tls := false
	if !ok {
		rest, ok = strings.CutPrefix(u, "wss://")
		tls = true
	}
	if !ok || strings.IndexByte(u, 0) >= 0 {
		return DialURL{}, ErrDialURL
	}
	n := 0
	for n < len(rest) && rest[n] != ':' && rest[n] != '/' {
		b := rest[n]
		if !(b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || b == '.' || b == '-') {
			return DialURL{}, ErrDialURL
		}
		if n++; n > DNSNameMax {
			return DialURL{}, ErrDialURL
		}
	}
	if n == 0 {
		return DialURL{}, ErrDialURL
	}
	d := DialURL{Host: rest[:n], Port: 80, Named: true, TLS: tls}
	if tls {
		d.Port = 443
	}
	if a, tail, err := parseQuad(d.Host); err == nil && tail == "" {
		d.Named, d.Addr = false, a.As4()
	}
	i := n
	if i < len(rest) && rest[i] == ':' {
		i++
		v, digits := 0, 0
		for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
			if digits++; digits > dialURLPortDigits {
				return DialURL{}, ErrDialURL
			}
			v = v*10 + int(rest[i]-'0')
			i++
		}
		if digits == 0 || v == 0 || v > 65535 {
			return DialURL{}, ErrDialURL
		}
		d.Port = uint16(v)
	}
	d.HostPort, d.Path = rest[:i], rest[i:]
	switch {
	case d.Path == "":
		d.Path = "/"
	case d.Path[0] != '/' || len(d.Path) > dialURLPathMax:
		return DialURL{}, ErrDialURL
	}
	for i := 0; i < len(d.Path); i++ {
		if b := d.Path[i]; b < 0x21 || b > 0x7e || b == '"' || b == '\\' || b == '#' {
			return DialURL{}, ErrDialURL // it goes into the request line as it is
		}
	}
	return d, nil
}

// dnsAlphabet biases the "dns" digest's random bytes towards lengths,
// pointers, flags, RCODEs and the test ID.
var dnsAlphabet = [16]byte{0x00, 0x01, 0x02, 0x04, 0xC0, 0x0C, 0x05, 0x81, 0x80, 0x83, 0x12, 0x34, 0x3F, 0x40, 0xFF, 0x03}

// dnsTemplate is a valid answer to query 0x1234 for "a.b": a CNAME and an
// A record (10.0.0.7, TTL 300), both names compressed to the question.
var dnsTemplate = []byte{
	0x12, 0x34, 0x81, 0x80, 0, 1, 0, 2, 0, 0, 0, 0,
	1, 'a', 1, 'b', 0, 0, 1, 0, 1,
	0xC0, 12, 0, 5, 0, 1, 0, 0, 0, 9, 0, 2, 0xC0, 12,
	0xC0, 12, 0, 1, 0, 1, 0, 0, 1, 0x2C, 0, 4, 10, 0, 0, 7,
}

// DNSDigest is the kernel's "selftest digest dns" for a seed. Each of the
// 4096 cases draws r = next(). When r&3 == 0 the message is (r>>8)%64
// bytes from dnsAlphabet, taken by the nibbles of next() words (16 bytes a
// word); otherwise it is dnsTemplate with (r>>8)&3 bytes changed, each by
// w = next(): position (w&0xFFFF) % len, byte dnsAlphabet[(w>>16)&15],
// and, when (r>>12)&3 == 0, cut by (r>>16)%16 bytes. ParseDNSAnswer with
// ID 0x1234 folds its verdict, then the address (as a little-endian load)
// and TTL of an answer or the RCODE. Then t = next() folds
// DNSTTLClamp(uint32(t)) and DNSRetryDelayMS(uint32(t>>32) % 40).
func DNSDigest(seed uint32) uint64 {
	rng := &splitmix64{state: uint64(seed)}
	d := newDigest()
	for i := 0; i < ChecksumDigestCases; i++ {
		r := rng.next()
		var m []byte
		if r&3 == 0 {
			m = make([]byte, (r>>8)%64)
			for j := 0; j < len(m); j += 16 {
				w := rng.next()
				for k := 0; k < 16 && j+k < len(m); k++ {
					m[j+k] = dnsAlphabet[(w>>(4*k))&15]
				}
			}
		} else {
			m = append([]byte(nil), dnsTemplate...)
			for c := (r >> 8) & 3; c > 0; c-- {
				w := rng.next()
				m[(w&0xFFFF)%uint64(len(m))] = dnsAlphabet[(w>>16)&15]
			}
			if (r>>12)&3 == 0 {
				m = m[:len(m)-int((r>>16)%16)]
			}
		}
		res := ParseDNSAnswer(m, 0x1234)
		d.add(uint64(res.Verdict))
		switch res.Verdict {
		case DNSAnswer:
			d.add(uint64(binary.LittleEndian.Uint32(res.Addr[:])))
			d.add(uint64(res.TTL))
		case DNSRcode:
			d.add(uint64(res.Rcode))
		}
		t := rng.next()
		d.add(uint64(DNSTTLClamp(uint32(t))))
		d.add(uint64(DNSRetryDelayMS(uint32(t>>32) % 40)))
	}
	return uint64(d)
}

// urlAlphabet biases the "gwurl" digest's random bytes towards quads,
// ports, paths and the bytes a host may not hold.
var urlAlphabet = [16]byte{'0', '1', '2', '5', '9', '.', '.', ':', '/', 'a', 'Z', '-', '?', ' ', '6', '.'}

// DialURLCase is the "gwurl" digest's case for r = next(), reading further
// words from next: "ws://" when (r>>8)&3 is 1 or 2, "wss://" when 3; when (r>>10)&7 == 0,
// k = (r>>16)&0x1FF bytes of 'a' (a long host); when it is 1, "h" and k
// bytes of '/' (a long path); when it is 2, "h:" and k&7 bytes of '0'
// (ports of many digits); then (r%40) bytes from urlAlphabet by the
// nibbles of next() words.
func DialURLCase(r uint64, next func() uint64) string {
	var b []byte
	switch (r >> 8) & 3 {
	case 1, 2:
		b = append(b, "ws://"...)
	case 3:
		b = append(b, "wss://"...)
	}
	k := int((r >> 16) & 0x1FF)
	switch (r >> 10) & 7 {
	case 0:
		b = append(b, strings.Repeat("a", k)...)
	case 1:
		b = append(b, 'h')
		b = append(b, strings.Repeat("/", k)...)
	case 2:
		b = append(b, 'h', ':')
		b = append(b, strings.Repeat("0", k&7)...)
	}
	n := int(r % 40)
	for j := 0; j < n; j += 16 {
		w := next()
		for i := 0; i < 16 && j+i < n; i++ {
			b = append(b, urlAlphabet[(w>>(4*i))&15])
		}
	}
	return string(b)
}

// DialURLDigest is the kernel's "selftest digest gwurl" for a seed: 4096
// DialURLCase URLs through ParseDialURL, folding 1 for a refusal, else 0,
// the address (a little-endian load, 0 for a name), the port, 1 for a
// name, 1 for wss://, and the lengths of Host, HostPort and Path.
func DialURLDigest(seed uint32) uint64 {
	rng := &splitmix64{state: uint64(seed)}
	d := newDigest()
	for i := 0; i < ChecksumDigestCases; i++ {
		u, err := ParseDialURL(DialURLCase(rng.next(), rng.next))
		if err != nil {
			d.add(1)
			continue
		}
		d.add(0)
		d.add(uint64(binary.LittleEndian.Uint32(u.Addr[:])))
		d.add(uint64(u.Port))
		d.add(b2u(u.Named))
		d.add(b2u(u.TLS))
		d.add(uint64(len(u.Host)))
		d.add(uint64(len(u.HostPort)))
		d.add(uint64(len(u.Path)))
	}
	return uint64(d)
}
