package main

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/discord-pxe/dpxe/image"
)

// captureRun runs the dpxe command line args and returns its exit status and
// what it wrote to stdout and stderr.
func captureRun(t *testing.T, args ...string) (int, string) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	oldOut, oldErr := os.Stdout, os.Stderr
	os.Stdout, os.Stderr = w, w
	done := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(r)
		done <- b
	}()
	code := run(args)
	os.Stdout, os.Stderr = oldOut, oldErr
	w.Close()
	return code, string(<-done)
}

// TestBuildAndConfigCommands builds the real embedded kernel with `dpxe
// build`, then edits the node config of the new usb.img with `dpxe config`.
func TestBuildAndConfigCommands(t *testing.T) {
	if _, err := exec.LookPath("nasm"); err != nil {
		t.Skip("nasm not installed (apt-get install nasm)")
	}
	out := t.TempDir()
	if code, msg := captureRun(t, "build", "--out", out); code != 0 {
		t.Fatalf("dpxe build: exit %d\n%s", code, msg)
	}
	img := filepath.Join(out, "usb.img")
	before, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"config", "show", img}, 0, "# effective: nothing set"},
		{[]string{"config", "set", img, "node=rack1-n07", "controller=http://10.0.0.1:8080", "cred=abcdefghijklmnop1234"}, 0, "cred=********"},
		{[]string{"config", "show", img}, 0, "# effective: node=rack1-n07 controller=http://10.0.0.1:8080 cred=********"},
		{[]string{"config", "show", "--reveal", img}, 0, "cred=abcdefghijklmnop1234"},
		{[]string{"config", "set", img, "shards=4", "node="}, 0, "DPXE.CFG now: controller=http://10.0.0.1:8080 cred=******** shards=4"},
		{[]string{"config", "set", img, "colour=blue"}, 2, `unknown key "colour"`},
		{[]string{"config", "set", img, "shards=129"}, 2, "129 is out of range 1..128"},
		{[]string{"config", "set", img, "node=a/b"}, 2, "node ID has '/'"},
		{[]string{"config", "set", img}, 2, "usage"},
		{[]string{"config", "frob", img}, 2, `unknown config verb "frob"`},
		{[]string{"config", "show", filepath.Join(out, "kernel.bin")}, 1, "not a Discord-PXE USB image"},
		{[]string{"config", "set", "--reset", img, "node=n2"}, 0, "DPXE.CFG now: node=n2"},
		{[]string{"config", "show", img}, 0, "# effective: node=n2\n"},
	} {
		code, msg := captureRun(t, tc.args...)
		if code != tc.code || !strings.Contains(msg, tc.want) {
			t.Errorf("dpxe %s: exit %d, want %d with %q; output:\n%s", strings.Join(tc.args, " "), code, tc.code, tc.want, msg)
		}
	}
	// Only DPXE.CFG's 4096 bytes changed.
	after, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := image.ReadUSBConfig(img)
	if err != nil {
		t.Fatal(err)
	}
	lo, hi := int(cfg.Offset), int(cfg.Offset)+4096
	if !bytes.Equal(before[:lo], after[:lo]) || !bytes.Equal(before[hi:], after[hi:]) {
		t.Error("dpxe config changed bytes outside DPXE.CFG")
	}
	if bytes.Equal(before[lo:hi], after[lo:hi]) {
		t.Error("DPXE.CFG did not change")
	}
}
