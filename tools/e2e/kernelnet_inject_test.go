package e2e

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/discord-pxe/dpxe/appliance"
)

// Malformed traffic for the kernel's parsers, sent from inside the test's
// namespace on its bridge, to the node's MAC only. Each frame is wrong in
// one way, and names the counter the kernel must raise for it.

// testSrcMAC is a locally administered address no real station uses.
var testSrcMAC = []byte{0x02, 0x00, 0x5e, 0x10, 0x00, 0x01}

const (
	testSrcIP = "10.77.255.1" // a source on no subnet of the test: nothing replies to it
)

// malformedFrames returns frames for dst (the node) and the counter each
// one must raise.
func malformedFrames(dst []byte, dstIP [4]byte) [][2]any {
	src := [4]byte(net.ParseIP(testSrcIP).To4())
	eth := func(etherType uint16, payload []byte) []byte {
		f := append(append(append([]byte{}, dst...), testSrcMAC...), byte(etherType>>8), byte(etherType))
		return append(f, payload...)
	}
	ipHdr := func(proto byte, payloadLen int, fix func(h []byte)) []byte {
		h := make([]byte, 20)
		h[0] = 0x45
		binary.BigEndian.PutUint16(h[2:], uint16(20+payloadLen))
		binary.BigEndian.PutUint16(h[4:], 0x4242)
		h[8] = 64
		h[9] = proto
		copy(h[12:], src[:])
		copy(h[16:], dstIP[:])
		if fix != nil {
			fix(h)
		}
		binary.BigEndian.PutUint16(h[10:], appliance.InternetChecksum(h))
		return h
	}
	udp := func(dport uint16, ulen int, data []byte) []byte {
		u := make([]byte, 8)
		binary.BigEndian.PutUint16(u[0:], 67)
		binary.BigEndian.PutUint16(u[2:], dport)
		binary.BigEndian.PutUint16(u[4:], uint16(ulen))
		return append(u, data...) // checksum 0: not computed (RFC 768)
	}
	var out [][2]any
	add := func(counter string, frame []byte) { out = append(out, [2]any{counter, frame}) }

	// IPv4 header checksum wrong.
	h := ipHdr(17, 8, nil)
	h[10] ^= 0xff
	add("bad_ipsum", eth(0x0800, append(h, udp(9, 8, nil)...)))
	// Header length 4 words (< 5).
	add("bad_iphdr", eth(0x0800, append(ipHdr(17, 8, func(h []byte) { h[0] = 0x44 }), udp(9, 8, nil)...)))
	// Total length claims more than the frame holds.
	add("bad_iphdr", eth(0x0800, append(ipHdr(17, 8, func(h []byte) { binary.BigEndian.PutUint16(h[2:], 1400) }), udp(9, 8, nil)...)))
	// Version 6 in an IPv4 EtherType.
	add("bad_iphdr", eth(0x0800, append(ipHdr(17, 8, func(h []byte) { h[0] = 0x65 }), udp(9, 8, nil)...)))
	// A first fragment (MF set) and a later fragment (offset 185).
	add("frag", eth(0x0800, append(ipHdr(17, 8, func(h []byte) { h[6] = 0x20 }), udp(9, 8, nil)...)))
	add("frag", eth(0x0800, append(ipHdr(17, 8, func(h []byte) { h[7] = 185 }), udp(9, 8, nil)...)))
	// UDP length larger than the IP payload.
	add("bad_udp", eth(0x0800, append(ipHdr(17, 8, nil), udp(68, 200, nil)...)))
	// UDP with a wrong (non-zero) checksum.
	bad := udp(9, 12, []byte{1, 2, 3, 4})
	bad[6], bad[7] = 0x12, 0x34
	add("bad_udp", eth(0x0800, append(ipHdr(17, 12, nil), bad...)))
	// A DHCP reply far shorter than the fixed header.
	add("bad_dhcp", eth(0x0800, append(ipHdr(17, 8+100, nil), udp(68, 108, make([]byte, 100))...)))
	// ICMP echo request with a wrong checksum.
	icmp := []byte{8, 0, 0xde, 0xad, 0, 1, 0, 1, 'x', 'y'}
	add("bad_icmp", eth(0x0800, append(ipHdr(1, len(icmp), nil), icmp...)))
	// ICMP shorter than its header.
	add("bad_icmp", eth(0x0800, append(ipHdr(1, 4, nil), 8, 0, 0xf7, 0xff)))
	// A protocol the kernel does not speak.
	add("bad_proto", eth(0x0800, append(ipHdr(99, 4, nil), 1, 2, 3, 4)))
	// ARP with a 7-byte hardware address. (A truncated ARP cannot be
	// tested: Ethernet pads every frame to 60 bytes.)
	arp := []byte{0, 1, 8, 0, 7, 4, 0, 1}
	arp = append(arp, make([]byte, 20)...)
	add("bad_arp", eth(0x0806, arp))
	// ARP with operation 3 (neither request nor reply).
	op3 := []byte{0, 1, 8, 0, 6, 4, 0, 3}
	op3 = append(op3, testSrcMAC...)
	op3 = append(op3, make([]byte, 14)...)
	add("bad_arp", eth(0x0806, op3))
	// An EtherType nobody handles.
	add("bad_type", eth(0x88b5, []byte("nonsense payload")))
	// An IPv4 packet whose Ethernet frame is only a header.
	add("bad_iphdr", eth(0x0800, nil))
	return out
}

// injectMalformed sends malformedFrames to the node from namespace nsName
// through an AF_PACKET socket on the bridge, and returns how much each
// counter must rise.
func injectMalformed(nsName, nodeMAC, nodeIP string) (map[string]uint64, error) {
	hw, err := net.ParseMAC(nodeMAC)
	if err != nil {
		return nil, err
	}
	ip := net.ParseIP(nodeIP).To4()
	if ip == nil {
		return nil, fmt.Errorf("bad node address %q", nodeIP)
	}
	fd, ifindex, err := packetSocketIn(nsName, "br0")
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	dstIP := [4]byte(ip) // the node itself, so every layer up to UDP/ICMP is reached
	want := map[string]uint64{}
	to := &unix.SockaddrLinklayer{Ifindex: ifindex, Halen: 6}
	copy(to.Addr[:], hw)
	for _, fc := range malformedFrames(hw, dstIP) {
		frame := fc[1].([]byte)
		if len(frame) < 60 {
			frame = append(frame, make([]byte, 60-len(frame))...) // Ethernet minimum: what a NIC pads to anyway
		}
		if err := unix.Sendto(fd, frame, 0, to); err != nil {
			return nil, fmt.Errorf("sending a %s frame: %w", fc[0], err)
		}
		want[fc[0].(string)]++
	}
	return want, nil
}

// packetSocketIn opens an AF_PACKET socket bound to ifname inside network
// namespace nsName: the socket stays in that namespace after the thread
// returns to its own.
func packetSocketIn(nsName, ifname string) (fd, ifindex int, err error) {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return -1, 0, err
	}
	defer orig.Close()
	target, err := os.Open("/var/run/netns/" + nsName)
	if err != nil {
		runtime.UnlockOSThread()
		return -1, 0, err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return -1, 0, fmt.Errorf("setns %s: %w", nsName, err)
	}
	defer func() {
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread() // back home: the thread may be reused
		} // else stay locked: Go retires the thread with the goroutine
	}()
	ifc, err := net.InterfaceByName(ifname)
	if err != nil {
		return -1, 0, err
	}
	proto := int(htons(unix.ETH_P_ALL))
	fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, proto)
	if err != nil {
		return -1, 0, err
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifc.Index}); err != nil {
		unix.Close(fd)
		return -1, 0, err
	}
	return fd, ifc.Index, nil
}

// floodFrames sends n minimum-size frames of an unhandled EtherType to the
// node, as fast as the socket takes them: many times the RX ring, so the
// rings wrap and fill up while the node keeps polling.
func floodFrames(nsName, nodeMAC string, n int) error {
	hw, err := net.ParseMAC(nodeMAC)
	if err != nil {
		return err
	}
	fd, ifindex, err := packetSocketIn(nsName, "br0")
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	to := &unix.SockaddrLinklayer{Ifindex: ifindex, Halen: 6}
	copy(to.Addr[:], hw)
	frame := make([]byte, 60)
	copy(frame, hw)
	copy(frame[6:], testSrcMAC)
	frame[12], frame[13] = 0x88, 0xb5 // IEEE 802 local experimental EtherType
	for i := 0; i < n; i++ {
		binary.BigEndian.PutUint32(frame[14:], uint32(i))
		if err := unix.Sendto(fd, frame, 0, to); err != nil && err != unix.ENOBUFS {
			return fmt.Errorf("flood frame %d: %w", i, err)
		}
	}
	return nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
