package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/image/flash"
)

// TestCLIJSONOffline (issue 23.5): the commands that print without a
// controller have --json too: flash (and flash --list), config show and
// set, build; what they print decodes into the documented shape with no
// field left over.
func TestCLIJSONOffline(t *testing.T) {
	src := flashSource(t)
	dir := t.TempDir()
	target := filepath.Join(dir, "stick.img")
	const cred = "Json-credential_0123456789"
	var f flashOut
	mustJSON(t, &f, "flash", "--image", src, "--node", "json-1", "--controller", "http://10.0.0.5:8080", "--cred", cred, "--yes", target)
	if f.Target != target || f.Size != image.USBImageSize || len(f.SHA256) != 64 || f.Config != "node=json-1 controller=http://10.0.0.5:8080 cred=********" ||
		f.Credential != "given with --cred" || f.Written+f.Skipped != f.Size {
		t.Errorf("flash --json: %+v", f)
	}

	var shown configOut
	mustJSON(t, &shown, "config", "show", target)
	if shown.Image != target || shown.LBA == 0 || !strings.Contains(shown.Text, "cred=****") || strings.Contains(shown.Text, cred) ||
		shown.Effective != f.Config || shown.Error != "" {
		t.Errorf("config show --json: %+v", shown)
	}
	mustJSON(t, &shown, "config", "show", target, "--reveal")
	if !strings.Contains(shown.Effective, "cred="+cred) {
		t.Errorf("config show --reveal --json: %+v", shown)
	}
	var set configOut
	mustJSON(t, &set, "config", "set", target, "capacity=8")
	if set.Effective != "node=json-1 controller=http://10.0.0.5:8080 cred=******** capacity=8" {
		t.Errorf("config set --json: %+v", set)
	}

	flashEnv = func() *flash.Env {
		e := flash.System()
		e.SysRoot, e.DevRoot = filepath.Join(dir, "sys"), filepath.Join(dir, "dev")
		return e
	}
	defer func() { flashEnv = flash.System }()
	os.MkdirAll(filepath.Join(dir, "sys", "block"), 0o755)
	var list struct {
		Devices []any `json:"devices"`
	}
	mustJSON(t, &list, "flash", "--list")
	if list.Devices == nil || len(list.Devices) != 0 {
		t.Errorf("flash --list --json with no devices: %+v", list)
	}

	if _, err := exec.LookPath("nasm"); err != nil {
		t.Skip("nasm not installed: build --json not checked")
	}
	var m image.Manifest
	mustJSON(t, &m, "build", "--out", filepath.Join(dir, "out"))
	if m.KernelVersion == "" || len(m.Artifacts) == 0 {
		t.Errorf("build --json: %+v", m)
	}
}
