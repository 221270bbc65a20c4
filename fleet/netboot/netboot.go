// Package netboot runs the network boot services of `dpxe serve`: DHCP
// (proxy or authoritative, plus the PXE port 4011), read-only TFTP and the
// HTTP boot handler, all fed by one inventory. Server.Serve starts every
// listener and returns the first fatal error, Pixiecore-style; policy (which
// MAC boots what) stays behind inventory.Inventory.
package netboot

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/discord-pxe/dpxe/fleet/netboot/bootfiles"
	"github.com/discord-pxe/dpxe/fleet/netboot/dhcp"
	"github.com/discord-pxe/dpxe/fleet/netboot/httpboot"
	"github.com/discord-pxe/dpxe/fleet/netboot/inventory"
	"github.com/discord-pxe/dpxe/fleet/netboot/ndp"
	"github.com/discord-pxe/dpxe/fleet/netboot/stats"
	"github.com/discord-pxe/dpxe/fleet/netboot/tftp"
	"github.com/discord-pxe/dpxe/fleet/security"
)

// DefaultIPXEDir is where Debian's ipxe package installs undionly.kpxe,
// ipxe.efi and snponly.efi.
const DefaultIPXEDir = "/usr/lib/ipxe"

// IPXEFiles are the iPXE binaries served from Config.IPXEDir.
var IPXEFiles = []string{"undionly.kpxe", "ipxe.efi", "snponly.efi", "ipxe.pxe"}

// Config configures a Server. Fields left zero take the documented default.
type Config struct {
	// Interface is the boot network interface; DHCP sockets are bound to
	// it. Required when DHCP is on.
	Interface string
	// ServerIP is this server's IPv4 address on the boot network.
	ServerIP netip.Addr
	// DHCP configures the DHCP service; DHCP.Mode 0 disables it (and the
	// PXE port 4011). DHCP.ServerIP and DHCP.Boot.HTTPBase are filled in.
	DHCP dhcp.Config
	// TFTPAddr is the TFTP listen address; default ServerIP:69. "off"
	// disables TFTP.
	TFTPAddr string
	// TFTPLimits bounds TFTP option negotiation (blksize, windowsize).
	TFTPLimits tftp.Limits
	// HTTPAddr, when set, makes Serve run its own HTTP listener for /boot/.
	// Leave it empty when the boot handler is mounted on the controller's
	// mux (see Register).
	HTTPAddr string
	// BaseURL is how nodes reach the HTTP boot handler; default
	// http://ServerIP[:port of HTTPAddr].
	BaseURL string
	// Controller is the controller API URL put on kernel command lines.
	Controller string
	// ControllerPin is put on kernel command lines as controller_pin= (""
	// for none).
	ControllerPin string
	// BootDir holds kernel.bin (the image pipeline's output); it is served
	// read-only. IPXEDir holds the iPXE binaries (default DefaultIPXEDir);
	// only the files named in IPXEFiles are served from it.
	BootDir, IPXEDir string
	// IPv6NoRouter answers IPv6 Router Solicitations on Interface with
	// "no router here" (see package ndp), which saves iPXE about 15 s of
	// waiting on networks without an IPv6 router. Off by default: it is
	// traffic on the operator's network that they should choose.
	IPv6NoRouter bool
	// ScriptRetry is how long unapproved nodes wait before asking again.
	ScriptRetry time.Duration
	// EnrollUntrusted lets approved machines enroll over the network in
	// proxy DHCP mode, where this server cannot know which address a MAC
	// has: within EnrollWindow of this server's proxy answer to a MAC, the
	// first fetch of its script, from any address, gets its enrollment
	// credential (`dpxe serve --proxy-enroll`; docs/security.md says what
	// that costs). Without it, in proxy mode and always without DHCP, an
	// approved machine's script carries no credential. Authoritative mode
	// ignores it: there the script goes only to the address just leased.
	EnrollUntrusted bool
	// EnrollWindow is how long after this server's DHCP answer (the ACK
	// in authoritative mode) an approved machine may fetch its script,
	// once (default DefaultEnrollWindow).
	EnrollWindow time.Duration
	// Refusals counts and logs refused requests, rate-limited; nil makes
	// one over Log.
	Refusals *security.Log
	// Stats, when set, counts each service's requests, answers, refusals
	// and bytes served (package stats); fleet/metrics exports them.
	Stats *stats.Counters
	Log   *slog.Logger
}

// DefaultEnrollWindow is Config.EnrollWindow's default: iPXE fetches its
// script right after its DHCP exchange, but may first wait ~15 s for IPv6
// autoconfiguration (see Config.IPv6NoRouter).
const DefaultEnrollWindow = 60 * time.Second

// Server is the set of netboot services.
type Server struct {
	cfg    Config
	log    *slog.Logger
	roots  *bootfiles.Roots
	dhcp   *dhcp.Handler
	http   *httpboot.Handler
	track  *tracker
	served atomic.Bool
}

// New checks cfg and prepares the services. inv answers what each MAC
// boots and receives the boot timeline; leases persists DHCP leases in
// authoritative mode (nil keeps them in memory).
func New(ctx context.Context, cfg Config, inv inventory.Inventory, leases inventory.LeaseStore) (*Server, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if !cfg.ServerIP.Is4() {
		return nil, errors.New("netboot: server IP must be an IPv4 address")
	}
	if cfg.IPXEDir == "" {
		cfg.IPXEDir = DefaultIPXEDir
	}
	if cfg.BootDir == "" {
		return nil, errors.New("netboot: no boot directory (the image output with kernel.bin)")
	}
	if cfg.TFTPAddr == "" {
		cfg.TFTPAddr = netip.AddrPortFrom(cfg.ServerIP, 69).String()
	}
	if cfg.BaseURL == "" {
		cfg.BaseURL = "http://" + cfg.ServerIP.String()
		if _, port, err := net.SplitHostPort(cfg.HTTPAddr); err == nil && port != "80" && port != "" {
			cfg.BaseURL += ":" + port
		}
	}
	roots, err := bootfiles.OpenRoots(cfg.BootDir)
	if err != nil {
		return nil, fmt.Errorf("netboot: %w", err)
	}
	// Debian's ipxe package links ipxe.efi to /boot/ipxe.efi, outside its
	// directory: publish the binaries by name instead of serving the tree.
	for _, name := range IPXEFiles {
		if err := roots.Publish(name, filepath.Join(cfg.IPXEDir, name)); err != nil {
			cfg.Log.Warn("netboot: iPXE binary not available", "file", name, "dir", cfg.IPXEDir, "err", err)
		}
	}
	if cfg.EnrollWindow <= 0 {
		cfg.EnrollWindow = DefaultEnrollWindow
	}
	if cfg.Refusals == nil {
		cfg.Refusals = security.New(cfg.Log)
	}
	tr, off := trustNone, "this server runs no DHCP here, so it cannot tell which machine asks (use --dhcp authoritative, or proxy with --proxy-enroll)"
	switch {
	case cfg.DHCP.Mode == dhcp.Authoritative:
		tr, off = trustLeases, ""
	case cfg.DHCP.Mode == dhcp.Proxy && cfg.EnrollUntrusted:
		tr, off = trustEnroll, ""
	case cfg.DHCP.Mode == dhcp.Proxy:
		off = "network enrollment is off in proxy DHCP mode, which cannot tell which machine asks (dpxe serve --proxy-enroll turns it on)"
	}
	s := &Server{cfg: cfg, log: cfg.Log, roots: roots}
	s.track = newTracker(inv, cfg.Log, tr, cfg.EnrollWindow)
	s.track.refusals = cfg.Refusals
	if cfg.DHCP.Mode != 0 {
		if cfg.Interface == "" {
			roots.Close()
			return nil, errors.New("netboot: DHCP needs an interface")
		}
		dc := cfg.DHCP
		dc.ServerIP = cfg.ServerIP
		if dc.Boot.HTTPBase == "" {
			dc.Boot.HTTPBase = cfg.BaseURL
		}
		if dc.Refusals == nil {
			dc.Refusals = cfg.Refusals
		}
		if dc.Stats == nil {
			dc.Stats = cfg.Stats
		}
		if dc.Approved == nil && inv != nil {
			dc.Approved = approvedBy(inv, cfg.Log)
		}
		if s.dhcp, err = dhcp.New(ctx, dc, leases, s.track, cfg.Log); err != nil {
			roots.Close()
			return nil, err
		}
	}
	s.http, err = httpboot.New(httpboot.Config{
		BaseURL: cfg.BaseURL, Controller: cfg.Controller, ControllerPin: cfg.ControllerPin, Roots: roots, Retry: cfg.ScriptRetry,
		EnrollOff: off, Refusals: cfg.Refusals, Stats: cfg.Stats,
	}, inv, s.track, cfg.Log)
	if err != nil {
		roots.Close()
		return nil, err
	}
	return s, nil
}

// approvedBy answers dhcp.Config.Approved from the inventory; a failed
// lookup counts as not approved (a short lease, never a refused boot of a
// machine whose lease it holds).
func approvedBy(inv inventory.Inventory, log *slog.Logger) func(context.Context, net.HardwareAddr) bool {
	var failures atomic.Int64
	return func(ctx context.Context, mac net.HardwareAddr) bool {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		n, err := inv.Lookup(ctx, mac)
		if err != nil && !errors.Is(err, inventory.ErrUnknownMAC) {
			if failures.Add(1)%1000 == 1 {
				log.Warn("netboot: inventory lookup for DHCP failed; treating the MAC as unapproved", "mac", mac.String(), "err", err)
			}
			return false
		}
		return err == nil && n.State == inventory.Approved
	}
}

// Register mounts the HTTP boot handler (GET /boot/...) on mux.
func (s *Server) Register(mux *http.ServeMux) { s.http.Register(mux) }

// Serve starts every configured listener and blocks until ctx ends (then it
// returns nil) or one of them fails (then it stops the others and returns
// that error). A Server serves once.
func (s *Server) Serve(ctx context.Context) error {
	if s.served.Swap(true) {
		return errors.New("netboot: Serve called twice")
	}
	defer s.roots.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	type service struct {
		name string
		run  func(context.Context) error
	}
	var svcs []service
	if s.dhcp != nil {
		for _, port := range []int{dhcp.ServerPort, dhcp.PXEServerPort} {
			conn, err := dhcp.Listen(s.cfg.Interface, port)
			if err != nil {
				return fmt.Errorf("netboot: DHCP port %d on %s: %w", port, s.cfg.Interface, err)
			}
			svcs = append(svcs, service{fmt.Sprintf("dhcp:%d", port), func(ctx context.Context) error {
				return s.dhcp.Serve(ctx, conn, port)
			}})
		}
	}
	if s.cfg.IPv6NoRouter {
		if s.cfg.Interface == "" {
			return errors.New("netboot: IPv6NoRouter needs an interface")
		}
		nd := &ndp.Responder{Interface: s.cfg.Interface, Log: s.log}
		svcs = append(svcs, service{"ndp", nd.Serve})
	}
	if s.cfg.TFTPAddr != "off" {
		ua, err := net.ResolveUDPAddr("udp4", s.cfg.TFTPAddr)
		if err != nil {
			return fmt.Errorf("netboot: TFTP address %q: %w", s.cfg.TFTPAddr, err)
		}
		conn, err := net.ListenUDP("udp4", ua)
		if err != nil {
			return fmt.Errorf("netboot: TFTP: %w", err)
		}
		ts := &tftp.Server{Roots: s.roots, Limits: s.cfg.TFTPLimits, OnTransfer: s.track.transfer, Log: s.log, Stats: s.cfg.Stats}
		svcs = append(svcs, service{"tftp", func(ctx context.Context) error { return ts.Serve(ctx, conn) }})
	}
	if s.cfg.HTTPAddr != "" {
		ln, err := net.Listen("tcp", s.cfg.HTTPAddr)
		if err != nil {
			return fmt.Errorf("netboot: HTTP: %w", err)
		}
		mux := http.NewServeMux()
		s.Register(mux)
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		svcs = append(svcs, service{"http", func(ctx context.Context) error {
			stop := context.AfterFunc(ctx, func() {
				sctx, c := context.WithTimeout(context.Background(), 2*time.Second)
				defer c()
				hs.Shutdown(sctx)
			})
			defer stop()
			err := hs.Serve(ln)
			if errors.Is(err, http.ErrServerClosed) {
				return nil
			}
			return err
		}})
	}
	errs := make(chan error, len(svcs)+1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); s.track.run(ctx) }()
	for _, sv := range svcs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := sv.run(ctx); err != nil && ctx.Err() == nil {
				errs <- fmt.Errorf("netboot: %s: %w", sv.name, err)
			} else if ctx.Err() == nil {
				errs <- fmt.Errorf("netboot: %s stopped unexpectedly", sv.name)
			}
		}()
	}
	names := make([]string, len(svcs))
	for i, sv := range svcs {
		names[i] = sv.name
	}
	s.log.Info("netboot: serving", "services", strings.Join(names, ","), "server", s.cfg.ServerIP,
		"base", s.cfg.BaseURL, "dhcp", s.cfg.DHCP.Mode)
	var err error
	select {
	case <-ctx.Done():
	case err = <-errs:
	}
	cancel()
	wg.Wait()
	return err
}
