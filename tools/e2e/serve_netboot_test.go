package e2e

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3"

	"github.com/discord-pxe/dpxe/image/qemu"
	"github.com/discord-pxe/dpxe/tools/netns"
)

// TestServeNetbootPXE runs the real `dpxe serve --interface` inside a
// namespace (authoritative DHCP, TFTP, HTTP boot, API and dashboard in one
// process), approves a MAC through the operator API, and PXE-boots a
// SeaBIOS + e1000 QEMU node with QEMU's own iPXE ROM: the kernel's banner
// must show the node ID, the controller URL and a credential, the inventory
// must hold no credential in clear, and `dpxe nodes show` must list the
// boot timeline.
// firstCheckin is the kernel's line for its first answered check-in.
var firstCheckin = regexp.MustCompile(`checkin: controller reachable.*\(network up (\d+) ms ago\)`)

func TestServeNetbootPXE(t *testing.T) {
	if err := netns.Available(); err != nil {
		t.Skipf("skipping: %v", err)
	}
	needQEMU(t, qemu.SeaBIOS)
	out := outDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	bin := filepath.Join(t.TempDir(), "dpxe")
	if b, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/discord-pxe/dpxe/cmd/dpxe").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	ns, err := netns.New(ctx, netip.MustParsePrefix("10.91.0.1/24"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })

	const (
		server = "http://10.91.0.1:8080"
		mac    = "52:54:00:91:00:07"
		nodeID = "rack9-07"
	)
	dir := t.TempDir()
	db := filepath.Join(dir, "dpxe.db")
	var logs bytes.Buffer
	srv := ns.Command(ctx, bin, "serve", "--db", db, "--listen", "10.91.0.1:8080", "--total-shards", "4",
		"--interface", ns.Bridge, "--dhcp", "authoritative", "--pool", "10.91.0.100-10.91.0.150/24",
		"--router", "10.91.0.1", "--boot-dir", out, "--ipv6-no-router")
	srv.Stdout, srv.Stderr = &logs, &logs
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- srv.Wait() }()
	t.Cleanup(func() {
		srv.Process.Kill()
		if t.Failed() {
			t.Logf("dpxe serve log:\n%s", logs.String())
		}
	})
	token := filepath.Join(dir, "admin.token")
	curl := func(args ...string) (string, error) {
		tok, err := os.ReadFile(token)
		if err != nil {
			return "", err
		}
		return ns.Run(ctx, "curl", append([]string{"-fsS", "--max-time", "5", "-H", "Authorization: Bearer " + strings.TrimSpace(string(tok))}, args...)...)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := curl(server + "/v1/netboot/machines"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dpxe serve did not come up:\n%s", logs.String())
		}
		time.Sleep(200 * time.Millisecond)
	}

	if resp, err := curl("-X", "POST", "-d", `{"node_id":"`+nodeID+`"}`, server+"/v1/netboot/machines/"+mac+"/approve"); err != nil {
		t.Fatalf("approve: %v %s", err, resp)
	}
	if _, err := curl("-X", "POST", "-d", `{"node_id":"x","extra":1}`, server+"/v1/netboot/machines/"+mac+"/approve"); err == nil {
		t.Error("approve accepted an unknown JSON field")
	}

	if err := ns.AddTap(ctx, "tap91"); err != nil {
		t.Fatal(err)
	}
	want := "node=" + nodeID + " controller=" + server + " cred=set"
	res, err := qemu.Run(ctx, qemu.Options{
		Firmware: qemu.SeaBIOS,
		Net: []string{"-netdev", "tap,id=n0,ifname=tap91,script=no,downscript=no",
			"-device", "e1000,netdev=n0,mac=" + mac + ",romfile=/usr/lib/ipxe/qemu/pxe-e1000.rom,bootindex=1"},
		Wrapper: ns.Wrapper(),
		Timeout: 150 * time.Second,
		Until: func(s string) bool {
			// The whole line: QEMU is stopped as soon as this is true.
			return firstCheckin.MatchString(s) || strings.Contains(s, "config error") || strings.Contains(s, "halted:")
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(res.Serial, want) {
		t.Fatalf("no %q on the node's console (stopped %v, timed out %v):\n%s", want, res.Stopped, res.TimedOut, res.Serial)
	}
	// The kernel's DHCP lease came from dpxe serve, and with the credential
	// minted for this boot it checked in: the machine is a live node.
	bound := regexp.MustCompile(`dhcp: bound (\S+)/24 gw \S+ server 10\.91\.0\.1 .* in (\d+) ms`).FindStringSubmatch(res.Serial)
	if bound == nil || !firstCheckin.MatchString(res.Serial) {
		t.Fatalf("the kernel did not get a lease from dpxe serve and check in:\n%s", res.Serial)
	}
	up := firstCheckin.FindStringSubmatch(res.Serial)
	if up == nil {
		t.Fatalf("no first check-in line with its time:\n%s", res.Serial)
	}
	t.Logf("kernel DHCP lease %s in %s ms, first check-in answered %s ms after the network came up; PXE boot to that answer %v after QEMU start",
		bound[1], bound[2], up[1], res.Elapsed.Round(time.Millisecond))
	nodes, err := ns.Run(ctx, bin, "nodes", "--json", "--server", server, "--token-file", token)
	var list struct {
		Nodes []controller.NodeView `json:"nodes"`
	}
	if err == nil {
		err = json.Unmarshal([]byte(nodes), &list)
	}
	live := false
	for _, n := range list.Nodes {
		live = live || n.ID == nodeID && n.Live && n.Address == bound[1] && n.Capacity == 128
	}
	if !live {
		t.Errorf("GET /v1/nodes does not list %s live at %s with capacity 128: %v\n%s", nodeID, bound[1], err, nodes)
	}

	// No secret in clear: the script's credential was minted for this boot.
	sdb, err := sql.Open("sqlite3", "file:"+db+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer sdb.Close()
	var stored sql.NullString
	if err := sdb.QueryRow(`SELECT credential FROM netboot_nodes WHERE mac = ?`, "52-54-00-91-00-07").Scan(&stored); err != nil {
		t.Fatalf("reading the inventory: %v", err)
	}
	if stored.Valid && stored.String != "" {
		t.Error("the netboot inventory holds a credential in clear")
	}

	show, err := ns.Run(ctx, bin, "nodes", "show", nodeID, "--server", server, "--token-file", token)
	if err != nil {
		t.Fatalf("dpxe nodes show: %v\n%s", err, show)
	}
	for _, stage := range []string{"dhcp_ack", "script_fetched", "kernel_fetched"} {
		if !strings.Contains(show, stage) {
			t.Errorf("dpxe nodes show lacks the %s step:\n%s", stage, show)
		}
	}
	machines, err := ns.Run(ctx, bin, "nodes", "machines", "--server", server, "--token-file", token)
	if err != nil || !strings.Contains(machines, nodeID) || !strings.Contains(machines, "approved") {
		t.Errorf("dpxe nodes machines: %v\n%s", err, machines)
	}

	// SIGTERM: a clean, prompt shutdown.
	srv.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("dpxe serve exited with %v after SIGTERM", err)
		}
	case <-time.After(20 * time.Second):
		t.Error("dpxe serve did not stop within 20 s of SIGTERM")
	}
	if !strings.Contains(logs.String(), "stopped") {
		t.Errorf("no clean stop in the log:\n%s", logs.String())
	}
}
