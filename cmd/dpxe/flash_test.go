package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/image/flash"
)

// flashSource returns a usb.img: $DPXE_OUT's (make test) or a fresh
// `dpxe build`.
func flashSource(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("DPXE_OUT"); d != "" {
		if p := filepath.Join(d, image.USBImageFile); fileExists(p) {
			return p
		}
	}
	if _, err := exec.LookPath("nasm"); err != nil {
		t.Skip("no $DPXE_OUT/usb.img and nasm not installed (apt-get install nasm)")
	}
	out := t.TempDir()
	if code, msg := captureRun(t, "build", "--out", out); code != 0 {
		t.Fatalf("dpxe build: exit %d\n%s", code, msg)
	}
	return filepath.Join(out, image.USBImageFile)
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func sumFile(t *testing.T, p string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// testController runs the controller API in process on a real store and
// returns its URL and the admin token file.
func testController(t *testing.T) (string, string) {
	t.Helper()
	return testControllerPin(t, "")
}

// testControllerPin is testController answering GET /v1/controller/pin
// with pin ("": it serves no HTTPS).
func testControllerPin(t *testing.T, pin string) (string, string) {
	t.Helper()
	dir := t.TempDir()
	cfg := defaultServeConfig()
	cfg.DB = filepath.Join(dir, "dpxe.db")
	cfg.AdminTokenFile = filepath.Join(dir, adminTokenName)
	app, err := buildFleet(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	app.api.SetControllerPin(pin)
	srv := httptest.NewServer(app.mux)
	t.Cleanup(func() {
		srv.Close()
		app.store.Close()
	})
	return srv.URL, cfg.AdminTokenFile
}

// TestFlashReadsControllerPin: for an https:// --controller without
// --controller-pin, dpxe flash reads the pin from the controller it gets
// the credential from; a controller without HTTPS is refused before
// anything is written.
func TestFlashReadsControllerPin(t *testing.T) {
	src := flashSource(t)
	pin := strings.Repeat("7d", 32)
	api, token := testControllerPin(t, pin)
	target := filepath.Join(t.TempDir(), "stick.img")
	code, msg := captureRun(t, "flash", "--image", src, "--controller", "https://10.0.0.5:8443", "--server", api, "--token-file", token, "--node", "pin-1", "--yes", target)
	if c := flashedConfig(t, target); code != 0 || c.ControllerPin != pin || c.Controller != "https://10.0.0.5:8443" {
		t.Fatalf("exit %d, DPXE.CFG %+v\n%s", code, c, msg)
	}
	plain, plainToken := testControllerPin(t, "")
	other := filepath.Join(t.TempDir(), "other.img")
	code, msg = captureRun(t, "flash", "--image", src, "--controller", "https://10.0.0.5:8443", "--server", plain, "--token-file", plainToken, "--node", "pin-2", "--yes", other)
	if code != 1 || !strings.Contains(msg, "serves no HTTPS") || fileExists(other) {
		t.Fatalf("a controller without HTTPS: exit %d, target written %v\n%s", code, fileExists(other), msg)
	}
}

// checkIn posts a check-in with cred and returns the HTTP status: 200 when
// the controller accepts the credential.
func checkIn(t *testing.T, api, node, cred string) int {
	t.Helper()
	body := fmt.Sprintf(`{"node_id":%q,"capacity":1}`, node)
	req, _ := http.NewRequest("POST", api+"/v1/checkin", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+cred)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// nodeStatus is the HTTP status of GET /v1/nodes/{id} with the admin token.
func nodeStatus(t *testing.T, api, tokenFile, node string) int {
	t.Helper()
	tok, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", api+"/v1/nodes/"+node, nil)
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// flashedConfig reads DPXE.CFG from a flashed file.
func flashedConfig(t *testing.T, p string) appliance.BootConfig {
	t.Helper()
	u, err := image.ReadUSBConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	c, err := appliance.ParseBootConfig(u.Raw)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestFlashCommand(t *testing.T) {
	src := flashSource(t)
	srcSum := sumFile(t, src)
	api, token := testController(t)
	dir := t.TempDir()
	target := filepath.Join(dir, "stick.img")
	const ctrl = "http://10.0.0.5:8080"
	base := []string{"flash", "--image", src, "--controller", ctrl, "--server", api, "--token-file", token}

	// A new node: created at the controller, its credential on the medium.
	code, msg := captureRun(t, append(base, "--node", "flash-n1", "--yes", target)...)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, msg)
	}
	for _, want := range []string{"flashed and verified", "DPXE.CFG: node=flash-n1 controller=" + ctrl + " cred=********", "write ", "verify ", "MB/s"} {
		if !strings.Contains(msg, want) {
			t.Errorf("output lacks %q:\n%s", want, msg)
		}
	}
	c1 := flashedConfig(t, target)
	if c1.NodeID != "flash-n1" || c1.Controller != ctrl {
		t.Errorf("DPXE.CFG %+v", c1)
	}
	if st := checkIn(t, api, "flash-n1", c1.Credential); st != http.StatusOK {
		t.Fatalf("check-in with the flashed credential: HTTP %d", st)
	}
	code, msg = captureRun(t, "config", "show", target)
	if code != 0 || !strings.Contains(msg, "# effective: node=flash-n1 controller="+ctrl+" cred=********") {
		t.Errorf("dpxe config show: exit %d\n%s", code, msg)
	}

	// The node exists now: refused without --rotate, nothing written.
	before := sumFile(t, target)
	code, msg = captureRun(t, append(base, "--node", "flash-n1", "--yes", target)...)
	if code != 1 || !strings.Contains(msg, "already exists") || !strings.Contains(msg, "--rotate") {
		t.Errorf("existing node without --rotate: exit %d\n%s", code, msg)
	}
	if sumFile(t, target) != before {
		t.Error("target written although the flash was refused")
	}

	// --rotate: a new credential; the old one stops working.
	code, msg = captureRun(t, append(base, "--node", "flash-n1", "--rotate", "--yes", target)...)
	if code != 0 {
		t.Fatalf("--rotate: exit %d\n%s", code, msg)
	}
	c2 := flashedConfig(t, target)
	if c2.Credential == c1.Credential || checkIn(t, api, "flash-n1", c2.Credential) != http.StatusOK || checkIn(t, api, "flash-n1", c1.Credential) != http.StatusUnauthorized {
		t.Error("rotation: the new credential must work and the old one must not")
	}

	// --cred: no controller needed.
	const cred = "Given-credential_0123456789"
	code, msg = captureRun(t, "flash", "--image", src, "--controller", ctrl, "--token-file", "/nonexistent", "--node", "given-1", "--cred", cred, "--yes", target)
	if code != 0 || flashedConfig(t, target).Credential != cred {
		t.Errorf("--cred: exit %d\n%s", code, msg)
	}

	// --controller-pin with an https:// controller: both on the medium.
	pin := strings.Repeat("c3", 32)
	code, msg = captureRun(t, "flash", "--image", src, "--controller", "https://10.0.0.5:8443", "--controller-pin", pin, "--node", "given-1", "--cred", cred, "--yes", target)
	if c := flashedConfig(t, target); code != 0 || c.ControllerPin != pin || c.Controller != "https://10.0.0.5:8443" {
		t.Errorf("--controller-pin: exit %d, %+v\n%s", code, c, msg)
	}

	if sumFile(t, src) != srcSum {
		t.Fatal("the source image changed")
	}
}

func TestFlashCommandConfirm(t *testing.T) {
	src := flashSource(t)
	api, token := testController(t)
	target := filepath.Join(t.TempDir(), "stick.img")
	if err := os.WriteFile(target, []byte("old data"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"flash", "--image", src, "--controller", "http://10.0.0.5:8080", "--server", api, "--token-file", token, "--node", "ask-1", target}
	defer func() { flashStdin = os.Stdin }()
	for _, tc := range []struct {
		answer string
		code   int
		want   string
	}{
		{"n\n", 1, "aborted: nothing was written"},
		{"", 1, "no answer on stdin"},
		{"yes\n", 0, "flashed and verified"},
	} {
		flashStdin = strings.NewReader(tc.answer)
		code, msg := captureRun(t, args...)
		if code != tc.code || !strings.Contains(msg, tc.want) || !strings.Contains(msg, "Everything on "+target+" will be lost") ||
			!strings.Contains(msg, "credential created at "+api) {
			t.Errorf("answer %q: exit %d, want %d with %q:\n%s", tc.answer, code, tc.code, tc.want, msg)
		}
		if tc.code != 0 {
			if b, _ := os.ReadFile(target); string(b) != "old data" {
				t.Errorf("answer %q: target written", tc.answer)
			}
			if st := nodeStatus(t, api, token, "ask-1"); st != http.StatusNotFound {
				t.Errorf("answer %q: node looked up with HTTP %d, want 404: nothing may change at the controller before the answer", tc.answer, st)
			}
		}
	}
	if c := flashedConfig(t, target); c.NodeID != "ask-1" || checkIn(t, api, "ask-1", c.Credential) != http.StatusOK {
		t.Errorf("after yes: %+v", c)
	}
}

func TestFlashCommandUsage(t *testing.T) {
	src := flashSource(t)
	dir := t.TempDir()
	target := filepath.Join(dir, "t.img")
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"flash", "--image", src, target}, 2, "--node is required"},
		{[]string{"flash", "--image", src, "--node", "a/b", "--cred", "abcdefghijklmnop", target}, 2, "node ID has '/'"},
		{[]string{"flash", "--image", src, "--node", "n", "--cred", "short", target}, 2, "--cred"},
		{[]string{"flash", "--image", src, "--node", "n", "--controller", "https://x", "--cred", "abcdefghijklmnop", target}, 2, "controller https://x is https:// but there is no controller pin"},
		{[]string{"flash", "--image", src, "--node", "n", "--controller", "https://x", "--controller-pin", "ABCD", "--cred", "abcdefghijklmnop", target}, 2, "--controller-pin: controller_pin: controller pin must be 64"},
		{[]string{"flash", "--image", src, "--node", "n", "--controller", "http://x", "--controller-pin", strings.Repeat("ab", 32), "--cred", "abcdefghijklmnop", target}, 2, "controller http://x is http:// but a controller pin is set"},
		{[]string{"flash", "--image", src, "--node", "n"}, 2, "usage"},
		{[]string{"flash", "--image", src, "--node", "n", "--cred", "abcdefghijklmnop", "--yes", src}, 1, "is the source image"},
		{[]string{"flash", "--image", src, "--node", "n", "--cred", "abcdefghijklmnop", "--yes", dir}, 1, "not a regular file or block device"},
		{[]string{"flash", "--image", filepath.Join(dir, "none.img"), "--node", "n", target}, 1, "no such file"},
		{[]string{"flash", "--list", "extra"}, 2, "--list takes no other arguments"},
	} {
		code, msg := captureRun(t, tc.args...)
		if code != tc.code || !strings.Contains(msg, tc.want) {
			t.Errorf("dpxe %s: exit %d, want %d with %q:\n%s", strings.Join(tc.args, " "), code, tc.code, tc.want, msg)
		}
	}
	if fileExists(target) {
		t.Error("a refused flash created the target")
	}
}

// TestFlashList lists a fake removable device whose node is a flashed
// image file, and a blank one, through a fake sysfs.
func TestFlashList(t *testing.T) {
	src := flashSource(t)
	root := t.TempDir()
	w := func(p, s string) {
		p = filepath.Join(root, p)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(s+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []struct{ name, dev, model string }{{"sdx", "8:240", "Cruzer"}, {"sdy", "8:224", "Blank"}} {
		dir := "sys/devices/usb/block/" + d.name
		w(dir+"/dev", d.dev)
		w(dir+"/size", "131072")
		w(dir+"/removable", "1")
		w(dir+"/device/vendor", "ACME")
		w(dir+"/device/model", d.model)
		os.MkdirAll(filepath.Join(root, "sys/block"), 0o755)
		os.MkdirAll(filepath.Join(root, "sys/dev/block"), 0o755)
		os.Symlink(filepath.Join(root, dir), filepath.Join(root, "sys/block", d.name))
		os.Symlink(filepath.Join(root, dir), filepath.Join(root, "sys/dev/block", d.dev))
	}
	os.MkdirAll(filepath.Join(root, "dev"), 0o755)
	if code, msg := captureRun(t, "flash", "--image", src, "--node", "listed-1", "--controller", "http://10.1.1.1:80", "--cred", "abcdefghijklmnop", "--yes", filepath.Join(root, "dev/sdx")); code != 0 {
		t.Fatalf("flash: %s", msg)
	}
	if err := os.WriteFile(filepath.Join(root, "dev/sdy"), bytes.Repeat([]byte{0}, 64<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	flashEnv = func() *flash.Env {
		e := flash.System()
		e.SysRoot, e.DevRoot = filepath.Join(root, "sys"), filepath.Join(root, "dev")
		return e
	}
	defer func() { flashEnv = flash.System }()
	code, msg := captureRun(t, "flash", "--list")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, msg)
	}
	lines := strings.Split(strings.TrimSpace(msg), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "DEVICE") {
		t.Fatalf("want a header and two devices:\n%s", msg)
	}
	for i, want := range [][]string{
		{filepath.Join(root, "dev/sdx"), "64.0 MiB", "yes", "ACME Cruzer", "yes", "listed-1", "http://10.1.1.1:80"},
		{filepath.Join(root, "dev/sdy"), "64.0 MiB", "yes", "ACME Blank", "no", "-", "-"},
	} {
		got := strings.Join(strings.Fields(lines[i+1]), " ")
		if !strings.HasPrefix(got, strings.Join(want, " ")) {
			t.Errorf("line %d: %q, want %q", i+1, got, strings.Join(want, " "))
		}
	}
}

// TestFlashCommandLoopDevice runs `dpxe flash` on a loop device backed by a
// file in t.TempDir() (root and losetup only) and reads the config back
// with `dpxe config show`.
func TestFlashCommandLoopDevice(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("loop devices need root")
	}
	if _, err := exec.LookPath("losetup"); err != nil {
		t.Skip("losetup not installed")
	}
	src := flashSource(t)
	srcSum := sumFile(t, src)
	api, token := testController(t)
	backing := filepath.Join(t.TempDir(), "backing.img")
	if err := os.WriteFile(backing, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(backing, image.USBImageSize); err != nil {
		t.Fatal(err)
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
	args := []string{"flash", "--image", src, "--node", "loop-cli-1", "--controller", "http://10.0.0.5:8080", "--server", api, "--token-file", token, "--yes", dev}
	code, msg := captureRun(t, args...)
	if code != 1 || !strings.Contains(msg, "is not a removable device") || !strings.Contains(msg, "--force") {
		t.Fatalf("without --force: exit %d\n%s", code, msg)
	}
	if nodeStatus(t, api, token, "loop-cli-1") != http.StatusNotFound {
		t.Error("a refused flash created the node at the controller")
	}
	code, msg = captureRun(t, append([]string{"flash", "--force"}, args[1:]...)...)
	if code != 0 || !strings.Contains(msg, "read back with O_DIRECT") || !strings.Contains(msg, "(the device already held them)") {
		t.Fatalf("with --force: exit %d\n%s", code, msg)
	}
	code, msg = captureRun(t, append([]string{"flash", "--force", "--rotate", "--skip-zeroed=false"}, args[1:]...)...)
	if code != 0 || !strings.Contains(msg, "wrote 67108864 bytes, skipped 0 zero bytes (none: every byte written)") {
		t.Fatalf("--skip-zeroed=false: exit %d\n%s", code, msg)
	}
	code, msg = captureRun(t, "config", "show", dev)
	if code != 0 || !strings.Contains(msg, "# effective: node=loop-cli-1 controller=http://10.0.0.5:8080 cred=********") {
		t.Errorf("dpxe config show %s: exit %d\n%s", dev, code, msg)
	}
	if c := flashedConfig(t, dev); checkIn(t, api, "loop-cli-1", c.Credential) != http.StatusOK {
		t.Error("the credential on the loop device does not check in")
	}
	if sumFile(t, src) != srcSum {
		t.Fatal("the source image changed")
	}
}
