// Package netns builds throw-away network namespaces for tests and
// development: one namespace with a bridge (the boot network), tap devices
// for QEMU nodes on that bridge, and helpers to run commands inside. Close
// removes the namespace and with it every device in it.
//
// It shells out to iproute2 (`ip`), so what it does can be repeated by hand.
// It is a development tool: product packages never import it.
package netns

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

// Prefix starts the name of every namespace this package creates, followed
// by the creating process ID, so stale ones can be recognised.
const Prefix = "dpxe-"

// DefaultBridge is the bridge device created in each namespace.
const DefaultBridge = "br0"

// ErrUnavailable is wrapped by Available when namespaces cannot be made.
var ErrUnavailable = errors.New("netns: network namespaces unavailable")

// Available reports why namespaces with tap devices cannot be created here
// (not root, no /dev/net/tun, no ip command), or nil.
func Available() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: need root", ErrUnavailable)
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		return fmt.Errorf("%w: no /dev/net/tun", ErrUnavailable)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("%w: no ip command (apt-get install iproute2)", ErrUnavailable)
	}
	return nil
}

// NS is one namespace with a bridge.
type NS struct {
	Name   string
	Bridge string
	Addr   netip.Prefix // the bridge's address, e.g. 10.77.0.1/24

	mu     sync.Mutex
	closed bool
	taps   []string
}

var seq atomic.Int64

// ip runs `ip args...` and returns its error with the output.
func ip(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// New creates a namespace named Prefix+PID+"-"+N with loopback up and a
// bridge DefaultBridge carrying addr. On error nothing is left behind.
func New(ctx context.Context, addr netip.Prefix) (*NS, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	CleanStale(ctx)
	n := &NS{
		Name:   fmt.Sprintf("%s%d-%d", Prefix, os.Getpid(), seq.Add(1)),
		Bridge: DefaultBridge,
		Addr:   addr,
	}
	if err := ip(ctx, "netns", "add", n.Name); err != nil {
		return nil, err
	}
	steps := [][]string{
		{"-n", n.Name, "link", "set", "lo", "up"},
		{"-n", n.Name, "link", "add", n.Bridge, "type", "bridge", "forward_delay", "0", "stp_state", "0"},
		{"-n", n.Name, "addr", "add", addr.String(), "dev", n.Bridge},
		{"-n", n.Name, "link", "set", n.Bridge, "up"},
	}
	for _, s := range steps {
		if err := ip(ctx, s...); err != nil {
			n.Close()
			return nil, err
		}
	}
	return n, nil
}

// AddTap creates a tap device on the bridge for a QEMU NIC
// (-netdev tap,ifname=NAME,script=no,downscript=no).
func (n *NS) AddTap(ctx context.Context, name string) error {
	if err := ip(ctx, "-n", n.Name, "tuntap", "add", "dev", name, "mode", "tap"); err != nil {
		return err
	}
	if err := ip(ctx, "-n", n.Name, "link", "set", name, "master", n.Bridge, "up"); err != nil {
		return err
	}
	n.mu.Lock()
	n.taps = append(n.taps, name)
	n.mu.Unlock()
	return nil
}

// AddAddr adds another address to the bridge (a second server on the same
// network, e.g. a peer DHCP or TFTP server).
func (n *NS) AddAddr(ctx context.Context, addr netip.Prefix) error {
	return ip(ctx, "-n", n.Name, "addr", "add", addr.String(), "dev", n.Bridge)
}

// Wrapper is the command prefix that runs a program inside the namespace.
func (n *NS) Wrapper() []string { return []string{"ip", "netns", "exec", n.Name} }

// Command returns a command that runs name with args inside the namespace.
// It is killed (process group) when ctx ends.
func (n *NS) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	argv := append(n.Wrapper(), name)
	argv = append(argv, args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	return cmd
}

// Run runs a command inside the namespace and returns its combined output.
func (n *NS) Run(ctx context.Context, name string, args ...string) (string, error) {
	out, err := n.Command(ctx, name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s in %s: %w: %s", name, strings.Join(args, " "), n.Name, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Close kills every process left in the namespace and deletes it, which
// removes its bridge and taps. It is safe to call more than once.
func (n *NS) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	n.closed = true
	killAll(n.Name)
	return ip(context.Background(), "netns", "del", n.Name)
}

// killAll sends SIGKILL to every process in namespace name.
func killAll(name string) {
	out, err := exec.Command("ip", "netns", "pids", name).Output()
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// CleanStale deletes namespaces this package created in processes that no
// longer exist (a test killed before its cleanup ran).
func CleanStale(ctx context.Context) {
	out, err := exec.CommandContext(ctx, "ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], Prefix) {
			continue
		}
		pidText, _, _ := strings.Cut(strings.TrimPrefix(f[0], Prefix), "-")
		pid, err := strconv.Atoi(pidText)
		if err != nil || pid == os.Getpid() {
			continue
		}
		if syscall.Kill(pid, 0) == nil {
			continue // still running: not ours to remove
		}
		killAll(f[0])
		ip(ctx, "netns", "del", f[0])
	}
}
