package appliance

// The Go reference of the kernel's WAN TCP formulas (kernel/net/tcp_tcb.inc,
// tcp_conn.inc and tcp_loss.inc): the window scale a receive ring is
// offered with (RFC 7323), the receive window advertised (RFC 9293
// §3.8.6.2), the out-of-order ranges and the SACK blocks reported for them
// (RFC 2018), and the congestion-control and loss-detection numbers (RFC
// 5681, RFC 6928, RFC 6675, RFC 5827). TCPWANDigest folds them over random
// cases exactly as the kernel's "tcpwan" self-test digest does.

// Sizes and limits as in the kernel.
const (
	TCPRxBuf       = 16384   // TCP_RXBUF: every block's own receive ring
	TCPTxBuf       = 8192    // TCP_TXBUF
	TCPBulkRxBuf   = 8 << 20 // TCP_BULK_RXBUF: a bulk ring (window scale 7)
	TCPOOOMax      = 32      // TCP_OOO_MAX: out-of-order ranges a block holds
	TCPBulkOOO     = 512     // TCP_BULK_OOO: those of a bulk ring's table
	TCPMSSOurs     = 1460    // TCP_MSS_OURS
	TCPWindowMax   = 65535   // the 16-bit window field
	TCPIWBytes     = 14600   // RFC 6928 §2
	TCPDupThreshed = 3       // RFC 5681 §3.2, RFC 6675 §2: DupThresh
	TCPERSegs      = 4       // RFC 5827 §3.1: early retransmit below 4 segments
	TCPCwndMax     = TCPTxBuf + TCPMSSOurs
)

// seqDiff is a - b as a signed 32-bit number: its sign orders a and b in
// sequence space (RFC 9293 §3.4).
func seqDiff(a, b uint32) int32 { return int32(a - b) }

// TCPWindowScale is the shift the kernel offers on its SYN for a receive
// ring of size bytes (tcp_wscale_for): the smallest, at most TCPWSMax, at
// which size - 1 fits the 16-bit window field.
func TCPWindowScale(size uint32) uint32 {
	var s uint32
	for ; s < TCPWSMax; s++ {
		if (size-1)>>s <= TCPWindowMax {
			break
		}
	}
	return s
}

// TCPReceiveWindow is the window in bytes the kernel advertises in a
// synchronized state (tcp_rcv_wnd): ring and rxLen give the free ring,
// capped at 65535 << shift; adv is rcv_adv - rcv_nxt, what the peer may
// still send (0 when negative). When the free ring exceeds adv by at least
// one MSS (RFC 9293 §3.8.6.2.2) the free ring is offered, rounded down to
// the scale; otherwise the old edge is kept, rounded up to the scale.
func TCPReceiveWindow(ring, rxLen uint32, adv int32, shift uint32) uint32 {
	free := ring - rxLen
	if lim := uint32(TCPWindowMax) << shift; free > lim {
		free = lim
	}
	cur := uint32(max(adv, 0))
	if free >= cur && free-cur >= TCPMSSOurs {
		return free >> shift << shift
	}
	g := uint32(1)<<shift - 1
	return (cur + g) &^ g
}

// TCPInitialWindow is RFC 6928 §2's initial congestion window for an MSS:
// min(10 MSS, max(2 MSS, 14600)) (tcp_iw).
func TCPInitialWindow(mss uint32) uint32 {
	return min(10*mss, max(2*mss, TCPIWBytes))
}

// TCPSsthresh is ssthresh after a loss (RFC 5681 §3.1 equation (4)):
// max(FlightSize / 2, 2 MSS) (tcp_ssthresh_for).
func TCPSsthresh(flight, mss uint32) uint32 { return max(flight/2, 2*mss) }

// TCPCwndGrow is cwnd after an ACK of acked new bytes outside recovery
// (tcp_cwnd_grow): below ssthresh slow start adds min(acked, MSS) (RFC 5681
// equation (2)), at or above it congestion avoidance adds max(1, MSS * MSS /
// cwnd) (equation (3)); at most TCPCwndMax.
func TCPCwndGrow(cwnd, ssthresh, acked, mss uint32) uint32 {
	var n uint32
	if cwnd < ssthresh {
		n = cwnd + min(acked, mss)
	} else {
		inc := uint32(1)
		if cwnd != 0 {
			if q := uint32(uint64(mss) * uint64(mss) / uint64(cwnd)); q != 0 {
				inc = q
			}
		}
		n = cwnd + inc
	}
	return min(n, TCPCwndMax)
}

// TCPDupThresh is the kernel's DupThresh for a flight (tcp_dupthresh): 3
// (RFC 6675 §2), or, when nothing more waits to be sent and fewer than 4
// segments are in flight, one less than those segments, at least 1 (early
// retransmit, RFC 5827 §3.1).
func TCPDupThresh(flight, mss, unsent uint32) uint32 {
	if unsent != 0 || mss == 0 {
		return TCPDupThreshed
	}
	oseg := (flight + mss - 1) / mss
	if oseg >= TCPERSegs {
		return TCPDupThreshed
	}
	if oseg <= 1 {
		return 1
	}
	return oseg - 1
}

// TCPRange is [Seq, End) in sequence space.
type TCPRange struct{ Seq, End uint32 }

// TCPReassembly is a receiver's out-of-order ranges as the kernel keeps
// them (the table at TCB.ooo_ptr): disjoint and not touching, most recently
// changed first, at most Max (0 means TCPOOOMax, a block's own table;
// a bulk ring's holds TCPBulkOOO).
type TCPReassembly struct {
	RcvNxt uint32
	Ranges []TCPRange
	Max    int
}

func (r *TCPReassembly) limit() int {
	if r.Max == 0 {
		return TCPOOOMax
	}
	return r.Max
}

// Add records that [s, e), past rcv_nxt, is held (tcp_ooo_add): every range
// it overlaps or touches is merged into it, and the result goes first. It
// reports false, and keeps nothing, when no range merged and all Max are
// in use.
func (r *TCPReassembly) Add(s, e uint32) bool {
	for i := 0; i < len(r.Ranges); {
		g := r.Ranges[i]
		if seqDiff(g.Seq, e) > 0 || seqDiff(g.End, s) < 0 {
			i++
			continue
		}
		if seqDiff(g.Seq, s) < 0 {
			s = g.Seq
		}
		if seqDiff(g.End, e) > 0 {
			e = g.End
		}
		r.Ranges = append(r.Ranges[:i], r.Ranges[i+1:]...)
	}
	if len(r.Ranges) >= r.limit() {
		return false
	}
	r.Ranges = append([]TCPRange{{s, e}}, r.Ranges...)
	return true
}

// Advance joins to the stream every range that starts at or before
// rcv_nxt, moving rcv_nxt past it (tcp_ooo_absorb), and returns how many
// joined.
func (r *TCPReassembly) Advance() int {
	joined := 0
	for again := true; again; {
		again = false
		for i, g := range r.Ranges {
			if seqDiff(g.Seq, r.RcvNxt) > 0 {
				continue
			}
			if seqDiff(g.End, r.RcvNxt) > 0 {
				r.RcvNxt = g.End
			}
			r.Ranges = append(r.Ranges[:i], r.Ranges[i+1:]...)
			joined++
			again = true
			break
		}
	}
	return joined
}

// SACKBlocks are the blocks an ACK reports (tcp_sack_fill, RFC 2018 §4):
// the first TCPSACKMax ranges, the most recently changed first.
func (r *TCPReassembly) SACKBlocks() []TCPRange {
	return r.Ranges[:min(len(r.Ranges), TCPSACKMax)]
}

// TCPWANDigest is the kernel's "selftest digest tcpwan" for a seed. Per
// case, with r = next() and w = next(): size = (r & 0x1FFFFFFF) + 1 gives
// TCPWindowScale(size); mss = ((r >> 32) & 0x7FF) + 1, flight = w &
// 0xFFFFF give TCPInitialWindow(mss) and TCPSsthresh(flight, mss); cwnd =
// ((w >> 20) & 0xFFFF) + 1, ssthresh = ((w >> 36) & 0xFFFF) + 1, acked = w
// >> 52 give TCPCwndGrow; unsent = (r >> 43) & 0xFF when bit 51 of r is
// set (else 0) gives TCPDupThresh(flight & 0x1FFF, mss, unsent). Then x =
// next(): ring = 1 << (14 + (x & 7)), shift = (x >> 3) & 7, rxLen = (x >>
// 8) & (ring - 1), adv = int32(x >> 32) >> 9 give TCPReceiveWindow. Every
// eighth case also runs a reassembly: rcv_nxt = uint32(next()), then 16
// arrivals of r = next(), off = (r & 0x3FF) - 128, length ((r >> 10) &
// 0xFF) + 1 from rcv_nxt + off: wholly old folds 0; reaching rcv_nxt
// moves it to the end and folds 1 and the ranges joined; past it folds 2
// when held, 3 when refused; after each, rcv_nxt, the number of ranges and
// the SACK blocks' edges.
func TCPWANDigest(seed uint32) uint64 {
	rng := &splitmix64{state: uint64(seed)}
	next := rng.next
	d := newDigest()
	add := d.add32
	for i := 0; i < ChecksumDigestCases; i++ {
		r, w := next(), next()
		add(TCPWindowScale(uint32(r&0x1FFFFFFF) + 1))
		mss := uint32(r>>32)&0x7FF + 1
		flight := uint32(w) & 0xFFFFF
		add(TCPInitialWindow(mss))
		add(TCPSsthresh(flight, mss))
		add(TCPCwndGrow(uint32(w>>20)&0xFFFF+1, uint32(w>>36)&0xFFFF+1, uint32(w>>52), mss))
		var unsent uint32
		if r>>51&1 == 1 {
			unsent = uint32(r>>43) & 0xFF
		}
		add(TCPDupThresh(flight&0x1FFF, mss, unsent))
		x := next()
		ring := uint32(1) << (14 + x&7)
		add(TCPReceiveWindow(ring, uint32(x>>8)&(ring-1), int32(uint32(x>>32))>>9, uint32(x>>3)&7))
		if i%8 != 0 {
			continue
		}
		ra := TCPReassembly{RcvNxt: uint32(next())}
		for range 16 {
			a := next()
			s := ra.RcvNxt + uint32(int32(a&0x3FF)-128)
			e := s + uint32(a>>10)&0xFF + 1
			switch {
			case seqDiff(e, ra.RcvNxt) <= 0:
				add(0)
			case seqDiff(s, ra.RcvNxt) <= 0:
				ra.RcvNxt = e
				add(1)
				add(uint32(ra.Advance()))
			case ra.Add(s, e):
				add(2)
			default:
				add(3)
			}
			add(ra.RcvNxt)
			add(uint32(len(ra.Ranges)))
			for _, b := range ra.SACKBlocks() {
				add(b.Seq)
				add(b.End)
			}
		}
	}
	return uint64(d)
}
