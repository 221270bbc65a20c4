package appliance

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"
)

func TestInternetChecksum(t *testing.T) {
	cases := []struct {
		in   []byte
		want uint16
	}{
		{[]byte{0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7}, 0x220d}, // RFC 1071 §3
		{[]byte{0x01}, 0xfeff},
		{nil, 0xffff},
		{[]byte{0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00,
			0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7}, 0xb861},
	}
	for _, c := range cases {
		if got := InternetChecksum(c.in); got != c.want {
			t.Errorf("InternetChecksum(% x) = %04x, want %04x", c.in, got, c.want)
		}
	}
}

// FuzzInternetChecksum: a buffer with its checksum appended (at an even
// offset) verifies to 0, the property the kernel relies on when checking.
func FuzzInternetChecksum(f *testing.F) {
	f.Add([]byte{1, 2, 3})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b)%2 == 1 {
			b = append(b, 0)
		}
		sum := InternetChecksum(b)
		b = binary.BigEndian.AppendUint16(b, sum)
		if got := InternetChecksum(b); got != 0 && !(got == 0xffff && sum == 0xffff) {
			t.Fatalf("checksum of data+checksum = %04x", got)
		}
	})
}

func TestParseStaticIP(t *testing.T) {
	ok := map[string]StaticIP{
		"10.0.0.5/24":          {netip.MustParseAddr("10.0.0.5"), 24, netip.Addr{}},
		"10.0.0.5/24,10.0.0.1": {netip.MustParseAddr("10.0.0.5"), 24, netip.MustParseAddr("10.0.0.1")},
		"0.0.0.0/32":           {netip.MustParseAddr("0.0.0.0"), 32, netip.Addr{}},
		"255.255.255.255/1":    {netip.MustParseAddr("255.255.255.255"), 1, netip.Addr{}},
	}
	for in, want := range ok {
		got, err := ParseStaticIP(in)
		if err != nil || got != want {
			t.Errorf("ParseStaticIP(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "10.0.0.5", "10.0.0.5/", "10.0.0.5/0", "10.0.0.5/33", "10.0.0.5/08",
		"10.0.0.5/8,", "10.0.0.256/24", "10.0.0.05/24", "1.2.3/8", "1.2.3.4.5/8", "1..2.3/8",
		"1.2.3.4/8,1.2.3.4,", "1234.1.1.1/8", "1.2.3.4/8;1.2.3.4", " 1.2.3.4/8"} {
		if _, err := ParseStaticIP(in); err == nil {
			t.Errorf("ParseStaticIP(%q) accepted", in)
		}
	}
}

// FuzzParseStaticIP: whatever is accepted renders back to the same text.
func FuzzParseStaticIP(f *testing.F) {
	f.Add("10.0.0.5/24,10.0.0.1")
	f.Add("1.2.3.4/8")
	f.Fuzz(func(t *testing.T, v string) {
		s, err := ParseStaticIP(v)
		if err != nil {
			return
		}
		back := fmt.Sprintf("%s/%d", s.Addr, s.Prefix)
		if s.Gateway.IsValid() {
			back += "," + s.Gateway.String()
		}
		if back != v {
			t.Fatalf("ParseStaticIP(%q) renders as %q", v, back)
		}
	})
}

func TestChecksumDigestDependsOnSeed(t *testing.T) {
	if ChecksumDigest(1) == ChecksumDigest(2) {
		t.Fatal("digest ignores the seed")
	}
}

// The generated option fields must reach both verdicts and every option
// kind, or the kernel/Go digest comparison proves little.
func TestDHCPOptionCasesCoverage(t *testing.T) {
	ok, bad, have := 0, 0, uint32(0)
	for seed := uint32(0); seed < 4; seed++ {
		dhcpOptionCases(seed, func(b []byte) {
			o, err := ParseDHCPOptions(b)
			if err != nil {
				bad++
				return
			}
			ok++
			have |= o.Have
		})
	}
	t.Logf("%d well-formed, %d malformed, have bits %#x", ok, bad, have)
	if ok < 400 || bad < 400 {
		t.Errorf("verdicts too lopsided: %d well-formed, %d malformed", ok, bad)
	}
	if have != 1<<9-1 {
		t.Errorf("options never parsed: have bits %#x of %#x", have, 1<<9-1)
	}
}

func TestParseDHCPOptions(t *testing.T) {
	o, err := ParseDHCPOptions([]byte{53, 1, 5, 51, 4, 0, 0, 0x0e, 0x10, 3, 8, 10, 0, 0, 1, 10, 0, 0, 2, 255})
	if err != nil || o.Type != 5 || o.Lease != 3600 || o.Router != 0x0100000a ||
		o.Have != DHCPHaveType|DHCPHaveLease|DHCPHaveRouter {
		t.Fatalf("got %+v, %v", o, err)
	}
	for _, b := range [][]byte{{}, {53, 1}, {53}, {53, 2, 5, 5, 255}, {3, 6, 1, 2, 3, 4, 5, 6, 255}, {6, 0, 255}, {99, 200, 1, 255}} {
		if _, err := ParseDHCPOptions(b); err == nil {
			t.Errorf("ParseDHCPOptions(% x) accepted", b)
		}
	}
}
