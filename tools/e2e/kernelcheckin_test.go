package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/image/qemu"
	"github.com/discord-pxe/dpxe/tools/netns"
)

// TestKernelCheckin boots two nodes, one per NIC model, against a real
// `dpxe serve` in a namespace. Each checks in with its credential and
// capacity and must appear live in GET /v1/nodes with a contiguous range
// and one ASSIGNED status per shard; stopping the controller must make
// each node report its lease expired within one lease of its last
// check-in, and a restarted controller (same SQLite file) must see both
// nodes again.
func TestKernelCheckin(t *testing.T) {
	if err := netns.Available(); err != nil {
		t.Skip(err)
	}
	needQEMU(t, qemu.SeaBIOS)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	bin := dpxeBinary(t)
	const subnet = "10.78.0"
	ns, err := netns.New(ctx, netip.MustParsePrefix(subnet+".1/24"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })

	const lease = 6 * time.Second
	server := "http://" + subnet + ".1:8080"
	dir := t.TempDir()
	db := filepath.Join(dir, "dpxe.db")
	token := filepath.Join(dir, "admin.token")
	var logs bytes.Buffer
	start := func() *exec.Cmd {
		srv := ns.Command(ctx, bin, "serve", "--db", db, "--listen", subnet+".1:8080", "--total-shards", "8",
			"--lease", lease.String(), "--no-dashboard")
		srv.Stdout, srv.Stderr = &logs, &logs
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			if _, err := ns.Run(ctx, bin, "nodes", "--server", server, "--token-file", token); err == nil {
				return srv
			}
			if time.Now().After(deadline) {
				t.Fatalf("dpxe serve did not come up:\n%s", logs.String())
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	srv := start()
	t.Cleanup(func() {
		if srv != nil {
			srv.Process.Kill()
			srv.Wait()
		}
		if t.Failed() {
			t.Logf("dpxe serve log:\n%s", logs.String())
		}
	})

	type node struct {
		id, nic, ip string
		capacity    int
		serial      *nodeSerial
		run         *bgNode
	}
	nodes := []*node{
		{id: "ck-e1000", nic: "e1000", ip: subnet + ".21", capacity: 3},
		{id: "ck-virtio", nic: "virtio-net-pci", ip: subnet + ".22", capacity: 5},
	}
	credLine := regexp.MustCompile(`cred=(\S+)`)
	for i, n := range nodes {
		out, err := ns.Run(ctx, bin, "nodes", "add", n.id, "--server", server, "--token-file", token)
		if err != nil {
			t.Fatalf("dpxe nodes add %s: %v\n%s", n.id, err, out)
		}
		m := credLine.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no credential in %q", out)
		}
		tap := fmt.Sprintf("tapck%d", i)
		if err := ns.AddTap(ctx, tap); err != nil {
			t.Fatal(err)
		}
		cfg := appliance.BootConfig{NodeID: n.id, Controller: server, Credential: m[1], Capacity: uint32(n.capacity), HasCapacity: true,
			StaticIP: n.ip + "/24," + subnet + ".1"}
		o := qemu.Options{
			Firmware: qemu.SeaBIOS,
			Kernel:   filepath.Join(outDir(t), image.KernelFile),
			Append:   cfg.String(),
			Net: []string{"-netdev", "tap,id=n0,ifname=" + tap + ",script=no,downscript=no",
				"-device", fmt.Sprintf("%s,netdev=n0,mac=52:54:00:78:00:%02x", n.nic, 0x21+i)},
			Wrapper: ns.Wrapper(),
			Timeout: 170 * time.Second,
		}
		n.run = startNode(ctx, o)
		n.serial = n.run.serial
	}
	defer func() {
		for _, n := range nodes {
			if n.run == nil {
				continue
			}
			if err := n.run.stop(); err != nil {
				t.Errorf("qemu: %v", err)
			}
		}
		if t.Failed() {
			for _, n := range nodes {
				t.Logf("%s console:\n%s", n.id, n.serial.String())
			}
		}
	}()

	tok, err := os.ReadFile(token)
	if err != nil {
		t.Fatal(err)
	}
	nodeDetail := func(id string) (controller.NodeDetail, error) {
		var d controller.NodeDetail
		out, err := ns.Run(ctx, "curl", "-fsS", "--max-time", "5", "-H", "Authorization: Bearer "+strings.TrimSpace(string(tok)), server+"/v1/nodes/"+id)
		if err != nil {
			return d, fmt.Errorf("GET /v1/nodes/%s: %v %s", id, err, out)
		}
		return d, json.Unmarshal([]byte(out), &d)
	}
	// settled waits until every node is live with its capacity, has
	// acknowledged the current plan with nothing pending, the plan covers
	// all 8 shards, and each node's last check-in reported exactly its
	// range as ASSIGNED shards.
	settled := func(within time.Duration) map[string]controller.NodeDetail {
		deadline := time.Now().Add(within)
		var why string
		for {
			ok, sum, gen := true, uint32(0), uint64(0)
			got := map[string]controller.NodeDetail{}
			for _, n := range nodes {
				d, err := nodeDetail(n.id)
				if err != nil {
					ok, why = false, err.Error()
					break
				}
				got[n.id] = d
				sum += d.RangeCount
				if gen == 0 {
					gen = d.AckedGeneration
				}
				switch {
				case !d.Live || d.Capacity != uint32(n.capacity) || d.RangeCount == 0:
					ok, why = false, fmt.Sprintf("%s: live %v capacity %d range %d+%d", n.id, d.Live, d.Capacity, d.RangeStart, d.RangeCount)
				case d.Pending != 0 || d.AckedGeneration != gen:
					ok, why = false, fmt.Sprintf("%s: pending %d, acked generation %d vs %d", n.id, d.Pending, d.AckedGeneration, gen)
				case len(d.Shards) != int(d.RangeCount):
					ok, why = false, fmt.Sprintf("%s: %d statuses for range %d+%d", n.id, len(d.Shards), d.RangeStart, d.RangeCount)
				}
				for _, st := range d.Shards {
					if st.State != appliance.ShardAssigned || st.ID < d.RangeStart || st.ID >= d.RangeStart+d.RangeCount {
						ok, why = false, fmt.Sprintf("%s: status %+v outside range %d+%d or not ASSIGNED", n.id, st, d.RangeStart, d.RangeCount)
					}
				}
			}
			if ok && sum == 8 {
				return got
			}
			if time.Now().After(deadline) {
				t.Fatalf("the fleet did not settle within %v: %s", within, why)
			}
			time.Sleep(300 * time.Millisecond)
		}
	}

	for _, n := range nodes {
		if n.serial.waitFor(regexp.MustCompile(`checkin: controller reachable`), 60*time.Second) == nil {
			t.Fatalf("%s never reached the controller", n.id)
		}
	}
	m := settled(30 * time.Second)
	for _, n := range nodes {
		d := m[n.id]
		t.Logf("%s: live, capacity %d, range %d+%d, generation %d, address %s", n.id, d.Capacity, d.RangeStart, d.RangeCount, d.AckedGeneration, d.Address)
		// The console names the plan it applied.
		if n.serial.waitFor(regexp.MustCompile(fmt.Sprintf(`plan: generation %d, %d of 8 shards \[%d\.\.%d\]`,
			d.AckedGeneration, d.RangeCount, d.RangeStart, d.RangeStart+d.RangeCount-1)), 5*time.Second) == nil {
			t.Errorf("%s: no plan line for generation %d, range %d+%d", n.id, d.AckedGeneration, d.RangeStart, d.RangeCount)
		}
	}

	// Malformed traffic: the e1000 node counts and drops it, and goes on
	// checking in (its TCP, which has nothing to do with these frames,
	// included).
	n0 := nodes[0]
	nodeLine := regexp.MustCompile(`node: controller=ok checkins=(\d+) failed=(\d+)`)
	last := func() (int, int) {
		m := nodeLine.FindAllStringSubmatch(n0.serial.String(), -1)
		if len(m) == 0 {
			return 0, 0
		}
		var ok, failed int
		fmt.Sscan(m[len(m)-1][1], &ok)
		fmt.Sscan(m[len(m)-1][2], &failed)
		return ok, failed
	}
	okBefore, failedBefore := last()
	want, err := injectMalformed(ns.Name, "52:54:00:78:00:21", n0.ip)
	if err != nil {
		t.Fatalf("injecting malformed frames: %v", err)
	}
	t.Logf("sent %d kinds of malformed frames to %s", len(want), n0.id)
	deadline := time.Now().Add(15 * time.Second)
	for {
		ok, failed := last()
		if ok >= okBefore+3 && failed == failedBefore {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s after malformed frames: %d check-ins (was %d), %d failed (was %d)", n0.id, ok, okBefore, failed, failedBefore)
		}
		time.Sleep(300 * time.Millisecond)
	}
	st := waitStatus(t, n0.serial, len(statusLine.FindAllString(n0.serial.String(), -1)), 10*time.Second)
	for name, n := range want {
		if st.counters[name] < n {
			t.Errorf("%s: counter %s = %d, want at least %d", n0.id, name, st.counters[name], n)
		}
	}

	// Stop the controller: each node's lease lapses within one lease of its
	// last check-in (it renews every third of the lease).
	stopped := time.Now()
	srv.Process.Signal(syscall.SIGTERM)
	srv.Wait()
	srv = nil
	for _, n := range nodes {
		got := n.serial.waitFor(regexp.MustCompile(`lease: expired \(generation \d+, no renewal within (\d+) ms`), lease+10*time.Second)
		if got == nil {
			t.Fatalf("%s did not report its lease expired within %v of the controller stopping", n.id, lease+10*time.Second)
		}
		if got[1] != fmt.Sprint(lease.Milliseconds()) {
			t.Errorf("%s: lease of %s ms, want %d", n.id, got[1], lease.Milliseconds())
		}
		if n.serial.waitFor(regexp.MustCompile(`checkin: failed \(connection refused or reset\)`), 5*time.Second) == nil {
			t.Errorf("%s: no console line saying the controller is unreachable", n.id)
		}
	}
	if took := time.Since(stopped); took > lease+5*time.Second {
		t.Errorf("leases lapsed %v after the controller stopped, want at most one lease (%v) plus margin", took, lease)
	}

	// Restart it: both nodes come back.
	before := map[string]int{}
	for _, n := range nodes {
		before[n.id] = strings.Count(n.serial.String(), "checkin: controller reachable")
	}
	srv = start()
	settled(30 * time.Second)
	for _, n := range nodes {
		deadline := time.Now().Add(15 * time.Second)
		for strings.Count(n.serial.String(), "checkin: controller reachable") <= before[n.id] {
			if time.Now().After(deadline) {
				t.Fatalf("%s did not report the controller reachable again", n.id)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	if b, err := os.ReadFile(db); err != nil || len(b) == 0 {
		t.Errorf("the SQLite file is missing: %v", err)
	}
}
