package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/image/smoke"
)

func TestParseSmokeFlags(t *testing.T) {
	f, paths, err := parseSmokeFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if f.out != "out" || len(paths) != len(smoke.Paths) || f.timeout != smoke.DefaultTimeout || f.accel != smoke.AccelAuto || f.json || f.junit != "" {
		t.Errorf("defaults %+v, %d paths", f, len(paths))
	}
	f, paths, err = parseSmokeFlags([]string{"--out", "o2", "--paths", "bios", "--junit", "s.xml", "--json", "--timeout", "30s",
		"--jobs", "1", "--seed", "4294967295", "--accel", "tcg", "--kernel-version", "0.1.0", "--gateway-emulator", "/x/emu"})
	if err != nil {
		t.Fatal(err)
	}
	if f.out != "o2" || len(paths) != 4 || f.junit != "s.xml" || !f.json || f.timeout != 30*time.Second || f.jobs != 1 ||
		f.seed != 4294967295 || f.accel != "tcg" || f.kernelVersion != "0.1.0" || f.gatewayEmulator != "/x/emu" {
		t.Errorf("parsed %+v, %d paths", f, len(paths))
	}
	for _, bad := range [][]string{
		{"--paths", "floppy"}, {"--timeout", "0s"}, {"--jobs", "-1"}, {"--seed", "-3"}, {"--seed", "4294967296"},
		{"--accel", "hvf"}, {"extra"},
	} {
		if _, _, err := parseSmokeFlags(bad); !errors.Is(err, errUsage) {
			t.Errorf("%q: error %v, want a usage error", bad, err)
		}
	}
}

func TestFindGatewayEmulator(t *testing.T) {
	dir := t.TempDir()
	self := filepath.Join(dir, "dpxe")
	if got := findGatewayEmulator("/given", self); got != "/given" {
		t.Errorf("flag: %q", got)
	}
	t.Setenv("PATH", t.TempDir())
	t.Chdir(t.TempDir())
	if got := findGatewayEmulator("", self); got != "" {
		t.Errorf("nothing anywhere: %q", got)
	}
	os.Mkdir("bin", 0o755)
	os.WriteFile(filepath.Join("bin", gatewayEmulatorName), []byte("#!/bin/sh\n"), 0o755)
	if got := findGatewayEmulator("", self); !strings.HasSuffix(got, "/bin/"+gatewayEmulatorName) || !filepath.IsAbs(got) {
		t.Errorf("bin/ of the working directory: %q", got)
	}
	beside := filepath.Join(dir, gatewayEmulatorName)
	os.WriteFile(beside, []byte("#!/bin/sh\n"), 0o755)
	if got := findGatewayEmulator("", self); got != beside {
		t.Errorf("beside dpxe: %q, want %q", got, beside)
	}
	os.Chmod(beside, 0o644)
	if got := findGatewayEmulator("", self); got == beside {
		t.Error("a file that is not executable was chosen")
	}
}

// TestSmokeReportsMissingArtifacts runs the command on an empty output
// directory: every path fails naming the missing manifest, the JUnit file
// is still written, and the exit status is 1.
func TestSmokeReportsMissingArtifacts(t *testing.T) {
	dir := t.TempDir()
	junit := filepath.Join(dir, "smoke.xml")
	f, paths, err := parseSmokeFlags([]string{"--out", filepath.Join(dir, "out"), "--paths", "kernel-seabios", "--junit", junit, "--seed", "5"})
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	err = smokeMain(context.Background(), f, paths, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "1 of 1 paths failed") {
		t.Errorf("error %v", err)
	}
	out := stdout.String()
	for _, want := range []string{"dpxe smoke: 1 paths from " + filepath.Join(dir, "out") + ", 2m0s per path, seed 5",
		"FAIL  kernel-seabios", "manifest.json: build the artifacts first (make image", "FAIL: 1 paths, 0 passed, 1 failed"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	b, err := os.ReadFile(junit)
	if err != nil || !strings.Contains(string(b), `<failure message="artifacts: no `) {
		t.Errorf("JUnit file: %v\n%s", err, b)
	}
	if code := run([]string{"smoke", "--paths", "nope"}); code != 2 {
		t.Errorf("bad --paths: exit %d, want 2", code)
	}
}
