package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
)

// mustRun runs a dpxe command line in process and fails unless it exits 0.
func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	code, out := captureRun(t, args...)
	if code != 0 {
		t.Fatalf("dpxe %s: exit %d\n%s", strings.Join(args, " "), code, out)
	}
	return out
}

// captureSplit runs a dpxe command line in process and returns its exit
// status, standard output and standard error apart.
func captureSplit(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	or, ow, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	er, ew, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	oldOut, oldErr := os.Stdout, os.Stderr
	os.Stdout, os.Stderr = ow, ew
	outc, errc := make(chan []byte), make(chan []byte)
	go func() { b, _ := io.ReadAll(or); outc <- b }()
	go func() { b, _ := io.ReadAll(er); errc <- b }()
	code := run(args)
	os.Stdout, os.Stderr = oldOut, oldErr
	ow.Close()
	ew.Close()
	return code, string(<-outc), string(<-errc)
}

// mustJSON runs a command with --json and decodes its standard output into
// v, refusing unknown fields and anything after the value (what the
// command prints is what v says).
func mustJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	args = append(args, "--json")
	code, out, errOut := captureSplit(t, args...)
	if code != 0 {
		t.Fatalf("dpxe %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errOut)
	}
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("dpxe %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	if dec.More() {
		t.Fatalf("dpxe %s: more than one JSON value on stdout:\n%s", strings.Join(args, " "), out)
	}
}

// nodeCheckin posts a check-in for node with cred and body fields and
// returns the answer.
func nodeCheckin(t *testing.T, base, node, cred string, req appliance.CheckinRequest) appliance.CheckinResponse {
	t.Helper()
	req.NodeID = node
	b, _ := json.Marshal(req)
	var resp appliance.CheckinResponse
	if st := httpJSON(t, "POST", base+"/v1/checkin", cred, string(b), &resp); st != http.StatusOK {
		t.Fatalf("check-in %s: HTTP %d", node, st)
	}
	return resp
}

// TestCLIClientCommands (issue 23.4-23.6) drives every client verb against
// a real `dpxe serve` on loopback: the one flag vocabulary with flags
// anywhere, --json for every verb that prints, the boot config line of
// nodes add, nodes show with shard states and close codes, MACs with
// colons, no stale counts for a node whose lease ended.
func TestCLIClientCommands(t *testing.T) {
	const lease = 5 * time.Second
	srv := startCLIServer(t, "--total-shards", "2", "--lease", lease.String())
	c := srv.client

	// nodes add: a boot config line that parses, with controller=.
	out := mustRun(t, c("nodes", "add", "n1", "--controller", "http://10.0.0.5:8080")...)
	m := regexp.MustCompile(`(?m)^boot config: (.*)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("nodes add prints no boot config line:\n%s", out)
	}
	bc, err := appliance.ParseBootConfig([]byte(m[1]))
	if err != nil || bc.NodeID != "n1" || bc.Controller != "http://10.0.0.5:8080" || bc.Credential == "" {
		t.Fatalf("boot config line %q: %+v %v", m[1], bc, err)
	}
	// Without --controller the line names --server, with a warning.
	var added credentialOut
	mustJSON(t, &added, c("nodes", "add", "n2")...)
	if added.NodeID != "n2" || !strings.Contains(added.BootConfig, "controller="+srv.url) || !strings.Contains(added.BootConfig, "cred="+added.Credential) {
		t.Errorf("nodes add --json: %+v", added)
	}
	var rotated credentialOut
	mustJSON(t, &rotated, c("nodes", "rotate", "n2", "--controller", "http://10.0.0.5:8080")...)
	if rotated.Credential == added.Credential || rotated.BootConfig != "node=n2 controller=http://10.0.0.5:8080 cred="+rotated.Credential {
		t.Errorf("nodes rotate --json: %+v", rotated)
	}

	// Neither --controller given nor --server usable as controller=: the
	// line leaves it out and says so.
	code, stdout, stderr := captureSplit(t, "nodes", "add", "n6", "--server", strings.Replace(srv.url, "http://", "HTTP://", 1), "--token-file", srv.token)
	if m := regexp.MustCompile(`(?m)^boot config: (node=n6 cred=\S+)$`).FindStringSubmatch(stdout); code != 0 || m == nil || !strings.Contains(stderr, "no controller=") {
		t.Errorf("nodes add with an unusable --server: exit %d\n%s%s", code, stdout, stderr)
	} else if _, err := appliance.ParseBootConfig([]byte(m[1])); err != nil {
		t.Errorf("boot config line %q: %v", m[1], err)
	}

	// A node with two shards, one READY and one FATAL 4004.
	first := nodeCheckin(t, srv.url, "n1", bc.Credential, appliance.CheckinRequest{Capacity: 2})
	report := appliance.CheckinRequest{Capacity: 2, Generation: first.Generation, ReadyShards: 1, FatalShards: 1, Shards: []appliance.ShardStatus{
		{ID: 0, State: appliance.ShardReady, HeartbeatAcks: 7},
		{ID: 1, State: appliance.ShardFatal, CloseCode: 4004, LastError: "authentication failed"},
	}}
	nodeCheckin(t, srv.url, "n1", bc.Credential, report)
	out = mustRun(t, c("nodes", "show", "n1")...)
	for _, want := range []string{"node n1: live", "shards     0-1 (2)", "check-in   ", "lease      until ", "FATAL", "4004", "authentication failed", "READY", "dpxe restart-fatal n1"} {
		if !strings.Contains(out, want) {
			t.Errorf("nodes show lacks %q:\n%s", want, out)
		}
	}
	var shown nodeShow
	mustJSON(t, &shown, c("nodes", "show", "n1")...)
	if !shown.Node.Live || len(shown.Node.Shards) != 2 || shown.Node.Shards[1].CloseCode != 4004 || shown.Machines == nil {
		t.Errorf("nodes show --json: %+v", shown)
	}
	var list struct {
		Nodes []controller.NodeView `json:"nodes"`
	}
	mustJSON(t, &list, c("nodes")...)
	if len(list.Nodes) != 3 { // n1, n2, n6
		t.Errorf("nodes --json: %+v", list)
	}

	// Machines: approve and retire print MACs as the docs write them.
	out = mustRun(t, c("nodes", "approve", "52-54-00-12-34-56", "--id", "n3")...)
	if !strings.HasPrefix(out, "52:54:00:12:34:56 approved as n3") {
		t.Errorf("approve: %s", out)
	}
	out = mustRun(t, c("nodes", "machines")...)
	if !strings.Contains(out, "52:54:00:12:34:56") || strings.Contains(out, "52-54") {
		t.Errorf("machines: %s", out)
	}
	var machines machineList
	mustJSON(t, &machines, c("nodes", "machines")...)
	if len(machines.Machines) != 1 || machines.Machines[0].NodeID != "n3" {
		t.Errorf("machines --json: %+v", machines)
	}
	var approved, retired map[string]string
	mustJSON(t, &approved, c("nodes", "approve", "52:54:00:12:34:57", "--id", "n4")...)
	mustJSON(t, &retired, c("nodes", "retire", "52:54:00:12:34:57")...)
	if approved["node_id"] != "n4" || retired["state"] == "" {
		t.Errorf("approve/retire --json: %v %v", approved, retired)
	}

	// Drain and undrain through `nodes`, with --json.
	var drained struct {
		controller.NodeView
		Preview *controller.DrainPreview `json:"preview"`
	}
	mustJSON(t, &drained, c("nodes", "drain", "n2")...)
	if !drained.Draining || drained.Preview == nil {
		t.Errorf("nodes drain --json: %+v", drained)
	}
	mustJSON(t, &drained, c("nodes", "undrain", "n2")...)
	if drained.Draining {
		t.Errorf("nodes undrain --json: %+v", drained)
	}

	// One vocabulary, flags anywhere: the same flags before and after.
	for _, args := range [][]string{
		{"route", "--server", srv.url, "--token-file", srv.token, "81384788765712384"},
		{"route", "81384788765712384", "--server", srv.url, "--token-file", srv.token},
		{"nodes", "show", "--server", srv.url, "n1", "--token-file", srv.token},
		{"restart-fatal", "n1", "1", "--server", srv.url, "--token-file", srv.token},
	} {
		mustRun(t, args...)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"flash", "--api", srv.url, "--node", "x", "t.img"}, "--api is now called --server"},
		{[]string{"flash", "--admin-token-file", srv.token, "--node", "x", "t.img"}, "--admin-token-file is now called --token-file"},
		{[]string{"nodes", "--server", "ftp://x"}, "--server"},
		{[]string{"nodes", "add", "n9", "--controller", "https://x", "--server", srv.url, "--token-file", srv.token}, "without controller_pin="},
		{[]string{"nodes", "--db", filepath.Join(srv.dir, "var", "dpxe.db"), "add", "n9", "--controller", "wss://x"}, "--controller"},
		{[]string{"nodes", "show", "n1", "--id", "x", "--server", srv.url, "--token-file", srv.token}, "--id is for approve only"},
	} {
		code, msg := captureRun(t, tc.args...)
		if code != 2 || !strings.Contains(msg, tc.want) {
			t.Errorf("dpxe %s: exit %d, want 2 with %q:\n%s", strings.Join(tc.args, " "), code, tc.want, msg)
		}
	}

	// delete: refused while live, and the credential keeps working.
	code, msg := captureRun(t, c("nodes", "delete", "n1")...)
	if code != 1 || !strings.Contains(msg, "node is live") {
		t.Errorf("nodes delete of a live node: exit %d\n%s", code, msg)
	}
	nodeCheckin(t, srv.url, "n1", bc.Credential, report)

	// The lease ends: no READY count that is not running any more.
	deadline := time.Now().Add(lease + e2eDeadline)
	for {
		mustJSON(t, &list, c("nodes")...)
		if n := findNode(list.Nodes, "n1"); n != nil && !n.Live {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("n1 still live after its lease: %+v", list.Nodes)
		}
		time.Sleep(100 * time.Millisecond)
	}
	out = mustRun(t, c("nodes")...)
	if line := lineWith(out, "n1 "); !strings.Contains(line, " - ") || strings.Contains(line, "1/0/0/1") {
		t.Errorf("nodes lists counts for a node that is not live: %q", line)
	}
	out = mustRun(t, c("nodes", "show", "n1")...)
	if !strings.Contains(out, "NOT LIVE") || !strings.Contains(out, "STALE") {
		t.Errorf("nodes show of an expired node does not say so:\n%s", out)
	}

	// Not live: delete goes through, names the machine still approved as
	// the node, and the credential stops working.
	out = mustRun(t, c("nodes", "delete", "n1")...)
	if !strings.Contains(out, "node n1 deleted") || strings.Contains(out, "still approved") {
		t.Errorf("nodes delete n1:\n%s", out)
	}
	mustRun(t, c("nodes", "approve", "52:54:00:12:34:58", "--id", "n5")...)
	out = mustRun(t, c("nodes", "delete", "n5")...)
	if !strings.Contains(out, "node n5 deleted") || !strings.Contains(out, "machine 52:54:00:12:34:58 is still approved as n5") {
		t.Errorf("nodes delete n5:\n%s", out)
	}
	b, _ := json.Marshal(appliance.CheckinRequest{NodeID: "n1", Capacity: 2})
	if st := httpJSON(t, "POST", srv.url+"/v1/checkin", bc.Credential, string(b), nil); st != http.StatusUnauthorized {
		t.Errorf("check-in of a deleted node: HTTP %d, want 401", st)
	}
	var del map[string]any
	mustJSON(t, &del, c("nodes", "delete", "n3")...)
	if del["node_id"] != "n3" || del["deleted"] != true {
		t.Errorf("nodes delete --json: %v", del)
	}
	if code, msg := captureRun(t, c("nodes", "delete", "n1")...); code != 1 || !strings.Contains(msg, "404") {
		t.Errorf("nodes delete of a deleted node: exit %d\n%s", code, msg)
	}
}

func findNode(ns []controller.NodeView, id string) *controller.NodeView {
	for i := range ns {
		if ns[i].ID == id {
			return &ns[i]
		}
	}
	return nil
}

func lineWith(text, prefix string) string {
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

// TestCLILoginLinkAndVersion: login-link --json prints the API's fields
// and the link; dpxe version matches what dpxe serve logs; help is aligned.
func TestCLILoginLinkAndVersion(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "var", adminTokenName)
	p := startServe(t, sharedDpxe(t), "--db", filepath.Join(dir, "var", "dpxe.db"))
	t.Cleanup(func() { p.stop(t) })
	var link struct {
		Path      string    `json:"path"`
		ExpiresAt time.Time `json:"expires_at"`
		URL       string    `json:"url"`
	}
	mustJSON(t, &link, "login-link", "--server", p.url, "--token-file", tok)
	if link.Path == "" || link.URL != p.url+link.Path || time.Until(link.ExpiresAt) <= 0 {
		t.Errorf("login-link --json: %+v", link)
	}
	code, out := runServeBinary(t, dir, "version")
	v := strings.TrimSpace(strings.TrimPrefix(out, "dpxe "))
	if code != 0 || v == "" || !strings.Contains(p.logs(), fmt.Sprintf("version=%q", v)) {
		t.Errorf("dpxe version %q (exit %d) is not in serve's log:\n%s", out, code, p.logs())
	}
	var vj map[string]string
	mustJSON(t, &vj, "version")
	if vj["version"] == "" {
		t.Errorf("version --json: %v", vj)
	}
	var hz struct{ Version string }
	if code := httpJSON(t, "GET", p.url+"/healthz", "", "", &hz); code != 200 || hz.Version != vj["version"] {
		t.Errorf("GET /healthz: %d, version %q, want %q", code, hz.Version, vj["version"])
	}

	_, help := captureRun(t, "help")
	col := -1
	for _, l := range strings.Split(help, "\n") {
		if !strings.HasPrefix(l, "  ") {
			continue
		}
		name := strings.Fields(l)[0]
		if _, ok := commands[name]; !ok {
			continue
		}
		at := strings.Index(l, commands[name].summary)
		if col >= 0 && at != col {
			t.Errorf("help: %q's summary at column %d, others at %d", name, at, col)
		}
		col = at
	}
	if col < 0 {
		t.Fatalf("help lists no command:\n%s", help)
	}
}
