package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/image/qemu"
	"github.com/discord-pxe/dpxe/tools/netns"
)

// TestKernelCheckinPinRules boots nodes against a real `dpxe serve` with
// an HTTPS listener, in a namespace, and checks the kernel's rules for
// the controller channel (node/ctltls.inc): an https:// controller
// without controller_pin= is refused (no_pin); with a pin, an http://
// replica is refused (pin_needs_https) and, until the kernel's TLS
// check-in exists, so is the pinned https:// one (tls_unavailable). Each
// refusal is a console line and a failed check-in that moves on to the
// next replica; the node never sends its credential, so the controller
// records no check-in and refuses no credential.
func TestKernelCheckinPinRules(t *testing.T) {
	if err := netns.Available(); err != nil {
		t.Skip(err)
	}
	needQEMU(t, qemu.SeaBIOS)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	bin := filepath.Join(t.TempDir(), "dpxe")
	if b, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/discord-pxe/dpxe/cmd/dpxe").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	const subnet = "10.79.0"
	ns, err := netns.New(ctx, netip.MustParsePrefix(subnet+".1/24"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })

	dir := t.TempDir()
	db := filepath.Join(dir, "dpxe.db")
	token := filepath.Join(dir, "admin.token")
	pinOut, err := exec.CommandContext(ctx, bin, "serve", "--db", db, "--print-pin").Output()
	if err != nil {
		t.Fatalf("--print-pin: %v", err)
	}
	pin := strings.TrimSpace(string(pinOut))
	server := "http://" + subnet + ".1:8080"
	secure := "https://" + subnet + ".1:8443"
	var logs bytes.Buffer
	srv := ns.Command(ctx, bin, "serve", "--db", db, "--listen", subnet+".1:8080", "--tls-listen", subnet+".1:8443", "--no-dashboard")
	srv.Stdout, srv.Stderr = &logs, &logs
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		srv.Process.Kill()
		srv.Wait()
		if t.Failed() {
			t.Logf("dpxe serve log:\n%s", logs.String())
		}
	})
	for deadline := time.Now().Add(20 * time.Second); ; {
		if _, err := ns.Run(ctx, bin, "nodes", "--server", server, "--token-file", token); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dpxe serve did not come up:\n%s", logs.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	out, err := ns.Run(ctx, bin, "nodes", "add", "pin-node", "--server", server, "--token-file", token)
	if err != nil {
		t.Fatalf("dpxe nodes add: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`cred=(\S+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no credential in %q", out)
	}
	cred := m[1]
	if err := ns.AddTap(ctx, "tappin0"); err != nil {
		t.Fatal(err)
	}

	// boot runs one node with cfg until every line in want has appeared
	// on its console in order (each within its own bound), then stops it.
	boot := func(name string, cfg appliance.BootConfig, want ...string) {
		t.Helper()
		cfg.NodeID, cfg.Credential = "pin-node", cred
		cfg.StaticIP = subnet + ".31/24," + subnet + ".1"
		n := startNode(ctx, qemu.Options{
			Firmware: qemu.SeaBIOS,
			Kernel:   filepath.Join(outDir(t), image.KernelFile),
			Append:   cfg.String(),
			Net: []string{"-netdev", "tap,id=n0,ifname=tappin0,script=no,downscript=no",
				"-device", "e1000,netdev=n0,mac=52:54:00:79:00:31"},
			Wrapper: ns.Wrapper(),
			Timeout: 90 * time.Second,
		})
		defer func() {
			if err := n.stop(); err != nil {
				t.Errorf("%s: qemu: %v", name, err)
			}
			if t.Failed() {
				t.Logf("%s console:\n%s", name, n.serial.String())
			}
		}()
		for _, w := range want {
			if n.serial.waitFor(regexp.MustCompile(w), 40*time.Second) == nil {
				t.Fatalf("%s: no console line %q", name, w)
			}
		}
		if strings.Contains(n.serial.String(), "checkin: controller reachable") {
			t.Fatalf("%s: the node checked in", name)
		}
	}
	q := regexp.QuoteMeta
	boot("no pin", appliance.BootConfig{Controller: secure},
		`checkin: refused reason=no_pin controller=`+q(secure)+`\r?\n`,
		q(`checkin: failed (refused: no_pin), attempt 1;`))
	boot("pinned", appliance.BootConfig{Controller: secure + "," + server, ControllerPin: pin},
		`checkin: refused reason=tls_unavailable controller=`+q(secure)+`\r?\n`,
		q(`checkin: failed (refused: tls_unavailable), attempt 1;`),
		`checkin: refused reason=pin_needs_https controller=`+q(server)+`\r?\n`)

	// Nothing reached the controller: no check-in, no refused credential.
	tok, err := exec.CommandContext(ctx, "cat", token).Output()
	if err != nil {
		t.Fatal(err)
	}
	detail, err := ns.Run(ctx, "curl", "-fsS", "--max-time", "5", "-H", "Authorization: Bearer "+strings.TrimSpace(string(tok)), server+"/v1/nodes/pin-node")
	if err != nil {
		t.Fatalf("GET /v1/nodes/pin-node: %v %s", err, detail)
	}
	if !strings.Contains(detail, `"live":false`) || strings.Contains(detail, subnet+".31") {
		t.Errorf("the controller saw the node: %s", detail)
	}
	for _, bad := range []string{"node_credential", "/v1/checkin", cred} {
		if strings.Contains(logs.String(), bad) {
			t.Errorf("the serve log mentions %q: the node sent something", bad)
		}
	}
	t.Log(fmt.Sprintf("pin %s; refusals seen for no_pin, tls_unavailable, pin_needs_https", pin))
}
