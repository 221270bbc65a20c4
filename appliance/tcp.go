package appliance

import (
	"encoding/binary"
	"errors"
	"net/netip"
)

// TCP constants as in kernel/net/tcp.inc (RFC 9293 §3.1, §3.2).
const (
	TCPHeaderSize = 20 // header without options
	TCPOptEOL     = 0  // end of option list
	TCPOptNOP     = 1  // no-operation
	TCPOptMSS     = 2  // maximum segment size
	TCPOptMSSLen  = 4  // kind, length, 16-bit value
	ipProtoTCP    = 6

	TCPOptWS        = 3  // RFC 7323 §2.2: window scale
	TCPOptWSLen     = 3  // kind, length, shift.cnt
	TCPWSMax        = 14 // RFC 7323 §2.3: a larger shift is used as 14
	TCPOptSACKOK    = 4  // RFC 2018 §2: SACK-permitted
	TCPOptSACKOKLen = 2
	TCPOptSACK      = 5 // RFC 2018 §3: SACK blocks, 2 + 8n bytes
	TCPSACKMax      = 4 // blocks that fit in 40 bytes of options

	// TCPSegment.Opts bits (TCPO_* in kernel/net/tcp.inc).
	TCPOptsWS     = 1 << 0
	TCPOptsSACKOK = 1 << 1
)

// Errors of ParseTCPSegment, one per kernel drop counter.
var (
	// ErrTCPLength means the segment is shorter than a TCP header, or its
	// data offset is below 5 words or past the end of the segment.
	ErrTCPLength = errors.New("tcp: bad length or data offset")
	// ErrTCPChecksum means the checksum over the IPv4 pseudo-header and
	// the segment does not verify.
	ErrTCPChecksum = errors.New("tcp: bad checksum")
	// ErrTCPOption means an option's length byte is missing, below 2 or
	// runs past the header, or an MSS option is not 4 bytes long, a window
	// scale not 3, a SACK-permitted not 2, or a SACK option not 2 + 8n
	// bytes with n >= 1.
	ErrTCPOption = errors.New("tcp: malformed option")
)

// TCPSegment is what the kernel's tcp_parse keeps of a segment (struc
// TCPSEG), in host order.
type TCPSegment struct {
	SrcPort, DstPort uint32
	Seq, Ack         uint32
	Flags, Window    uint32
	HdrLen, DataLen  uint32
	MSS              uint32 // 0 when the segment carries no MSS option
	Opts             uint32 // TCPOptsWS, TCPOptsSACKOK
	WScale           uint32 // window scale shift (with TCPOptsWS), at most TCPWSMax
	SACKN            uint32 // SACK blocks, 0-4
	SACK             [2 * TCPSACKMax]uint32
}

// SeqCmp compares two TCP sequence numbers modulo 2^32 (RFC 9293 §3.4):
// -1 when a is before b, 0 when equal, 1 when after. A difference of
// exactly 2^31 counts as "before", as the kernel's signed test does.
func SeqCmp(a, b uint32) int {
	d := int32(a - b)
	switch {
	case d < 0:
		return -1
	case d > 0:
		return 1
	}
	return 0
}

// TCPPseudoChecksum is the RFC 9293 §3.1 checksum of seg with the IPv4
// pseudo-header for src and dst (addresses as 4 bytes in wire order).
func TCPPseudoChecksum(src, dst [4]byte, seg []byte) uint16 {
	b := make([]byte, 0, 12+len(seg))
	b = append(b, src[:]...)
	b = append(b, dst[:]...)
	b = append(b, 0, ipProtoTCP, byte(len(seg)>>8), byte(len(seg)))
	b = append(b, seg...)
	return InternetChecksum(b)
}

// ParseTCPSegment checks a received segment as the kernel's tcp_parse
// does and returns its header fields.
func ParseTCPSegment(src, dst [4]byte, seg []byte) (TCPSegment, error) {
	var s TCPSegment
	if len(seg) < TCPHeaderSize {
		return s, ErrTCPLength
	}
	hl := int(seg[12]>>4) * 4
	if hl < TCPHeaderSize || hl > len(seg) {
		return s, ErrTCPLength
	}
	if TCPPseudoChecksum(src, dst, seg) != 0 {
		return s, ErrTCPChecksum
	}
	s.SrcPort = uint32(binary.BigEndian.Uint16(seg[0:]))
	s.DstPort = uint32(binary.BigEndian.Uint16(seg[2:]))
	s.Seq = binary.BigEndian.Uint32(seg[4:])
	s.Ack = binary.BigEndian.Uint32(seg[8:])
	s.Flags = uint32(seg[13])
	s.Window = uint32(binary.BigEndian.Uint16(seg[14:]))
	s.HdrLen = uint32(hl)
	s.DataLen = uint32(len(seg) - hl)
	for i := TCPHeaderSize; i < hl; {
		kind := seg[i]
		if kind == TCPOptEOL {
			break
		}
		if kind == TCPOptNOP {
			i++
			continue
		}
		if i+1 >= hl {
			return TCPSegment{}, ErrTCPOption
		}
		l := int(seg[i+1])
		if l < 2 || i+l > hl {
			return TCPSegment{}, ErrTCPOption
		}
		switch kind {
		case TCPOptMSS:
			if l != TCPOptMSSLen {
				return TCPSegment{}, ErrTCPOption
			}
			s.MSS = uint32(binary.BigEndian.Uint16(seg[i+2:]))
		case TCPOptWS:
			if l != TCPOptWSLen {
				return TCPSegment{}, ErrTCPOption
			}
			s.WScale = min(uint32(seg[i+2]), TCPWSMax)
			s.Opts |= TCPOptsWS
		case TCPOptSACKOK:
			if l != TCPOptSACKOKLen {
				return TCPSegment{}, ErrTCPOption
			}
			s.Opts |= TCPOptsSACKOK
		case TCPOptSACK:
			if l < 10 || (l-2)%8 != 0 {
				return TCPSegment{}, ErrTCPOption
			}
			s.SACKN = uint32(l-2) / 8
			for j := range 2 * int(s.SACKN) {
				s.SACK[j] = binary.BigEndian.Uint32(seg[i+2+4*j:])
			}
		}
		i += l
	}
	return s, nil
}

// tcpDigestOffsets are the data-offset nibbles the "tcpseg" digest draws
// from (index (r >> 35) & 7), as net_tcp_doffs in the kernel.
var tcpDigestOffsets = [8]byte{5, 5, 6, 7, 8, 15, 4, 0}

// TCPSegmentDigest is the kernel's "selftest digest tcpseg" for a seed.
// For each case r = next(); n = r % 81 bytes of next() words (little
// endian); w = next() gives the source (low 32 bits) and destination
// addresses (as the kernel loads them: first octet in the low byte).
// mode = (r >> 32) & 7. When n >= 13 byte 12 gets a data offset from
// tcpDigestOffsets; modes 1 and 2 with n >= 24 put an MSS option kind and
// length at bytes 20-21, mode 3 a window scale's (3, 3), mode 4 a
// SACK-permitted's (4, 2) and mode 5 a 2-block SACK option's (5, 18);
// unless mode is 7, a segment of n >= 18 bytes gets its correct checksum.
// The verdict (0 well-formed, 1 length, 2 checksum, 3 option) is folded,
// then the 21 TCPSegment fields when well-formed (SACK as 8 words), then SeqCmp(src, dst) and SeqCmp(src, src + (dst & 0xFF) - 0x80) as
// sign-extended 64-bit values.
func TCPSegmentDigest(seed uint32) uint64 {
	rng := &splitmix64{state: uint64(seed)} // the PRNG every kernel self-test shares
	next := rng.next
	d := newDigest()
	add := d.add
	buf := make([]byte, 88)
	for i := 0; i < ChecksumDigestCases; i++ {
		r := next()
		n := int(r % 81)
		mode := (r >> 32) & 7
		for j := 0; j < n; j += 8 {
			binary.LittleEndian.PutUint64(buf[j:], next())
		}
		w := next()
		srcV, dstV := uint32(w), uint32(w>>32)
		var src, dst [4]byte
		binary.LittleEndian.PutUint32(src[:], srcV)
		binary.LittleEndian.PutUint32(dst[:], dstV)
		seg := buf[:n]
		if n >= 13 {
			seg[12] = tcpDigestOffsets[(r>>35)&7] << 4
		}
		if n >= 24 {
			switch mode {
			case 1, 2:
				seg[20], seg[21] = TCPOptMSS, TCPOptMSSLen
			case 3:
				seg[20], seg[21] = TCPOptWS, TCPOptWSLen
			case 4:
				seg[20], seg[21] = TCPOptSACKOK, TCPOptSACKOKLen
			case 5:
				seg[20], seg[21] = TCPOptSACK, 18
			}
		}
		if mode != 7 && n >= 18 {
			seg[16], seg[17] = 0, 0
			binary.BigEndian.PutUint16(seg[16:], TCPPseudoChecksum(src, dst, seg))
		}
		s, err := ParseTCPSegment(src, dst, seg)
		switch err {
		case nil:
			add(0)
			for _, v := range []uint32{s.SrcPort, s.DstPort, s.Seq, s.Ack, s.Flags, s.Window, s.HdrLen, s.DataLen, s.MSS, s.Opts, s.WScale, s.SACKN} {
				add(uint64(v))
			}
			for _, v := range s.SACK {
				add(uint64(v))
			}
		case ErrTCPLength:
			add(1)
		case ErrTCPChecksum:
			add(2)
		case ErrTCPOption:
			add(3)
		}
		add(uint64(int64(SeqCmp(srcV, dstV))))
		add(uint64(int64(SeqCmp(srcV, srcV+dstV&0xFF-0x80))))
	}
	return uint64(d)
}

// TCPTestBytes is how many bytes the kernel's tcptest= client receives
// on each connection before it closes it, when the value gives no size.
const TCPTestBytes = 65536

// TCPTestConns is how many connections the kernel's tcptest= client opens
// at once when the value gives no size (TCPT_CONNS in kernel/net/tcp_app.inc).
const TCPTestConns = 4

// TCPTestMaxBytes is the largest size tcptest=A.B.C.D:PORT,BYTES accepts
// (TCPT_BYTES_MAX in kernel/net/tcp_app.inc).
const TCPTestMaxBytes = 1 << 30

// ErrTCPTest means a tcptest= value is not A.B.C.D:PORT[,BYTES].
var ErrTCPTest = errors.New("tcptest must be A.B.C.D:PORT or A.B.C.D:PORT,BYTES (octets 0-255, port 1-65535, BYTES 1-1073741824, no leading zeros)")

// TCPTestSpec is what a tcptest= value asks the kernel for: Conns
// connections at once to Server, each closed by the kernel after Bytes.
type TCPTestSpec struct {
	Server netip.AddrPort
	Bytes  int
	Conns  int
}

// ParseTCPTestSpec checks a tcptest= value as the kernel's
// cfg_value_tcptest does: a dotted quad (ParseStaticIP's octet rules), ':',
// a port of 1-65535 and optionally ',' and a size of 1-TCPTestMaxBytes,
// both in decimal without a leading zero, nothing after them. Without a
// size the kernel opens TCPTestConns connections of TCPTestBytes; with one
// it opens a single connection of that many bytes (the throughput
// benchmark's mode).
func ParseTCPTestSpec(v string) (TCPTestSpec, error) {
	a, rest, err := parseQuad(v)
	if err != nil || len(rest) < 2 || rest[0] != ':' {
		return TCPTestSpec{}, ErrTCPTest
	}
	port, rest, ok := tcpTestNumber(rest[1:])
	if !ok || port > 65535 {
		return TCPTestSpec{}, ErrTCPTest
	}
	s := TCPTestSpec{Server: netip.AddrPortFrom(a, uint16(port)), Bytes: TCPTestBytes, Conns: TCPTestConns}
	if rest == "" {
		return s, nil
	}
	n, rest, ok := tcpTestNumber(rest[1:]) // rest starts with the ','
	if !ok || rest != "" || n > TCPTestMaxBytes {
		return TCPTestSpec{}, ErrTCPTest
	}
	s.Bytes, s.Conns = int(n), 1
	return s, nil
}

// tcpTestNumber reads 1-10 decimal digits without a leading zero up to a
// ',' or the end, as the kernel's tcpt_number: the value and what follows.
func tcpTestNumber(v string) (uint64, string, bool) {
	var n uint64
	i := 0
	for ; i < len(v) && v[i] != ','; i++ {
		c := v[i]
		if c < '0' || c > '9' || (i == 0 && c == '0') || i == 10 {
			return 0, v, false
		}
		n = n*10 + uint64(c-'0')
	}
	return n, v[i:], i > 0
}

// ParseTCPTest is ParseTCPTestSpec's server address.
func ParseTCPTest(v string) (netip.AddrPort, error) {
	s, err := ParseTCPTestSpec(v)
	return s.Server, err
}

// TCPTestDigest is the FNV-1a (32-bit, per byte) of data, as the kernel
// prints it in "tcptest: received N bytes fnv1a=XXXXXXXX".
func TCPTestDigest(data []byte) uint32 {
	h := uint32(2166136261)
	for _, b := range data {
		h ^= uint32(b)
		h *= 16777619
	}
	return h
}
