// Package deb holds the test of the dpxe Debian package that build.sh
// makes (make deb).
package deb

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// serveDeadline bounds the wait for the installed dpxe serve to listen.
const serveDeadline = 30 * time.Second

func need(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed: package test skipped", tool)
		}
	}
}

func sh(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestDebianPackage builds the package, checks its control data and file
// list, verifies the systemd unit, installs it into a temporary root with
// dpkg, and starts the installed binary with the installed configuration.
func TestDebianPackage(t *testing.T) {
	need(t, "dpkg-deb", "dpkg", "git")
	if testing.Short() {
		t.Skip("builds dpxe and runs nfpm")
	}
	out := t.TempDir()
	sh(t, "./build.sh", out)
	debs, _ := filepath.Glob(filepath.Join(out, "dpxe_*_amd64.deb"))
	if len(debs) != 1 {
		t.Fatalf("build.sh made %v", debs)
	}
	deb := debs[0]

	info := sh(t, "dpkg-deb", "--info", deb)
	for _, want := range []string{"Package: dpxe", "Architecture: amd64", "Depends: libc6", "Section: net", "postinst", "prerm"} {
		if !strings.Contains(info, want) {
			t.Errorf("dpkg-deb --info lacks %q:\n%s", want, info)
		}
	}
	if conff := sh(t, "dpkg-deb", "--field", deb, "Version"); !regexp.MustCompile(`^0\.0\.0~git\d{14}\.[0-9a-f]+\n$`).MatchString(conff) {
		t.Errorf("version %q", conff)
	}
	contents := sh(t, "dpkg-deb", "--contents", deb)
	for _, want := range []struct{ mode, path string }{
		{"-rwxr-xr-x", "./usr/bin/dpxe"},
		{"-rw-r--r--", "./usr/lib/systemd/system/dpxe-serve.service"},
		{"-rw-r--r--", "./usr/lib/sysusers.d/dpxe.conf"},
		{"-rw-r--r--", "./etc/dpxe/serve.json"},
		{"-rw-r--r--", "./usr/share/doc/dpxe/README.md"},
		{"-rw-r--r--", "./usr/share/doc/dpxe/metrics.md"},
		{"-rw-r--r--", "./usr/share/doc/dpxe/examples/dpxe-rules.yml"},
		{"-rw-r--r--", "./usr/share/doc/dpxe/examples/dpxe-fleet.json"},
	} {
		re := `(?m)^` + regexp.QuoteMeta(want.mode) + ` root/root +\d+ \S+ \S+ ` + regexp.QuoteMeta(want.path) + `$`
		if !regexp.MustCompile(re).MatchString(contents) {
			t.Errorf("dpkg-deb --contents has no %s root/root %s:\n%s", want.mode, want.path, contents)
		}
	}
	ctl := t.TempDir()
	sh(t, "dpkg-deb", "--control", deb, ctl)
	if b, err := os.ReadFile(filepath.Join(ctl, "conffiles")); err != nil || strings.TrimSpace(string(b)) != "/etc/dpxe/serve.json" {
		t.Errorf("conffiles %q %v, want /etc/dpxe/serve.json", b, err)
	}

	// Install into a temporary root. The maintainer scripts run outside it
	// with DPKG_ROOT set, and then create no user on this machine.
	root := t.TempDir()
	admin := filepath.Join(root, "var/lib/dpkg")
	for _, d := range []string{admin + "/info", admin + "/updates", admin + "/triggers"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(admin, "status"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	inst := sh(t, "dpkg", "--root="+root, "--force-script-chrootless", "--force-depends", "--force-not-root", "--no-triggers", "-i", deb)
	if !strings.Contains(inst, "not creating the dpxe user under DPKG_ROOT") {
		t.Errorf("postinst did not run (or did not see DPKG_ROOT):\n%s", inst)
	}
	status := sh(t, "dpkg", "--root="+root, "-s", "dpxe")
	if !strings.Contains(status, "Status: install ok installed") {
		t.Fatalf("dpkg -s dpxe in the root:\n%s", status)
	}
	bin := filepath.Join(root, "usr/bin/dpxe")
	if fi, err := os.Stat(bin); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("installed binary: %v %v", fi, err)
	}

	unit := filepath.Join(root, "usr/lib/systemd/system/dpxe-serve.service")
	unitText, err := os.ReadFile(unit)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"User=dpxe", "StateDirectory=dpxe", "ExecStart=/usr/bin/dpxe serve --config /etc/dpxe/serve.json",
		"CapabilityBoundingSet=CAP_NET_BIND_SERVICE CAP_NET_RAW", "AmbientCapabilities=CAP_NET_BIND_SERVICE CAP_NET_RAW",
		"NoNewPrivileges=yes", "ProtectSystem=strict"} {
		if !strings.Contains(string(unitText), want+"\n") {
			t.Errorf("unit lacks %q", want)
		}
	}
	verifyUnit(t, root)

	// The installed binary starts with the installed configuration (the
	// database and listener moved into the test's directories).
	state := t.TempDir()
	cmd := exec.Command(bin, "serve", "--config", filepath.Join(root, "etc/dpxe/serve.json"),
		"--db", filepath.Join(state, "dpxe.db"), "--listen", "127.0.0.1:0", "--no-dashboard")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	timeout := time.After(serveDeadline)
	var log strings.Builder
wait:
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("installed dpxe serve exited:\n%s", log.String())
			}
			log.WriteString(l + "\n")
			if strings.Contains(l, "msg=listening") {
				break wait
			}
		case <-timeout:
			cmd.Process.Kill()
			t.Fatalf("installed dpxe serve did not listen within %v:\n%s", serveDeadline, log.String())
		}
	}
	cmd.Process.Signal(syscall.SIGTERM)
	for range lines {
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("dpxe serve after SIGTERM: %v\n%s", err, log.String())
	}
}

// verifyUnit runs systemd-analyze verify on the installed unit, in a copy
// of the root that also holds this machine's targets and slices (which
// the unit's default dependencies name). Any warning fails the test:
// systemd-analyze exits 0 on an unknown key.
func verifyUnit(t *testing.T, root string) {
	t.Helper()
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Log("systemd-analyze not installed: the unit is not verified")
		return
	}
	units := filepath.Join(root, "usr/lib/systemd/system")
	for _, pat := range []string{"/lib/systemd/system/*.target", "/lib/systemd/system/*.slice"} {
		files, _ := filepath.Glob(pat)
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			if err := os.WriteFile(filepath.Join(units, filepath.Base(f)), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	out, err := exec.Command("systemd-analyze", "verify", "--root="+root, "dpxe-serve.service").CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	sec, err := exec.Command("systemd-analyze", "security", "--offline=true", "--root="+root, "dpxe-serve.service").CombinedOutput()
	if m := regexp.MustCompile(`Overall exposure level for dpxe-serve\.service: ([0-9.]+)`).FindSubmatch(sec); err == nil && m != nil {
		t.Logf("systemd-analyze security: exposure %s (0 best, 10 worst)", m[1])
	}
}
