package e2e

// Side-by-side benchmarks of the netboot services against tftpd-hpa and
// dnsmasq, run only with DPXE_BENCH=1 (make bench). Every peer serves the
// same files from the same namespace; clients run in the namespace as
// helper processes. Results are reported as ratios (ours / peer).

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"

	"github.com/discord-pxe/dpxe/image/qemu"
)

const nbBenchClientEnv = "DPXE_NETBOOT_BENCHCLIENT"

func nbSkipUnlessBench(b *testing.B) {
	if os.Getenv("DPXE_BENCH") != "1" {
		b.Skip("side-by-side benchmark; set DPXE_BENCH=1 (make bench)")
	}
}

// nbBenchJob is what a client helper process does.
type nbBenchJob struct {
	Kind string // "tftp" or "dhcp"
	// TFTP
	Server  string // addr:port
	File    string
	Blksize int // 0: send no options at all
	Window  int
	Count   int
	// DHCP
	Iface       string
	MACs        int // distinct clients
	Requests    int // DISCOVERs in total
	Concurrency int
}

// nbBenchResult is a client helper's report.
type nbBenchResult struct {
	Bytes      int64
	Seconds    float64
	Negotiated map[string]string
	Offers     int
	Lost       int
	LatencyMS  []float64
	Err        string
}

// TestNetbootBenchClientHelper is not a test: benchmarks run it inside
// their namespace to act as a client.
func TestNetbootBenchClientHelper(t *testing.T) {
	raw := os.Getenv(nbBenchClientEnv)
	if raw == "" {
		t.Skip("client helper of the netboot benchmarks; runs only when they start it")
	}
	var job nbBenchJob
	json.Unmarshal([]byte(raw), &job)
	var res nbBenchResult
	var err error
	switch job.Kind {
	case "tftp":
		res, err = nbRunTFTPJob(job)
	case "dhcp":
		res, err = nbRunDHCPJob(job)
	default:
		err = fmt.Errorf("unknown job %q", job.Kind)
	}
	if err != nil {
		res.Err = err.Error()
	}
	out, _ := json.Marshal(res)
	fmt.Println("RESULT " + string(out))
	os.Exit(0)
}

// nbTFTPFetch downloads name with a minimal RFC 1350/2347/2348/7440 client
// and returns the byte count and the options the server accepted.
func nbTFTPFetch(server, name string, blk, win int) (int64, map[string]string, error) {
	dst, err := net.ResolveUDPAddr("udp4", server)
	if err != nil {
		return 0, nil, err
	}
	c, err := net.ListenUDP("udp4", nil)
	if err != nil {
		return 0, nil, err
	}
	defer c.Close()
	req := []byte{0, 1}
	req = append(append(req, name...), 0)
	req = append(append(req, "octet"...), 0)
	if blk > 0 {
		for _, kv := range [][2]string{{"blksize", strconv.Itoa(blk)}, {"windowsize", strconv.Itoa(win)}, {"tsize", "0"}} {
			req = append(append(append(append(req, kv[0]...), 0), kv[1]...), 0)
		}
	}
	if _, err := c.WriteToUDP(req, dst); err != nil {
		return 0, nil, err
	}
	useBlk, useWin := 512, 1
	opts := map[string]string{}
	var peer *net.UDPAddr
	var total int64
	expect, inWindow := uint16(1), 0
	buf := make([]byte, 65536)
	lastAck := []byte(nil)
	retries := 0
	ack := func(b uint16) {
		lastAck = []byte{0, 4, byte(b >> 8), byte(b)}
		c.WriteToUDP(lastAck, peer)
	}
	for {
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, from, err := c.ReadFromUDP(buf)
		if err != nil {
			if lastAck == nil {
				return 0, opts, fmt.Errorf("no answer from %s to the read request for %s within 2 s", server, name)
			}
			if retries++; retries > 5 {
				return total, opts, fmt.Errorf("timeout after %d bytes", total)
			}
			c.WriteToUDP(lastAck, peer)
			continue
		}
		retries = 0
		if n < 4 {
			continue
		}
		peer = from
		switch binary.BigEndian.Uint16(buf) {
		case 6: // OACK
			f := bytes.Split(buf[2:n-1], []byte{0})
			for i := 0; i+1 < len(f); i += 2 {
				opts[string(f[i])] = string(f[i+1])
			}
			if v, err := strconv.Atoi(opts["blksize"]); err == nil {
				useBlk = v
			}
			if v, err := strconv.Atoi(opts["windowsize"]); err == nil {
				useWin = v
			}
			ack(0)
		case 3: // DATA
			b := binary.BigEndian.Uint16(buf[2:])
			if b != expect {
				// Lost or reordered: acknowledge what we have, the
				// server restarts the window from there (RFC 7440 §4).
				ack(expect - 1)
				inWindow = 0
				continue
			}
			total += int64(n - 4)
			expect++
			inWindow++
			if n-4 < useBlk {
				ack(b)
				return total, opts, nil
			}
			if inWindow == useWin {
				ack(b)
				inWindow = 0
			}
		case 5:
			return total, opts, fmt.Errorf("server error %d: %s", binary.BigEndian.Uint16(buf[2:]), buf[4:n-1])
		}
	}
}

func nbRunTFTPJob(job nbBenchJob) (nbBenchResult, error) {
	var res nbBenchResult
	start := time.Now()
	for i := 0; i < job.Count; i++ {
		n, opts, err := nbTFTPFetch(job.Server, job.File, job.Blksize, job.Window)
		if err != nil {
			return res, err
		}
		res.Bytes += n
		res.Negotiated = opts
	}
	res.Seconds = time.Since(start).Seconds()
	return res, nil
}

// nbRunDHCPJob sends DISCOVERs from job.MACs clients, at most
// job.Concurrency outstanding, and measures OFFER latency.
func nbRunDHCPJob(job nbBenchJob) (nbBenchResult, error) {
	var res nbBenchResult
	conn, err := server4.NewIPv4UDPConn(job.Iface, &net.UDPAddr{Port: 68})
	if err != nil {
		return res, err
	}
	defer conn.Close()
	var mu sync.Mutex
	pending := map[dhcpv4.TransactionID]time.Time{}
	slots := make(chan struct{}, job.Concurrency)
	done := make(chan struct{})
	go func() {
		buf := make([]byte, 4096)
		for {
			n, _, err := conn.ReadFrom(buf)
			if err != nil {
				close(done)
				return
			}
			m, err := dhcpv4.FromBytes(buf[:n])
			if err != nil || m.OpCode != dhcpv4.OpcodeBootReply || m.MessageType() != dhcpv4.MessageTypeOffer {
				continue
			}
			mu.Lock()
			if t0, ok := pending[m.TransactionID]; ok {
				delete(pending, m.TransactionID)
				res.Offers++
				res.LatencyMS = append(res.LatencyMS, float64(time.Since(t0).Microseconds())/1000)
				<-slots
			}
			mu.Unlock()
		}
	}()
	bcast := &net.UDPAddr{IP: net.IPv4bcast, Port: 67}
	start := time.Now()
	deadline := start.Add(60 * time.Second)
	for i := 0; i < job.Requests && time.Now().Before(deadline); i++ {
		select {
		case slots <- struct{}{}:
		case <-time.After(time.Second):
			// A lost offer: drop the oldest pending request.
			mu.Lock()
			for x, t0 := range pending {
				if time.Since(t0) > time.Second {
					delete(pending, x)
					res.Lost++
					<-slots
				}
			}
			mu.Unlock()
			slots <- struct{}{}
		}
		hw := net.HardwareAddr{0x02, 0xbe, 0, 0, byte(i % job.MACs >> 8), byte(i % job.MACs)}
		m, err := dhcpv4.NewDiscovery(hw, dhcpv4.WithBroadcast(true))
		if err != nil {
			return res, err
		}
		mu.Lock()
		pending[m.TransactionID] = time.Now()
		mu.Unlock()
		if _, err := conn.WriteTo(m.ToBytes(), bcast); err != nil {
			return res, err
		}
	}
	// Wait for the stragglers (bounded).
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		n := len(pending)
		mu.Unlock()
		if n == 0 {
			break
		}
	}
	res.Seconds = time.Since(start).Seconds()
	mu.Lock()
	res.Lost += len(pending)
	mu.Unlock()
	return res, nil
}

// runClient runs a benchmark client job inside the environment.
func (e *nbEnv) runClient(job nbBenchJob) nbBenchResult {
	e.t.Helper()
	raw, _ := json.Marshal(job)
	exe, _ := os.Executable()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cmd := e.ns.Command(ctx, exe, "-test.run=^TestNetbootBenchClientHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), nbBenchClientEnv+"="+string(raw))
	out, err := cmd.Output()
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "RESULT ") {
			var r nbBenchResult
			json.Unmarshal([]byte(strings.TrimPrefix(line, "RESULT ")), &r)
			if r.Err != "" {
				e.t.Fatalf("bench client %+v: %s", job, r.Err)
			}
			return r
		}
	}
	e.t.Fatalf("bench client %+v: no result (%v): %s", job, err, out)
	return nbBenchResult{}
}

// peerStartTimeout bounds how long a peer server may take to bind its port.
const peerStartTimeout = 15 * time.Second

// startPeer runs a peer server inside the namespace until the test ends and
// returns once it has bound UDP port port, its only sign of readiness (these
// servers print nothing when they start). A peer that exits, or has not
// bound the port within peerStartTimeout, fails the test with its exit
// status and everything it printed.
func (e *nbEnv) startPeer(name string, port int, args ...string) {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := e.ns.Command(ctx, name, args...)
	var log nbBuffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		cancel()
		e.t.Fatalf("%s: %v", name, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	e.t.Cleanup(func() {
		cancel()
		<-exited
		if e.t.Failed() {
			e.t.Logf("%s log:\n%s", name, log.String())
		}
	})
	// `ip netns exec` execs the server, so the PID is the server's and
	// /proc/PID/net/udp lists the sockets of the namespace it runs in.
	udp := fmt.Sprintf("/proc/%d/net/udp", cmd.Process.Pid)
	want := fmt.Sprintf(":%04X ", port)
	deadline := time.NewTimer(peerStartTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if tab, err := os.ReadFile(udp); err == nil {
			for _, line := range strings.Split(string(tab), "\n")[1:] {
				if f := strings.Fields(line); len(f) > 1 && strings.HasSuffix(f[1]+" ", want) {
					return
				}
			}
		}
		select {
		case err := <-exited:
			exited <- err // for the cleanup
			e.t.Fatalf("peer %s exited before binding UDP port %d: %v (%s)\noutput:\n%s", name, port, err, cmd.ProcessState, log.String())
		case <-deadline.C:
			e.t.Fatalf("peer %s did not bind UDP port %d within %v\noutput:\n%s", name, port, peerStartTimeout, log.String())
		case <-tick.C:
		}
	}
}

// nbMBps is a throughput in MB/s (10^6 bytes).
func nbMBps(r nbBenchResult) float64 { return float64(r.Bytes) / r.Seconds / 1e6 }

// nbNegotiated renders the options a server accepted.
func nbNegotiated(o map[string]string) string {
	if len(o) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range []string{"blksize", "windowsize"} {
		if v, ok := o[k]; ok {
			parts = append(parts, k+"="+v)
		}
	}
	if len(parts) == 0 {
		return "tsize only"
	}
	return strings.Join(parts, " ")
}

// BenchmarkNetbootTFTP compares TFTP throughput of our server, tftpd-hpa
// and dnsmasq serving the same kernel.bin and a 32 MiB file, for blksize
// 512/1468 and windowsize 1/16/64 (and no options at all), best of three
// runs each.
func BenchmarkNetbootTFTP(b *testing.B) {
	nbSkipUnlessBench(b)
	for _, bin := range []string{"in.tftpd", "dnsmasq"} {
		if _, err := exec.LookPath(bin); err != nil {
			b.Skipf("%s not installed (make deps-bench)", bin)
		}
	}
	e := newNbEnvWith(b, "off", func(hc *nbHelperConfig) { hc.Quiet = true })
	ctx := context.Background()
	big := make([]byte, 32<<20)
	rand.Read(big)
	if err := os.WriteFile(filepath.Join(e.bootDir, "big.bin"), big, 0o644); err != nil {
		b.Fatal(err)
	}
	base := e.prefix.Addr().As4()
	hpa := netip.AddrFrom4([4]byte{base[0], base[1], base[2], 2})
	dnsm := netip.AddrFrom4([4]byte{base[0], base[1], base[2], 3})
	for _, a := range []netip.Addr{hpa, dnsm} {
		if err := e.ns.AddAddr(ctx, netip.PrefixFrom(a, 24)); err != nil {
			b.Fatal(err)
		}
	}
	e.startPeer("in.tftpd", 69, "-L", "-s", e.bootDir, "-a", hpa.String()+":69")
	e.startPeer("dnsmasq", 69, "-k", "-C", "/dev/null", "--port=0", "--enable-tftp", "--tftp-root="+e.bootDir,
		"--listen-address="+dnsm.String(), "--bind-interfaces", "--user=root", "--pid-file=", "--log-facility=-")

	servers := []struct{ name, addr string }{
		{"dpxe", e.serverIP.String() + ":69"},
		{"tftpd-hpa", hpa.String() + ":69"},
		{"dnsmasq", dnsm.String() + ":69"},
	}
	cases := []struct{ blk, win int }{{0, 0}, {512, 1}, {512, 16}, {512, 64}, {1468, 1}, {1468, 16}, {1468, 64}}
	files := []struct {
		name  string
		count int
	}{{"kernel.bin", 40}, {"big.bin", 1}}
	b.ResetTimer()
	var table strings.Builder
	fmt.Fprintf(&table, "%-10s %-13s %22s %22s %22s %8s %8s\n", "file", "asked", "dpxe MB/s", "tftpd-hpa MB/s", "dnsmasq MB/s", "/hpa", "/dnsmasq")
	for _, f := range files {
		for _, c := range cases {
			best := make([]nbBenchResult, len(servers))
			for round := 0; round < 3; round++ {
				for i, s := range servers {
					r := e.runClient(nbBenchJob{Kind: "tftp", Server: s.addr, File: f.name, Blksize: c.blk, Window: c.win, Count: f.count})
					if best[i].Seconds == 0 || nbMBps(r) > nbMBps(best[i]) {
						best[i] = r
					}
				}
			}
			asked := "no options"
			if c.blk > 0 {
				asked = fmt.Sprintf("%d/w%d", c.blk, c.win)
			}
			cell := func(r nbBenchResult) string {
				return fmt.Sprintf("%6.1f (%s)", nbMBps(r), strings.TrimPrefix(strings.ReplaceAll(nbNegotiated(r.Negotiated), "windowsize=", "w"), "blksize="))
			}
			r0, r1 := nbMBps(best[0])/nbMBps(best[1]), nbMBps(best[0])/nbMBps(best[2])
			fmt.Fprintf(&table, "%-10s %-13s %22s %22s %22s %8.2f %8.2f\n", f.name, asked, cell(best[0]), cell(best[1]), cell(best[2]), r0, r1)
			if f.name == "big.bin" && (c.blk == 1468 && c.win == 64 || c.blk == 0) {
				tag := "w64"
				if c.blk == 0 {
					tag = "defaults"
				}
				b.ReportMetric(r0, "x-vs-tftpd-hpa-32MiB-"+tag)
				b.ReportMetric(r1, "x-vs-dnsmasq-32MiB-"+tag)
			}
		}
	}
	// Printed, not logged: benchmark logs are truncated.
	fmt.Printf("TFTP throughput, client and servers in one namespace (loopback path), best of 3; (nbNegotiated blksize/window)\n%s", table.String())
}

// BenchmarkNetbootDHCP compares DISCOVER→OFFER rate and latency of our
// authoritative server and dnsmasq on a 100-address pool, with 80 client
// MACs, 16 requests in flight, 20000 requests.
func BenchmarkNetbootDHCP(b *testing.B) {
	nbSkipUnlessBench(b)
	if _, err := exec.LookPath("dnsmasq"); err != nil {
		b.Skip("dnsmasq not installed")
	}
	job := nbBenchJob{Kind: "dhcp", Iface: "cl0", MACs: 80, Requests: 20000, Concurrency: 16}
	ctx := context.Background()

	ours := newNbEnvWith(b, "authoritative", func(hc *nbHelperConfig) { hc.Quiet = true })
	ours.addLoadClient(ctx)
	peer := newNbEnvWith(b, "off", func(hc *nbHelperConfig) { hc.Quiet = true; hc.TFTPOff = true })
	peer.addLoadClient(ctx)
	base := peer.prefix.Addr().As4()
	dir := b.TempDir()
	peer.startPeer("dnsmasq", 67, "-k", "-C", "/dev/null", "--port=0", "--interface="+peer.ns.Bridge, "--bind-interfaces",
		fmt.Sprintf("--dhcp-range=%d.%d.%d.100,%d.%d.%d.199,255.255.255.0,10m", base[0], base[1], base[2], base[0], base[1], base[2]),
		"--no-ping", "--dhcp-authoritative", "--quiet-dhcp", "--dhcp-leasefile="+filepath.Join(dir, "leases"),
		"--user=root", "--pid-file=", "--log-facility=-")
	warm := nbBenchJob{Kind: "dhcp", Iface: "cl0", MACs: 80, Requests: 200, Concurrency: 16}
	ours.runClient(warm)
	peer.runClient(warm)
	// Alternate the two servers for three rounds and keep each one's best
	// round: the machine is shared, and a busy neighbour should not decide
	// the ratio.
	var r0, r1 nbBenchResult
	better := func(a, b nbBenchResult) nbBenchResult {
		if a.Seconds == 0 || b.Seconds > 0 && float64(b.Offers)/b.Seconds > float64(a.Offers)/a.Seconds {
			return b
		}
		return a
	}
	for round := 0; round < 3; round++ {
		r0 = better(r0, ours.runClient(job))
		r1 = better(r1, peer.runClient(job))
	}

	stat := func(r nbBenchResult) (rate, p50, p99 float64) {
		l := append([]float64(nil), r.LatencyMS...)
		sort.Float64s(l)
		if len(l) == 0 {
			return 0, math.NaN(), math.NaN()
		}
		return float64(r.Offers) / r.Seconds, l[len(l)/2], l[int(float64(len(l))*0.99)]
	}
	a, ap50, ap99 := stat(r0)
	d, dp50, dp99 := stat(r1)
	b.Logf("DHCP DISCOVER→OFFER, 100-address pool, 80 MACs, 16 in flight, %d requests, best of 3 alternating rounds:\n"+
		"  dpxe:    %7.0f offers/s  p50 %.2f ms  p99 %.2f ms  lost %d\n"+
		"  dnsmasq: %7.0f offers/s  p50 %.2f ms  p99 %.2f ms  lost %d\n"+
		"  ratio dpxe/dnsmasq: rate %.2f, p99 %.2f", job.Requests, a, ap50, ap99, r0.Lost, d, dp50, dp99, r1.Lost, a/d, ap99/dp99)
	b.ReportMetric(a/d, "x-offers/s-vs-dnsmasq")
	b.ReportMetric(ap99/dp99, "x-p99-vs-dnsmasq")
}

// BenchmarkNetbootPXEBoot compares the time from QEMU start to the kernel
// banner (SeaBIOS, e1000, QEMU's iPXE ROM) when booting from our server
// (DHCP + HTTP script + HTTP kernel), with and without its IPv6
// "no router" answer, and from dnsmasq (DHCP + TFTP script + TFTP kernel)
// serving the same kernel.bin with its defaults.
func BenchmarkNetbootPXEBoot(b *testing.B) {
	nbSkipUnlessBench(b)
	const runs = 3
	var ours, oursSlow, theirs []time.Duration
	for i := 0; i < runs; i++ {
		for _, slow := range []bool{false, true} {
			e := newNbEnvWith(b, "authoritative", func(hc *nbHelperConfig) { hc.Quiet = true; hc.SlowIPv6 = slow })
			mac := fmt.Sprintf("52-54-00-be-00-%02x", i)
			e.approve(mac, "bench-node")
			n := e.boot(mac, "tap0", qemu.SeaBIOS, "e1000")
			d := e.waitBooted(n, "bench-node", 120*time.Second)
			n.cancel()
			if slow {
				oursSlow = append(oursSlow, d)
			} else {
				ours = append(ours, d)
			}
		}

		p := newNbEnvWith(b, "off", func(hc *nbHelperConfig) { hc.Quiet = true; hc.TFTPOff = true; hc.SlowIPv6 = true })
		base := p.prefix.Addr().As4()
		script := fmt.Sprintf("#!ipxe\nkernel tftp://%s/kernel.bin node=bench-node controller=%s cred=%s\nboot\n",
			p.serverIP, nbControllerURL, p.credential("bench-node"))
		os.WriteFile(filepath.Join(p.bootDir, "boot.ipxe"), []byte(script), 0o644)
		p.startPeer("dnsmasq", 67, "-k", "-C", "/dev/null", "--port=0", "--interface="+p.ns.Bridge, "--bind-interfaces",
			fmt.Sprintf("--dhcp-range=%d.%d.%d.100,%d.%d.%d.199,255.255.255.0,10m", base[0], base[1], base[2], base[0], base[1], base[2]),
			"--dhcp-userclass=set:ipxe,iPXE", "--dhcp-boot=tag:ipxe,boot.ipxe", "--dhcp-boot=tag:!ipxe,undionly.kpxe",
			"--enable-tftp", "--tftp-root="+p.bootDir, "--no-ping", "--dhcp-leasefile="+filepath.Join(b.TempDir(), "leases"),
			"--user=root", "--pid-file=", "--log-facility=-")
		mac := fmt.Sprintf("52-54-00-be-01-%02x", i)
		pn := p.boot(mac, "tap0", qemu.SeaBIOS, "e1000")
		theirs = append(theirs, p.waitFor(pn, 120*time.Second, "kernel banner", func() bool {
			return strings.Contains(pn.serial.String(), "node=bench-node")
		}))
		pn.cancel()
	}
	med := func(d []time.Duration) time.Duration {
		s := append([]time.Duration(nil), d...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return s[len(s)/2]
	}
	fmt.Printf("PXE boot, QEMU start → kernel banner (SeaBIOS, e1000, iPXE ROM, TCG), %d runs each:\n"+
		"  dpxe (IPv6 no-router answer on): %v median %v\n"+
		"  dpxe (stock IPv6 wait):          %v median %v\n"+
		"  dnsmasq (DHCP+TFTP, defaults):   %v median %v\n"+
		"  ratio dpxe/dnsmasq: %.2f (on), %.2f (stock wait)\n",
		runs, ours, med(ours), oursSlow, med(oursSlow), theirs, med(theirs),
		float64(med(ours))/float64(med(theirs)), float64(med(oursSlow))/float64(med(theirs)))
	b.ReportMetric(float64(med(ours))/float64(med(theirs)), "x-boot-time-vs-dnsmasq")
	b.ReportMetric(float64(med(oursSlow))/float64(med(theirs)), "x-boot-time-vs-dnsmasq-stock-ipv6")
}

// addLoadClient gives the DHCP load generator its own link (cl0) on the
// bridge. Its UDP socket sends from an address of the namespace, so the
// bridge and cl0 must accept packets with a local source address.
func (e *nbEnv) addLoadClient(ctx context.Context) {
	e.t.Helper()
	e.addClientLink(ctx, "cl0", "02:00:00:00:00:c2")
	for _, dev := range []string{e.ns.Bridge, "cl0"} {
		// /proc/sys/net is the namespace's own for a process inside it.
		if _, err := e.ns.Run(ctx, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/conf/"+dev+"/accept_local"); err != nil {
			e.t.Fatal(err)
		}
	}
}
