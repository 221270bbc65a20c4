package main

import (
	"path/filepath"
	"testing"
)

// TestRestartFatalUsage: bad arguments are usage errors (exit 2) before any
// request is made; the full path (a kernel node's FATAL shard restarted) is
// tools/e2e TestKernelGatewayFaults.
func TestRestartFatalUsage(t *testing.T) {
	tok := filepath.Join(t.TempDir(), "missing.token")
	for _, args := range [][]string{
		{"restart-fatal", "--token-file", tok},
		{"restart-fatal", "--token-file", tok, "bad id"},
		{"restart-fatal", "--token-file", tok, "node-1", "x"},
		{"restart-fatal", "--token-file", tok, "node-1", "-1"},
		{"restart-fatal", "--token-file", tok, "node-1", "131072"},
	} {
		if code := run(args); code != 2 {
			t.Errorf("dpxe %q: exit %d, want 2 (usage)", args, code)
		}
	}
	// Well-formed but no token file: an error, not a usage error.
	if code := run([]string{"restart-fatal", "--token-file", tok, "node-1", "0", "131071"}); code != 1 {
		t.Errorf("restart-fatal without a token file: exit %d, want 1", code)
	}
}
