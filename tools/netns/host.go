package netns

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
)

// Host is another machine on a namespace's boot network: a namespace of
// its own with one interface, HostIface, whose peer is a port of the
// bridge. Tests use hosts for victims and attackers that must not share
// the server's network stack (in the server's namespace, traffic to the
// server's own address never crosses the bridge). Close removes it.
type Host struct {
	Name string // namespace name (Prefix+PID+"-"+N, so CleanStale knows it)
	MAC  string // of HostIface

	mu     sync.Mutex
	closed bool
}

// HostIface is the interface name inside every Host.
const HostIface = "eth0"

// AddHost creates a host with mac on n's bridge, loopback and HostIface
// up, and addr on HostIface unless addr is the zero prefix (the host then
// gets its address by DHCP, for example with busybox udhcpc).
func (n *NS) AddHost(ctx context.Context, mac string, addr netip.Prefix) (*Host, error) {
	h := &Host{Name: fmt.Sprintf("%s%d-%d", Prefix, os.Getpid(), seq.Add(1)), MAC: mac}
	if err := ip(ctx, "netns", "add", h.Name); err != nil {
		return nil, err
	}
	port := fmt.Sprintf("vh%d", seq.Add(1))
	steps := [][]string{
		{"-n", n.Name, "link", "add", port, "type", "veth", "peer", "name", HostIface, "netns", h.Name},
		{"-n", n.Name, "link", "set", port, "master", n.Bridge, "up"},
		{"-n", h.Name, "link", "set", "lo", "up"},
		{"-n", h.Name, "link", "set", HostIface, "address", mac, "up"},
	}
	if addr.IsValid() {
		steps = append(steps, []string{"-n", h.Name, "addr", "add", addr.String(), "dev", HostIface})
	}
	for _, s := range steps {
		if err := ip(ctx, s...); err != nil {
			h.Close()
			return nil, err
		}
	}
	return h, nil
}

// Wrapper is the command prefix that runs a program inside the host.
func (h *Host) Wrapper() []string { return []string{"ip", "netns", "exec", h.Name} }

// Command returns a command that runs name with args inside the host. It
// is killed (process group) when ctx ends.
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	argv := append(h.Wrapper(), name)
	argv = append(argv, args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	return cmd
}

// Run runs a command inside the host and returns its combined output.
func (h *Host) Run(ctx context.Context, name string, args ...string) (string, error) {
	out, err := h.Command(ctx, name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s in %s: %w: %s", name, strings.Join(args, " "), h.Name, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Close kills every process left in the host and deletes it, which
// removes its interface and the bridge port. It is safe to call more than
// once.
func (h *Host) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil
	}
	h.closed = true
	killAll(h.Name)
	return ip(context.Background(), "netns", "del", h.Name)
}
