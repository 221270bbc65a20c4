package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/image/qemu"
	"github.com/discord-pxe/dpxe/tools/netns"
)

// TestKernelCheckinPinRules boots nodes against a real `dpxe serve` with
// an HTTPS listener, in a namespace, and checks the kernel's controller
// channel (node/ctltls.inc): with the right controller_pin= a node checks
// in over https:// (the kernel's TLS 1.3 client in pin mode) and applies
// its plan; a wrong pin is refused at the handshake (pin_mismatch), an
// https:// controller without a pin (no_pin) and an http:// one when
// pinned (pin_needs_https) before anything is sent. Each refusal is a
// console line and a failed check-in; the refused node's credential never
// reaches the controller, which records no check-in for it.
func TestKernelCheckinPinRules(t *testing.T) {
	if err := netns.Available(); err != nil {
		t.Skip(err)
	}
	needQEMU(t, qemu.SeaBIOS)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	const subnet = "10.79.0"
	ps := startPinnedServe(t, ctx, subnet, 128, "pin-ok", "pin-refused")
	ns, token, pin, server, secure, logs, creds := ps.ns, ps.token, ps.pin, ps.server, ps.secure, ps.logs, ps.creds
	if err := ns.AddTap(ctx, "tappin0"); err != nil {
		t.Fatal(err)
	}
	tok, err := exec.CommandContext(ctx, "cat", token).Output()
	if err != nil {
		t.Fatal(err)
	}
	detail := func(id string) string {
		out, err := ns.Run(ctx, "curl", "-fsS", "--max-time", "5", "-H", "Authorization: Bearer "+strings.TrimSpace(string(tok)), server+"/v1/nodes/"+id)
		if err != nil {
			t.Fatalf("GET /v1/nodes/%s: %v %s", id, err, out)
		}
		return out
	}

	// boot runs one node with cfg until every line in want has appeared
	// on its console (each within its own bound), then stops it.
	boot := func(name, id string, cfg appliance.BootConfig, checksIn bool, want ...string) {
		t.Helper()
		cfg.NodeID, cfg.Credential = id, creds[id]
		cfg.StaticIP = subnet + ".31/24," + subnet + ".1"
		n := startNode(ctx, qemu.Options{
			Firmware: qemu.SeaBIOS,
			Kernel:   filepath.Join(outDir(t), image.KernelFile),
			Append:   cfg.String(),
			Net: []string{"-netdev", "tap,id=n0,ifname=tappin0,script=no,downscript=no",
				"-device", "e1000,netdev=n0,mac=52:54:00:79:00:31"},
			Wrapper: ns.Wrapper(),
			Timeout: 100 * time.Second,
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
			if n.serial.waitFor(regexp.MustCompile(w), 60*time.Second) == nil {
				t.Fatalf("%s: no console line %q", name, w)
			}
		}
		if got := strings.Contains(n.serial.String(), "checkin: controller reachable"); got != checksIn {
			t.Fatalf("%s: checked in %v, want %v", name, got, checksIn)
		}
	}
	q := regexp.QuoteMeta
	boot("no pin", "pin-refused", appliance.BootConfig{Controller: secure}, false,
		`checkin: refused reason=no_pin controller=`+q(secure)+`\r?\n`,
		q(`checkin: failed (refused: no_pin), attempt 1;`))
	boot("wrong pin", "pin-refused", appliance.BootConfig{Controller: secure, ControllerPin: strings.Repeat("0", 64)}, false,
		`checkin: refused reason=pin_mismatch controller=`+q(secure)+`\r?\n`,
		q(`checkin: failed (refused: pin_mismatch), attempt 1;`),
		q(`checkin: failed (refused: pin_mismatch), attempt 2;`))
	boot("http pinned", "pin-refused", appliance.BootConfig{Controller: server, ControllerPin: pin}, false,
		`checkin: refused reason=pin_needs_https controller=`+q(server)+`\r?\n`)
	if d := detail("pin-refused"); !strings.Contains(d, `"live":false`) || strings.Contains(d, subnet+".31") {
		t.Errorf("the controller saw the refused node: %s", d)
	}
	for _, bad := range []string{"node_credential", creds["pin-refused"]} {
		if strings.Contains(logs.String(), bad) {
			t.Errorf("the serve log mentions %q: the refused node sent something", bad)
		}
	}

	// The right pin: the node checks in over HTTPS and applies its plan,
	// then keeps checking in with a status per shard: 128 of them, a
	// request of several records.
	boot("pinned", "pin-ok", appliance.BootConfig{Controller: secure, ControllerPin: pin}, true,
		`controller: `+q(subnet+".1")+` \(address given\)`, `checkin: controller reachable`, `plan: generation \d+, 128 of 128 shards \[0\.\.127\]`,
		`node: controller=ok checkins=([4-9]|\d\d+) failed=0 `)
	if d := detail("pin-ok"); !strings.Contains(d, `"live":true`) {
		t.Errorf("the controller does not show the pinned node live: %s", d)
	}
	if strings.Contains(logs.String(), creds["pin-ok"]) {
		t.Error("the serve log shows the node credential")
	}
	t.Log(fmt.Sprintf("pin %s: pinned check-in over HTTPS applied its plan; pin_mismatch, no_pin, pin_needs_https refused", pin))
}

// pinnedServe is a `dpxe serve` in its own namespace SUBNET.1, with the
// node API on http://SUBNET.1:8080 and https://SUBNET.1:8443 (its
// self-generated identity, whose pin is pin), and nodes enrolled on it.
type pinnedServe struct {
	bin            string // the dpxe binary, built from this tree
	ns             *netns.NS
	token          string // the admin token file
	pin            string
	server, secure string
	logs           *bytes.Buffer
	creds          map[string]string // node ID -> credential
}

// startPinnedServe starts it with totalShards and a 6 s lease, waits until
// it answers, and enrolls ids.
func startPinnedServe(t *testing.T, ctx context.Context, subnet string, totalShards int, ids ...string) *pinnedServe {
	t.Helper()
	p := &pinnedServe{bin: dpxeBinary(t), logs: &bytes.Buffer{}, creds: map[string]string{},
		server: "http://" + subnet + ".1:8080", secure: "https://" + subnet + ".1:8443"}
	ns, err := netns.New(ctx, netip.MustParsePrefix(subnet+".1/24"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	p.ns = ns
	dir := t.TempDir()
	db := filepath.Join(dir, "dpxe.db")
	p.token = filepath.Join(dir, "admin.token")
	pinOut, err := exec.CommandContext(ctx, p.bin, "serve", "--db", db, "--print-pin").Output()
	if err != nil {
		t.Fatalf("--print-pin: %v", err)
	}
	p.pin = strings.TrimSpace(string(pinOut))
	srv := ns.Command(ctx, p.bin, "serve", "--db", db, "--listen", subnet+".1:8080", "--tls-listen", subnet+".1:8443",
		"--total-shards", strconv.Itoa(totalShards), "--lease", "6s", "--no-dashboard")
	srv.Stdout, srv.Stderr = p.logs, p.logs
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		srv.Process.Kill()
		srv.Wait()
		if t.Failed() {
			t.Logf("dpxe serve log:\n%s", p.logs.String())
		}
	})
	for deadline := time.Now().Add(20 * time.Second); ; {
		if _, err := ns.Run(ctx, p.bin, "nodes", "--server", p.server, "--token-file", p.token); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dpxe serve did not come up:\n%s", p.logs.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, id := range ids {
		out, err := ns.Run(ctx, p.bin, "nodes", "add", id, "--server", p.server, "--token-file", p.token)
		if err != nil {
			t.Fatalf("dpxe nodes add: %v\n%s", err, out)
		}
		m := regexp.MustCompile(`cred=(\S+)`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no credential in %q", out)
		}
		p.creds[id] = m[1]
	}
	return p
}
