package main

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The CLI's tests against a real `dpxe serve` (issue 23): the binary is
// built once per test run, each test starts its own server on a loopback
// port with its own database, and the client commands run in process
// against it.

var (
	dpxeBinOnce sync.Once
	dpxeBin     string
	dpxeBinErr  error
	dpxeBinDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if dpxeBinDir != "" {
		os.RemoveAll(dpxeBinDir)
	}
	os.Exit(code)
}

// sharedDpxe returns a dpxe binary built from this package, once.
func sharedDpxe(t *testing.T) string {
	t.Helper()
	dpxeBinOnce.Do(func() {
		dpxeBinDir, dpxeBinErr = os.MkdirTemp("", "dpxe-cli-test-")
		if dpxeBinErr == nil {
			dpxeBin, dpxeBinErr = buildDpxe(dpxeBinDir)
		}
	})
	if dpxeBinErr != nil {
		t.Fatalf("building dpxe: %v", dpxeBinErr)
	}
	return dpxeBin
}

// cliServer is a running `dpxe serve` and the client flags that reach it.
type cliServer struct {
	*serveProc
	dir, token string
}

// client returns args followed by --server and --token-file for s.
func (s *cliServer) client(args ...string) []string {
	return append(args, "--server", s.url, "--token-file", s.token)
}

// startCLIServer starts `dpxe serve` with a fresh database and extra args.
func startCLIServer(t *testing.T, extra ...string) *cliServer {
	t.Helper()
	dir := t.TempDir()
	s := &cliServer{dir: dir, token: filepath.Join(dir, "var", adminTokenName)}
	args := append([]string{"--db", filepath.Join(dir, "var", "dpxe.db"), "--no-dashboard"}, extra...)
	s.serveProc = startServe(t, sharedDpxe(t), args...)
	t.Cleanup(func() { s.stop(t) })
	return s
}

// runServeBinary runs the dpxe binary with args in dir and returns its exit
// code and output; it must end within the deadline (a refusal at start).
func runServeBinary(t *testing.T, dir string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(sharedDpxe(t), args...)
	cmd.Dir = dir
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(e2eDeadline):
		cmd.Process.Kill()
		<-done
		t.Fatalf("dpxe %s did not exit:\n%s", strings.Join(args, " "), out)
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), string(out)
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, string(out)
}

// TestFlashRefusesBeforeController (issue 23.2): a flash that its target
// checks refuse changes nothing at the controller, also when it would have
// created the node there (no --cred). The refusals are the ones that used
// to come only after the node was created: the source image itself as the
// target.
func TestFlashRefusesBeforeController(t *testing.T) {
	srv := startCLIServer(t)
	dir := t.TempDir()
	// A private copy: if the refusal broke, the shared image stays whole.
	src := filepath.Join(dir, "usb.img")
	b, err := os.ReadFile(flashSource(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(src, b, 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "same.img")
	if err := os.Link(src, link); err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		target, want string
	}{
		{src, "is the source image"},
		{link, "is the source image"}, // another name for the same file
		{dir, "not a regular file or block device"},
	} {
		node := "refused-" + string(rune('a'+i))
		code, msg := captureRun(t, srv.client("flash", "--image", src, "--node", node, "--controller", "http://10.0.0.5:8080", "--yes", tc.target)...)
		if code != 1 || !strings.Contains(msg, tc.want) {
			t.Errorf("flash onto %s: exit %d, want 1 with %q:\n%s", tc.target, code, tc.want, msg)
		}
		if st := nodeStatus(t, srv.url, srv.token, node); st != http.StatusNotFound {
			t.Errorf("flash onto %s was refused but node %s is at the controller (HTTP %d)", tc.target, node, st)
		}
	}
	if got := sumFile(t, src); got != sumFile(t, flashSource(t)) {
		t.Error("the source image changed")
	}
	// The same command onto a good target goes through, so the refusals
	// above were the target checks and not a broken setup.
	good := filepath.Join(dir, "stick.img")
	if code, msg := captureRun(t, srv.client("flash", "--image", src, "--node", "refused-ok", "--controller", "http://10.0.0.5:8080", "--yes", good)...); code != 0 {
		t.Fatalf("flash onto a new file: exit %d\n%s", code, msg)
	}
	if st := nodeStatus(t, srv.url, srv.token, "refused-ok"); st != http.StatusOK {
		t.Errorf("after a good flash: node HTTP %d", st)
	}
}

// TestServeRefusesBadFlags (issue 23.3): every setting `dpxe serve` could
// not honour is refused at start, with a usage error naming the flag.
func TestServeRefusesBadFlags(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--controller-url", "http://10.0.0.1:8080"}, "--controller-url needs --interface"},
		{[]string{"--dhcp", "authoritative", "--pool", "10.0.0.100-10.0.0.200/24"}, "--dhcp, --pool need --interface"},
		{[]string{"--reserve", "52:54:00:00:00:01=10.0.0.5"}, "--reserve needs --interface"},
		{[]string{"--tftp", "off"}, "--tftp needs --interface"},
		{[]string{"--interface", "lo", "--controller-url", "wss://x"}, `--controller-url "wss://x"`},
		{[]string{"--interface", "lo", "--controller-url", "https://ctl.example:8443"}, "is https:// but --tls-listen is not set"},
		{[]string{"--interface", "lo", "--controller-url", "ftp://ctl.example"}, "must start with http:// or https://"},
		{[]string{"--tls-cert", "c.pem"}, "tls_cert and tls_key go together"},
		{[]string{"--tls-listen", "8443"}, "tls_listen"},
		{[]string{"--interface", "lo", "--dhcp", "foo"}, "want proxy, authoritative or off"},
		{[]string{"--interface", "lo", "--dhcp", "proxy", "--pool", "10.0.0.100-10.0.0.200/24"}, "need --dhcp authoritative"},
		{[]string{"--interface", "lo", "--dhcp", "authoritative"}, "needs --pool"},
		{[]string{"--interface", "lo", "--dhcp", "off", "--proxy-enroll"}, "--proxy-enroll needs --dhcp proxy"},
		{[]string{"--interface", "lo", "--tftp", "nonsense"}, "--tftp"},
		{[]string{"--db", "mysql://dpxe:secret@db.example/dpxe"}, "--db"},
		{[]string{"--db", "sqlite:///var/lib/dpxe.db"}, "sqlite databases are not supported"},
		{[]string{"--listen", "8080"}, "--listen"},
		{[]string{"--listen", "127.0.0.1:99999"}, "--listen"},
		{[]string{"--lease", "500ms"}, "--lease 500ms out of range"},
		{[]string{"--identify-window", "2m"}, "--identify-window"},
		{[]string{"--session-budget", "10", "--session-reserve", "10"}, "--session-reserve"},
		{[]string{"--total-shards", "200000"}, "--total-shards"},
		{[]string{"--dashboard-live", "0s"}, "--dashboard-live"},
		{[]string{"--no-dashboard", "--dashboard-live", "1s"}, "--dashboard-live"},
		{[]string{"--intents", "0"}, "intents"},
	} {
		_, err := parseServeFlags(tc.args)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("dpxe serve %s: %v, want a usage error with %q", strings.Join(tc.args, " "), err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("dpxe serve %s: the error shows the database password: %v", strings.Join(tc.args, " "), err)
		}
	}
	// Good settings still pass: netboot flags with --interface.
	if _, err := parseServeFlags([]string{"--interface", "lo", "--dhcp", "authoritative", "--pool", "10.0.0.100-10.0.0.200/24",
		"--reserve", "52:54:00:00:00:01=10.0.0.5", "--controller-url", "http://10.0.0.1:8080", "--tftp", "off"}); err != nil {
		t.Errorf("good netboot flags refused: %v", err)
	}

	// The real binary: exit 2 at once, nothing created (a URL --db used to
	// become a folder named after its scheme). PostgreSQL itself is refused
	// until the store takes it (dbSchemes).
	if !dbSchemes["postgres"] {
		if _, err := parseServeFlags([]string{"--db", "postgres://dpxe:secret@db.example/dpxe"}); !errors.Is(err, errUsage) || strings.Contains(err.Error(), "secret") {
			t.Errorf("postgres --db: %v", err)
		}
	}
	for _, args := range [][]string{
		{"serve", "--db", "mysql://u@h/db"},
		{"serve", "--db", "var/dpxe.db", "--controller-url", "wss://x"},
	} {
		code, msg := runServeBinary(t, dir, args...)
		if code != 2 || !strings.Contains(msg, "dpxe serve: usage: --") {
			t.Errorf("dpxe %s: exit %d\n%s", strings.Join(args, " "), code, msg)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("refused starts left %v behind", ents)
	}
}

// TestServeConfigCoversEveryPart (issue 23.9): --config sets any flag by
// name (netboot, dashboard, Gateway, core), the command line wins, and
// every key or value it cannot use is refused with the key named.
func TestServeConfigCoversEveryPart(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.json", `{"total_shards": 64, "max-concurrency": 4, "lease": "20s", "listen": "127.0.0.1:9000",
		"interface": "lo", "dhcp": "authoritative", "pool": "10.0.0.100-10.0.0.200/24",
		"reserve": ["52:54:00:00:00:01=10.0.0.5", "52:54:00:00:00:02=10.0.0.6"],
		"ipv6_no_router": true, "dashboard_live": "3s", "intents": 513}`)
	cfg, err := parseServeFlags([]string{"--config", good, "--total-shards", "32"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.TotalShards != 32 || !cfg.totalFixed || cfg.MaxConcurrency != 4 || !cfg.mcFixed || time.Duration(cfg.Lease) != 20*time.Second ||
		cfg.Listen != "127.0.0.1:9000" || netbootFlags.iface != "lo" || len(netbootFlags.reserve) != 2 || !netbootFlags.ipv6NoRouter ||
		webFlags.liveEvery != 3*time.Second || cfg.Intents != 513 {
		t.Fatalf("config %+v netboot %+v web %+v", cfg, netbootFlags, webFlags)
	}
	for name, tc := range map[string]struct{ body, want string }{
		"unknown.json":    {`{"total_shards": 8, "shards": 3}`, `key "shards": unknown key`},
		"badlease.json":   {`{"lease": 30}`, `key "lease"`},
		"twice.json":      {`{"lease": "20s", "lease": "30s"}`, `"lease" given twice`},
		"nested.json":     {`{"dhcp": {"mode": "proxy"}}`, `key "dhcp"`},
		"null.json":       {`{"db": null}`, `key "db"`},
		"list.json":       {`{"lease": ["20s"]}`, `repeatable`},
		"rotate.json":     {`{"rotate_admin_token": true}`, "one-time action"},
		"config.json":     {`{"config": "other.json"}`, "cannot name another"},
		"array.json":      {`[1]`, "JSON object"},
		"trailing.json":   {`{} {}`, "after the JSON object"},
		"stray.json":      {`{"pool": "10.0.0.100-10.0.0.200/24"}`, "--pool needs --interface"},
		"controller.json": {`{"interface": "lo", "controller_url": "wss://x"}`, "--controller-url"},
	} {
		_, err := parseServeFlags([]string{"--config", write(name, tc.body)})
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want a usage error with %q", name, err, tc.want)
		}
	}
}

// TestServeConfigMissing: a --config file that is not there is a usage
// error that still says so (the docs test lets a reader's own file be
// missing by that).
func TestServeConfigMissing(t *testing.T) {
	_, err := parseServeFlags([]string{"--config", filepath.Join(t.TempDir(), "none.json")})
	if !errors.Is(err, errUsage) || !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "--config") {
		t.Errorf("missing --config file: %v", err)
	}
}

// FuzzConfigObject: the --config parser never panics, and what it accepts
// has keys given once.
func FuzzConfigObject(f *testing.F) {
	for _, s := range []string{`{}`, `{"a": 1, "b": "x", "c": true, "d": ["1", 2]}`, `{"a": {"b": 1}}`, `{"a":1,"a":2}`, `[`, `{"a": -1.5e3}`, `{"a": null}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		es, err := parseConfigObject(b)
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for _, e := range es {
			if seen[e.key] {
				t.Fatalf("key %q twice in %q", e.key, b)
			}
			seen[e.key] = true
		}
	})
}

// losetup attaches backing to a free loop device for the test (root and
// losetup only; the test is skipped otherwise).
func losetup(t *testing.T, backing string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("loop devices need root")
	}
	if _, err := exec.LookPath("losetup"); err != nil {
		t.Skip("losetup not installed")
	}
	out, err := exec.Command("losetup", "--find", "--show", backing).CombinedOutput()
	if err != nil {
		t.Skipf("losetup: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "--detach", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup --detach %s: %v: %s", dev, err, out)
		}
	})
	return dev
}

// TestFlashRefusesDevicesBeforeController (issue 23.2) on loop devices: a
// device backed by the source image, and a device another program holds
// exclusively, are refused before the node is created at the controller.
func TestFlashRefusesDevicesBeforeController(t *testing.T) {
	srv := startCLIServer(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "usb.img")
	b, err := os.ReadFile(flashSource(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(src, b, 0o644); err != nil {
		t.Fatal(err)
	}
	self := losetup(t, src)
	other := filepath.Join(dir, "other.img")
	if err := os.WriteFile(other, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(other, int64(len(b))); err != nil {
		t.Fatal(err)
	}
	held := losetup(t, other)
	h, err := os.OpenFile(held, os.O_RDONLY|unix.O_EXCL, 0)
	if err != nil {
		t.Fatalf("holding %s: %v", held, err)
	}
	defer h.Close()
	for i, tc := range []struct{ dev, want string }{
		{self, "is the source image"},
		{held, "is in use"},
	} {
		node := fmt.Sprintf("loop-refused-%d", i)
		code, msg := captureRun(t, srv.client("flash", "--force", "--image", src, "--node", node, "--controller", "http://10.0.0.5:8080", "--yes", tc.dev)...)
		if code != 1 || !strings.Contains(msg, tc.want) {
			t.Errorf("flash onto %s: exit %d, want 1 with %q:\n%s", tc.dev, code, tc.want, msg)
		}
		if st := nodeStatus(t, srv.url, srv.token, node); st != http.StatusNotFound {
			t.Errorf("flash onto %s was refused but node %s is at the controller (HTTP %d)", tc.dev, node, st)
		}
	}
	h.Close()
	if code, msg := captureRun(t, srv.client("flash", "--force", "--image", src, "--node", "loop-ok", "--controller", "http://10.0.0.5:8080", "--yes", held)...); code != 0 {
		t.Errorf("flash onto %s once released: exit %d\n%s", held, code, msg)
	}
}
