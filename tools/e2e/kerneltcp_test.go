package e2e

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/image/qemu"
	"github.com/discord-pxe/dpxe/tools/netns"
)

// TestKernelTCPSelfTest boots the kernel with selftest=1: the TCP
// self-tests (sequence comparisons across the wrap, build then parse,
// malformed segments, the scripted connections with SACK, window scaling,
// delayed ACKs and loss recovery) must pass, the "tcpseg" digest over
// random segments must equal appliance.TCPSegmentDigest, and the "tcpwan"
// digest over the WAN formulas and random reassemblies
// appliance.TCPWANDigest.
func TestKernelTCPSelfTest(t *testing.T) {
	res := bootSelfTest(t, "tcp-selftest", "", 60*time.Second)
	fail := t.Errorf
	logSerialOnFailure(t, res)
	if strings.Contains(res.Serial, "selftest net FAIL tcp") {
		fail("a TCP self-test failed")
	}
	rep, err := appliance.ParseSelfTestReport(res.Serial)
	if err != nil {
		fail("%v", err)
		return
	}
	got, ok := rep.Digests["tcpseg"]
	if !ok {
		fail("no \"selftest digest tcpseg\" line: the TCP self-test did not run")
		return
	}
	if want := appliance.TCPSegmentDigest(selfTestSeed); got != want {
		fail("TCP segment digest (seed %d): kernel %016x, Go %016x", selfTestSeed, got, want)
	}
	got, ok = rep.Digests["tcpwan"]
	if !ok {
		fail("no \"selftest digest tcpwan\" line: the TCP WAN self-test did not run")
		return
	}
	if want := appliance.TCPWANDigest(selfTestSeed); got != want {
		fail("TCP WAN digest (seed %d): kernel %016x, Go %016x", selfTestSeed, got, want)
	}
	if !strings.Contains(res.Serial, "selftest net tcp connection script done") {
		fail("the TCP connection scripts did not finish")
	}
}

// tcpTestServer is what the namespace's TCP server saw of one of the
// kernel's tcptest= connections.
type tcpTestServer struct {
	port   int   // the kernel's local port
	mss    int   // TCP_MAXSEG of the accepted socket: the SYN's MSS option
	extra  int   // bytes the kernel sent (none expected)
	eofErr error // nil when the kernel's FIN ended the stream cleanly
	err    error // accept or write failure
}

// listenInNetns opens a TCP listener inside the named network namespace
// (the socket keeps its namespace after the thread returns home).
func listenInNetns(nsName, addr string) (net.Listener, error) {
	var ln net.Listener
	err := inNetns(nsName, func() (err error) {
		ln, err = net.Listen("tcp4", addr)
		return err
	})
	return ln, err
}

// TestKernelTCP boots a node with a static address and
// tcptest=SERVER:PORT in a namespace: it must open appliance.TCPTestConns
// connections at once to a Go server there, each from its own port with
// an MSS option of 1460 in its SYN; receive 64 KiB on each (a different
// payload per connection) and print each FNV-1a, which must match the
// payloads one to one (appliance.TCPTestDigest); close each with a FIN the
// server reads as a clean end of stream, and reach TIME_WAIT.
func TestKernelTCP(t *testing.T) {
	if err := netns.Available(); err != nil {
		t.Skip(err)
	}
	needQEMU(t, qemu.SeaBIOS)
	runTCPNode(t, 60)
}

// runTCPNode is one TestKernelTCP run on subnet 10.77.<netIndex>.0/24.
func runTCPNode(t *testing.T, netIndex int) {
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	subnet := fmt.Sprintf("10.77.%d", netIndex)
	ns, err := netns.New(ctx, netip.MustParsePrefix(subnet+".1/24"))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := ns.AddTap(ctx, "tap0"); err != nil {
		t.Fatal(err)
	}
	ln, err := listenInNetns(ns.Name, subnet+".1:9000")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// One payload per connection, in accept order; the kernel's report
	// lines name its own connection numbers, so hashes are matched as a set.
	payloads := make([][]byte, appliance.TCPTestConns)
	want := map[uint32]int{}
	for i := range payloads {
		payloads[i] = make([]byte, appliance.TCPTestBytes)
		rng := rand.New(rand.NewPCG(7, uint64(9+i)))
		for j := range payloads[i] {
			payloads[i][j] = byte(rng.Uint32())
		}
		want[appliance.TCPTestDigest(payloads[i])] = i
	}
	served := make(chan tcpTestServer, appliance.TCPTestConns)
	go func() {
		ln.(*net.TCPListener).SetDeadline(time.Now().Add(20 * time.Second))
		for i := range payloads {
			c, err := ln.Accept()
			if err != nil {
				served <- tcpTestServer{err: err}
				continue
			}
			go func(c net.Conn, payload []byte) {
				var s tcpTestServer
				defer func() { served <- s }()
				defer c.Close()
				s.port = c.RemoteAddr().(*net.TCPAddr).Port
				c.SetDeadline(time.Now().Add(20 * time.Second))
				raw, _ := c.(*net.TCPConn).SyscallConn()
				raw.Control(func(fd uintptr) {
					s.mss, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG)
				})
				if _, err := c.Write(payload); err != nil {
					s.err = err
					return
				}
				rest, err := io.ReadAll(c)
				s.extra, s.eofErr = len(rest), err
			}(c, payloads[i])
		}
	}()

	cfg := appliance.BootConfig{NodeID: "tcp-test", StaticIP: subnet + ".50/24," + subnet + ".1", TCPTest: subnet + ".1:9000"}
	o := qemu.Options{
		Firmware: qemu.SeaBIOS,
		Kernel:   filepath.Join(outDir(t), image.KernelFile),
		Append:   cfg.String(),
		Net: []string{"-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no",
			"-device", fmt.Sprintf("virtio-net-pci,netdev=n0,mac=52:54:00:77:%02x:50", netIndex)},
		Wrapper: ns.Wrapper(),
		Timeout: 24 * time.Second,
	}
	node := startNode(ctx, o)
	serial := node.serial
	defer func() {
		if err := node.stop(); err != nil {
			t.Errorf("qemu: %v", err)
		}
		if t.Failed() {
			t.Logf("serial console:\n%s", serial.String())
		}
	}()

	if serial.waitFor(regexp.MustCompile(`tcptest: done `), 20*time.Second) == nil {
		t.Fatal("the node did not finish its connections")
	}
	out := serial.String()
	received := regexp.MustCompile(`tcptest: conn (\d+) received (\d+) bytes fnv1a=([0-9a-f]{16}) in (\d+) ms`).FindAllStringSubmatch(out, -1)
	if len(received) != appliance.TCPTestConns {
		t.Errorf("%d connections reported their payload, want %d", len(received), appliance.TCPTestConns)
	}
	slowest := 0
	for _, m := range received {
		if m[2] != strconv.Itoa(appliance.TCPTestBytes) {
			t.Errorf("conn %s received %s bytes, want %d", m[1], m[2], appliance.TCPTestBytes)
		}
		h, _ := strconv.ParseUint(m[3], 16, 64)
		if _, ok := want[uint32(h)]; !ok {
			t.Errorf("conn %s fnv1a %s matches no payload (or one already matched)", m[1], m[3])
		}
		delete(want, uint32(h))
		ms, _ := strconv.Atoi(m[4])
		slowest = max(slowest, ms)
	}
	total := appliance.TCPTestConns * appliance.TCPTestBytes
	t.Logf("%d x 64 KiB received in %d ms (%.1f MB/s)", appliance.TCPTestConns, slowest, float64(total)/1e3/float64(max(slowest, 1)))
	if n := len(regexp.MustCompile(`tcptest: conn \d+ closed cleanly, state 8 `).FindAllString(out, -1)); n != appliance.TCPTestConns {
		t.Errorf("%d connections reached TIME_WAIT after closing, want %d", n, appliance.TCPTestConns)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "tcptest:") {
			t.Log(strings.TrimSpace(line))
		}
	}
	ports := map[int]bool{}
	for range appliance.TCPTestConns {
		var s tcpTestServer
		select {
		case s = <-served:
		case <-ctx.Done():
			t.Fatal("the server did not finish")
		}
		if s.err != nil {
			t.Errorf("server: %v", s.err)
			continue
		}
		t.Logf("server: port %d, TCP_MAXSEG %d, %d bytes after the payload, end of stream %v", s.port, s.mss, s.extra, s.eofErr)
		if ports[s.port] {
			t.Errorf("two connections from port %d", s.port)
		}
		ports[s.port] = true
		if s.port < 49152 {
			t.Errorf("port %d outside the dynamic range 49152-65535", s.port)
		}
		if s.mss != 1460 {
			t.Errorf("server's TCP_MAXSEG %d, want 1460 (the SYN's MSS option)", s.mss)
		}
		if s.eofErr != nil || s.extra != 0 {
			t.Errorf("server's read after the payload: %d bytes, %v; want a clean FIN", s.extra, s.eofErr)
		}
	}
}
