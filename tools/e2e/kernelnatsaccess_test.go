package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/events/natsauth"
	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/image/qemu"
	"github.com/discord-pxe/dpxe/tools/netns"
)

// TestKernelCheckinNATSAccess: with `dpxe serve --nats-auth` every
// check-in answer carries the node's "nats" member (broker URLs and
// credentials); a kernel node still applies the plan (it acknowledges the
// generation and reports its range), and neither its console nor serve's
// log shows its NATS password.
func TestKernelCheckinNATSAccess(t *testing.T) {
	if err := netns.Available(); err != nil {
		t.Skip(err)
	}
	needQEMU(t, qemu.SeaBIOS)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin := dpxeBinary(t)
	const subnet = "10.93.0"
	ns, err := netns.New(ctx, netip.MustParsePrefix(subnet+".1/24"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	server := "http://" + subnet + ".1:8080"
	dir := t.TempDir()
	token := filepath.Join(dir, "admin.token")
	var logs bytes.Buffer
	srv := ns.Command(ctx, bin, "serve", "--db", filepath.Join(dir, "dpxe.db"), "--listen", subnet+".1:8080", "--total-shards", "2",
		"--lease", "6s", "--no-dashboard", "--nats-auth", "--nats-listen", subnet+".1:4222")
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
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if _, err := ns.Run(ctx, bin, "nodes", "--server", server, "--token-file", token); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("dpxe serve did not come up")
		}
	}
	const id = "ck-nats"
	out, err := ns.Run(ctx, bin, "nodes", "add", id, "--server", server, "--token-file", token)
	if err != nil {
		t.Fatalf("dpxe nodes add: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`cred=(\S+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no credential in %q", out)
	}
	if err := ns.AddTap(ctx, "tapna0"); err != nil {
		t.Fatal(err)
	}
	cfg := appliance.BootConfig{NodeID: id, Controller: server, Credential: m[1], Capacity: 2, HasCapacity: true,
		StaticIP: subnet + ".21/24," + subnet + ".1"}
	run := startNode(ctx, qemu.Options{
		Firmware: qemu.SeaBIOS,
		Kernel:   filepath.Join(outDir(t), image.KernelFile),
		Append:   cfg.String(),
		Net: []string{"-netdev", "tap,id=n0,ifname=tapna0,script=no,downscript=no",
			"-device", "e1000,netdev=n0,mac=52:54:00:93:00:21"},
		Wrapper: ns.Wrapper(),
		Timeout: 170 * time.Second,
	})
	defer func() {
		if err := run.stop(); err != nil {
			t.Errorf("qemu: %v", err)
		}
		if t.Failed() {
			t.Logf("console:\n%s", run.serial.String())
		}
	}()
	tok, err := os.ReadFile(token)
	if err != nil {
		t.Fatal(err)
	}
	var d controller.NodeDetail
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		out, err := ns.Run(ctx, "curl", "-fsS", "--max-time", "5", "-H", "Authorization: Bearer "+strings.TrimSpace(string(tok)), server+"/v1/nodes/"+id)
		if err == nil && json.Unmarshal([]byte(out), &d) == nil && d.Live && d.RangeCount == 2 && d.AckedGeneration >= 1 &&
			strings.Contains(run.serial.String(), "plan: generation") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node did not apply a plan: %+v (%v)", d, err)
		}
	}
	f, err := natsauth.Open(filepath.Join(dir, natsauth.FileName))
	if err != nil {
		t.Fatal(err)
	}
	pass := f.NodePassword(id)
	if strings.Contains(run.serial.String(), pass) || strings.Contains(logs.String(), pass) {
		t.Error("the node's NATS password is on its console or in serve's log")
	}
	// Its check-ins report its broker connection (nn_checkin_json): up
	// once it connected to the embedded server.
	var nats *appliance.BrokerStatus
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		var d2 controller.NodeDetail
		out, err := ns.Run(ctx, "curl", "-fsS", "--max-time", "5", "-H", "Authorization: Bearer "+strings.TrimSpace(string(tok)), server+"/v1/nodes/"+id)
		if err == nil && json.Unmarshal([]byte(out), &d2) == nil && d2.NATS != nil && d2.NATS.State == appliance.BrokerUp && d2.NATS.Connects >= 1 {
			nats = d2.NATS
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node's check-ins do not report its broker connection up: %+v (%v)", d2.NATS, err)
		}
	}
	// the answer the node got had the member: ask as the node would
	body := fmt.Sprintf(`{"node_id":%q,"capacity":2,"generation":%d}`, id, d.AckedGeneration)
	out, err = ns.Run(ctx, "curl", "-fsS", "--max-time", "5", "-H", "Authorization: Bearer "+m[1], "-H", "Content-Type: application/json",
		"-d", body, server+"/v1/checkin")
	var r appliance.CheckinResponse
	if err != nil || json.Unmarshal([]byte(out), &r) != nil || r.NATS == nil || r.NATS.User != "node-"+id || r.NATS.Password != pass ||
		len(r.NATS.URLs) != 1 || r.NATS.URLs[0] != "nats://"+subnet+".1:4222" {
		t.Fatalf("check-in answer's nats: %+v (%v)", r.NATS, err)
	}
	t.Logf("node %s applied generation %d with nats access %v in its answers; it reports its broker connection %+v", id, d.AckedGeneration, r.NATS.URLs, *nats)
}
