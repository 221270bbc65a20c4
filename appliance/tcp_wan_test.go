package appliance

import (
	"encoding/binary"
	"slices"
	"testing"
)

func TestTCPWindowScale(t *testing.T) {
	for _, c := range []struct{ size, want uint32 }{
		{1, 0}, {TCPRxBuf, 0}, {65536, 0}, {65537, 1}, {131072, 1}, {131073, 2},
		{TCPBulkRxBuf, 7}, {TCPBulkRxBuf + 1, 8}, {1 << 30, 14}, {0xFFFFFFFF, 14},
	} {
		if got := TCPWindowScale(c.size); got != c.want {
			t.Errorf("TCPWindowScale(%d) = %d, want %d", c.size, got, c.want)
		}
	}
}

func TestTCPReceiveWindow(t *testing.T) {
	for _, c := range []struct {
		name        string
		ring, rxLen uint32
		adv         int32
		shift, want uint32
	}{
		{"empty 16 KiB ring, edge at its end", TCPRxBuf, 0, TCPRxBuf, 0, TCPRxBuf},
		{"a small step keeps the edge (SWS)", TCPRxBuf, 5, TCPRxBuf - 8, 0, TCPRxBuf - 8},
		{"one MSS moves it", TCPRxBuf, 100, 100, 0, TCPRxBuf - 100},
		{"a stale edge counts as 0", TCPRxBuf, 0, -20, 0, TCPRxBuf},
		{"bulk ring capped at 65535 << 7", TCPBulkRxBuf, 0, 65535, 7, 65535 << 7},
		{"free ring rounded down to the scale", TCPBulkRxBuf, 1000, 0, 7, (TCPBulkRxBuf - 1000) &^ 127},
		{"a kept edge rounded up to the scale", TCPBulkRxBuf, TCPBulkRxBuf - 1000, 900, 7, 1024},
	} {
		if got := TCPReceiveWindow(c.ring, c.rxLen, c.adv, c.shift); got != c.want {
			t.Errorf("%s: TCPReceiveWindow = %d, want %d", c.name, got, c.want)
		}
	}
}

func TestTCPCongestionFormulas(t *testing.T) {
	for _, c := range []struct{ mss, want uint32 }{{536, 5360}, {1000, 10000}, {1460, 14600}, {100, 1000}, {8000, 16000}} {
		if got := TCPInitialWindow(c.mss); got != c.want {
			t.Errorf("TCPInitialWindow(%d) = %d, want %d (RFC 6928)", c.mss, got, c.want)
		}
	}
	if got := TCPSsthresh(400, 100); got != 200 {
		t.Errorf("TCPSsthresh(400, 100) = %d, want 200", got)
	}
	if got := TCPSsthresh(10000, 1460); got != 5000 {
		t.Errorf("TCPSsthresh(10000, 1460) = %d, want 5000", got)
	}
	for _, c := range []struct{ cwnd, ssthresh, acked, mss, want uint32 }{
		{100, 200, 100, 100, 200},            // slow start: + min(acked, MSS)
		{1000, 5000, 3000, 1460, 2460},       // a stretch ACK adds one MSS
		{2920, 2920, 1460, 1460, 2920 + 730}, // congestion avoidance: MSS^2 / cwnd
		{9000, 100, 1460, 10, 9001},          // at least 1 byte
		{TCPCwndMax, 1, 1460, 1460, TCPCwndMax},
	} {
		if got := TCPCwndGrow(c.cwnd, c.ssthresh, c.acked, c.mss); got != c.want {
			t.Errorf("TCPCwndGrow(%d, %d, %d, %d) = %d, want %d", c.cwnd, c.ssthresh, c.acked, c.mss, got, c.want)
		}
	}
	for _, c := range []struct{ flight, mss, unsent, want uint32 }{
		{400, 100, 0, 3}, {300, 100, 0, 2}, {200, 100, 0, 1}, {100, 100, 0, 1}, {5, 100, 0, 1}, {0, 100, 0, 1},
		{200, 100, 50, 3}, // more to send brings more duplicate ACKs
	} {
		if got := TCPDupThresh(c.flight, c.mss, c.unsent); got != c.want {
			t.Errorf("TCPDupThresh(%d, %d, %d) = %d, want %d", c.flight, c.mss, c.unsent, got, c.want)
		}
	}
}

// TestTCPReassembly follows the kernel self-test's script (tcp_selftest_wan
// part 1): ranges most recently changed first, merged when touching, joined
// when rcv_nxt reaches them, one past the last slot refused.
func TestTCPReassembly(t *testing.T) {
	var d uint32 = 0xFFFFFFF1 // the peer's first byte: sequence numbers wrap
	r := TCPReassembly{RcvNxt: d + 4}
	for _, off := range []uint32{10, 20, 30, 40, 50} {
		if !r.Add(d+off, d+off+4) {
			t.Fatalf("range at +%d refused", off)
		}
	}
	want := []TCPRange{{d + 50, d + 54}, {d + 40, d + 44}, {d + 30, d + 34}, {d + 20, d + 24}}
	if got := r.SACKBlocks(); !slices.Equal(got, want) {
		t.Fatalf("SACK blocks %v, want %v", got, want)
	}
	r.Add(d+12, d+16)
	if got := r.SACKBlocks()[0]; got != (TCPRange{d + 10, d + 16}) {
		t.Fatalf("first block %v, want the widened range", got)
	}
	r.RcvNxt = d + 10
	if n := r.Advance(); n != 1 || r.RcvNxt != d+16 || len(r.Ranges) != 4 {
		t.Fatalf("Advance: %d joined, rcv_nxt +%d, %d ranges", n, r.RcvNxt-d, len(r.Ranges))
	}
	for off := uint32(100); len(r.Ranges) < TCPOOOMax; off += 2 {
		r.Add(d+off, d+off+1)
	}
	if r.Add(d+46, d+47) || len(r.Ranges) != TCPOOOMax {
		t.Fatalf("a ninth range held: %v", r.Ranges)
	}
	if !r.Add(d+44, d+45) || r.Ranges[0] != (TCPRange{d + 40, d + 45}) {
		t.Fatalf("a touching segment with every slot in use: %v", r.Ranges)
	}
	r.RcvNxt = d + 1000
	if n := r.Advance(); n != TCPOOOMax || len(r.Ranges) != 0 {
		t.Fatalf("everything behind rcv_nxt: %d joined, %v left", n, r.Ranges)
	}
}

func TestTCPWANDigestDependsOnSeed(t *testing.T) {
	if TCPWANDigest(1) == TCPWANDigest(2) {
		t.Error("TCPWANDigest ignores its seed")
	}
}

func TestParseTCPSegmentWANOptions(t *testing.T) {
	src, dst := [4]byte{10, 0, 1, 1}, [4]byte{10, 0, 1, 2}
	build := func(opts []byte) []byte {
		seg := make([]byte, 20+len(opts))
		seg[12] = byte((20+len(opts))/4) << 4
		copy(seg[20:], opts)
		binary.BigEndian.PutUint16(seg[16:], TCPPseudoChecksum(src, dst, seg))
		return seg
	}
	s, err := ParseTCPSegment(src, dst, build([]byte{1, 3, 3, 20, 1, 1, 4, 2}))
	if err != nil || s.Opts != TCPOptsWS|TCPOptsSACKOK || s.WScale != TCPWSMax {
		t.Errorf("window scale 20 and SACK-permitted: %+v, %v (want the shift capped at 14)", s, err)
	}
	sack := []byte{1, 1, 5, 18, 0, 0, 0, 1, 0, 0, 0, 2, 0xFF, 0xFF, 0xFF, 0xF0, 0, 0, 0, 5}
	s, err = ParseTCPSegment(src, dst, build(sack))
	if err != nil || s.SACKN != 2 || s.SACK != [8]uint32{1, 2, 0xFFFFFFF0, 5} {
		t.Errorf("two SACK blocks: %+v, %v", s, err)
	}
	for _, bad := range [][]byte{
		{3, 4, 7, 0}, {4, 3, 0, 0}, {1, 1, 5, 2}, {5, 11, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
	} {
		for len(bad)%4 != 0 {
			bad = append(bad, 0)
		}
		if _, err := ParseTCPSegment(src, dst, build(bad)); err != ErrTCPOption {
			t.Errorf("options % x: %v, want ErrTCPOption", bad, err)
		}
	}
}

// TestTCPReassemblyInvariants feeds random arrivals (as TCPWANDigest
// draws them) and checks what the kernel relies on: ranges stay disjoint,
// never touch, lie past rcv_nxt and number at most TCPOOOMax, and the SACK
// blocks are the first of them.
func TestTCPReassemblyInvariants(t *testing.T) {
	rng := &splitmix64{state: 42}
	for c := 0; c < 2000; c++ {
		r := TCPReassembly{RcvNxt: uint32(rng.next())}
		for range 64 {
			a := rng.next()
			s := r.RcvNxt + uint32(int32(a&0x3FF)-128)
			e := s + uint32(a>>10)&0xFF + 1
			switch {
			case seqDiff(e, r.RcvNxt) <= 0:
			case seqDiff(s, r.RcvNxt) <= 0:
				r.RcvNxt = e
				r.Advance()
			default:
				r.Add(s, e)
			}
			if len(r.Ranges) > TCPOOOMax {
				t.Fatalf("%d ranges", len(r.Ranges))
			}
			for i, g := range r.Ranges {
				if seqDiff(g.Seq, r.RcvNxt) <= 0 || seqDiff(g.End, g.Seq) <= 0 {
					t.Fatalf("range %v with rcv_nxt %d", g, r.RcvNxt)
				}
				for _, h := range r.Ranges[i+1:] {
					if seqDiff(g.Seq, h.End) <= 0 && seqDiff(h.Seq, g.End) <= 0 {
						t.Fatalf("ranges %v and %v overlap or touch", g, h)
					}
				}
			}
			if b := r.SACKBlocks(); len(b) != min(len(r.Ranges), TCPSACKMax) || (len(b) > 0 && b[0] != r.Ranges[0]) {
				t.Fatalf("SACK blocks %v of %v", b, r.Ranges)
			}
		}
	}
}
