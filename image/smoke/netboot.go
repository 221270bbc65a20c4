package smoke

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/image/qemu"
)

// QEMU's own iPXE NIC ROMs (Debian's ipxe-qemu, a dependency of
// qemu-system-x86). QEMU's built-in DHCP hands every client the same boot
// file, so chaining undionly.kpxe or ipxe.efi would load itself again
// forever; the ROMs run the boot script directly, on BIOS and on UEFI.
const (
	ROMBIOS = "/usr/lib/ipxe/qemu/pxe-e1000.rom"
	ROMUEFI = "/usr/lib/ipxe/qemu/efi-virtio.rom"
)

// bootScript is the name of the iPXE script in the TFTP root.
const bootScript = "boot.ipxe"

// How long a netboot path waits, after READY, for the Gateway emulator
// and the controller to confirm it.
const confirmTimeout = 15 * time.Second

// nicFor returns the NIC model and its ROM for a firmware: e1000 on
// SeaBIOS, virtio-net on OVMF (the lab's pairs, docs/lab.md).
func nicFor(fw qemu.Firmware) (model, rom string) {
	if fw == qemu.OVMF {
		return "virtio-net-pci", ROMUEFI
	}
	return "e1000", ROMBIOS
}

// netboot boots a netboot path: a fleet (Gateway emulator and dpxe serve)
// on loopback, a node created at the controller, the image's
// boot.ipxe.tmpl rendered with the node's boot config into a TFTP root
// that QEMU's user-mode network serves (bootfile=boot.ipxe), and QEMU
// booting from the NIC. The path passes when the kernel prints READY for
// shard 0, the emulator holds its session with a heartbeat and no
// violation, and the controller sees the shard READY with an ACK.
func (s *run) netboot(ctx context.Context, p Path, res *Result) {
	if !need(p, res) {
		return
	}
	model, rom := nicFor(p.Firmware)
	if _, err := os.Stat(rom); err != nil {
		res.fail("packages", Error, fmt.Errorf("QEMU's iPXE NIC ROM %s is missing (apt-get install ipxe-qemu)", rom))
		return
	}
	for _, b := range []struct{ name, path, hint string }{
		{"dpxe", s.o.DPXE, "the dpxe binary to run `dpxe serve` from"},
		{"gateway-emulator", s.o.GatewayEmulator, "build it with `make build` (bin/gateway-emulator) or `go build -o bin/gateway-emulator ./tools/cmd/gateway-emulator`, or pass --gateway-emulator"},
	} {
		if b.path == "" {
			res.fail("peers", Error, fmt.Errorf("no %s binary (%s)", b.name, b.hint))
			return
		}
		if _, err := os.Stat(b.path); err != nil {
			res.fail("peers", Error, fmt.Errorf("%s binary %s: %w (%s)", b.name, b.path, errNotFound, b.hint))
			return
		}
	}
	art := s.art
	if art.netbootErr != nil {
		res.fail("artifacts", Fail, art.netbootErr)
		return
	}
	dir, err := s.workDir(p)
	if err != nil {
		res.fail("work", Error, err)
		return
	}
	// The path's timeout covers the fleet's start, the boot and the
	// confirmations.
	ctx, cancel := context.WithTimeout(ctx, s.o.Timeout)
	defer cancel()
	f, err := startFleet(ctx, s.o, dir)
	if err != nil {
		res.fail("peers", Error, err)
		return
	}
	defer func() {
		f.stop()
		res.Log = Tail(f.logs.String(), 10)
	}()
	node := "smoke-" + p.Name
	cred, err := f.addNode(ctx, node)
	if err != nil {
		res.fail("peers", Error, fmt.Errorf("creating node %s: %w", node, err))
		return
	}
	tftp := filepath.Join(dir, "tftp")
	cfg := appliance.BootConfig{NodeID: node, Controller: f.guestAPI, Credential: cred}
	if err := writeTFTPRoot(tftp, art, cfg); err != nil {
		res.fail("artifacts", Fail, err)
		return
	}

	start := time.Now()
	var done atomic.Bool
	con := newConsole(start)
	var mu sync.Mutex
	var confirmed []Check
	go func() {
		cs := s.confirm(ctx, f, con, node)
		mu.Lock()
		confirmed = cs
		mu.Unlock()
		done.Store(true)
	}()
	o := qemu.Options{
		Firmware: p.Firmware, Timeout: s.o.Timeout, Memory: DefaultMemory,
		Net: []string{
			"-netdev", "user,id=n0,tftp=" + qemuOpt(tftp) + ",bootfile=" + bootScript,
			"-device", model + ",netdev=n0,romfile=" + rom + ",bootindex=1",
		},
		Until: func(string) bool { return done.Load() },
	}
	qr, _, halted, err := s.boot(ctx, o, func() *console { return con }, res)
	cancel() // ends confirm if QEMU ended first
	for !done.Load() {
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		res.fail("qemu", Error, err)
		return
	}
	res.Serial = qr.Serial
	if at, ok := con.At(lineReady); ok {
		res.ToLine = at
	}
	res.Checks = append(res.Checks, checkBoot(qr.Serial, expect{path: p, version: art.version, node: node, trust: art.manifest.Trust})...)
	mu.Lock()
	defer mu.Unlock()
	if _, ok := con.Line(lineReady); !ok {
		why := fmt.Sprintf("no %q within %v (%s)", lineReady, s.o.Timeout, res.Accel)
		switch {
		case halted:
			why = "the kernel halted: " + haltReason(qr.Serial)
		case !qr.TimedOut && !qr.Stopped:
			why = fmt.Sprintf("QEMU exited with status %d before %q", qr.ExitCode, lineReady)
		}
		res.Checks = append(res.Checks, Check{"ready", Fail, why})
		return
	}
	res.Checks = append(res.Checks, confirmed...)
}

// confirm waits for the kernel's READY line, then polls the emulator and
// the controller until both confirm it or confirmTimeout passes.
func (s *run) confirm(ctx context.Context, f *fleet, con *console, node string) []Check {
	line, err := con.Wait(ctx, lineReady)
	if err != nil {
		return nil // the boot's own checks say what happened
	}
	session := strings.Fields(strings.TrimPrefix(line, lineReady))
	cs := []Check{{"ready", Pass, strings.TrimSpace(line)}}
	if len(session) == 0 {
		return append(cs, Check{"gateway", Fail, "no session ID on the READY line"})
	}
	ctx, cancel := context.WithTimeout(ctx, confirmTimeout)
	defer cancel()
	var gw, ctl Check
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		if gw.Status != Pass {
			gw = gatewayCheck(ctx, f, session[0])
		}
		if ctl.Status != Pass {
			ctl = controllerCheck(ctx, f, node)
		}
		if gw.Status == Pass && ctl.Status == Pass {
			break
		}
		select {
		case <-ctx.Done():
			return append(cs, gw, ctl)
		case <-tick.C:
		}
	}
	return append(cs, gw, ctl)
}

// gatewayCheck asks the emulator whether session is connected as shard
// [0, 1] with at least one heartbeat, and whether it recorded violations.
func gatewayCheck(ctx context.Context, f *fleet, session string) Check {
	st, err := f.gateway(ctx)
	if err != nil {
		return Check{"gateway", Fail, err.Error()}
	}
	if len(st.Violations) > 0 {
		return Check{"gateway", Fail, fmt.Sprintf("the emulator recorded %d protocol violations, the first: %s", len(st.Violations), st.Violations[0])}
	}
	for _, sh := range st.Shards {
		for _, ses := range sh.Sessions {
			if ses.ID != session {
				continue
			}
			if sh.Shard != [2]int{0, 1} || ses.State != "connected" || ses.Heartbeats < 1 || st.Counters.HeartbeatAcks < 1 {
				return Check{"gateway", Fail, fmt.Sprintf("session %s: shard %v, %s, %d heartbeats (waiting for connected [0 1] with a heartbeat ACK)", session, sh.Shard, ses.State, ses.Heartbeats)}
			}
			return Check{"gateway", Pass, fmt.Sprintf("emulator: session %s shard [0 1] connected, %d heartbeats ACKed, no violation", session, ses.Heartbeats)}
		}
	}
	return Check{"gateway", Fail, "the emulator has no session " + session}
}

// controllerCheck asks dpxe serve whether the node is live with shard 0
// READY and an ACK, as the kernel reports it in its check-ins.
func controllerCheck(ctx context.Context, f *fleet, node string) Check {
	live, shards, err := f.nodeShards(ctx, node)
	if err != nil {
		return Check{"controller", Fail, err.Error()}
	}
	for _, sh := range shards {
		if sh.ID == 0 && sh.State == appliance.ShardReady && sh.HeartbeatAcks >= 1 && live {
			return Check{"controller", Pass, fmt.Sprintf("dpxe serve: node %s live, shard 0 READY, %d heartbeat ACKs", node, sh.HeartbeatAcks)}
		}
	}
	return Check{"controller", Fail, fmt.Sprintf("dpxe serve: node %s live=%v shards %+v (waiting for shard 0 READY with an ACK)", node, live, shards)}
}

// writeTFTPRoot writes the TFTP root of a netboot path: the netboot
// tree's kernel.bin and boot.ipxe, the image's boot.ipxe.tmpl rendered
// with cfg and the kernel's TFTP URL on QEMU's user-mode network.
func writeTFTPRoot(dir string, art *artifacts, cfg appliance.BootConfig) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := copyFile(art.file(filepath.Join(image.NetbootDir, image.KernelFile)), filepath.Join(dir, image.KernelFile)); err != nil {
		return err
	}
	script, err := image.RenderIPXE(art.template, image.IPXEVars{KernelURL: "tftp://" + GuestHost + "/" + image.KernelFile, Cmdline: cfg.String()})
	if err != nil {
		return fmt.Errorf("%s: %w", art.rel(image.IPXETemplateFile), err)
	}
	if err := os.WriteFile(filepath.Join(dir, bootScript), script, 0o600); err != nil {
		return err
	}
	return nil
}

// qemuOpt escapes a value inside a QEMU option list (',' is doubled).
func qemuOpt(v string) string { return strings.ReplaceAll(v, ",", ",,") }
