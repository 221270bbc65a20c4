package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/discord-pxe/dpxe/fleet/netboot"
	"github.com/discord-pxe/dpxe/fleet/netboot/dhcp"
	"github.com/discord-pxe/dpxe/fleet/netboot/inventory"
	"github.com/discord-pxe/dpxe/fleet/netboot/stats"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// The netboot part of `dpxe serve`: DHCP (proxy or authoritative), TFTP and
// HTTP boot on --interface, plus the operator endpoints that approve
// discovered machines (fleet/api's RegisterNetboot). Without --interface
// only the endpoints run.

// netbootFlags are the netboot flags of `dpxe serve`.
var netbootFlags struct {
	iface        string
	dhcpMode     string
	pool         string
	routers      string
	dns          string
	reserve      multiFlag
	bootDir      string
	ipxeDir      string
	controller   string
	ipv6NoRouter bool
	tftp         string
	proxyEnroll  bool
}

// multiFlag collects a repeatable flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func init() {
	registerServePart(servePart{
		name: "netboot",
		flags: func(fs *flag.FlagSet) {
			f := &netbootFlags
			f.reserve = nil // a fresh parse starts with no reservations
			fs.StringVar(&f.iface, "interface", "", "boot network interface: serve DHCP, TFTP and HTTP boot on it (netboot is off without it)")
			fs.StringVar(&f.dhcpMode, "dhcp", "proxy", "DHCP mode on --interface: proxy (beside the site's DHCP server), authoritative (own --pool) or off")
			fs.StringVar(&f.pool, "pool", "", "authoritative address pool, START-END/BITS (e.g. 10.0.0.100-10.0.0.200/24)")
			fs.StringVar(&f.routers, "router", "", "authoritative mode: default routers, comma-separated")
			fs.StringVar(&f.dns, "dns", "", "authoritative mode: DNS servers, comma-separated")
			fs.Var(&f.reserve, "reserve", "authoritative mode: static reservation MAC=IP (repeatable)")
			fs.StringVar(&f.bootDir, "boot-dir", "out", "directory with kernel.bin (make image's output)")
			fs.StringVar(&f.ipxeDir, "ipxe-dir", netboot.DefaultIPXEDir, "directory with Debian's iPXE binaries (package ipxe)")
			fs.StringVar(&f.controller, "controller-url", "", "controller URL put on kernel command lines (default https://<interface IP>:<--tls-listen port> with its pin when --tls-listen is set, else http://<interface IP>:<--listen port>; give an http:// URL to keep nodes on plain HTTP)")
			fs.BoolVar(&f.ipv6NoRouter, "ipv6-no-router", false, "answer IPv6 router solicitations on --interface so iPXE does not wait ~15 s for IPv6")
			fs.StringVar(&f.tftp, "tftp", "", "TFTP listen address (default <interface IP>:69, \"off\" disables it)")
			fs.BoolVar(&f.proxyEnroll, "proxy-enroll", false, "with --dhcp proxy: let approved machines enroll over the network although proxy DHCP cannot tell which address a MAC has (any host on the boot LAN that answers first after a machine's DHCP can then enroll as it while it is not live; see docs/security.md)")
		},
		apply:  checkNetbootFlags,
		attach: attachNetboot,
	})
}

// bootRoute is the boot network's HTTP surface: only what nodes use
// (/boot/, check-in, Identify, /healthz), served to connections made to
// the boot address, never the operator's routes.
type bootRoute struct {
	ip  netip.Addr
	mux *http.ServeMux
	// app, when set, is the fleet whose replica (app.ha) forwards the
	// node routes to the leader while this replica follows.
	app *fleetApp
	// httpURL and httpsURL are how nodes on the boot network reach this
	// replica over http and https ("" when it has no HTTPS listener):
	// --controller-url for its scheme, else the boot address and the
	// --listen or --tls-listen port. Replicas record them (node_urls).
	httpURL, httpsURL string
}

// bootKey marks a request's context as come by the boot network's
// listener (cameByBoot).
type bootKey struct{}

// cameByBoot reports whether a request came by the boot network's
// listener.
func cameByBoot(ctx context.Context) bool {
	v, _ := ctx.Value(bootKey{}).(bool)
	return v
}

// ServeHTTP serves the boot mux; with replicas, node requests (/v1/...)
// go to the leader as on the operator listener, so a node that booted
// from this replica keeps checking in here after it stops leading.
func (b *bootRoute) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if b.app != nil && b.app.ha != nil {
		r = r.WithContext(context.WithValue(r.Context(), bootKey{}, true))
		b.app.ha.forward(b.mux).ServeHTTP(w, r)
		return
	}
	b.mux.ServeHTTP(w, r)
}

// dispatch sends connections made to the boot address to the boot mux and
// the others to op. `dpxe serve` uses it when --listen is a wildcard that
// also accepts the boot network's connections.
func (b *bootRoute) dispatch(op http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
			if ap, err := netip.ParseAddrPort(la.String()); err == nil && ap.Addr().Unmap() == b.ip {
				b.ServeHTTP(w, r)
				return
			}
		}
		op.ServeHTTP(w, r)
	})
}

// attachNetboot mounts the operator endpoints and, with --interface, starts
// the DHCP, TFTP and HTTP boot services.
func attachNetboot(ctx context.Context, app *fleetApp, log *slog.Logger) (func(context.Context) error, error) {
	// One inventory (app.netboot, made with the fleet) for the services,
	// the API and the dashboard: approval creates the node at the
	// controller and stores no secret with the MAC.
	inv := app.netboot
	app.api.RegisterNetboot(app.mux, inv)
	app.controller.OnNodeLive(func(nodeID, addr string) {
		go inv.RecordCheckin(nodeID, addr, log)
	})
	f := &netbootFlags
	if f.iface == "" {
		log.Info("netboot services off (give --interface IF to serve DHCP, TFTP and HTTP boot)")
		return nil, nil
	}
	ip, err := interfaceIPv4(f.iface)
	if err != nil {
		return nil, err
	}
	dcfg, err := netbootDHCPConfig()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	host, port, err := net.SplitHostPort(app.cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("%w: --listen %q: %v", errUsage, app.cfg.Listen, err)
	}
	if a, err := netip.ParseAddr(host); err == nil && a.Unmap() == ip {
		return nil, fmt.Errorf("%w: --listen %s is the boot network's address: the operator API and the dashboard must not be served to the boot LAN; "+
			"keep --listen on loopback or a management address (nodes get their own listener on %s:%s)", errUsage, app.cfg.Listen, ip, port)
	}
	// On PostgreSQL several replicas may serve one boot network: every
	// address is then allocated in the shared database (docs/ha.md).
	// SQLite holds one replica, which keeps its table in memory.
	dcfg.SharedLeases = store.IsPostgresURL(app.cfg.DB)
	if f.proxyEnroll && dcfg.Mode != dhcp.Proxy {
		return nil, fmt.Errorf("%w: --proxy-enroll needs --dhcp proxy (authoritative mode enrolls from its own leases; without DHCP nothing enrolls)", errUsage)
	}
	base := "http://" + net.JoinHostPort(ip.String(), port)
	controllerURL := f.controller
	if controllerURL == "" {
		controllerURL = defaultControllerURL(base, ip, app.cfg.tlsConfig.TLSListen, app.tls != nil)
	}
	// Nodes pin the controller's key when it is reached over https://
	// (a pin with an http:// controller would make the node refuse it).
	pin := ""
	if strings.Contains(controllerURL, "https://") {
		if app.tls == nil {
			return nil, fmt.Errorf("%w: --controller-url %s is https:// but this controller has no TLS identity to pin (give --tls-listen)", errUsage, controllerURL)
		}
		pin = app.tls.Pin
	}
	// The services' counters are exported on /metrics (docs/metrics.md#netboot).
	counters := stats.New()
	app.api.Metrics().SetNetboot(counters)
	nb, err := netboot.New(ctx, netboot.Config{
		Interface: f.iface, ServerIP: ip, DHCP: dcfg, TFTPAddr: f.tftp, Stats: counters,
		BaseURL: base, Controller: controllerURL, ControllerPin: pin, EnrollUntrusted: f.proxyEnroll, Refusals: app.refusals,
		BootDir: f.bootDir, IPXEDir: f.ipxeDir, IPv6NoRouter: f.ipv6NoRouter, Log: log,
	}, inv, inv)
	if err != nil {
		return nil, err
	}
	// The boot network gets its own mux: the boot files and scripts, and
	// the node routes of the API. /boot/ is on no other listener, and no
	// operator route is on this one.
	boot := &bootRoute{ip: ip, mux: http.NewServeMux(), app: app, httpURL: base}
	if tl := app.cfg.tlsConfig.TLSListen; tl != "" && app.tls != nil {
		boot.httpsURL = defaultControllerURL(base, ip, tl, true)
	}
	// One --controller-url is how nodes reach this replica over its
	// scheme; a list (several replicas) leaves this one's by address.
	switch {
	case strings.Contains(controllerURL, ","):
	case strings.HasPrefix(controllerURL, "https://"):
		boot.httpsURL = controllerURL
	default:
		boot.httpURL = controllerURL
	}
	nb.Register(boot.mux)
	app.api.RegisterNode(boot.mux)
	app.boot = boot

	// Nodes reach it at the interface's address: a listener of its own
	// there, unless --listen is a wildcard that takes those connections
	// (then the main server dispatches them by local address).
	var bootSrv *http.Server
	var bootLn net.Listener
	if !listenCovers(app.cfg.Listen, ip) {
		bootLn, err = net.Listen("tcp", net.JoinHostPort(ip.String(), port))
		if err != nil {
			return nil, fmt.Errorf("listening for nodes on %s: %w", f.iface, err)
		}
		bootSrv = &http.Server{Handler: boot, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 15 * time.Second,
			WriteTimeout: 5 * time.Minute, IdleTimeout: 2 * time.Minute,
			ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	}
	switch {
	case dcfg.Mode == dhcp.Proxy && !f.proxyEnroll:
		log.Warn("netboot: proxy DHCP without --proxy-enroll: approved machines are not enrolled over the network (boot them from USB, or see docs/security.md)")
	case dcfg.Mode == 0:
		log.Warn("netboot: without DHCP approved machines are not enrolled over the network (boot them from USB, or see docs/security.md)")
	case f.proxyEnroll:
		log.Warn("netboot: --proxy-enroll: any host on the boot LAN can enroll as an approved machine that is not live (docs/security.md)")
	}
	log.Info("netboot on", "interface", f.iface, "ip", ip, "dhcp", f.dhcpMode, "boot_url", base, "controller_url", controllerURL, "controller_pin", pin != "")
	return func(ctx context.Context) error {
		errc := make(chan error, 2)
		go func() { errc <- nb.Serve(ctx) }()
		if bootSrv != nil {
			go func() {
				if err := bootSrv.Serve(bootLn); !errors.Is(err, http.ErrServerClosed) {
					errc <- err
				}
			}()
		}
		select {
		case err := <-errc:
			if bootSrv != nil {
				bootSrv.Close()
			}
			return err
		case <-ctx.Done():
		}
		if bootSrv != nil {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
			defer cancel()
			bootSrv.Shutdown(sctx)
		}
		return nil
	}, nil
}

// netbootDHCPConfig turns the DHCP flags into a dhcp.Config.
func netbootDHCPConfig() (dhcp.Config, error) {
	f := &netbootFlags
	var c dhcp.Config
	if f.dhcpMode == "off" {
		return c, nil
	}
	mode, err := dhcp.ParseMode(f.dhcpMode)
	if err != nil {
		return c, fmt.Errorf("--dhcp: %v", err)
	}
	c.Mode = mode
	if mode != dhcp.Authoritative {
		if f.pool != "" || f.routers != "" || f.dns != "" || len(f.reserve) > 0 {
			return c, fmt.Errorf("--pool, --router, --dns and --reserve need --dhcp authoritative")
		}
		return c, nil
	}
	if f.pool == "" {
		return c, fmt.Errorf("--dhcp authoritative needs --pool START-END/BITS")
	}
	if c.Pool, err = dhcp.ParsePool(f.pool); err != nil {
		return c, fmt.Errorf("--pool: %v", err)
	}
	if c.Router, err = parseAddrList("--router", f.routers); err != nil {
		return c, err
	}
	if c.DNS, err = parseAddrList("--dns", f.dns); err != nil {
		return c, err
	}
	for _, r := range f.reserve {
		mac, ipText, ok := strings.Cut(r, "=")
		if !ok {
			return c, fmt.Errorf("--reserve %q: want MAC=IP", r)
		}
		hw, err := inventory.ParseMAC(mac)
		if err != nil {
			return c, fmt.Errorf("--reserve %q: %v", r, err)
		}
		addr, err := netip.ParseAddr(ipText)
		if err != nil || !addr.Is4() {
			return c, fmt.Errorf("--reserve %q: %q is not an IPv4 address", r, ipText)
		}
		if c.Reservations == nil {
			c.Reservations = map[string]netip.Addr{}
		}
		c.Reservations[inventory.MACKey(hw)] = addr
	}
	return c, nil
}

func parseAddrList(flagName, s string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		a, err := netip.ParseAddr(part)
		if err != nil || !a.Is4() {
			return nil, fmt.Errorf("%s: %q is not an IPv4 address", flagName, part)
		}
		out = append(out, a)
	}
	return out, nil
}

// interfaceIPv4 returns the first IPv4 address of the named interface.
func interfaceIPv4(name string) (netip.Addr, error) {
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("--interface %s: %w", name, err)
	}
	addrs, err := ifc.Addrs()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("--interface %s: %w", name, err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap().Is4() {
				return ip.Unmap(), nil
			}
		}
	}
	return netip.Addr{}, fmt.Errorf("--interface %s has no IPv4 address", name)
}

// listenCovers reports whether the API listen address is a wildcard that
// also accepts connections on the boot address (--listen on the boot
// address itself is refused).
func listenCovers(listen string, ip netip.Addr) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	return host == "" || host == "0.0.0.0" || host == "::"
}

// defaultControllerURL is the controller URL boot scripts carry when
// --controller-url is not given: https:// on the boot address and
// --tls-listen's port when this controller has a TLS identity (the
// scripts then carry its pin too), else base (http:// and --listen's port).
func defaultControllerURL(base string, ip netip.Addr, tlsListen string, hasIdentity bool) string {
	if tlsListen == "" || !hasIdentity {
		return base
	}
	_, port, err := net.SplitHostPort(tlsListen)
	if err != nil {
		return base
	}
	return "https://" + net.JoinHostPort(ip.String(), port)
}
