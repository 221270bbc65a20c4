package e2e

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/tools/netns"
	"github.com/discord-pxe/dpxe/tools/qemu"
)

// TestKernelTCPSelfTest boots the kernel with selftest=1: the TCP
// self-tests (sequence comparisons across the wrap, build then parse,
// malformed segments) must pass, and the "tcpseg" digest over random
// segments must equal appliance.TCPSegmentDigest.
func TestKernelTCPSelfTest(t *testing.T) {
	needQEMU(t, qemu.SeaBIOS)
	cfg := appliance.BootConfig{NodeID: "tcp-selftest", SelfTest: true, Seed: selfTestSeed, HasSeed: true}
	res, err := qemu.Run(context.Background(), qemu.Options{
		Firmware: qemu.SeaBIOS,
		Kernel:   filepath.Join(outDir(t), image.KernelFile),
		Append:   cfg.String(),
		Timeout:  60 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	fail := t.Errorf
	logSerialOnFailure(t, res)
	if !res.Passed() {
		fail("QEMU exit status %d, want %d (self-test pass)", res.ExitCode, qemu.ExitPass)
	}
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
}

// tcpTestServer is what the namespace's TCP server saw of the kernel's
// tcptest= connection.
type tcpTestServer struct {
	mss    int   // TCP_MAXSEG of the accepted socket: the SYN's MSS option
	extra  int   // bytes the kernel sent (none expected)
	eofErr error // nil when the kernel's FIN ended the stream cleanly
	err    error // accept or write failure
}

// listenInNetns opens a TCP listener inside the named network namespace
// (the socket keeps its namespace after the thread returns home).
func listenInNetns(nsName, addr string) (net.Listener, error) {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer orig.Close()
	target, err := os.Open("/var/run/netns/" + nsName)
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("setns %s: %w", nsName, err)
	}
	defer func() {
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
	}()
	return net.Listen("tcp4", addr)
}

// TestKernelTCP boots a node with a static address and
// tcptest=SERVER:PORT in a namespace: it must connect to a Go server there
// with an MSS option of 1460 in its SYN, receive 64 KiB whose FNV-1a it
// prints (compared with appliance.TCPTestDigest), close with a FIN the
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
	payload := make([]byte, appliance.TCPTestBytes)
	rng := rand.New(rand.NewPCG(7, 9))
	for i := range payload {
		payload[i] = byte(rng.Uint32())
	}
	served := make(chan tcpTestServer, 1)
	go func() {
		var s tcpTestServer
		defer func() { served <- s }()
		ln.(*net.TCPListener).SetDeadline(time.Now().Add(20 * time.Second))
		c, err := ln.Accept()
		if err != nil {
			s.err = err
			return
		}
		defer c.Close()
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
	}()

	cfg := appliance.BootConfig{NodeID: "tcp-test", StaticIP: subnet + ".50/24," + subnet + ".1", TCPTest: subnet + ".1:9000"}
	serial := &nodeSerial{}
	done := make(chan struct{})
	o := qemu.Options{
		Firmware: qemu.SeaBIOS,
		Kernel:   filepath.Join(outDir(t), image.KernelFile),
		Append:   cfg.String(),
		Net: []string{"-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no",
			"-device", fmt.Sprintf("virtio-net-pci,netdev=n0,mac=52:54:00:77:%02x:50", netIndex)},
		Wrapper: ns.Wrapper(),
		Serial:  serial,
		Timeout: 24 * time.Second,
		Until: func(string) bool {
			select {
			case <-done:
				return true
			default:
				return false
			}
		},
	}
	ran := make(chan error, 1)
	go func() {
		_, err := qemu.Run(ctx, o)
		ran <- err
	}()
	defer func() {
		close(done)
		if err := <-ran; err != nil {
			t.Errorf("qemu: %v", err)
		}
		if t.Failed() {
			t.Logf("serial console:\n%s", serial.String())
		}
	}()

	got := serial.waitFor(regexp.MustCompile(`tcptest: received (\d+) bytes fnv1a=([0-9a-f]{16}) in (\d+) ms`), 20*time.Second)
	if got == nil {
		t.Fatal("the node did not report receiving the payload")
	}
	if got[1] != strconv.Itoa(appliance.TCPTestBytes) {
		t.Errorf("received %s bytes, want %d", got[1], appliance.TCPTestBytes)
	}
	if h, _ := strconv.ParseUint(got[2], 16, 64); h != uint64(appliance.TCPTestDigest(payload)) {
		t.Errorf("kernel fnv1a %s, Go %08x", got[2], appliance.TCPTestDigest(payload))
	}
	ms, _ := strconv.Atoi(got[3])
	t.Logf("64 KiB received in %d ms (%.1f MB/s)", ms, float64(appliance.TCPTestBytes)/1e3/float64(max(ms, 1)))
	if serial.waitFor(regexp.MustCompile(`tcptest: closed cleanly, state 8 `), 10*time.Second) == nil {
		t.Error("the node did not reach TIME_WAIT after closing")
	}
	for _, line := range strings.Split(serial.String(), "\n") {
		if strings.HasPrefix(line, "tcptest:") {
			t.Log(strings.TrimSpace(line))
		}
	}
	var s tcpTestServer
	select {
	case s = <-served:
	case <-ctx.Done():
		t.Fatal("the server did not finish")
	}
	if s.err != nil {
		t.Fatalf("server: %v", s.err)
	}
	t.Logf("server: TCP_MAXSEG %d, %d bytes after the payload, end of stream %v", s.mss, s.extra, s.eofErr)
	if s.mss != 1460 {
		t.Errorf("server's TCP_MAXSEG %d, want 1460 (the SYN's MSS option)", s.mss)
	}
	if s.eofErr != nil || s.extra != 0 {
		t.Errorf("server's read after the payload: %d bytes, %v; want a clean FIN", s.extra, s.eofErr)
	}
}
