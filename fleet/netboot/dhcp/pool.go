package dhcp

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// Pool is the address range the authoritative server hands out, and the
// subnet it lies in.
type Pool struct {
	Start, End netip.Addr   // inclusive
	Prefix     netip.Prefix // the subnet; gives the mask (option 1)
}

// ErrBadPool is wrapped by ParsePool errors.
var ErrBadPool = errors.New("dhcp: bad pool")

// ParsePool parses START-END/BITS, for example 10.0.0.100-10.0.0.200/24.
// Both ends must be IPv4, in the same /BITS subnet, START <= END, and
// neither may be the subnet's network or broadcast address.
func ParsePool(s string) (Pool, error) {
	rng, bits, ok := strings.Cut(s, "/")
	if !ok {
		return Pool{}, fmt.Errorf("%w %q: want START-END/BITS", ErrBadPool, s)
	}
	a, b, ok := strings.Cut(rng, "-")
	if !ok {
		return Pool{}, fmt.Errorf("%w %q: want START-END/BITS", ErrBadPool, s)
	}
	start, err1 := netip.ParseAddr(a)
	end, err2 := netip.ParseAddr(b)
	if err1 != nil || err2 != nil || !start.Is4() || !end.Is4() {
		return Pool{}, fmt.Errorf("%w %q: ends must be IPv4 addresses", ErrBadPool, s)
	}
	pfx, err := netip.ParsePrefix(a + "/" + bits)
	if err != nil || pfx.Bits() < 8 || pfx.Bits() > 30 {
		return Pool{}, fmt.Errorf("%w %q: prefix length must be 8..30", ErrBadPool, s)
	}
	pfx = pfx.Masked()
	p := Pool{Start: start, End: end, Prefix: pfx}
	switch {
	case end.Less(start):
		return Pool{}, fmt.Errorf("%w %q: start after end", ErrBadPool, s)
	case !pfx.Contains(end):
		return Pool{}, fmt.Errorf("%w %q: %s is outside %s", ErrBadPool, s, end, pfx)
	case start == pfx.Addr() || end == p.broadcast():
		return Pool{}, fmt.Errorf("%w %q: pool includes the network or broadcast address", ErrBadPool, s)
	}
	return p, nil
}

// Contains reports whether ip is in the range.
func (p Pool) Contains(ip netip.Addr) bool {
	return ip.Is4() && !ip.Less(p.Start) && !p.End.Less(ip)
}

// Size is the number of addresses in the range.
func (p Pool) Size() int {
	s, e := p.Start.As4(), p.End.As4()
	return int(be32(e)-be32(s)) + 1
}

func (p Pool) broadcast() netip.Addr {
	a := p.Prefix.Addr().As4()
	v := be32(a) | (1<<(32-p.Prefix.Bits()) - 1)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func be32(a [4]byte) uint32 {
	return uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
}

func (p Pool) String() string {
	return fmt.Sprintf("%s-%s/%d", p.Start, p.End, p.Prefix.Bits())
}
