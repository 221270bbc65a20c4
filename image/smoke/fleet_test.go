package smoke

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// peerBinaries builds dpxe and the Gateway emulator once per test binary:
// the netboot paths run them as child processes.
func peerBinaries(t *testing.T) (dpxe, emu string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds dpxe and the Gateway emulator")
	}
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "dpxe-smoke-bin-"); binErr != nil {
			return
		}
		for bin, pkg := range map[string]string{"dpxe": "./cmd/dpxe", "gateway-emulator": "./tools/cmd/gateway-emulator"} {
			cmd := exec.Command("go", "build", "-o", filepath.Join(binDir, bin), pkg)
			cmd.Dir = "../.."
			if out, err := cmd.CombinedOutput(); err != nil {
				binErr = &buildError{pkg, err, string(out)}
				return
			}
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return filepath.Join(binDir, "dpxe"), filepath.Join(binDir, "gateway-emulator")
}

type buildError struct {
	pkg string
	err error
	out string
}

func (e *buildError) Error() string { return "go build " + e.pkg + ": " + e.err.Error() + "\n" + e.out }

// TestFleet starts the real peers of a netboot path without a guest: the
// emulator's URLs name the user-mode gateway, dpxe serve takes the bot
// token and answers the admin API, a node can be created, and both peers
// end with stop.
func TestFleet(t *testing.T) {
	dpxe, emu := peerBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f, err := startFleet(ctx, &Options{DPXE: dpxe, GatewayEmulator: emu}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			f.stop()
		}
	}()
	if !strings.HasPrefix(f.api, "http://127.0.0.1:") || f.guestAPI != "http://"+GuestHost+":"+strings.TrimPrefix(f.api, "http://127.0.0.1:") {
		t.Errorf("API %s, guest API %s", f.api, f.guestAPI)
	}
	cred, err := f.addNode(ctx, "smoke-test")
	if err != nil || len(cred) < 16 {
		t.Fatalf("addNode: %q %v", cred, err)
	}
	if _, err := f.addNode(ctx, "smoke-test"); err == nil || !strings.Contains(err.Error(), "409") {
		t.Errorf("a second node with the same ID: %v, want 409", err)
	}
	if c := controllerCheck(ctx, f, "smoke-test"); c.Status != Fail || !strings.Contains(c.Detail, "live=false") {
		t.Errorf("controller check of a node that never checked in: %+v", c)
	}
	st, err := f.gateway(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Shards) != 0 || len(st.Violations) != 0 {
		t.Errorf("fresh emulator state %+v", st)
	}
	if c := gatewayCheck(ctx, f, "nosuchsession"); c.Status != Fail || !strings.Contains(c.Detail, "no session nosuchsession") {
		t.Errorf("gateway check of a session that does not exist: %+v", c)
	}
	// dpxe serve fetched /gateway/bot from the emulator with the token:
	// the URL it hands nodes names the guest's gateway.
	if !strings.Contains(f.logs.String(), "ws://"+GuestHost+":") {
		t.Errorf("dpxe serve did not take the gateway URL from the emulator:\n%s", f.logs.String())
	}
	f.stop()
	stopped = true
	for _, p := range f.procs {
		if err := p.cmd.Process.Signal(syscall.Signal(0)); err == nil {
			t.Errorf("%s still runs after stop", p.name)
		}
	}
}

func TestFleetPeerFails(t *testing.T) {
	ctx := context.Background()
	_, err := startFleet(ctx, &Options{DPXE: "/bin/true", GatewayEmulator: "/bin/false"}, t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "gateway emulator exited while starting") {
		t.Errorf("emulator that exits at once: %v", err)
	}
	_, err = startFleet(ctx, &Options{DPXE: "/bin/true", GatewayEmulator: filepath.Join(t.TempDir(), "none")}, t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "gateway emulator:") {
		t.Errorf("missing emulator binary: %v", err)
	}
}
