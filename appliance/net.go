package appliance

import (
	"errors"
	"fmt"
	"net/netip"
)

// Go references for what the kernel's network stack computes, so tests can
// compare the two: the Internet checksum (kernel/net/checksum.inc), the
// static-address syntax of the ip= boot key (kernel/core/cmdline.inc), and
// the differential self-test digest over random buffers.

// ErrStaticIP is wrapped by every ParseStaticIP error.
var ErrStaticIP = errors.New("ip must be A.B.C.D/NN or A.B.C.D/NN,GATEWAY (octets 0-255 without leading zeros, NN 1-32)")

// StaticIP is a parsed ip= value.
type StaticIP struct {
	Addr    netip.Addr // the node's address
	Prefix  int        // mask length, 1..32
	Gateway netip.Addr // zero when not given
}

// ParseStaticIP parses A.B.C.D/NN or A.B.C.D/NN,GATEWAY exactly as the
// kernel does: each octet is 1-3 decimal digits with no leading zero and at
// most 255; NN is 1-32 written the same way; nothing else may follow.
func ParseStaticIP(v string) (StaticIP, error) {
	var s StaticIP
	addr, rest, err := parseQuad(v)
	if err != nil {
		return s, err
	}
	if len(rest) == 0 || rest[0] != '/' {
		return s, fmt.Errorf("%w: no /NN after the address", ErrStaticIP)
	}
	n, rest, ok := parseOctet(rest[1:])
	if !ok || n < 1 || n > 32 {
		return s, fmt.Errorf("%w: bad prefix length", ErrStaticIP)
	}
	s.Addr, s.Prefix = addr, n
	if len(rest) == 0 {
		return s, nil
	}
	if rest[0] != ',' {
		return s, fmt.Errorf("%w: unexpected %q after the prefix", ErrStaticIP, rest[0])
	}
	gw, rest, err := parseQuad(rest[1:])
	if err != nil {
		return s, err
	}
	if len(rest) != 0 {
		return s, fmt.Errorf("%w: text after the gateway", ErrStaticIP)
	}
	s.Gateway = gw
	return s, nil
}

// parseOctet reads 1-3 digits without a leading zero, value <= 255.
func parseOctet(v string) (n int, rest string, ok bool) {
	i := 0
	for i < len(v) && v[i] >= '0' && v[i] <= '9' {
		if i == 3 || (i == 1 && n == 0) {
			return 0, v, false // a fourth digit, or a leading zero
		}
		n = n*10 + int(v[i]-'0')
		i++
	}
	if i == 0 || n > 255 {
		return 0, v, false
	}
	return n, v[i:], true
}

func parseQuad(v string) (netip.Addr, string, error) {
	var b [4]byte
	rest := v
	for k := 0; k < 4; k++ {
		if k > 0 {
			if len(rest) == 0 || rest[0] != '.' {
				return netip.Addr{}, v, fmt.Errorf("%w: an address needs four octets", ErrStaticIP)
			}
			rest = rest[1:]
		}
		n, r, ok := parseOctet(rest)
		if !ok {
			return netip.Addr{}, v, fmt.Errorf("%w: bad octet", ErrStaticIP)
		}
		b[k], rest = byte(n), r
	}
	return netip.AddrFrom4(b), rest, nil
}

// InternetChecksum is the RFC 1071 checksum of b, as the big-endian value
// that goes into a header.
func InternetChecksum(b []byte) uint16 {
	var sum uint64
	for len(b) >= 2 {
		sum += uint64(b[0])<<8 | uint64(b[1])
		b = b[2:]
	}
	if len(b) == 1 {
		sum += uint64(b[0]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// ChecksumDigestCases is the number of buffers the kernel's "cksum"
// self-test digest covers.
const ChecksumDigestCases = 4096

// ChecksumDigest is the kernel's "selftest digest cksum" for a seed: for
// each case r = next(); n = r % 1501 bytes; off = (r >> 32) % 8; a buffer
// of off+n bytes is filled with little-endian next() words; the checksum of
// buf[off:off+n] is folded into an FNV-1a-over-words digest.
func ChecksumDigest(seed uint32) uint64 {
	rng := &splitmix64{state: uint64(seed)} // the PRNG every kernel self-test shares
	next := rng.next
	d := newDigest()
	buf := make([]byte, 1512)
	for i := 0; i < ChecksumDigestCases; i++ {
		r := next()
		n := int(r % 1501)
		off := int((r >> 32) % 8)
		for j := 0; j < off+n; j += 8 {
			w := next()
			for k := 0; k < 8; k++ {
				buf[j+k] = byte(w >> (8 * k))
			}
		}
		d.add(uint64(InternetChecksum(buf[off : off+n])))
	}
	return uint64(d)
}

// DHCPOptions is what the kernel's dhcp_parse_options keeps of a DHCP
// options field (RFC 2132): addresses as they sit on the wire (first octet
// in the low byte, as the kernel stores them), times in host order.
type DHCPOptions struct {
	Have                      uint32 // DHCPHave* bits
	Type                      uint32
	Server, Mask, Router, DNS uint32
	Lease, T1, T2, Overload   uint32
}

// Bits of DHCPOptions.Have, as in kernel/net/dhcp.inc.
const (
	DHCPHaveType = 1 << iota
	DHCPHaveServer
	DHCPHaveLease
	DHCPHaveT1
	DHCPHaveT2
	DHCPHaveMask
	DHCPHaveRouter
	DHCPHaveDNS
	DHCPHaveOverload
)

// ErrDHCPOptions is returned for a malformed options field.
var ErrDHCPOptions = errors.New("dhcp: malformed options")

// ParseDHCPOptions applies the kernel's rules: pads are skipped, END ends
// the field (and must be present), every option's value must fit; type and
// overload must be 1 byte, server ID, mask, lease, T1 and T2 4 bytes, router
// and DNS a non-empty multiple of 4 (the first address is kept); a repeated
// option replaces the earlier one; unknown options are skipped.
func ParseDHCPOptions(b []byte) (DHCPOptions, error) {
	var o DHCPOptions
	le := func(v []byte) uint32 { return uint32(v[0]) | uint32(v[1])<<8 | uint32(v[2])<<16 | uint32(v[3])<<24 }
	be := func(v []byte) uint32 { return uint32(v[0])<<24 | uint32(v[1])<<16 | uint32(v[2])<<8 | uint32(v[3]) }
	for i := 0; ; {
		if i >= len(b) {
			return DHCPOptions{}, ErrDHCPOptions
		}
		code := b[i]
		if code == 0 {
			i++
			continue
		}
		if code == 255 {
			return o, nil
		}
		if i+1 >= len(b) {
			return DHCPOptions{}, ErrDHCPOptions
		}
		n := int(b[i+1])
		if i+2+n > len(b) {
			return DHCPOptions{}, ErrDHCPOptions
		}
		v := b[i+2 : i+2+n]
		switch code {
		case 53, 52:
			if n != 1 {
				return DHCPOptions{}, ErrDHCPOptions
			}
			if code == 53 {
				o.Type, o.Have = uint32(v[0]), o.Have|DHCPHaveType
			} else {
				o.Overload, o.Have = uint32(v[0]), o.Have|DHCPHaveOverload
			}
		case 54, 1, 51, 58, 59:
			if n != 4 {
				return DHCPOptions{}, ErrDHCPOptions
			}
			switch code {
			case 54:
				o.Server, o.Have = le(v), o.Have|DHCPHaveServer
			case 1:
				o.Mask, o.Have = le(v), o.Have|DHCPHaveMask
			case 51:
				o.Lease, o.Have = be(v), o.Have|DHCPHaveLease
			case 58:
				o.T1, o.Have = be(v), o.Have|DHCPHaveT1
			case 59:
				o.T2, o.Have = be(v), o.Have|DHCPHaveT2
			}
		case 3, 6:
			if n == 0 || n%4 != 0 {
				return DHCPOptions{}, ErrDHCPOptions
			}
			if code == 3 {
				o.Router, o.Have = le(v), o.Have|DHCPHaveRouter
			} else {
				o.DNS, o.Have = le(v), o.Have|DHCPHaveDNS
			}
		}
		i += 2 + n
	}
}

// dhcpOptAlphabet biases the differential test's random option fields
// towards bytes that form options, lengths, pads and END.
var dhcpOptAlphabet = [16]byte{0, 255, 1, 3, 4, 6, 51, 52, 53, 54, 58, 59, 2, 8, 5, 99}

// DHCPOptionsDigest is the kernel's "selftest digest dhcpopt": for each
// case r = next(), n = r % 41 bytes, each taken from dhcpOptAlphabet by the
// successive nibbles of next() words (16 bytes per word); the digest folds
// the verdict (1 malformed, 0 not) and, when well-formed, Have, Type,
// Server, Mask, Router, DNS, Lease, T1, T2 and Overload.
func DHCPOptionsDigest(seed uint32) uint64 {
	d := newDigest()
	add := d.add
	dhcpOptionCases(seed, func(b []byte) {
		o, err := ParseDHCPOptions(b)
		if err != nil {
			add(1)
			return
		}
		add(0)
		for _, v := range []uint32{o.Have, o.Type, o.Server, o.Mask, o.Router, o.DNS, o.Lease, o.T1, o.T2, o.Overload} {
			add(uint64(v))
		}
	})
	return uint64(d)
}

// dhcpOptionCases generates the differential test's option fields.
func dhcpOptionCases(seed uint32, f func([]byte)) {
	rng := &splitmix64{state: uint64(seed)} // the PRNG every kernel self-test shares
	next := rng.next
	for i := 0; i < ChecksumDigestCases; i++ {
		n := int(next() % 41)
		b := make([]byte, n)
		for j := 0; j < n; j += 16 {
			w := next()
			for k := 0; k < 16 && j+k < n; k++ {
				b[j+k] = dhcpOptAlphabet[(w>>(4*k))&15]
			}
		}
		f(b)
	}
}
