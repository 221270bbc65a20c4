// Package lab is `make run`: the whole Discord-PXE system live on one
// machine. It creates a network namespace with a bridge, starts the Gateway
// emulator and `dpxe serve` (authoritative DHCP, TFTP, HTTP boot, API and
// dashboard) inside it, relays the dashboard to the host's 127.0.0.1:8080,
// approves the lab's MACs and PXE-boots QEMU nodes on taps (SeaBIOS with an
// e1000, OVMF with a virtio-net, or both). Stop tears down exactly what
// Start created; Start first removes what a crashed lab left (see
// CleanLeftovers).
//
// Where the namespace lab cannot run (not root, no /dev/net/tun, no QEMU)
// it says what is missing and runs `dpxe serve` on loopback with simulated
// nodes instead: Go check-in clients named sim-N with real credentials whose
// shards connect to the Gateway emulator. See docs/lab.md.
//
// It is a development tool: product packages never import it.
package lab

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/discord-pxe/dpxe/fleet/events/natsauth"
	"github.com/discord-pxe/dpxe/image/qemu"
	"github.com/discord-pxe/dpxe/internal/freeport"
	"github.com/discord-pxe/dpxe/tools/netns"
)

// Firmware choices for the lab's QEMU nodes.
const (
	FirmwareBIOS  = "bios"  // SeaBIOS + e1000 with QEMU's iPXE ROM
	FirmwareUEFI  = "uefi"  // OVMF + virtio-net with QEMU's iPXE EFI ROM
	FirmwareMixed = "mixed" // odd nodes BIOS, even nodes UEFI
)

// Modes.
const (
	ModeNetns     = "netns"     // QEMU nodes PXE-boot in a network namespace
	ModeSimulated = "simulated" // nodes simulated over HTTP on loopback
)

// SimPrefix starts the node ID of every simulated node; the dashboard shows
// such nodes with a "simulated" badge (web/view.Simulated).
const SimPrefix = "sim-"

// identifyMargin is added to the emulator's Identify window to get the
// controller's: the controller's grant and the node's Identify reach the
// emulator at slightly different moments, and grants exactly one window
// apart could arrive a few milliseconds early.
const identifyMargin = 500 * time.Millisecond

// Config describes a lab. Zero fields take the defaults in parentheses.
type Config struct {
	Root           string // repository root (".")
	Out            string // make image's output with kernel.bin (Root/out)
	Var            string // the lab's files: database, logs, consoles (Root/var/lab)
	DPXE           string // the dpxe binary (Root/bin/dpxe)
	Emulator       string // the gateway-emulator binary (Root/bin/gateway-emulator)
	Nodes          int    // nodes to boot (3)
	Shards         int    // total shards (16)
	MaxConcurrency int    // Discord max_concurrency (1)
	Firmware       string // bios, uefi or mixed (mixed)
	// Listen is the host address of the dashboard and API (127.0.0.1:8080);
	// port 0 picks a free one (tests).
	Listen string
	// GatewayListen is the host address of the Gateway emulator
	// (127.0.0.1:7878); port 0 picks a free one.
	GatewayListen string
	// Subnet is the bridge's address in the namespace (10.213.0.1/24); the
	// DHCP pool is .100 to .199 of it.
	Subnet netip.Prefix
	// Simulate runs simulated nodes even where QEMU nodes could boot.
	Simulate bool
	// IdentifyWindow is the emulator's per-bucket Identify window (5 s, as
	// Discord); the controller's is half a second longer.
	IdentifyWindow time.Duration
	// HeartbeatInterval is the emulator's heartbeat_interval (41.25 s).
	HeartbeatInterval time.Duration
	// MessageRate is the emulator's synthetic MESSAGE_CREATEs per second
	// per ready session (0: none).
	MessageRate float64
	// PingEvery makes every PingEvery-th synthetic guild message a "!ping"
	// (the emulator's -ping-every; 0: none).
	PingEvery int
	// Pingbot is the examples/pingbot binary; the lab runs it on the host
	// against serve's NATS server (relayed from the namespace in netns
	// mode) and the emulator's REST API ("": no pingbot).
	Pingbot string
	// NATSAuth runs `dpxe serve --nats-auth`: nodes connect with node
	// credentials (QEMU nodes get theirs with their check-in answers and
	// publish only with them), pingbot and the operator with worker
	// credentials.
	NATSAuth bool
	// Plain runs the lab without TLS (make run TLS=0, for development):
	// the emulator on http:// and ws://, nodes checking in over http://.
	// By default the emulator serves https:// and wss:// with a CA it
	// generates (written to Var/gateway-ca.pem), the QEMU nodes boot an
	// image built with that CA beside the default anchors, dpxe serve has
	// --tls-listen and the netboot scripts hand nodes its https:// address
	// and pin, and every lab client of the emulator trusts that CA.
	Plain bool
	// Log receives the lab's progress lines (os.Stdout).
	Log io.Writer
}

func (c *Config) defaults() error {
	if c.Root == "" {
		c.Root = "."
	}
	abs, err := filepath.Abs(c.Root)
	if err != nil {
		return err
	}
	c.Root = abs
	def := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
		if !filepath.IsAbs(*p) {
			*p = filepath.Join(c.Root, *p)
		}
	}
	def(&c.Out, "out")
	def(&c.Var, filepath.Join("var", "lab"))
	def(&c.DPXE, filepath.Join("bin", "dpxe"))
	def(&c.Emulator, filepath.Join("bin", "gateway-emulator"))
	if c.Pingbot != "" && !filepath.IsAbs(c.Pingbot) {
		c.Pingbot = filepath.Join(c.Root, c.Pingbot)
	}
	if c.Nodes == 0 {
		c.Nodes = 3
	}
	if c.Shards == 0 {
		c.Shards = 16
	}
	if c.MaxConcurrency == 0 {
		c.MaxConcurrency = 1
	}
	if c.Firmware == "" {
		c.Firmware = FirmwareMixed
	}
	if c.Listen == "" {
		c.Listen = "127.0.0.1:8080"
	}
	if c.GatewayListen == "" {
		c.GatewayListen = "127.0.0.1:7878"
	}
	if !c.Subnet.IsValid() {
		c.Subnet = netip.MustParsePrefix("10.213.0.1/24")
	}
	if c.IdentifyWindow == 0 {
		c.IdentifyWindow = 5 * time.Second
	}
	if c.Log == nil {
		c.Log = os.Stdout
	}
	switch {
	case c.Nodes < 1 || c.Nodes > 99:
		return fmt.Errorf("lab: NODES=%d: want 1 to 99", c.Nodes)
	case c.Shards < 1 || c.Shards > 1<<20:
		return fmt.Errorf("lab: SHARDS=%d: want 1 to %d", c.Shards, 1<<20)
	case c.PingEvery < 0:
		return fmt.Errorf("lab: PING_EVERY=%d: want 0 or more", c.PingEvery)
	case c.MaxConcurrency < 1:
		return fmt.Errorf("lab: MAX_CONCURRENCY=%d: want at least 1", c.MaxConcurrency)
	case c.Firmware != FirmwareBIOS && c.Firmware != FirmwareUEFI && c.Firmware != FirmwareMixed:
		return fmt.Errorf("lab: FIRMWARE=%q: want bios, uefi or mixed", c.Firmware)
	case !c.Subnet.Addr().Is4() || c.Subnet.Bits() != 24:
		return fmt.Errorf("lab: subnet %s: want an IPv4 /24", c.Subnet)
	}
	return nil
}

// Lab is a running lab.
type Lab struct {
	cfg Config
	// Mode is ModeNetns or ModeSimulated.
	Mode string
	// Why says what was missing when Mode is ModeSimulated ("" when
	// simulation was asked for).
	Why string
	// URL is the dashboard and API on the host, e.g. http://127.0.0.1:8080.
	URL string
	// GatewayURL is the emulator on the host, e.g. http://127.0.0.1:7878;
	// its record is at GatewayURL + "/debug/state".
	GatewayURL string
	// TokenFile is the admin token `dpxe serve` wrote.
	TokenFile string
	// GatewayFlags reports whether this dpxe serve took --gateway-api,
	// --bot-token-file and --intents.
	GatewayFlags bool
	// NATSURL is serve's NATS server as the host reaches it: where
	// simulated nodes publish, or the host relay of the namespace's
	// server in netns mode ("" without event delivery; events.go).
	NATSURL string
	// Pingbot: the lab runs examples/pingbot (events.go).
	Pingbot bool
	// CAFile is the emulator's CA certificate (PEM), which the QEMU
	// nodes' image, pingbot and the lab's own clients trust ("" with
	// Config.Plain).
	CAFile string
	// BootDir is the image dpxe serve netboots: Config.Out with
	// Config.Plain, else Var/boot, built with the emulator's CA.
	BootDir string

	admin   *client
	ns      *netns.NS
	dialer  *nsDialer
	fwds    []*forwarder
	state   labState
	runCtx  context.Context
	stopRun context.CancelFunc

	mu    sync.Mutex
	procs []*process
	nodes []*Node
	sims  []*simNode
	next  int            // number of the next node
	nc    *nats.Conn     // the simulated nodes' NATS connection (events.go)
	auth  *natsauth.File // with Config.NATSAuth: serve's NATS credentials (events.go)
}

// process is a child process the lab started and stops.
type process struct {
	name string
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}
	err  error
}

// Node is one lab node: a QEMU machine (netns mode) or a simulated node.
type Node struct {
	Name     string
	MAC      string // "" for simulated nodes
	Firmware string // "seabios+e1000", "ovmf+virtio-net" or "simulated"
	Console  string // serial console file (QEMU nodes)
	Started  time.Time
	proc     *process
}

func randomToken() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// logf writes one progress line.
func (l *Lab) logf(format string, args ...any) {
	fmt.Fprintf(l.cfg.Log, "lab: "+format+"\n", args...)
}

// Config returns the lab's configuration with defaults filled in.
func (l *Lab) Config() Config { return l.cfg }

// Start cleans up after a crashed lab on the same var directory, then
// starts a lab. On error everything it started is stopped again.
func Start(ctx context.Context, cfg Config) (*Lab, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	l := &Lab{cfg: cfg}
	if err := os.MkdirAll(cfg.Var, 0o750); err != nil {
		return nil, err
	}
	did, err := CleanLeftovers(ctx, cfg.Var)
	for _, d := range did {
		l.logf("leftover from a previous lab: %s", d)
	}
	if err != nil {
		return nil, err
	}
	for _, b := range []string{cfg.DPXE, cfg.Emulator} {
		if _, err := os.Stat(b); err != nil {
			return nil, fmt.Errorf("lab: %w (tools/scripts/run.sh builds it)", err)
		}
	}
	l.Mode = ModeNetns
	if cfg.Simulate {
		l.Mode = ModeSimulated
	} else if why := Missing(cfg.Firmware); why != "" {
		l.Mode, l.Why = ModeSimulated, why
	}
	if _, err := os.Stat(filepath.Join(cfg.Out, "kernel.bin")); err != nil && l.Mode == ModeNetns {
		return nil, fmt.Errorf("lab: no %s: run make image first", filepath.Join(cfg.Out, "kernel.bin"))
	}
	if err := l.resetFiles(); err != nil {
		return nil, err
	}
	l.runCtx, l.stopRun = context.WithCancel(context.Background())
	l.state = labState{PID: os.Getpid(), Cmdline: cmdline(os.Getpid()), Started: time.Now().UTC(), Mode: l.Mode}
	if err := writeState(cfg.Var, &l.state); err != nil {
		return nil, err
	}
	if l.Mode == ModeNetns {
		err = l.startNetns(ctx)
	} else {
		err = l.startSimulated(ctx)
	}
	if err != nil {
		l.Stop()
		return nil, err
	}
	return l, nil
}

// Missing says what the namespace lab needs and does not have here (root,
// /dev/net/tun, ip, QEMU, OVMF, iPXE ROMs), or "".
func Missing(firmware string) string {
	var why []string
	if err := netns.Available(); err != nil {
		why = append(why, strings.TrimPrefix(err.Error(), "netns: "))
	}
	if err := qemu.Available(qemu.SeaBIOS); err != nil {
		why = append(why, err.Error())
	} else if firmware != FirmwareBIOS {
		if err := qemu.Available(qemu.OVMF); err != nil {
			why = append(why, err.Error())
		}
	}
	roms := map[string]string{FirmwareBIOS: romBIOS, FirmwareUEFI: romUEFI}
	for fw, rom := range roms {
		if firmware != FirmwareMixed && firmware != fw {
			continue
		}
		if _, err := os.Stat(rom); err != nil {
			why = append(why, "no "+rom+" (apt-get install ipxe-qemu)")
		}
	}
	return strings.Join(why, "; ")
}

// QEMU's iPXE option ROMs (Debian package ipxe-qemu).
const (
	romBIOS = "/usr/lib/ipxe/qemu/pxe-e1000.rom"
	romUEFI = "/usr/lib/ipxe/qemu/efi-virtio.rom"
)

// resetFiles removes the previous lab's database, token and logs: each lab
// starts with a fresh inventory. Nothing outside cfg.Var is touched.
func (l *Lab) resetFiles() error {
	for _, name := range []string{"dpxe.db", "dpxe.db-wal", "dpxe.db-shm", "admin.token", "bot.token",
		"serve.log", "gateway.log", "lab.log", "pingbot.log", "nats-auth.json",
		"worker-operator.token", "worker-pingbot.token", caFile, "build.log"} {
		if err := os.Remove(filepath.Join(l.cfg.Var, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if err := os.RemoveAll(filepath.Join(l.cfg.Var, bootDir)); err != nil {
		return err
	}
	return os.RemoveAll(filepath.Join(l.cfg.Var, "nodes"))
}

// The lab's TLS files under cfg.Var: the emulator's CA and the image built
// to trust it.
const (
	caFile  = "gateway-ca.pem"
	bootDir = "boot"
)

// scheme returns plain with Config.Plain, else secure ("http"/"https",
// "ws"/"wss").
func (l *Lab) scheme(plain, secure string) string {
	if l.cfg.Plain {
		return plain
	}
	return secure
}

// emuTLS returns a TLS client config trusting the emulator's CA (nil with
// Config.Plain): the lab's own clients of the emulator (its record, the
// simulated nodes' sessions) verify its chain like any client.
func (l *Lab) emuTLS() (*tls.Config, error) {
	if l.cfg.Plain {
		return nil, nil
	}
	pem, err := os.ReadFile(l.CAFile)
	if err != nil {
		return nil, fmt.Errorf("lab: the emulator's CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("lab: the emulator's CA %s holds no certificate", l.CAFile)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// GatewayClient returns an HTTP client of the emulator's REST and debug
// routes at GatewayURL, trusting its CA unless the lab is plain.
func (l *Lab) GatewayClient() (*http.Client, error) {
	conf, err := l.emuTLS()
	if err != nil {
		return nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = conf
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}, nil
}

// gateway returns a client of the emulator's routes (no token).
func (l *Lab) gateway() (*client, error) {
	hc, err := l.GatewayClient()
	if err != nil {
		return nil, err
	}
	c := newClient(l.GatewayURL, "")
	c.http = hc
	return c, nil
}

// buildImage builds the image the QEMU nodes netboot with the emulator's
// CA as a trust anchor beside the default set (`dpxe build --trust default
// --trust CA`), into cfg.Var/boot; its output is build.log.
func (l *Lab) buildImage(ctx context.Context) (string, error) {
	dir := filepath.Join(l.cfg.Var, bootDir)
	logPath := filepath.Join(l.cfg.Var, "build.log")
	cmd := exec.CommandContext(ctx, l.cfg.DPXE, "build", "--out", dir, "--trust", "default", "--trust", l.CAFile)
	cmd.Dir = l.cfg.Root // the kernel sources
	out, err := cmd.CombinedOutput()
	if werr := os.WriteFile(logPath, out, 0o640); werr != nil && err == nil {
		err = werr
	}
	if err != nil {
		return "", fmt.Errorf("lab: building the image that trusts the emulator's CA: %v; the end of %s:\n%s", err, logPath, tail(logPath, 20))
	}
	return dir, nil
}

// start runs a child process with its output in logName under cfg.Var and
// records it in the state file. wrap, when set, builds the command (the
// namespace's Command); otherwise the process runs on the host.
func (l *Lab) start(name, logName string, wrap func(ctx context.Context, name string, args ...string) *exec.Cmd, argv ...string) (*process, error) {
	f, err := os.OpenFile(filepath.Join(l.cfg.Var, logName), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return nil, err
	}
	var cmd *exec.Cmd
	if wrap != nil {
		cmd = wrap(l.runCtx, argv[0], argv[1:]...)
	} else {
		cmd = exec.CommandContext(l.runCtx, argv[0], argv[1:]...)
		// Own process group: the terminal's Ctrl-C reaches the lab only,
		// which stops the children in order.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, log: f, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	l.mu.Lock()
	l.procs = append(l.procs, p)
	// Wait briefly for exec so the recorded command line is the program's,
	// not the wrapper's (ip netns exec execs the program in place).
	l.state.Procs = append(l.state.Procs, proc{PID: cmd.Process.Pid, Name: name})
	l.mu.Unlock()
	go l.recordCmdline(cmd.Process.Pid, argv[0])
	return p, nil
}

// recordCmdline stores a started process's command line in the state file
// once it runs argv0 (it may still be "ip netns exec" for a moment).
func (l *Lab) recordCmdline(pid int, argv0 string) {
	for i := 0; i < 50; i++ {
		c := cmdline(pid)
		if c == "" {
			return
		}
		if strings.HasPrefix(c, argv0) || i == 49 {
			l.mu.Lock()
			for j := range l.state.Procs {
				if l.state.Procs[j].PID == pid {
					l.state.Procs[j].Cmdline = c
				}
			}
			writeState(l.cfg.Var, &l.state)
			l.mu.Unlock()
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// exited reports a process's end, or nil while it runs.
func (p *process) exited() error {
	select {
	case <-p.done:
		if p.err == nil {
			return fmt.Errorf("%s exited", p.name)
		}
		return fmt.Errorf("%s exited: %v", p.name, p.err)
	default:
		return nil
	}
}

// stop sends SIGTERM, waits up to grace, then kills the process group.
func (p *process) stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		p.cmd.Process.Kill()
		<-p.done
	}
}

// serveHelp returns `dpxe serve -h`, to see which flags this build has.
func serveHelp(dpxe string) string {
	out, _ := exec.Command(dpxe, "serve", "-h").CombinedOutput()
	return string(out)
}

// hasFlag reports whether a flag set's usage text lists -name.
func hasFlag(help, name string) bool {
	return strings.Contains(help, "  -"+name+" ") || strings.Contains(help, "  -"+name+"\n")
}

// waitHealthy polls GET /healthz through base until it answers, p exits,
// or 30 s pass.
func waitHealthy(ctx context.Context, base string, p *process, logPath string) error {
	hc := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		req, _ := http.NewRequestWithContext(ctx, "GET", base+"/healthz", nil)
		if resp, err := hc.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if err := p.exited(); err != nil {
			return fmt.Errorf("%v; the end of %s:\n%s", err, logPath, tail(logPath, 20))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer %s/healthz within 30 s; the end of %s:\n%s", p.name, base, logPath, tail(logPath, 20))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// startEmulator starts the Gateway emulator listening on addr and returns
// its REST base URL (as it printed it); extra are more of its flags.
func (l *Lab) startEmulator(ctx context.Context, wrap func(ctx context.Context, name string, args ...string) *exec.Cmd, addr string, botToken string, extra ...string) (*process, error) {
	args := []string{l.cfg.Emulator, "-listen", addr, "-token", botToken,
		"-shards", fmt.Sprint(l.cfg.Shards), "-max-concurrency", fmt.Sprint(l.cfg.MaxConcurrency),
		"-identify-window", l.cfg.IdentifyWindow.String()}
	args = append(args, extra...)
	if !l.cfg.Plain {
		l.CAFile = filepath.Join(l.cfg.Var, caFile)
		args = append(args, "-tls", "-ca-out", l.CAFile)
	}
	if l.cfg.HeartbeatInterval > 0 {
		args = append(args, "-heartbeat-interval", l.cfg.HeartbeatInterval.String())
	}
	if l.cfg.MessageRate > 0 {
		args = append(args, "-message-rate", fmt.Sprint(l.cfg.MessageRate))
	}
	if l.cfg.PingEvery > 0 {
		args = append(args, "-ping-every", fmt.Sprint(l.cfg.PingEvery))
	}
	p, err := l.start("gateway-emulator", "gateway.log", wrap, args...)
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(l.cfg.Var, "gateway.log")
	deadline := time.Now().Add(15 * time.Second)
	for !strings.Contains(readFile(logPath), "\nrest: ") && !strings.HasPrefix(readFile(logPath), "rest: ") {
		if err := p.exited(); err != nil {
			return nil, fmt.Errorf("%v:\n%s", err, tail(logPath, 20))
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the Gateway emulator did not start within 15 s:\n%s", tail(logPath, 20))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return p, nil
}

// The host names the lab's emulator answers to, as Discord's Gateway and
// one of its resume edges.
const (
	labGatewayHost = "gateway.discord.gg"
	labResumeHost  = "gateway-us-east1-b.discord.gg"
)

// startDNS starts dnsmasq as the namespace's DNS server (no DHCP: dpxe
// serve hands out the leases) holding the Gateway's host names at the
// bridge address ip. It says false, and the nodes dial the emulator by
// address, when dnsmasq is not installed.
func (l *Lab) startDNS(wrap func(ctx context.Context, name string, args ...string) *exec.Cmd, bridge, ip string) (bool, error) {
	bin, err := exec.LookPath("dnsmasq")
	if err != nil {
		l.logf("no dnsmasq: the nodes dial the Gateway emulator by address, not by Discord's host names")
		return false, nil
	}
	p, err := l.start("dnsmasq", "dns.log", wrap, bin, "--no-daemon", "--conf-file=/dev/null", "--port=53",
		"--no-resolv", "--no-hosts", "--local-ttl=300", "--interface="+bridge, "--bind-interfaces", "--pid-file=",
		"--host-record="+labGatewayHost+","+ip, "--host-record="+labResumeHost+","+ip)
	if err != nil {
		return false, err
	}
	// Up when it takes a connection on port 53 (dnsmasq serves DNS over
	// TCP too); polled, at most 10 s.
	for i := 0; ; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := l.dialer.DialContext(ctx, "tcp", ip+":53")
		cancel()
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-p.done: // it refused its flags, or port 53 is taken
		case <-time.After(100 * time.Millisecond):
			if i < 100 {
				continue
			}
			p.stop(5 * time.Second)
		}
		l.logf("dnsmasq did not come up (%v): the nodes dial the Gateway emulator by address\n%s", err, tail(filepath.Join(l.cfg.Var, "dns.log"), 10))
		return false, nil
	}
	l.logf("dns: %s and %s -> %s (dnsmasq in the namespace)", labGatewayHost, labResumeHost, ip)
	return true, nil
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// serveArgs are the flags of `dpxe serve` common to both modes. Plain, the
// controller fetches the Gateway URL from the emulator's REST API at
// gatewayAPI; with TLS it hands nodes gatewayURL (wss://) itself, so dpxe
// serve needs no trust in the lab's CA.
func (l *Lab) serveArgs(listen, gatewayAPI, gatewayURL string) []string {
	args := []string{l.cfg.DPXE, "serve",
		"--db", filepath.Join(l.cfg.Var, "dpxe.db"),
		"--admin-token-file", l.TokenFile,
		"--listen", listen,
		"--total-shards", fmt.Sprint(l.cfg.Shards),
		"--max-concurrency", fmt.Sprint(l.cfg.MaxConcurrency),
		"--identify-window", (l.cfg.IdentifyWindow + identifyMargin).String()}
	help := serveHelp(l.cfg.DPXE)
	if hasFlag(help, "nats-listen") && l.Mode == ModeSimulated {
		// A port of its own, so a lab beside tests or a NATS server on
		// 4222 does not collide; the address is in serve's "events" line.
		args = append(args, "--nats-listen", "127.0.0.1:0")
	}
	// In the namespace serve's default: with --nats-auth the bridge
	// address on NATS's port, where the kernel nodes reach it (their
	// check-in answers name it), and the namespace's loopback relayed to
	// it, where the lab relays it to the host (natsNetnsPort); without,
	// loopback only. The namespace's ports are its own: no collision with
	// the host.
	if l.cfg.NATSAuth && hasFlag(help, "nats-auth") {
		args = append(args, "--nats-auth")
	}
	if hasFlag(help, "gateway-api") && hasFlag(help, "bot-token-file") {
		l.GatewayFlags = true
		if l.cfg.Plain {
			args = append(args, "--gateway-api", gatewayAPI)
		} else {
			args = append(args, "--gateway-url", gatewayURL)
		}
		args = append(args, "--bot-token-file", filepath.Join(l.cfg.Var, "bot.token"))
		if hasFlag(help, "intents") {
			args = append(args, "--intents", fmt.Sprint(labIntents))
		}
	}
	return args
}

// labIntents are the Gateway intents the lab's bot asks for: GUILDS and
// GUILD_MESSAGES, neither privileged.
const labIntents = 1 | 1<<9

// hostForwarders opens the host listeners first, so a taken port fails the
// lab before anything else starts.
func (l *Lab) hostForwarders() (*forwarder, *forwarder, error) {
	api, err := listenForward(l.cfg.Listen)
	if err != nil {
		return nil, nil, fmt.Errorf("lab: the dashboard's address %s: %w (another dpxe serve or lab? LISTEN=127.0.0.1:8081 picks another)", l.cfg.Listen, err)
	}
	gw, err := listenForward(l.cfg.GatewayListen)
	if err != nil {
		api.Close()
		return nil, nil, fmt.Errorf("lab: the Gateway emulator's address %s: %w (GATEWAY_LISTEN=127.0.0.1:7879 picks another)", l.cfg.GatewayListen, err)
	}
	return api, gw, nil
}

// freeHostAddr resolves port 0 of addr to a free port (simulated mode,
// where the children listen on the host themselves), and checks that a
// given port is free now. Port 0 becomes a port below the kernel's
// ephemeral range (freeport): a ":0" port closed and handed on could be
// taken by the next ":0" bind or an outgoing connection before the child
// binds it.
func freeHostAddr(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	if port == "0" {
		p, err := freeport.Get()
		if err != nil {
			return "", err
		}
		addr = net.JoinHostPort(host, strconv.Itoa(p))
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", err
	}
	ln.Close()
	return addr, nil
}

// startNetns starts the namespace lab.
func (l *Lab) startNetns(ctx context.Context) error {
	apiFwd, gwFwd, err := l.hostForwarders()
	if err != nil {
		return err
	}
	l.fwds = append(l.fwds, apiFwd, gwFwd)
	l.URL, l.GatewayURL = "http://"+apiFwd.Addr(), l.scheme("http", "https")+"://"+gwFwd.Addr()
	l.state.Listen = l.URL
	ns, err := netns.New(ctx, l.cfg.Subnet)
	if err != nil {
		return err
	}
	l.ns = ns
	l.state.Netns = ns.Name
	if err := writeState(l.cfg.Var, &l.state); err != nil {
		return err
	}
	l.logf("namespace %s: bridge %s %s", ns.Name, ns.Bridge, l.cfg.Subnet)
	if l.dialer, err = newNSDialer(ns.Name); err != nil {
		return err
	}
	ip := l.cfg.Subnet.Addr().String()
	botToken := randomToken()
	if err := os.WriteFile(filepath.Join(l.cfg.Var, "bot.token"), []byte(botToken+"\n"), 0o600); err != nil {
		return err
	}
	// Discord's host names when a DNS server can serve them in the
	// namespace: the nodes then look up the Gateway and resume hosts
	// exactly as they would in production (docs/kernel.md "Host names").
	names, err := l.startDNS(ns.Command, ns.Bridge, ip)
	if err != nil {
		return err
	}
	// The Gateway as the nodes dial it; with TLS the emulator's
	// certificate names it.
	gwHost := ip + ":7878"
	emuArgs := []string{"-public-host", gwHost}
	if names {
		emuArgs = []string{"-public-host", labGatewayHost, "-resume-host", labResumeHost}
		gwHost = labGatewayHost + ":7878"
	}
	if _, err := l.startEmulator(ctx, ns.Command, ip+":7878", botToken, emuArgs...); err != nil {
		return err
	}
	l.BootDir = l.cfg.Out
	if !l.cfg.Plain {
		// The nodes validate the emulator's chain against anchors in
		// their image, so this run's image holds its CA.
		start := time.Now()
		if l.BootDir, err = l.buildImage(ctx); err != nil {
			return err
		}
		l.logf("image %s: the default trust anchors and the emulator's CA %s (%v)", l.BootDir, l.CAFile, time.Since(start).Round(100*time.Millisecond))
	}
	l.TokenFile = filepath.Join(l.cfg.Var, "admin.token")
	s := l.cfg.Subnet.Addr().As4()
	pool := fmt.Sprintf("%d.%d.%d.100-%d.%d.%d.199/24", s[0], s[1], s[2], s[0], s[1], s[2])
	// The operator API and dashboard listen on the namespace's loopback
	// (dpxe serve keeps them off the boot network); nodes use the boot
	// listener dpxe serve opens on ip:8080.
	args := append(l.serveArgs("127.0.0.1:8080", "http://"+ip+":7878/api/v10", "wss://"+gwHost),
		"--interface", ns.Bridge, "--dhcp", "authoritative", "--pool", pool, "--router", ip,
		"--boot-dir", l.BootDir, "--ipv6-no-router")
	if !l.cfg.Plain {
		// Nodes check in and claim Identifies over HTTPS pinned to
		// serve's own key. --tls-listen stays on the namespace's
		// loopback, like --listen (the operator API is never served to
		// the boot network); serve opens the nodes' own HTTPS listener
		// on IP:8443, and with netboot and no --controller-url the
		// scripts carry https://IP:8443 and controller_pin=.
		args = append(args, "--tls-listen", "127.0.0.1:8443")
	}
	if names {
		args = append(args, "--dns", ip) // the leases name the lab's DNS server
	}
	serve, err := l.start("dpxe serve", "serve.log", ns.Command, args...)
	if err != nil {
		return err
	}
	apiFwd.serve("127.0.0.1:8080", l.dialer.DialContext)
	gwFwd.serve(ip+":7878", l.dialer.DialContext)
	if err := waitHealthy(ctx, l.URL, serve, filepath.Join(l.cfg.Var, "serve.log")); err != nil {
		return err
	}
	if err := l.loadAdmin(); err != nil {
		return err
	}
	// The broker on the host for pingbot and the operator's CLI: a relay
	// from a free host port to the namespace's loopback.
	natsFwd, err := listenForward("127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("lab: a host port for NATS: %w", err)
	}
	l.fwds = append(l.fwds, natsFwd)
	natsFwd.serve(fmt.Sprintf("127.0.0.1:%d", natsNetnsPort), l.dialer.DialContext)
	if err := l.connectEvents("nats://" + natsFwd.Addr()); err != nil {
		return err
	}
	if err := l.startPingbot(); err != nil {
		return err
	}
	for i := 0; i < l.cfg.Nodes; i++ {
		if _, err := l.AddNode(ctx); err != nil {
			return err
		}
	}
	return nil
}

// natsNetnsPort is the embedded NATS server's port in the lab's namespace
// (serve's default, NATS's registered port), on the namespace's loopback.
const natsNetnsPort = 4222

func (l *Lab) loadAdmin() error {
	tok, err := os.ReadFile(l.TokenFile)
	if err != nil {
		return fmt.Errorf("lab: admin token: %w", err)
	}
	l.admin = newClient(l.URL, strings.TrimSpace(string(tok)))
	return nil
}

// nodeFirmware returns the firmware of node number n (1-based).
func (l *Lab) nodeFirmware(n int) qemu.Firmware {
	switch l.cfg.Firmware {
	case FirmwareBIOS:
		return qemu.SeaBIOS
	case FirmwareUEFI:
		return qemu.OVMF
	}
	if n%2 == 1 {
		return qemu.SeaBIOS
	}
	return qemu.OVMF
}

// AddNode adds one more node: in netns mode it approves a new MAC as
// lab-N and PXE-boots a QEMU machine on a new tap; in simulated mode it
// creates sim-N and starts its check-ins.
func (l *Lab) AddNode(ctx context.Context) (*Node, error) {
	l.mu.Lock()
	l.next++
	n := l.next
	l.mu.Unlock()
	if l.Mode == ModeSimulated {
		return l.addSimNode(ctx, n)
	}
	name := fmt.Sprintf("lab-%d", n)
	mac := fmt.Sprintf("52:54:00:d0:%02x:%02x", n>>8, n&0xff)
	if err := l.admin.do(ctx, "POST", "/v1/netboot/machines/"+mac+"/approve", map[string]string{"node_id": name}, nil); err != nil {
		return nil, fmt.Errorf("approving %s as %s: %w", mac, name, err)
	}
	tap := fmt.Sprintf("lab%d", n)
	if err := l.ns.AddTap(ctx, tap); err != nil {
		return nil, err
	}
	fw := l.nodeFirmware(n)
	dev, label := "e1000,romfile="+romBIOS, "seabios+e1000"
	if fw == qemu.OVMF {
		dev, label = "virtio-net-pci,romfile="+romUEFI, "ovmf+virtio-net"
	}
	dir := filepath.Join(l.cfg.Var, "nodes", name)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, err
	}
	args, err := qemu.Args(qemu.Options{
		Firmware: fw,
		Net: []string{"-netdev", fmt.Sprintf("tap,id=n0,ifname=%s,script=no,downscript=no", tap),
			"-device", fmt.Sprintf("%s,netdev=n0,mac=%s,bootindex=1", dev, mac)},
		// QEMU's iPXE ROM dies under our nested KVM; TCG boots it
		// (DPXE_KVM=1 tries KVM, as for the other QEMU runs).
		NoKVM: os.Getenv("DPXE_KVM") != "1",
		Extra: []string{"-name", name},
	}, dir)
	if err != nil {
		return nil, err
	}
	console := filepath.Join("nodes", name, "console.log")
	node := &Node{Name: name, MAC: mac, Firmware: label, Console: filepath.Join(l.cfg.Var, console), Started: time.Now()}
	p, err := l.start("qemu "+name, console, l.ns.Command, append([]string{"qemu-system-x86_64"}, args...)...)
	if err != nil {
		return nil, err
	}
	node.proc = p
	l.mu.Lock()
	l.nodes = append(l.nodes, node)
	l.mu.Unlock()
	l.logf("booting %s: %s, MAC %s, tap %s, console %s", name, label, mac, tap, node.Console)
	return node, nil
}

// Nodes returns the lab's nodes in the order they were added.
func (l *Lab) Nodes() []*Node {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*Node(nil), l.nodes...)
}

// LoginLink asks `dpxe serve` for a one-time dashboard login link.
func (l *Lab) LoginLink(ctx context.Context) (string, time.Time, error) {
	path, exp, err := l.admin.loginLink(ctx)
	if err != nil {
		return "", time.Time{}, err
	}
	return l.URL + path, exp, nil
}

// Admin returns the API base URL and the admin token, for tests.
func (l *Lab) Admin() (string, string) { return l.admin.base, l.admin.token }

// Stop tears down what Start created, in order: nodes, `dpxe serve` (which
// flushes its database on SIGTERM), the emulator, the host relays, the
// namespace with its bridge and taps. It then checks that none of it is
// left and says what is.
func (l *Lab) Stop() error {
	l.mu.Lock()
	sims := l.sims
	procs := append([]*process(nil), l.procs...)
	l.mu.Unlock()
	for _, s := range sims {
		s.stop()
	}
	l.closeEvents()
	var wg sync.WaitGroup
	for _, p := range procs { // QEMU first, all at once
		if strings.HasPrefix(p.name, "qemu ") {
			wg.Add(1)
			go func() { defer wg.Done(); p.stop(5 * time.Second) }()
		}
	}
	wg.Wait()
	for _, name := range []string{"pingbot", "dpxe serve", "gateway-emulator", "dnsmasq"} {
		for _, p := range procs {
			if p.name == name {
				p.stop(15 * time.Second)
			}
		}
	}
	for _, f := range l.fwds {
		f.Close()
	}
	if l.dialer != nil {
		l.dialer.Close()
	}
	if l.stopRun != nil {
		l.stopRun()
	}
	var errs []error
	if l.ns != nil {
		if err := l.ns.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := l.Leftovers(); err != nil {
		errs = append(errs, err)
	} else if err := os.Remove(filepath.Join(l.cfg.Var, stateFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Leftovers reports anything of this lab that still exists: its namespace
// or a process it started.
func (l *Lab) Leftovers() error {
	var left []string
	if l.ns != nil && netnsExists(context.Background(), l.ns.Name) {
		left = append(left, "namespace "+l.ns.Name)
	}
	l.mu.Lock()
	for _, p := range l.procs {
		if alive(p.cmd.Process.Pid) {
			left = append(left, fmt.Sprintf("%s (pid %d)", p.name, p.cmd.Process.Pid))
		}
	}
	l.mu.Unlock()
	if len(left) > 0 {
		return fmt.Errorf("lab: still there after teardown: %s", strings.Join(left, ", "))
	}
	return nil
}

// PIDs returns the process IDs the lab started, for tests.
func (l *Lab) PIDs() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []int
	for _, p := range l.procs {
		out = append(out, p.cmd.Process.Pid)
	}
	return out
}

// Netns is the lab's namespace name ("" in simulated mode).
func (l *Lab) Netns() string {
	if l.ns == nil {
		return ""
	}
	return l.ns.Name
}

// consoleLines returns the serial console of a QEMU node.
func consoleLines(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		out = append(out, strings.TrimRight(sc.Text(), "\r"))
	}
	return out
}
