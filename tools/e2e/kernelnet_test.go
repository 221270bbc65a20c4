package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/image/qemu"
	"github.com/discord-pxe/dpxe/tools/netns"
)

// TestKernelNetSelfTest boots the kernel with selftest=1 and a module of
// ip= boot-config cases: the network self-tests must pass, the "cksum",
// "dhcpopt", "dns" and "gwurl" digests must equal appliance.ChecksumDigest,
// DHCPOptionsDigest, DNSDigest and DialURLDigest, and every ip= verdict must equal
// appliance.ParseBootConfig's.
func TestKernelNetSelfTest(t *testing.T) {
	needQEMU(t, qemu.SeaBIOS)
	cases := ipConfigCases()
	res := bootSelfTest(t, "net-selftest", writeCaseModule(t, cases), 60*time.Second)
	fail := t.Errorf
	logSerialOnFailure(t, res)
	if strings.Contains(res.Serial, "selftest net FAIL") {
		fail("a network self-test failed")
	}
	if !strings.Contains(res.Serial, "selftest net dhcp option cases ") {
		fail("the DHCP option cases did not run")
	}
	rep, err := appliance.ParseSelfTestReport(res.Serial)
	if err != nil {
		fail("%v", err)
		return
	}
	if got, want := rep.Digests["cksum"], appliance.ChecksumDigest(selfTestSeed); got != want {
		fail("checksum digest (seed %d): kernel %016x, Go %016x", selfTestSeed, got, want)
	}
	if got, want := rep.Digests["dhcpopt"], appliance.DHCPOptionsDigest(selfTestSeed); got != want {
		fail("DHCP options digest (seed %d): kernel %016x, Go %016x", selfTestSeed, got, want)
	}
	if got, want := rep.Digests["dns"], appliance.DNSDigest(selfTestSeed); got != want {
		fail("DNS answer and rules digest (seed %d): kernel %016x, Go %016x", selfTestSeed, got, want)
	}
	if got, want := rep.Digests["gwurl"], appliance.DialURLDigest(selfTestSeed); got != want {
		fail("dial URL digest (seed %d): kernel %016x, Go %016x", selfTestSeed, got, want)
	}
	checkConfigCases(t, rep, cases, fail)
}

// ipConfigCases are boot configs around every rule of the ip= syntax.
func ipConfigCases() [][]byte {
	vals := []string{
		"10.0.0.5/24", "10.0.0.5/24,10.0.0.1", "0.0.0.0/32", "255.255.255.255/1", "1.2.3.4/32,5.6.7.8",
		"10.0.0.5", "10.0.0.5/", "10.0.0.5/0", "10.0.0.5/33", "10.0.0.5/08", "10.0.0.5/8,", "10.0.0.5/8,1.2.3",
		"10.0.0.5/8,1.2.3.4,", "10.0.0.5/8;1.2.3.4", "10.0.0.256/24", "10.0.0.05/24", "010.0.0.5/24", "1.2.3/8",
		"1.2.3.4.5/8", "1..2.3/8", ".1.2.3/8", "1.2.3.4/8/9", "1234.1.1.1/8", "1.2.3.4/100", "a.b.c.d/8",
		"1.2.3.4/8,1.2.3.400", "1.2.3.4/8,01.2.3.4", "1.2.3.4 /8",
	}
	var cases [][]byte
	for _, v := range vals {
		cases = append(cases, []byte("node=n ip="+v))
	}
	cases = append(cases, []byte("ip=1.2.3.4/8 ip=1.2.3.4/8"), []byte("ip="), []byte("kernel ip=9.9.9.9/9,9.9.9.1 node=x"))
	return cases
}

// nodeSerial collects a QEMU console while the run goes on.
type nodeSerial struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *nodeSerial) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *nodeSerial) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// bgNode is a QEMU run in the background that lasts until stop.
type bgNode struct {
	serial *nodeSerial
	done   chan struct{}
	ran    chan error
}

// startNode runs QEMU with o in the background, its console in the
// returned node's serial, until stop (o.Until is set here) or o.Timeout.
func startNode(ctx context.Context, o qemu.Options) *bgNode {
	b := &bgNode{serial: &nodeSerial{}, done: make(chan struct{}), ran: make(chan error, 1)}
	o.Serial = b.serial
	o.Until = func(string) bool {
		select {
		case <-b.done:
			return true
		default:
			return false
		}
	}
	go func() {
		_, err := qemu.Run(ctx, o)
		b.ran <- err
	}()
	return b
}

// stop ends the run, waits for QEMU and returns its error (nil when it
// ran and was stopped or timed out).
func (b *bgNode) stop() error {
	close(b.done)
	return <-b.ran
}

// waitFor polls the console until re matches or the deadline passes.
func (s *nodeSerial) waitFor(re *regexp.Regexp, within time.Duration) []string {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if m := re.FindStringSubmatch(s.String()); m != nil {
			return m
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

// netNode describes one kernel boot on a NIC model.
type netNode struct {
	name   string
	fw     qemu.Firmware
	device string // QEMU -device model
	static bool   // ip= instead of DHCP
	renew  bool   // also wait for the DHCP renewal at T1
}

// TestKernelNet boots the kernel on each NIC model in a namespace with
// dnsmasq as the DHCP and DNS server: the node must print its lease,
// resolve the controller's host name, answer ping
// from the namespace, count a burst of malformed frames in the right
// counters and still answer ping afterwards. One node runs with a static
// ip= instead of DHCP; the e1000 node also waits for its renewal at T1.
func TestKernelNet(t *testing.T) {
	if err := netns.Available(); err != nil {
		t.Skip(err)
	}
	nodes := []netNode{
		{name: "e1000-seabios", fw: qemu.SeaBIOS, device: "e1000", renew: true},
		{name: "virtio-ovmf", fw: qemu.OVMF, device: "virtio-net-pci"},
		{name: "virtio-seabios-static", fw: qemu.SeaBIOS, device: "virtio-net-pci", static: true},
	}
	for i, n := range nodes {
		t.Run(n.name, func(t *testing.T) {
			needQEMU(t, n.fw)
			runNetNode(t, n, i)
		})
	}
}

func runNetNode(t *testing.T, n netNode, index int) {
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	subnet := fmt.Sprintf("10.77.%d", 10+index)
	ns, err := netns.New(ctx, netip.MustParsePrefix(subnet+".1/24"))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := ns.AddTap(ctx, "tap0"); err != nil {
		t.Fatal(err)
	}
	mac := fmt.Sprintf("52:54:00:77:%02x:50", index)
	nodeIP := subnet + ".50"

	// The renewing node's server sends T1 (option 58) of 20 s: the kernel
	// must take it over its lease/2 default, and the test need not wait the
	// 60 s of a two-minute lease (dnsmasq's shortest).
	t1 := "60s"
	if !n.static {
		args := []string{"--no-daemon", "--conf-file=/dev/null",
			"--port=53", "--no-resolv", "--no-hosts", "--local-ttl=60", // DNS for controller.test only
			"--host-record=controller.test," + subnet + ".1",
			"--interface=br0", "--bind-interfaces", "--no-ping", "--pid-file=",
			"--dhcp-leasefile=" + filepath.Join(t.TempDir(), "leases"),
			"--dhcp-range=" + subnet + ".100," + subnet + ".150,255.255.255.0,2m",
			"--dhcp-option=3," + subnet + ".1",
			"--dhcp-host=" + mac + "," + nodeIP}
		if n.renew {
			t1 = "20s"
			args = append(args, "--dhcp-option=option:T1,20")
		}
		dnsmasq := ns.Command(ctx, "dnsmasq", args...)
		var dlog bytes.Buffer
		dnsmasq.Stdout, dnsmasq.Stderr = &dlog, &dlog
		if err := dnsmasq.Start(); err != nil {
			t.Skipf("dnsmasq: %v", err)
		}
		defer func() {
			dnsmasq.Cancel()
			dnsmasq.Wait()
			if t.Failed() {
				t.Logf("dnsmasq:\n%s", dlog.String())
			}
		}()
	}

	cfg := appliance.BootConfig{NodeID: "net-" + n.name, Controller: "http://controller.test:8080"}
	if n.static {
		cfg.StaticIP = nodeIP + "/24," + subnet + ".1"
		cfg.Controller = "http://" + subnet + ".1:8080" // no DNS server without DHCP
	}
	monitor := filepath.Join(t.TempDir(), "monitor.sock")
	o := qemu.Options{
		Firmware: n.fw,
		Kernel:   filepath.Join(outDir(t), image.KernelFile),
		Net: []string{"-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no",
			"-device", n.device + ",netdev=n0,mac=" + mac},
		Wrapper: ns.Wrapper(),
		Extra:   []string{"-monitor", "unix:" + monitor + ",server=on,wait=off"}, // for set_link
		Timeout: 140 * time.Second,
	}
	if n.fw == qemu.OVMF {
		o.Config = cfg.String()
	} else {
		o.Append = cfg.String()
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

	nicLine := regexp.MustCompile(`nic: [0-9a-f:.]+ [0-9a-f]{4}:[0-9a-f]{4} (e1000|virtio-net) mac=` + mac + ` link=up`)
	if nicLine.FindString(serial.String()) == "" && serial.waitFor(nicLine, 60*time.Second) == nil {
		t.Fatalf("no NIC line for %s with mac %s", n.device, mac)
	}
	if n.static {
		if serial.waitFor(regexp.MustCompile(`net: static `+regexp.QuoteMeta(nodeIP)+`/24 gw `+regexp.QuoteMeta(subnet+".1")), 30*time.Second) == nil {
			t.Fatal("no static address line")
		}
	} else {
		m := serial.waitFor(regexp.MustCompile(`dhcp: bound `+regexp.QuoteMeta(nodeIP)+`/24 gw `+regexp.QuoteMeta(subnet+".1")+` server \S+ lease 120s t1 `+t1+` t2 105s in (\d+) ms`), 60*time.Second)
		if m == nil {
			t.Fatal("no DHCP lease within 60 s")
		}
		t.Logf("%s: DHCP discover to bound in %s ms", n.name, m[1])
		d := serial.waitFor(regexp.MustCompile(`dns: controller\.test -> `+regexp.QuoteMeta(subnet+".1")+` ttl 60s in (\d+) ms`), 15*time.Second)
		if d == nil {
			t.Fatal("the controller name was not resolved through dnsmasq")
		}
		t.Logf("%s: DNS controller.test resolved in %s ms", n.name, d[1])
	}
	if n.static && serial.waitFor(regexp.MustCompile(`controller: `+regexp.QuoteMeta(subnet+".1")+` \(address given\)`), 10*time.Second) == nil {
		t.Fatal("no controller line for an IPv4 controller URL")
	}

	rtt, got := pingNode(t, ctx, ns, nodeIP, 5)
	if got < 4 {
		t.Fatalf("ping: %d of 5 answered", got)
	}
	t.Logf("%s: ping %d/5, average RTT %.3f ms", n.name, got, rtt)

	before := waitStatus(t, serial, 0, 12*time.Second)
	sent, err := injectMalformed(ns.Name, mac, nodeIP)
	if err != nil {
		t.Fatalf("injecting frames: %v", err)
	}
	total := uint64(0)
	for _, n := range sent {
		total += n
	}
	// The burst may straddle a status line: look at up to two more.
	var short []string
	for extra := 1; extra <= 2; extra++ {
		after := waitStatus(t, serial, before.seq+extra, 12*time.Second)
		short = short[:0]
		for name, want := range sent {
			if d := after.counters[name] - before.counters[name]; d < want {
				short = append(short, fmt.Sprintf("%s rose by %d, want at least %d", name, d, want))
			}
		}
		if len(short) == 0 {
			var seen []string
			for name := range sent {
				seen = append(seen, fmt.Sprintf("%s+%d", name, after.counters[name]-before.counters[name]))
			}
			sort.Strings(seen)
			t.Logf("%s: counters after the burst: %s", n.name, strings.Join(seen, " "))
			break
		}
	}
	for _, s := range short {
		t.Errorf("after %d malformed frames: counter %s", total, s)
	}
	if rtt, got := pingNode(t, ctx, ns, nodeIP, 3); got < 3 {
		t.Errorf("after the malformed burst: ping %d of 3 answered", got)
	} else {
		t.Logf("%s: alive after %d malformed frames (%d kinds), RTT %.3f ms", n.name, total, len(sent), rtt)
	}

	// A flood many times the RX ring: the rings wrap and overflow; the node
	// must count what it gets, keep polling and still answer.
	const flood = 2000
	before = waitStatus(t, serial, 0, 12*time.Second)
	if err := floodFrames(ns.Name, mac, flood); err != nil {
		t.Fatal(err)
	}
	after := waitStatus(t, serial, before.seq+1, 12*time.Second)
	counted := after.counters["bad_type"] - before.counters["bad_type"]
	if counted < 64 {
		t.Errorf("flood of %d frames: bad_type rose by %d, want at least 64 (twice the RX ring)", flood, counted)
	}
	if rtt, ok := pingNode(t, ctx, ns, nodeIP, 3); ok < 3 {
		t.Errorf("after the flood: ping %d of 3 answered", ok)
	} else {
		t.Logf("%s: flood of %d frames, %d counted, nic_rx_err %d, then RTT %.3f ms", n.name, flood, counted, after.counters["nic_rx_err"], rtt)
	}

	// Link state: the NIC's link goes down and up (QEMU set_link); the
	// node must notice both within its 100 ms link poll and keep working.
	for _, state := range []string{"off", "on"} {
		if err := qemuMonitor(monitor, "set_link n0 "+state); err != nil {
			t.Fatalf("set_link %s: %v", state, err)
		}
		word := map[string]string{"off": "down", "on": "up"}[state]
		if serial.waitFor(regexp.MustCompile(`(?m)^net: link `+word+`\r?$`), 10*time.Second) == nil {
			t.Fatalf("the node did not report link %s", word)
		}
	}
	if _, ok := pingNode(t, ctx, ns, nodeIP, 3); ok < 2 {
		t.Errorf("after the link came back: ping %d of 3 answered", ok)
	}

	if n.renew {
		if serial.waitFor(regexp.MustCompile(`dhcp: renewed `+regexp.QuoteMeta(nodeIP)+`/24 .* renewals 1`), 90*time.Second) == nil {
			t.Error("no DHCP renewal at the server's T1 (20 s)")
		}
	}
}

// qemuMonitor sends one human-monitor command to QEMU's monitor socket.
func qemuMonitor(sock, cmd string) error {
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4096)
	if _, err := c.Read(buf); err != nil { // the greeting and prompt
		return err
	}
	if _, err := c.Write([]byte(cmd + "\n")); err != nil {
		return err
	}
	time.Sleep(200 * time.Millisecond) // let QEMU run it before the socket closes
	return nil
}

var pingSummary = regexp.MustCompile(`(\d+) packets received.*\n.*= [\d.]+/([\d.]+)/`)

// pingNode pings ip count times from the namespace with busybox ping and
// returns the average RTT and the replies received.
func pingNode(t *testing.T, ctx context.Context, ns *netns.NS, ip string, count int) (float64, int) {
	t.Helper()
	out, _ := ns.Run(ctx, "busybox", "ping", "-c", strconv.Itoa(count), "-W", "2", ip)
	m := pingSummary.FindStringSubmatch(out)
	if m == nil {
		t.Logf("ping output:\n%s", out)
		return 0, 0
	}
	got, _ := strconv.Atoi(m[1])
	avg, _ := strconv.ParseFloat(m[2], 64)
	return avg, got
}

// status is one parsed "net: ..." console line.
type status struct {
	seq      int // index of the line in the console
	counters map[string]uint64
}

var statusLine = regexp.MustCompile(`(?m)^net: ip=.*$`)

// waitStatus waits for status line number >= seq and parses its counters.
func waitStatus(t *testing.T, serial *nodeSerial, seq int, within time.Duration) status {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		lines := statusLine.FindAllString(serial.String(), -1)
		if len(lines) > seq && len(lines) > 0 {
			st := status{seq: len(lines) - 1, counters: map[string]uint64{}}
			for _, f := range strings.Fields(lines[len(lines)-1]) {
				if k, v, ok := strings.Cut(f, "="); ok {
					if n, err := strconv.ParseUint(strings.TrimSuffix(v, "ms"), 10, 64); err == nil {
						st.counters[k] = n
					}
				}
			}
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("no status line number %d within %v", seq, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestKernelNICModels boots one machine with several NIC models and no
// network behind them: the banner must list every one with the right
// driver, bring up the first, call the others spare, and refuse a
// legacy-only virtio device with a reason.
func TestKernelNICModels(t *testing.T) {
	needQEMU(t, qemu.SeaBIOS)
	want := []*regexp.Regexp{
		regexp.MustCompile(`nic: 00:0a\.0 8086:100f e1000 mac=52:54:00:00:00:0a link=(up|down)`),
		regexp.MustCompile(`nic: 00:0b\.0 1af4:1041 supported, not used: one NIC at a time`),
		regexp.MustCompile(`nic: 00:0c\.0 1af4:1000 supported, not used: one NIC at a time`),
		regexp.MustCompile(`nic: 00:0d\.0 8086:10d3 no driver`),
	}
	o := qemu.Options{
		Firmware: qemu.SeaBIOS,
		Kernel:   filepath.Join(outDir(t), image.KernelFile),
		Append:   "node=nic-models",
		Timeout:  60 * time.Second,
		Extra: []string{
			"-device", "e1000-82545em,mac=52:54:00:00:00:0a,addr=0a",
			"-device", "virtio-net-pci,disable-legacy=on,addr=0b",
			"-device", "virtio-net-pci,disable-modern=on,addr=0c",
			"-device", "e1000e,addr=0d",
		},
		Until: func(s string) bool { return strings.Contains(s, "dhcp: discover") },
	}
	res, err := qemu.Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	for _, re := range want {
		if !re.MatchString(res.Serial) {
			t.Errorf("no line matching %q", re)
		}
	}
	if t.Failed() {
		t.Logf("serial console:\n%s", res.Serial)
	}

	// A legacy-only virtio-net alone: named, refused, and the node says it
	// has no usable NIC instead of pretending.
	o.Extra = []string{"-device", "virtio-net-pci,disable-modern=on,addr=0c"}
	o.Until = func(s string) bool { return strings.Contains(s, "halting") }
	res, err = qemu.Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"1af4:1000 virtio-net (no usable virtio 1.x capabilities: legacy-only devices are not supported) init FAILED",
		"net: no supported NIC"} {
		if !strings.Contains(res.Serial, w) {
			t.Errorf("no %q in the console:\n%s", w, res.Serial)
		}
	}
}

// TestKernelPCIECAM boots a q35 machine (the harness's default), whose ACPI
// has an MCFG table: the kernel must read configuration space through ECAM
// (mapped uncacheable) and find both NIC models on the PCIe root bus; an
// i440fx machine has no MCFG, and the kernel says it uses the legacy ports.
func TestKernelPCIECAM(t *testing.T) {
	needQEMU(t, qemu.SeaBIOS)
	o := qemu.Options{
		Firmware: qemu.SeaBIOS,
		Kernel:   filepath.Join(outDir(t), image.KernelFile),
		Append:   "node=ecam",
		Timeout:  60 * time.Second,
		Extra: []string{
			"-device", "e1000,mac=52:54:00:00:00:0a,addr=0a",
			"-device", "virtio-net-pci,disable-legacy=on,addr=0b",
		},
		Until: func(s string) bool { return strings.Contains(s, "dhcp: discover") || strings.Contains(s, "halting") },
	}
	res, err := qemu.Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	for _, re := range []*regexp.Regexp{
		regexp.MustCompile(`pci: ECAM at 0x00000000b0000000 buses 0-255 \(ACPI MCFG\)`),
		regexp.MustCompile(`nic: 00:0a\.0 8086:100e e1000 mac=52:54:00:00:00:0a link=(up|down)`),
		regexp.MustCompile(`nic: 00:0b\.0 1af4:1041 supported, not used: one NIC at a time`),
	} {
		if !re.MatchString(res.Serial) {
			t.Errorf("no line matching %q", re)
		}
	}
	o.Extra = []string{"-machine", "pc", "-device", "e1000,addr=0a"}
	if res2, err := qemu.Run(context.Background(), o); err != nil || !strings.Contains(res2.Serial, "pci: legacy configuration ports (no usable ACPI MCFG)") ||
		!strings.Contains(res2.Serial, "nic: 00:0a.0 8086:100e e1000") {
		t.Errorf("i440fx: no legacy-ports line (%v)\n%s", err, res2.Serial)
	}
	if t.Failed() {
		t.Logf("serial console:\n%s", res.Serial)
	}
}
