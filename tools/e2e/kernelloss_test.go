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
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/image/qemu"
	"github.com/discord-pxe/dpxe/tools/netns"
)

// This machine has no sch_netem (nor tc's gact), so the lossy link of the
// TCP-under-loss test is made here: QEMU's NIC talks to a UDP socket
// (-netdev socket), and a relay in the test's namespace passes each
// Ethernet frame between that socket and a tap on the namespace's bridge,
// dropping, delaying and reordering them like `netem loss 5% delay 50ms
// reorder`.

// impairment is what the relay does to the frames of one direction.
type impairment struct {
	loss    float64       // share of frames dropped
	delay   time.Duration // added to every frame
	reorder float64       // share of frames held back an extra 10 ms, so later ones overtake them
}

// lossyRelay passes frames between QEMU's UDP socket and a tap.
type lossyRelay struct {
	udp      *net.UDPConn
	qemuAddr *net.UDPAddr
	tap      *os.File
	mu       sync.Mutex
	rng      *rand.Rand
	dropped  [2]int // toward the node, from the node
	passed   [2]int
	wg       sync.WaitGroup
}

// inNetns runs fn on a thread inside the named network namespace; sockets
// and devices it opens stay there.
func inNetns(nsName string, fn func() error) error {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	target, err := os.Open("/var/run/netns/" + nsName)
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("setns %s: %w", nsName, err)
	}
	defer func() {
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
	}()
	return fn()
}

// openTap attaches to an existing tap device (IFF_TAP, no packet info).
func openTap(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("TUNSETIFF %s: %w", name, err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// startLossyRelay opens the relay's UDP socket (relayPort) and the tap in
// the namespace and starts passing frames; QEMU listens on qemuPort.
func startLossyRelay(nsName, tap string, relayPort, qemuPort int, toNode, fromNode impairment, seed uint64) (*lossyRelay, error) {
	r := &lossyRelay{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		qemuAddr: &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: qemuPort}}
	err := inNetns(nsName, func() error {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: relayPort})
		if err != nil {
			return err
		}
		r.udp = c
		r.tap, err = openTap(tap)
		if err != nil {
			c.Close()
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	r.wg.Add(2)
	go r.pump(0, toNode, func(b []byte) (int, error) { return r.tap.Read(b) }, func(b []byte) { r.udp.WriteToUDP(b, r.qemuAddr) })
	go r.pump(1, fromNode, func(b []byte) (int, error) { n, _, err := r.udp.ReadFromUDP(b); return n, err }, func(b []byte) { r.tap.Write(b) })
	return r, nil
}

// pump reads frames with read and hands each to write after the
// impairment; it ends when read fails (Close).
func (r *lossyRelay) pump(dir int, imp impairment, read func([]byte) (int, error), write func([]byte)) {
	defer r.wg.Done()
	buf := make([]byte, 65536)
	for {
		n, err := read(buf)
		if err != nil {
			return
		}
		frame := append([]byte(nil), buf[:n]...)
		r.mu.Lock()
		drop := r.rng.Float64() < imp.loss
		late := r.rng.Float64() < imp.reorder
		if drop {
			r.dropped[dir]++
		} else {
			r.passed[dir]++
		}
		r.mu.Unlock()
		if drop {
			continue
		}
		d := imp.delay
		if late {
			d += 10 * time.Millisecond
		}
		time.AfterFunc(d, func() { write(frame) })
	}
}

func (r *lossyRelay) Close() {
	r.udp.Close()
	r.tap.Close()
	r.wg.Wait()
}

// TestKernelTCPUnderLoss downloads 1 MiB into the kernel over a link that
// drops 5% of the frames both ways, delays those toward the node by 50 ms
// and reorders 5%: the hash must be right, the close clean, and the
// counters must show the kernel retransmitted and held out-of-order data.
func TestKernelTCPUnderLoss(t *testing.T) {
	if err := netns.Available(); err != nil {
		t.Skip(err)
	}
	needQEMU(t, qemu.SeaBIOS)
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	const subnet = "10.90.0"
	ns, err := netns.New(ctx, netip.MustParsePrefix(subnet+".1/24"))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := ns.AddTap(ctx, "taploss"); err != nil {
		t.Fatal(err)
	}
	const relayPort, qemuPort = 40001, 40002
	relay, err := startLossyRelay(ns.Name, "taploss", relayPort, qemuPort,
		impairment{loss: 0.05, delay: 50 * time.Millisecond, reorder: 0.05},
		impairment{loss: 0.05, reorder: 0.05}, 5)
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()

	const size = 1 << 20
	payload := make([]byte, size)
	rng := rand.New(rand.NewPCG(11, 13))
	for i := range payload {
		payload[i] = byte(rng.Uint32())
	}
	ln, err := listenInNetns(ns.Name, subnet+".1:9000")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	served := make(chan error, 1)
	var serverRetrans uint32
	go func() {
		ln.(*net.TCPListener).SetDeadline(time.Now().Add(120 * time.Second))
		c, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(120 * time.Second))
		if _, err := c.Write(payload); err != nil {
			served <- err
			return
		}
		_, err = io.Copy(io.Discard, c) // until the kernel's FIN
		if raw, e := c.(*net.TCPConn).SyscallConn(); e == nil {
			raw.Control(func(fd uintptr) {
				if info, e := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); e == nil {
					serverRetrans = info.Total_retrans
				}
			})
		}
		served <- err
	}()

	cfg := appliance.BootConfig{NodeID: "tcp-loss", StaticIP: subnet + ".50/24," + subnet + ".1", TCPTest: subnet + ".1:9000," + strconv.Itoa(size)}
	o := qemu.Options{
		Firmware: qemu.SeaBIOS,
		Kernel:   filepath.Join(outDir(t), image.KernelFile),
		Append:   cfg.String(),
		Net: []string{"-netdev", fmt.Sprintf("socket,id=n0,udp=127.0.0.1:%d,localaddr=127.0.0.1:%d", relayPort, qemuPort),
			"-device", "virtio-net-pci,netdev=n0,mac=52:54:00:90:00:50"},
		Wrapper: ns.Wrapper(),
		Timeout: 140 * time.Second,
	}
	node := startNode(ctx, o)
	serial := node.serial
	defer func() {
		node.stop()
		if t.Failed() {
			t.Logf("serial console:\n%s", serial.String())
		}
	}()

	got := serial.waitFor(regexp.MustCompile(`tcptest: conn \d+ received (\d+) bytes fnv1a=([0-9a-f]{16}) in (\d+) ms`), 120*time.Second)
	if got == nil {
		t.Fatal("the download did not complete over the lossy link")
	}
	if got[1] != strconv.Itoa(size) {
		t.Errorf("received %s bytes, want %d", got[1], size)
	}
	if h, _ := strconv.ParseUint(got[2], 16, 64); h != uint64(appliance.TCPTestDigest(payload)) {
		t.Errorf("kernel fnv1a %s, Go %08x", got[2], appliance.TCPTestDigest(payload))
	}
	closed := serial.waitFor(regexp.MustCompile(`tcptest: done rtx=(\d+) ooo=(\d+) held=(\d+)`), 30*time.Second)
	if closed == nil {
		t.Fatal("the connection did not close cleanly")
	}
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("server: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the server did not see the kernel's FIN")
	}
	relay.mu.Lock()
	t.Logf("1 MiB over 5%% loss each way, 50 ms delay toward the node, 5%% reordered: %s ms; relay dropped %d of %d frames toward the node, %d of %d from it; kernel rtx=%s, out-of-order dropped=%s held=%s, server retransmissions %d",
		got[3], relay.dropped[0], relay.dropped[0]+relay.passed[0], relay.dropped[1], relay.dropped[1]+relay.passed[1], closed[1], closed[2], closed[3], serverRetrans)
	if relay.dropped[0] == 0 || relay.dropped[1] == 0 {
		t.Error("the relay dropped nothing in one direction: the test did not test loss")
	}
	relay.mu.Unlock()
	if serverRetrans == 0 {
		t.Error("the server retransmitted nothing: no data segment was lost")
	}
}
