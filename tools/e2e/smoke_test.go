package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/xml"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/image/qemu"
	"github.com/discord-pxe/dpxe/image/smoke"
)

// The unprivileged user the smoke test runs as when the tests run as root.
const (
	nobodyUID = 65534
	nobodyGID = 65534
)

// ciSmokeArgs returns the arguments of the `bin/dpxe smoke ...` command
// in docs/ci.md. The GitHub Actions workflow and the GitLab job must run
// the same one.
func ciSmokeArgs(t *testing.T) []string {
	t.Helper()
	doc, err := os.ReadFile("../../docs/ci.md")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^\s*(?:- )?(?:run: )?make image build && bin/dpxe smoke( [^\n]*)?$`)
	ms := re.FindAllStringSubmatch(string(doc), -1)
	if len(ms) < 2 {
		t.Fatalf("docs/ci.md has %d `make image build && bin/dpxe smoke ...` lines, want the GitHub and the GitLab one", len(ms))
	}
	for _, m := range ms[1:] {
		if m[1] != ms[0][1] {
			t.Fatalf("docs/ci.md runs two smoke commands: %q and %q", ms[0][0], m[0])
		}
	}
	return strings.Fields(ms[0][1])
}

// smokeSandbox is a working directory as a CI job sees it after
// `make image build`: out/ (the images of this test run), bin/dpxe and
// bin/gateway-emulator, all readable by the unprivileged user, who owns
// the directory.
type smokeSandbox struct {
	dir  string
	cred *syscall.Credential // nil: the tests already run unprivileged
}

func newSmokeSandbox(t *testing.T) *smokeSandbox {
	t.Helper()
	s := &smokeSandbox{}
	if os.Geteuid() == 0 {
		s.cred = &syscall.Credential{Uid: nobodyUID, Gid: nobodyGID, NoSetGroups: true}
	}
	dir, err := os.MkdirTemp("", "dpxe-smoke-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s.dir = dir
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	for bin, pkg := range map[string]string{"dpxe": "./cmd/dpxe", "gateway-emulator": "./tools/cmd/gateway-emulator"} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "bin", bin), pkg)
		cmd.Dir = "../.."
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, b)
		}
	}
	// Share the images make test built when the user can read them;
	// otherwise copy them (a checkout under a private home directory).
	out := outDir(t)
	if s.readable(t, out) {
		if err := os.Symlink(out, filepath.Join(dir, "out")); err != nil {
			t.Fatal(err)
		}
	} else {
		t.Logf("%s is not readable by uid %d: copying the images", out, nobodyUID)
		s.copyOut(t, out, filepath.Join(dir, "out"))
	}
	if s.cred != nil {
		if err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(p, nobodyUID, nobodyGID)
		}); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// readable reports whether the sandbox user can read every artifact in out.
func (s *smokeSandbox) readable(t *testing.T, out string) bool {
	if s.cred == nil {
		return true
	}
	args := []string{}
	for _, f := range []string{image.KernelFile, image.USBImageFile, image.ManifestFile, image.IPXETemplateFile, filepath.Join(image.NetbootDir, image.KernelFile)} {
		args = append(args, "-r", filepath.Join(out, f), "-a")
	}
	cmd := exec.Command("test", append(args, "-x", out)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	return cmd.Run() == nil
}

// copyOut copies the artifacts of from into a new directory to.
func (s *smokeSandbox) copyOut(t *testing.T, from, to string) {
	t.Helper()
	for _, f := range []string{image.KernelFile, image.USBImageFile, image.ManifestFile, image.IPXETemplateFile, filepath.Join(image.NetbootDir, image.KernelFile)} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(to, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		copyImage(t, filepath.Join(from, f), filepath.Join(to, f))
	}
	if s.cred != nil {
		filepath.Walk(to, func(p string, _ os.FileInfo, err error) error {
			if err == nil {
				os.Lchown(p, nobodyUID, nobodyGID)
			}
			return err
		})
	}
}

// run runs bin/dpxe with args in the sandbox as its user and returns the
// combined output and the exit status.
func (s *smokeSandbox) run(t *testing.T, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(s.dir, "bin", "dpxe"), args...)
	cmd.Dir = s.dir
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + s.dir, "TMPDIR=" + s.dir}
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	var b bytes.Buffer
	cmd.Stdout, cmd.Stderr = &b, &b
	start := time.Now()
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("dpxe %s: %v", strings.Join(args, " "), err)
	}
	t.Logf("dpxe %s: exit %d in %v", strings.Join(args, " "), code, time.Since(start).Round(100*time.Millisecond))
	return b.String(), code
}

// junitReport is a JUnit file as a CI system reads it.
type junitReport struct {
	Tests    int `xml:"tests,attr"`
	Failures int `xml:"failures,attr"`
	Errors   int `xml:"errors,attr"`
	Suites   []struct {
		Cases []struct {
			Name    string `xml:"name,attr"`
			Time    string `xml:"time,attr"`
			Failure *struct {
				Message string `xml:"message,attr"`
			} `xml:"failure"`
			Error *struct {
				Message string `xml:"message,attr"`
			} `xml:"error"`
			SystemOut string `xml:"system-out"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

func (s *smokeSandbox) junit(t *testing.T, name string) *junitReport {
	t.Helper()
	p := filepath.Join(s.dir, name)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("no JUnit report: %v", err)
	}
	if s.cred != nil {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil || st.Uid != nobodyUID {
			t.Errorf("%s is owned by uid %d, want %d: the smoke test did not run unprivileged", name, st.Uid, nobodyUID)
		}
	}
	var r junitReport
	if err := xml.Unmarshal(b, &r); err != nil {
		t.Fatalf("%s is not JUnit XML: %v", name, err)
	}
	if len(r.Suites) != 1 {
		t.Fatalf("%s has %d test suites", name, len(r.Suites))
	}
	return &r
}

// TestSmokeUnprivileged runs docs/ci.md's smoke command as an
// unprivileged user on the images make test built: every path must pass
// and the JUnit file must say so, path by path. Then it breaks copies of
// the images the ways an operator's build can break and wants each to
// fail with a message that names the fault.
func TestSmokeUnprivileged(t *testing.T) {
	needQEMU(t, qemu.OVMF)
	for _, rom := range []string{smoke.ROMBIOS, smoke.ROMUEFI} {
		if _, err := os.Stat(rom); err != nil {
			t.Skipf("skipping: %s missing (apt-get install ipxe-qemu)", rom)
		}
	}
	args := ciSmokeArgs(t)
	s := newSmokeSandbox(t)

	out, code := s.run(t, append([]string{"smoke"}, args...)...)
	t.Logf("dpxe smoke %s:\n%s", strings.Join(args, " "), out)
	if code != 0 {
		t.Errorf("exit status %d, want 0", code)
	}
	r := s.junit(t, "smoke.xml")
	if r.Tests != len(smoke.Paths) || r.Failures != 0 || r.Errors != 0 {
		t.Errorf("JUnit: %d tests, %d failures, %d errors; want %d, 0, 0", r.Tests, r.Failures, r.Errors, len(smoke.Paths))
	}
	cases := map[string]bool{}
	for _, c := range r.Suites[0].Cases {
		cases[c.Name] = true
		awaited := "selftest: pass"
		if strings.HasPrefix(c.Name, "netboot-") {
			awaited = "shard 0: READY session"
		}
		if c.Failure != nil || c.Error != nil || !strings.Contains(c.SystemOut, awaited) || c.Time == "" {
			t.Errorf("JUnit case %s: failure %v, error %v, console has %q: %v", c.Name, c.Failure, c.Error, awaited, strings.Contains(c.SystemOut, awaited))
		}
	}
	for _, p := range smoke.Paths {
		if !cases[p.Name] {
			t.Errorf("no JUnit case for %s", p.Name)
		}
		if !regexp.MustCompile(`(?m)^PASS +` + p.Name + ` +\d+\.\ds to `).MatchString(out) {
			t.Errorf("no PASS line with the time to the awaited line for %s", p.Name)
		}
	}

	t.Run("broken", func(t *testing.T) { smokeBroken(t, s) })
}

// smokeBroken breaks copies of the images and wants dpxe smoke to fail
// each with the fault named, as the same unprivileged user.
func smokeBroken(t *testing.T, s *smokeSandbox) {
	kernel, err := os.ReadFile(filepath.Join(s.dir, "out", image.KernelFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		dir   string
		paths string
		edit  func(t *testing.T, out string)
		want  []string // in the output, one per selected path
	}{
		{"corrupted kernel in usb.img", "usb-kernel", "usb-seabios,usb-ovmf", func(t *testing.T, out string) {
			editBytes(t, filepath.Join(out, image.USBImageFile), image.KernelLBA*image.SectorSize+4096, 0xff)
		}, []string{"FAIL  usb-seabios", "FAIL  usb-ovmf", "the BIOS copy in the MBR gap differs at byte 4096 of kernel.bin (image offset 4608, LBA 9)"}},
		{"bad boot config", "usb-config", "disk-seabios", func(t *testing.T, out string) {
			raw := make([]byte, appliance.MaxBootConfigLen)
			copy(raw, "node=rack-1 bogus=1")
			loc, err := image.ReadUSBConfig(filepath.Join(out, image.USBImageFile))
			if err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(filepath.Join(out, image.USBImageFile), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteAt(raw, loc.Offset); err != nil {
				t.Fatal(err)
			}
		}, []string{"FAIL  disk-seabios", `\DPXE.CFG: boot config: byte 12: key "bogus": unknown key`}},
		{"another kernel than the manifest's", "other-kernel", "kernel-seabios", func(t *testing.T, out string) {
			// A kernel.bin rebuilt from other sources with a manifest to
			// match: it boots, and the banner gives it away.
			k := bytes.Replace(kernel, []byte("Discord-PXE shard kernel 0.1.0"), []byte("Discord-PXE shard kernel 0.1.9"), 1)
			if bytes.Equal(k, kernel) {
				t.Skip("the kernel's banner is not \"Discord-PXE shard kernel 0.1.0\"")
			}
			os.WriteFile(filepath.Join(out, image.KernelFile), k, 0o644)
			rewriteManifestDigest(t, out, image.KernelFile, k)
		}, []string{"FAIL  kernel-seabios", "banner: kernel 0.1.9 on the console, manifest.json says 0.1.0", "serial console, last"}},
		{"another trust set than the manifest's", "other-trust", "kernel-seabios", func(t *testing.T, out string) {
			// A manifest whose anchor set is not the one compiled into
			// kernel.bin (an image rebuilt with other --trust files).
			editManifest(t, out, func(m *image.Manifest) {
				if m.Trust == nil {
					t.Fatal("manifest.json records no trust set")
				}
				m.Trust.SHA256 = strings.Repeat("0", 64)
			})
		}, []string{"FAIL  kernel-seabios", `anchors: "tls: anchors=`, `manifest.json says "tls: anchors=`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			broken := filepath.Join(s.dir, "broken-"+tc.dir)
			s.copyOut(t, filepath.Join(s.dir, "out"), broken)
			tc.edit(t, broken)
			if s.cred != nil {
				os.Lchown(filepath.Join(broken, image.USBImageFile), nobodyUID, nobodyGID)
			}
			junit := "junit-" + filepath.Base(broken) + ".xml"
			out, code := s.run(t, "smoke", "--out", filepath.Base(broken), "--paths", tc.paths, "--junit", junit)
			if code != 1 {
				t.Errorf("exit status %d, want 1", code)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q", w)
				}
			}
			r := s.junit(t, junit)
			if r.Failures != len(strings.Split(tc.paths, ",")) || r.Errors != 0 {
				t.Errorf("JUnit: %d failures, %d errors", r.Failures, r.Errors)
			}
			for _, c := range r.Suites[0].Cases {
				if c.Failure == nil || c.Failure.Message == "" {
					t.Errorf("JUnit case %s has no failure message", c.Name)
				}
			}
			if t.Failed() {
				t.Logf("output:\n%s", out)
			}
		})
	}
}

// editBytes flips the bits of the byte at off in file name with mask.
func editBytes(t *testing.T, name string, off int, mask byte) {
	t.Helper()
	f, err := os.OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := []byte{0}
	if _, err := f.ReadAt(b, int64(off)); err != nil {
		t.Fatal(err)
	}
	b[0] ^= mask
	if _, err := f.WriteAt(b, int64(off)); err != nil {
		t.Fatal(err)
	}
}

// rewriteManifestDigest sets the size and SHA-256 of artifact name in
// out/manifest.json to those of data.
func rewriteManifestDigest(t *testing.T, out, name string, data []byte) {
	t.Helper()
	editManifest(t, out, func(m *image.Manifest) {
		for i := range m.Artifacts {
			if m.Artifacts[i].Path == name {
				m.Artifacts[i].Size = int64(len(data))
				sum := sha256.Sum256(data)
				m.Artifacts[i].SHA256 = hex.EncodeToString(sum[:])
			}
		}
	})
}

// editManifest rewrites out/manifest.json with edit applied.
func editManifest(t *testing.T, out string, edit func(*image.Manifest)) {
	t.Helper()
	p := filepath.Join(out, image.ManifestFile)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var m image.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	edit(&m)
	nb, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, nb, 0o644); err != nil {
		t.Fatal(err)
	}
}
