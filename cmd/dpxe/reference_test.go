package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCommandsReference (issue 23.10): docs/commands.md is what the flag
// sets of this build say. DPXE_UPDATE_DOCS=1 rewrites it.
func TestCommandsReference(t *testing.T) {
	got, err := commandReference()
	if err != nil {
		t.Fatal(err)
	}
	for name := range commands {
		if !strings.Contains(got, "\n## dpxe "+name+"\n") || !strings.Contains(got, "usage: dpxe "+name) {
			t.Errorf("the reference has no section with the usage of %s", name)
		}
	}
	path := filepath.Join("..", "..", "docs", "commands.md")
	if os.Getenv("DPXE_UPDATE_DOCS") == "1" {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (create it: go run ./cmd/dpxe help reference > docs/commands.md)", err)
	}
	if string(want) != got {
		t.Errorf("docs/commands.md is stale: run `go run ./cmd/dpxe help reference > docs/commands.md` (or DPXE_UPDATE_DOCS=1 go test -run TestCommandsReference ./cmd/dpxe)")
	}
}

// TestHelpCommand: `dpxe help NAME` prints that command's flags; an unknown
// name is a usage error.
func TestHelpCommand(t *testing.T) {
	code, out := captureRun(t, "help", "drain")
	if code != 0 || !strings.Contains(out, "usage: dpxe drain") || !strings.Contains(out, "-force") {
		t.Errorf("help drain: exit %d\n%s", code, out)
	}
	if code, out := captureRun(t, "help", "nonesuch"); code != 2 || !strings.Contains(out, "unknown command") {
		t.Errorf("help nonesuch: exit %d\n%s", code, out)
	}
}
