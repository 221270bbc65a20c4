package e2e

// Harness of the netboot end-to-end tests: a network namespace with a
// bridge, the netboot server running inside it as a helper process (this
// test binary re-executed through `ip netns exec`), a SQLite inventory the
// test can read and write, and QEMU nodes on tap devices.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/netboot"
	"github.com/discord-pxe/dpxe/fleet/netboot/dhcp"
	"github.com/discord-pxe/dpxe/fleet/netboot/inventory"
	"github.com/discord-pxe/dpxe/fleet/store"
	"github.com/discord-pxe/dpxe/image/qemu"
	"github.com/discord-pxe/dpxe/tools/netns"
)

// nbHelperEnv carries the helper process's configuration (JSON).
const nbHelperEnv = "DPXE_NETBOOT_HELPER"

// nbHelperConfig is what the helper process serves.
type nbHelperConfig struct {
	Interface  string
	ServerIP   string
	Mode       string // "proxy", "authoritative" or "" (no DHCP)
	Pool       string
	HTTPAddr   string
	BootDir    string
	IPXEDir    string
	Controller string
	DB         string
	RetrySec   int
	TFTPOff    bool // no TFTP listener (a peer serves TFTP)
	// EnrollUntrusted is netboot.Config.EnrollUntrusted (proxy mode's
	// opt-in to network enrollment, dpxe serve --proxy-enroll).
	EnrollUntrusted bool
	Quiet           bool // log at Info, not Debug (benchmarks)
	// SlowIPv6 leaves IPv6 router solicitations unanswered, so iPXE
	// waits ~15 s for IPv6 autoconfiguration (the stock behaviour).
	SlowIPv6 bool
}

// TestNetbootHelperProcess is not a test: the netboot e2e tests run this
// binary inside their namespace with nbHelperEnv set, and this function then
// serves until killed.
func TestNetbootHelperProcess(t *testing.T) {
	raw := os.Getenv(nbHelperEnv)
	if raw == "" {
		t.Skip("helper process of the netboot e2e tests; runs only when they start it")
	}
	var hc nbHelperConfig
	if err := json.Unmarshal([]byte(raw), &hc); err != nil {
		fmt.Fprintln(os.Stderr, "helper config:", err)
		os.Exit(2)
	}
	if err := nbRunHelper(hc); err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// nbOpenStore opens the inventory file the test and its helper process
// share; the first to open it applies the schema.
func nbOpenStore(path string) (*store.Store, error) {
	return store.Open(context.Background(), path)
}

func nbRunHelper(hc nbHelperConfig) error {
	level := slog.LevelDebug
	if hc.Quiet {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	st, err := nbOpenStore(hc.DB)
	if err != nil {
		return err
	}
	inv := st.Netboot()
	cfg := netboot.Config{
		Interface: hc.Interface, ServerIP: netip.MustParseAddr(hc.ServerIP),
		HTTPAddr: hc.HTTPAddr, BootDir: hc.BootDir, IPXEDir: hc.IPXEDir,
		Controller: hc.Controller, ScriptRetry: time.Duration(hc.RetrySec) * time.Second, Log: log,
		EnrollUntrusted: hc.EnrollUntrusted,
	}
	if hc.TFTPOff {
		cfg.TFTPAddr = "off"
	}
	cfg.IPv6NoRouter = !hc.SlowIPv6
	if hc.Mode != "" {
		if cfg.DHCP.Mode, err = dhcp.ParseMode(hc.Mode); err != nil {
			return err
		}
	}
	if hc.Pool != "" {
		if cfg.DHCP.Pool, err = dhcp.ParsePool(hc.Pool); err != nil {
			return err
		}
		cfg.DHCP.Router = []netip.Addr{cfg.ServerIP}
		cfg.DHCP.LeaseTime = 10 * time.Minute
	}
	ctx := context.Background()
	s, err := netboot.New(ctx, cfg, inv, inv)
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	for deadline := time.Now().Add(10 * time.Second); ; {
		select {
		case err := <-done:
			return err
		default:
		}
		if c, err := net.DialTimeout("tcp", hc.HTTPAddr, time.Second); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("HTTP %s never came up", hc.HTTPAddr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	fmt.Println("READY")
	return <-done
}

// netbootKernel returns the shard kernel to boot: the image directory of
// the e2e tests (outDir: $DPXE_OUT, or built once for the run).
func netbootKernel(t testing.TB) string {
	t.Helper()
	return filepath.Join(outDir(t), "kernel.bin")
}

var nbSubnetSeq atomic.Int32

// nbEnv is one namespace with a netboot server.
type nbEnv struct {
	t        testing.TB
	ns       *netns.NS
	serverIP netip.Addr
	prefix   netip.Prefix
	base     string // http://server:8080
	inv      *store.NetbootInventory
	kernel   string
	logs     *nbBuffer
	bootDir  string
	pool     string
}

type nbBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *nbBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *nbBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

const nbControllerURL = "http://10.77.0.1:8081"

// newNbEnv creates the namespace and starts the netboot server in it.
// mode is "proxy", "authoritative" or "off" (no DHCP: TFTP and HTTP only).
func newNbEnv(t testing.TB, mode string) *nbEnv {
	t.Helper()
	return newNbEnvWith(t, mode, func(*nbHelperConfig) {})
}

// newNbEnvWith is newNbEnv with a hook to adjust the server's config.
func newNbEnvWith(t testing.TB, mode string, adjust func(*nbHelperConfig)) *nbEnv {
	t.Helper()
	if err := netns.Available(); err != nil {
		t.Skipf("netboot e2e needs root and /dev/net/tun: %v", err)
	}
	n := 10 + nbSubnetSeq.Add(1)
	prefix := netip.MustParsePrefix(fmt.Sprintf("10.77.%d.0/24", n))
	server := netip.MustParseAddr(fmt.Sprintf("10.77.%d.1", n))
	ctx := context.Background()
	ns, err := netns.New(ctx, netip.PrefixFrom(server, 24))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ns.Close(); err != nil {
			t.Errorf("removing namespace: %v", err)
		}
	})
	dir := t.TempDir()
	kernel := netbootKernel(t)
	bootDir := filepath.Join(dir, "boot")
	os.Mkdir(bootDir, 0o755)
	nbCopyFile(t, kernel, filepath.Join(bootDir, "kernel.bin"))
	dbPath := filepath.Join(dir, "dpxe.db")
	st, err := nbOpenStore(dbPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e := &nbEnv{t: t, ns: ns, serverIP: server, prefix: prefix, inv: st.Netboot(),
		kernel: kernel, logs: &nbBuffer{}, bootDir: bootDir,
		base: "http://" + server.String() + ":8080"}
	hc := nbHelperConfig{
		Interface: ns.Bridge, ServerIP: server.String(), HTTPAddr: server.String() + ":8080",
		BootDir: bootDir, IPXEDir: netboot.DefaultIPXEDir, Controller: nbControllerURL, DB: dbPath, RetrySec: 2,
	}
	switch mode {
	case "authoritative":
		hc.Mode, hc.Pool = mode, fmt.Sprintf("10.77.%d.100-10.77.%d.199/24", n, n)
	case "proxy":
		// The proxy tests boot approved machines: they opt in, as an
		// operator would with --proxy-enroll.
		hc.Mode, hc.EnrollUntrusted = mode, true
	}
	adjust(&hc)
	e.startHelper(hc)
	return e
}

func nbCopyFile(t testing.TB, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func (e *nbEnv) startHelper(hc nbHelperConfig) {
	e.pool = hc.Pool
	t := e.t
	raw, _ := json.Marshal(hc)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := e.ns.Command(ctx, exe, "-test.run=^TestNetbootHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), nbHelperEnv+"="+string(raw))
	cmd.Stderr = e.logs
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		cmd.Wait()
		if t.Failed() || os.Getenv("DPXE_NETBOOT_LOGS") == "1" {
			t.Logf("netboot server log:\n%s", e.logs.String())
		}
	})
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		ok := false
		for sc.Scan() {
			if sc.Text() == "READY" && !ok {
				ok = true
				ready <- true
			}
		}
		if !ok {
			ready <- false
		}
		io.Copy(io.Discard, out)
	}()
	select {
	case ok := <-ready:
		if !ok {
			t.Fatalf("netboot server exited before it was ready:\n%s", e.logs.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("netboot server not ready after 20 s:\n%s", e.logs.String())
	}
}

// approve makes mac a node named id.
func (e *nbEnv) approve(mac, id string) {
	e.t.Helper()
	hw, err := inventory.ParseMAC(mac)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.inv.Approve(context.Background(), hw, id, "cred-"+strings.ReplaceAll(id, ".", "-")+"-0123456789", time.Now()); err != nil {
		e.t.Fatal(err)
	}
}

func (e *nbEnv) credential(id string) string {
	return "cred-" + strings.ReplaceAll(id, ".", "-") + "-0123456789"
}

// stages returns mac's timeline as stage names.
func (e *nbEnv) stages(mac string) []string {
	hw, _ := inventory.ParseMAC(mac)
	ev, err := e.inv.Timeline(context.Background(), hw)
	if err != nil {
		e.t.Fatal(err)
	}
	var s []string
	for _, x := range ev {
		s = append(s, string(x.Stage))
	}
	return s
}

func (e *nbEnv) timeline(mac string) string {
	hw, _ := inventory.ParseMAC(mac)
	ev, _ := e.inv.Timeline(context.Background(), hw)
	var b strings.Builder
	for _, x := range ev {
		fmt.Fprintf(&b, "  %s %-15s %s\n", x.At.Format("15:04:05.000"), x.Stage, x.Detail)
	}
	return b.String()
}

// nbInOrder reports whether want occurs in got as a subsequence.
func nbInOrder(got []string, want ...string) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}

// nbNode is one QEMU machine on the boot network.
type nbNode struct {
	mac, tap string
	fw       qemu.Firmware
	nic      string // "e1000" or "virtio"
	serial   *nbBuffer
	cancel   context.CancelFunc
	done     chan *qemu.Result
	start    time.Time
}

// boot starts a QEMU node that network-boots on a new tap device.
func (e *nbEnv) boot(mac, tap string, fw qemu.Firmware, nic string) *nbNode {
	t := e.t
	t.Helper()
	if err := qemu.Available(fw); err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	if err := e.ns.AddTap(ctx, tap); err != nil {
		t.Fatal(err)
	}
	dev := "e1000,romfile=/usr/lib/ipxe/qemu/pxe-e1000.rom"
	switch nic {
	case "virtio":
		dev = "virtio-net-pci,romfile=/usr/lib/ipxe/qemu/efi-virtio.rom"
	case "virtio-noipxe":
		// No option ROM: OVMF's own virtio-net driver and PXE stack.
		dev = "virtio-net-pci,romfile="
	}
	n := &nbNode{mac: mac, tap: tap, fw: fw, nic: nic, serial: &nbBuffer{}, done: make(chan *qemu.Result, 1)}
	qctx, cancel := context.WithCancel(ctx)
	n.cancel = cancel
	opts := qemu.Options{
		Firmware: fw,
		Net: []string{
			"-netdev", fmt.Sprintf("tap,id=n0,ifname=%s,script=no,downscript=no", tap),
			"-device", fmt.Sprintf("%s,netdev=n0,mac=%s,bootindex=1", dev, strings.ReplaceAll(mac, "-", ":")),
		},
		Wrapper: e.ns.Wrapper(),
		// iPXE's option ROM dies with "KVM: emulation failure" on the
		// nested KVM of our machines; TCG boots it. DPXE_NETBOOT_KVM=1
		// tries KVM anyway.
		NoKVM:   os.Getenv("DPXE_NETBOOT_KVM") != "1",
		Timeout: 150 * time.Second,
		Serial:  n.serial,
	}
	n.start = time.Now()
	go func() {
		res, err := qemu.Run(qctx, opts)
		if err != nil {
			n.serial.Write([]byte("\n[qemu error] " + err.Error()))
		}
		n.done <- res
	}()
	t.Cleanup(func() {
		cancel()
		<-n.done
		if t.Failed() {
			t.Logf("serial console of %s:\n%s", mac, n.serial.String())
		}
	})
	return n
}

// waitFor polls cond until it holds, the node's QEMU exits, or timeout.
func (e *nbEnv) waitFor(n *nbNode, timeout time.Duration, what string, cond func() bool) time.Duration {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return time.Since(n.start)
		}
		select {
		case res := <-n.done:
			n.done <- res
			if cond() {
				return time.Since(n.start)
			}
			e.t.Fatalf("%s: QEMU ended (exit %v) before %s\ntimeline:\n%s", n.mac, res, what, e.timeline(n.mac))
		default:
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: no %s after %s\ntimeline:\n%s", n.mac, what, timeout, e.timeline(n.mac))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitBooted waits until node n has booted as node id: the timeline
// reaches kernel_fetched and the kernel's banner on the serial console
// names the node and the controller.
func (e *nbEnv) waitBooted(n *nbNode, id string, timeout time.Duration) time.Duration {
	e.t.Helper()
	e.waitFor(n, timeout, "kernel_fetched", func() bool {
		return nbInOrder(e.stages(n.mac), "script_fetched", "kernel_fetched")
	})
	return e.waitFor(n, timeout, "kernel banner with node="+id, func() bool {
		s := n.serial.String()
		if strings.Contains(s, "config error") {
			e.t.Fatalf("%s: the kernel rejected its command line:\n%s", n.mac, s)
		}
		for _, line := range strings.Split(s, "\n") {
			if strings.Contains(line, "node="+id) && strings.Contains(line, "controller="+nbControllerURL) {
				e.t.Logf("%s: kernel banner: %s", n.mac, strings.TrimSpace(line))
				return true
			}
		}
		return false
	})
}

// addClientLink adds a veth pair with one end (name) for a client and the
// other on the bridge.
func (e *nbEnv) addClientLink(ctx context.Context, name, mac string) {
	e.t.Helper()
	for _, args := range [][]string{
		{"link", "add", name, "type", "veth", "peer", "name", name + "p"},
		{"link", "set", name + "p", "master", e.ns.Bridge, "up"},
		{"link", "set", name, "address", mac, "up"},
	} {
		if _, err := e.ns.Run(ctx, "ip", args...); err != nil {
			e.t.Fatal(err)
		}
	}
}
