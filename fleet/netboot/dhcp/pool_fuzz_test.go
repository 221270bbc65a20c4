package dhcp

import (
	"errors"
	"testing"
)

// FuzzParsePool: ParsePool never panics; a pool it accepts is IPv4, in
// order, inside its subnet (/8../30) without the network or broadcast
// address, has a positive size, and its String form parses back to the
// same pool. Refusals wrap ErrBadPool.
func FuzzParsePool(f *testing.F) {
	for _, s := range []string{"10.0.0.100-10.0.0.200/24", "192.168.1.1-192.168.1.254/24", "10.0.0.0-10.0.0.5/24",
		"10.0.0.5-10.0.0.1/24", "10.0.0.1-10.0.1.1/24", "10.0.0.1-10.0.0.2/31", "::1-::2/64", "10.0.0.1/24",
		"10.0.0.1-10.0.0.2", "10.0.0.1-10.0.0.2/8", "10.0.0.1-10.0.0.2/030", "", "-/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePool(s)
		if err != nil {
			if !errors.Is(err, ErrBadPool) {
				t.Fatalf("refusal %v does not wrap ErrBadPool", err)
			}
			return
		}
		if !p.Start.Is4() || !p.End.Is4() || p.End.Less(p.Start) || !p.Prefix.Contains(p.Start) || !p.Prefix.Contains(p.End) ||
			p.Prefix.Bits() < 8 || p.Prefix.Bits() > 30 || p.Start == p.Prefix.Addr() || p.End == p.broadcast() || p.Size() < 1 {
			t.Fatalf("ParsePool(%q) accepted %+v", s, p)
		}
		if !p.Contains(p.Start) || !p.Contains(p.End) {
			t.Fatalf("pool %v does not contain its own ends", p)
		}
		again, err := ParsePool(p.String())
		if err != nil || again != p {
			t.Fatalf("round trip of %q via %q: %+v, %v", s, p.String(), again, err)
		}
	})
}
