package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/discord-pxe/dpxe/fleet/ctlcert"
)

// The HTTPS part of `dpxe serve` (issue 17, "Controller channel"): the
// same routes as --listen on --tls-listen, answered with the operator's
// --tls-cert/--tls-key or with a key and self-signed certificate serve
// keeps beside its database (fleet/ctlcert). Nodes do not validate that
// certificate: their boot config pins its key (controller_pin=), which
// `dpxe serve --print-pin` prints and every start logs. With netboot on,
// the boot network gets an HTTPS listener of its own on the interface's
// address and --tls-listen's port (node routes only, like the HTTP one),
// and boot scripts whose --controller-url is https:// carry the pin.

// tlsConfig is the HTTPS part of serveConfig; its JSON names are promoted
// into the --config file.
type tlsConfig struct {
	// TLSListen is the HTTPS listen address ("" for none).
	TLSListen string `json:"tls_listen"`
	// TLSCert and TLSKey are the operator's PEM files; without them the
	// self-generated identity in dataDir is used.
	TLSCert string `json:"tls_cert"`
	TLSKey  string `json:"tls_key"`
	// PrintPin prints the pin and exits (flag only).
	PrintPin bool `json:"-"`
}

var tlsFlags tlsConfig

func init() {
	registerServePart(servePart{
		name: "tls",
		flags: func(fs *flag.FlagSet) {
			tlsFlags = tlsConfig{}
			fs.StringVar(&tlsFlags.TLSListen, "tls-listen", "", "also serve the API over HTTPS here (e.g. 0.0.0.0:8443); nodes pin the key (controller_pin=, docs/security.md)")
			fs.StringVar(&tlsFlags.TLSCert, "tls-cert", "", "PEM certificate chain for HTTPS (default: a self-signed certificate over a key kept beside --db, made on first start)")
			fs.StringVar(&tlsFlags.TLSKey, "tls-key", "", "PEM private key of --tls-cert")
			fs.BoolVar(&tlsFlags.PrintPin, "print-pin", false, "print the controller's pin (the value of the boot config's controller_pin=) and exit; makes the self-generated key if there is none")
		},
		apply:  applyTLSFlags,
		attach: attachTLS,
	})
	configOnlyFlags["print-pin"] = "it is a one-time action; give it on the command line"
}

// applyTLSFlags lays the HTTPS flags given on the command line over cfg.
func applyTLSFlags(fs *flag.FlagSet, cfg *serveConfig) error {
	c := &cfg.tlsConfig
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "tls-listen":
			c.TLSListen = tlsFlags.TLSListen
		case "tls-cert":
			c.TLSCert = tlsFlags.TLSCert
		case "tls-key":
			c.TLSKey = tlsFlags.TLSKey
		}
	})
	c.PrintPin = tlsFlags.PrintPin
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return fmt.Errorf("%w: tls_cert and tls_key go together (or neither, for the self-generated key)", errUsage)
	}
	if strings.Contains(netbootFlags.controller, "https://") && c.TLSListen == "" {
		return fmt.Errorf("%w: --controller-url %s is https:// but --tls-listen is not set: nodes pin this controller's own key, served on --tls-listen", errUsage, netbootFlags.controller)
	}
	if c.TLSListen != "" {
		if _, _, err := net.SplitHostPort(c.TLSListen); err != nil {
			return fmt.Errorf("%w: tls_listen %q: %v", errUsage, c.TLSListen, err)
		}
	}
	return nil
}

// tlsOn says whether this serve has a TLS identity: it serves HTTPS, or
// was given a certificate.
func (c serveConfig) tlsOn() bool { return c.TLSListen != "" || c.TLSCert != "" }

// loadIdentity returns the controller's TLS identity: the operator's
// files, or the self-generated one, whose certificate names the listen
// addresses and the boot interface's address.
func loadIdentity(cfg serveConfig, now time.Time) (*ctlcert.Identity, error) {
	if cfg.TLSCert != "" {
		id, err := ctlcert.Load(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("tls-cert: %w", err)
		}
		return id, nil
	}
	addrs := []string{cfg.Listen}
	if cfg.TLSListen != "" {
		addrs = append(addrs, cfg.TLSListen)
	}
	hosts := ctlcert.Hosts(addrs...)
	if netbootFlags.iface != "" {
		if ip, err := interfaceIPv4(netbootFlags.iface); err == nil {
			hosts = append(hosts, ip.String())
		}
	}
	return ctlcert.LoadOrCreate(cfg.dataDir(), hosts, now)
}

// printPin implements `dpxe serve --print-pin`.
func printPin(cfg serveConfig) error {
	id, err := loadIdentity(cfg, time.Now())
	if err != nil {
		return err
	}
	fmt.Println(id.Pin)
	return nil
}

// logIdentity says which identity serve answers HTTPS with, and its pin.
func logIdentity(id *ctlcert.Identity, cfg serveConfig, log *slog.Logger) {
	source := "self-signed, beside the database"
	if cfg.TLSCert != "" {
		source = cfg.TLSCert
	}
	log.Info("controller TLS identity", "pin", id.Pin, "certificate", source, "not_after", id.Leaf.NotAfter.UTC().Format(time.RFC3339))
	if id.KeyCreated {
		log.Warn("new controller TLS key: nodes pinned to an older key refuse this controller; write controller_pin=" + id.Pin + " into their boot configs")
	}
}

// attachTLS starts the HTTPS listeners: --tls-listen with the same
// handler as --listen, and, with netboot on, one on the boot address for
// the node routes unless --tls-listen is a wildcard that covers it.
func attachTLS(ctx context.Context, app *fleetApp, log *slog.Logger) (func(context.Context) error, error) {
	cfg := app.cfg.tlsConfig
	if cfg.TLSListen == "" {
		return nil, nil
	}
	if app.tls == nil {
		return nil, errors.New("no TLS identity loaded")
	}
	tc := &tls.Config{Certificates: []tls.Certificate{app.tls.Cert}, MinVersion: tls.VersionTLS12}
	host, port, _ := net.SplitHostPort(cfg.TLSListen)
	type server struct {
		srv *http.Server
		ln  net.Listener
	}
	var servers []server
	listen := func(addr string, h http.Handler) error {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("tls_listen %s: %w", addr, err)
		}
		servers = append(servers, server{ln: tls.NewListener(ln, tc), srv: &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout: 15 * time.Second, WriteTimeout: 15 * time.Second, IdleTimeout: 2 * time.Minute,
			ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}})
		log.Info("https listening", "addr", ln.Addr().String(), "pin", app.tls.Pin)
		return nil
	}
	if b := app.boot; b != nil {
		if a, err := netip.ParseAddr(host); err == nil && a.Unmap() == b.ip {
			return nil, fmt.Errorf("%w: --tls-listen %s is the boot network's address: the operator API and the dashboard must not be served to the boot LAN; "+
				"keep it on loopback, a management address or a wildcard (nodes get their own HTTPS listener on %s:%s)", errUsage, cfg.TLSListen, b.ip, port)
		}
	}
	if err := listen(cfg.TLSListen, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { app.handler().ServeHTTP(w, r) })); err != nil {
		return nil, err
	}
	if b := app.boot; b != nil && !listenCovers(cfg.TLSListen, b.ip) {
		// b, not b.mux: the way nodes came is marked (the check-in
		// answer lists the replicas' boot URLs), and a follower forwards.
		if err := listen(net.JoinHostPort(b.ip.String(), port), b); err != nil {
			servers[0].ln.Close()
			return nil, err
		}
	}
	return func(ctx context.Context) error {
		errc := make(chan error, len(servers))
		for _, s := range servers {
			go func() { errc <- s.srv.Serve(s.ln) }()
		}
		var err error
		select {
		case err = <-errc:
		case <-ctx.Done():
		}
		shut, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
		defer cancel()
		for _, s := range servers {
			s.srv.Shutdown(shut)
		}
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		return err
	}, nil
}
