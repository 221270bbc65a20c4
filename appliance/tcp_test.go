package appliance

import (
	"encoding/binary"
	"strings"
	"testing"
)

func TestSeqCmp(t *testing.T) {
	cases := []struct {
		a, b uint32
		want int
	}{
		{1, 2, -1}, {2, 1, 1}, {7, 7, 0},
		{0xFFFFFFFF, 0, -1}, {0, 0xFFFFFFFF, 1},
		{0xFFFFFF00, 0x100, -1}, {0x100, 0xFFFFFF00, 1},
		{0, 0x7FFFFFFF, -1}, {0x7FFFFFFF, 0, 1},
		{0, 0x80000000, -1}, {0x80000000, 0, -1}, {0x80000001, 0, -1},
	}
	for _, c := range cases {
		if got := SeqCmp(c.a, c.b); got != c.want {
			t.Errorf("SeqCmp(%#x, %#x) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

// tcpTestSegment is a SYN from 10.0.1.1:49152 to 10.0.1.2:8080 with an
// MSS option of 1460 and 5 bytes of data, with its correct checksum.
func tcpTestSegment() (src, dst [4]byte, seg []byte) {
	src, dst = [4]byte{10, 0, 1, 1}, [4]byte{10, 0, 1, 2}
	seg = make([]byte, 29)
	binary.BigEndian.PutUint16(seg[0:], 49152)
	binary.BigEndian.PutUint16(seg[2:], 8080)
	binary.BigEndian.PutUint32(seg[4:], 0xFFFFFFF0)
	binary.BigEndian.PutUint32(seg[8:], 0x12345678)
	seg[12], seg[13] = 6<<4, 0x02
	binary.BigEndian.PutUint16(seg[14:], 8192)
	seg[20], seg[21], seg[22], seg[23] = TCPOptMSS, TCPOptMSSLen, 1460>>8, 1460&0xFF
	copy(seg[24:], "hello")
	binary.BigEndian.PutUint16(seg[16:], TCPPseudoChecksum(src, dst, seg))
	return src, dst, seg
}

func TestParseTCPSegment(t *testing.T) {
	src, dst, seg := tcpTestSegment()
	s, err := ParseTCPSegment(src, dst, seg)
	if err != nil {
		t.Fatal(err)
	}
	want := TCPSegment{SrcPort: 49152, DstPort: 8080, Seq: 0xFFFFFFF0, Ack: 0x12345678, Flags: 2, Window: 8192, HdrLen: 24, DataLen: 5, MSS: 1460}
	if s != want {
		t.Fatalf("parsed %+v, want %+v", s, want)
	}
	resum := func(b []byte) []byte {
		b[16], b[17] = 0, 0
		binary.BigEndian.PutUint16(b[16:], TCPPseudoChecksum(src, dst, b))
		return b
	}
	mut := func(f func(b []byte)) []byte {
		b := append([]byte(nil), seg...)
		f(b)
		return resum(b)
	}
	bad := []struct {
		name string
		seg  []byte
		want error
	}{
		{"19 bytes", seg[:19], ErrTCPLength},
		{"data offset 4", mut(func(b []byte) { b[12] = 4 << 4 }), ErrTCPLength},
		{"data offset past the end", mut(func(b []byte) { b[12] = 8 << 4 }), ErrTCPLength},
		{"corrupted payload", func() []byte { b := append([]byte(nil), seg...); b[28] ^= 1; return b }(), ErrTCPChecksum},
		{"option length 0", mut(func(b []byte) { b[21] = 0 }), ErrTCPOption},
		{"option length 1", mut(func(b []byte) { b[21] = 1 }), ErrTCPOption},
		{"option past the header", mut(func(b []byte) { b[21] = 5 }), ErrTCPOption},
		{"3-byte MSS", mut(func(b []byte) { b[21] = 3 }), ErrTCPOption},
		{"no length byte", mut(func(b []byte) { copy(b[20:], []byte{1, 1, 1, 99}) }), ErrTCPOption},
	}
	for _, c := range bad {
		if _, err := ParseTCPSegment(src, dst, c.seg); err != c.want {
			t.Errorf("%s: error %v, want %v", c.name, err, c.want)
		}
	}
	s, err = ParseTCPSegment(src, dst, mut(func(b []byte) { copy(b[20:], []byte{1, 0, 99, 99}) }))
	if err != nil || s.MSS != 0 {
		t.Errorf("options ended by EOL: %+v, %v", s, err)
	}
}

func TestTCPSegmentDigestDependsOnSeed(t *testing.T) {
	if TCPSegmentDigest(1) == TCPSegmentDigest(2) {
		t.Fatal("two seeds give the same digest")
	}
}

func FuzzParseTCPSegment(f *testing.F) {
	src, dst, seg := tcpTestSegment()
	f.Add(seg)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseTCPSegment(src, dst, b)
		if err == nil && int(s.HdrLen+s.DataLen) != len(b) {
			t.Fatalf("lengths %d+%d for %d bytes", s.HdrLen, s.DataLen, len(b))
		}
	})
}

func TestParseTCPTest(t *testing.T) {
	good := map[string]string{"10.0.0.1:9000": "10.0.0.1:9000", "1.2.3.4:1": "1.2.3.4:1", "255.255.255.255:65535": "255.255.255.255:65535"}
	for v, want := range good {
		ap, err := ParseTCPTest(v)
		if err != nil || ap.String() != want {
			t.Errorf("ParseTCPTest(%q) = %v, %v; want %s", v, ap, err, want)
		}
	}
	for _, v := range []string{"", "10.0.0.1", "10.0.0.1:", "10.0.0.1:0", "10.0.0.1:09000", "10.0.0.1:65536", "10.0.0.1:123456",
		"10.0.0.1:90a", "10.0.0.1:9000 ", "10.0.0.01:9000", "10.0.0:9000", "10.0.0.1;9000", "host:9000"} {
		if _, err := ParseTCPTest(v); err == nil {
			t.Errorf("ParseTCPTest(%q) accepted", v)
		}
	}
	sizes := map[string][2]int{
		"10.0.0.1:9000":            {TCPTestBytes, TCPTestConns},
		"10.0.0.1:9000,1":          {1, 1},
		"10.0.0.1:9000,33554432":   {33554432, 1},
		"10.0.0.1:9000,1073741824": {1073741824, 1},
	}
	for v, want := range sizes {
		s, err := ParseTCPTestSpec(v)
		if err != nil || s.Bytes != want[0] || s.Conns != want[1] || s.Server.String() != "10.0.0.1:9000" {
			t.Errorf("ParseTCPTestSpec(%q) = %+v, %v; want %d bytes on %d connections", v, s, err, want[0], want[1])
		}
	}
	for _, v := range []string{"10.0.0.1:9000,", "10.0.0.1:9000,0", "10.0.0.1:9000,01", "10.0.0.1:9000,1073741825",
		"10.0.0.1:9000,99999999999", "10.0.0.1:9000,1,2", "10.0.0.1:9000,1k", "10.0.0.1:,5", "10.0.0.1:0,5", "10.0.0.1:9000,-1"} {
		if _, err := ParseTCPTestSpec(v); err == nil {
			t.Errorf("ParseTCPTestSpec(%q) accepted", v)
		}
	}
	var c BootConfig
	if err := c.Set("tcptest=10.0.0.1:9000,33554432"); err != nil || !strings.Contains(c.String(), "tcptest=10.0.0.1:9000,33554432") {
		t.Errorf("Set/String: %v, %q", err, c.String())
	}
	c = BootConfig{}
	if err := c.Set("tcptest=10.0.0.1:9000"); err != nil || !strings.Contains(c.String(), "tcptest=10.0.0.1:9000") {
		t.Errorf("Set/String: %v, %q", err, c.String())
	}
}

func TestTCPTestDigest(t *testing.T) {
	if got := TCPTestDigest([]byte("a")); got != 0xe40c292c { // FNV-1a 32 test vector
		t.Errorf("TCPTestDigest(\"a\") = %08x, want e40c292c", got)
	}
}
