package e2e

// The attacker of the netboot security tests (issue 24): this test binary
// re-executed inside a host namespace, sending DHCP packets no stock
// client sends (a forged port-4011 REQUEST, a flood of made-up MACs).

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"
	"github.com/insomniacslk/dhcp/iana"

	"github.com/discord-pxe/dpxe/tools/netns"
)

// attackEnv carries the helper's job (JSON).
const attackEnv = "DPXE_ATTACK_HELPER"

// attackJob is one thing the attacker does.
type attackJob struct {
	Op     string // "pxe4011", "flood" or "discover"
	Server string // the server's address
	MAC    string // pxe4011, discover: chaddr
	CIAddr string // pxe4011: the address claimed
	Count  int    // flood: made-up MACs
}

// attackResult is what it saw.
type attackResult struct {
	Replied bool   // pxe4011, discover: an answer came
	File    string // its boot file
	Offers  int    // flood
	Acks    int    // flood
	Err     string
}

// TestNetbootAttackHelper is not a test: the security tests run this
// binary in an attacker's namespace with attackEnv set.
func TestNetbootAttackHelper(t *testing.T) {
	raw := os.Getenv(attackEnv)
	if raw == "" {
		t.Skip("helper process of the netboot security tests; runs only when they start it")
	}
	var job attackJob
	var res attackResult
	if err := json.Unmarshal([]byte(raw), &job); err != nil {
		res.Err = err.Error()
	} else if err := runAttack(job, &res); err != nil {
		res.Err = err.Error()
	}
	b, _ := json.Marshal(res)
	fmt.Println("RESULT " + string(b))
	os.Exit(0)
}

func runAttack(job attackJob, res *attackResult) error {
	switch job.Op {
	case "pxe4011":
		return attack4011(job, res)
	case "flood":
		return attackFlood(job, res)
	case "discover":
		return attackDiscover(job, res)
	}
	return fmt.Errorf("unknown op %q", job.Op)
}

// attack4011 sends one PXE boot-server REQUEST to port 4011 with chaddr
// job.MAC and ciaddr job.CIAddr (the victim's address), as a UEFI PXE
// client would.
func attack4011(job attackJob, res *attackResult) error {
	hw, err := net.ParseMAC(job.MAC)
	if err != nil {
		return err
	}
	m, err := dhcpv4.New(dhcpv4.WithHwAddr(hw), dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest),
		dhcpv4.WithClientIP(net.ParseIP(job.CIAddr)),
		dhcpv4.WithOption(dhcpv4.OptClassIdentifier("PXEClient:Arch:00007:UNDI:003016")),
		dhcpv4.WithOption(dhcpv4.OptClientArch(iana.EFI_BC)))
	if err != nil {
		return err
	}
	c, err := net.ListenUDP("udp4", &net.UDPAddr{})
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.WriteTo(m.ToBytes(), &net.UDPAddr{IP: net.ParseIP(job.Server), Port: 4011}); err != nil {
		return err
	}
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	buf := make([]byte, 2048)
	n, _, err := c.ReadFrom(buf)
	if err != nil {
		return nil // no answer at all is an answer too
	}
	if r, err := dhcpv4.FromBytes(buf[:n]); err == nil && r.TransactionID == m.TransactionID {
		res.Replied, res.File = true, r.BootFileName
	}
	return nil
}

// exchange sends m broadcast on conn and returns the first reply with its
// transaction ID, or nil after wait.
func exchange(conn net.PacketConn, m *dhcpv4.DHCPv4, wait time.Duration) (*dhcpv4.DHCPv4, error) {
	if _, err := conn.WriteTo(m.ToBytes(), &net.UDPAddr{IP: net.IPv4bcast, Port: 67}); err != nil {
		return nil, err
	}
	buf := make([]byte, 4096)
	for end := time.Now().Add(wait); time.Now().Before(end); {
		conn.SetReadDeadline(end)
		n, _, err := conn.ReadFrom(buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return nil, nil
			}
			return nil, err
		}
		r, err := dhcpv4.FromBytes(buf[:n])
		if err == nil && r.OpCode == dhcpv4.OpcodeBootReply && r.TransactionID == m.TransactionID {
			return r, nil
		}
	}
	return nil, nil
}

// attackFlood asks for an address for job.Count made-up MACs, each as a
// BIOS PXE client (so each is also a boot client the inventory sees):
// DISCOVER, then REQUEST of what was offered.
func attackFlood(job attackJob, res *attackResult) error {
	conn, err := server4.NewIPv4UDPConn(netns.HostIface, &net.UDPAddr{Port: 68})
	if err != nil {
		return err
	}
	defer conn.Close()
	pxe := []dhcpv4.Modifier{dhcpv4.WithBroadcast(true),
		dhcpv4.WithOption(dhcpv4.OptClassIdentifier("PXEClient:Arch:00000:UNDI:002001")),
		dhcpv4.WithOption(dhcpv4.OptClientArch(iana.INTEL_X86PC))}
	for i := 0; i < job.Count; i++ {
		hw := net.HardwareAddr{0x02, 0xf1, 0x00, 0x0d, byte(i >> 8), byte(i)}
		d, err := dhcpv4.NewDiscovery(hw, pxe...)
		if err != nil {
			return err
		}
		off, err := exchange(conn, d, 300*time.Millisecond)
		if err != nil {
			return err
		}
		if off == nil || off.MessageType() != dhcpv4.MessageTypeOffer {
			continue
		}
		res.Offers++
		req, err := dhcpv4.NewRequestFromOffer(off, pxe...)
		if err != nil {
			return err
		}
		ack, err := exchange(conn, req, 300*time.Millisecond)
		if err != nil {
			return err
		}
		if ack != nil && ack.MessageType() == dhcpv4.MessageTypeAck {
			res.Acks++
		}
	}
	return nil
}

// attackDiscover sends one DISCOVER as iPXE with chaddr job.MAC and
// returns the boot file of the (proxy) offer.
func attackDiscover(job attackJob, res *attackResult) error {
	hw, err := net.ParseMAC(job.MAC)
	if err != nil {
		return err
	}
	conn, err := server4.NewIPv4UDPConn(netns.HostIface, &net.UDPAddr{Port: 68})
	if err != nil {
		return err
	}
	defer conn.Close()
	d, err := dhcpv4.NewDiscovery(hw, dhcpv4.WithBroadcast(true),
		dhcpv4.WithOption(dhcpv4.OptClassIdentifier("PXEClient:Arch:00000:UNDI:002001")),
		dhcpv4.WithOption(dhcpv4.OptClientArch(iana.INTEL_X86PC)), dhcpv4.WithUserClass("iPXE", false))
	if err != nil {
		return err
	}
	off, err := exchange(conn, d, 3*time.Second)
	if err != nil || off == nil {
		return err
	}
	res.Replied, res.File = true, off.BootFileName
	return nil
}

// runAttackHelper runs job in host h and returns what it saw.
func runAttackHelper(t *testing.T, h *netns.Host, job attackJob) attackResult {
	t.Helper()
	raw, _ := json.Marshal(job)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := h.Command(t.Context(), exe, "-test.run=^TestNetbootAttackHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), attackEnv+"="+string(raw))
	out, err := cmd.Output()
	for _, line := range strings.Split(string(out), "\n") {
		if rest, ok := strings.CutPrefix(line, "RESULT "); ok {
			var r attackResult
			if err := json.Unmarshal([]byte(rest), &r); err != nil {
				t.Fatal(err)
			}
			if r.Err != "" {
				t.Fatalf("attacker %+v: %s", job, r.Err)
			}
			return r
		}
	}
	t.Fatalf("attacker %+v: no result (%v):\n%s", job, err, out)
	return attackResult{}
}
