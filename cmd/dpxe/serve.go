package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/discord-pxe/dpxe/fleet/api"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/ctlcert"
	"github.com/discord-pxe/dpxe/fleet/netboot/fleetinv"
	"github.com/discord-pxe/dpxe/fleet/security"
	"github.com/discord-pxe/dpxe/fleet/store"
)

func init() {
	register(&command{
		name:    "serve",
		summary: "run the fleet controller (API, inventory) on this machine",
		run:     runServe,
	})
}

// Defaults of `dpxe serve`.
const (
	defaultDBPath   = "./var/dpxe.db"
	defaultListen   = "127.0.0.1:8080"
	adminTokenName  = "admin.token" // beside the database unless --admin-token-file says otherwise
	flushEvery      = time.Second   // batched store writes (lease renewals, status, events)
	shutdownTimeout = 10 * time.Second
	maxConfigFile   = 1 << 20
)

// duration is a time.Duration that reads and writes JSON as "30s".
type duration time.Duration

func (d *duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration string such as \"30s\"")
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = duration(v)
	return nil
}

func (d duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// serveConfig is what `dpxe serve` runs with: flags, or the same names in a
// JSON file given with --config (flags given on the command line win).
type serveConfig struct {
	DB             string   `json:"db"`
	Listen         string   `json:"listen"`
	AdminTokenFile string   `json:"admin_token_file"`
	TotalShards    uint32   `json:"total_shards"`
	MaxConcurrency uint32   `json:"max_concurrency"`
	Lease          duration `json:"lease"`
	IdentifyWindow duration `json:"identify_window"`
	SessionBudget  int      `json:"session_budget"`
	SessionReserve int      `json:"session_reserve"`
	// RotateAdminToken replaces the admin token at start (flag only).
	RotateAdminToken bool `json:"-"`
	// The Gateway settings nodes receive (serve_gateway.go).
	gatewayConfig
	// Metrics, the metrics token and readiness (serve_metrics.go).
	metricsConfig
	// Event delivery (serve_events.go).
	eventsConfig
	// Controller replicas on PostgreSQL (serve_ha.go).
	haConfig
	// HTTPS and the controller's TLS identity (serve_tls.go).
	tlsConfig
	// totalFixed and mcFixed say the operator gave total_shards or
	// max_concurrency (flag or file); otherwise GET /gateway/bot may set
	// them.
	totalFixed, mcFixed bool
}

func defaultServeConfig() serveConfig {
	return serveConfig{
		DB:             defaultDBPath,
		Listen:         defaultListen,
		TotalShards:    controller.DefaultTotalShards,
		MaxConcurrency: controller.DefaultMaxConcurrency,
		Lease:          duration(controller.DefaultLease),
		IdentifyWindow: duration(controller.DefaultIdentifyWindow),
		SessionBudget:  controller.DefaultSessionBudget,
		SessionReserve: controller.DefaultSessionReserve,
		gatewayConfig: gatewayConfig{Intents: controller.DefaultIntents,
			GatewayRefresh: duration(controller.DefaultGatewayRefresh), ResumeTTL: duration(controller.DefaultResumeTTL)},
	}
}

// parseServeFlags turns arguments into a config: defaults, then the
// dataDir is where serve keeps its own files by default (the admin and
// metrics tokens, the embedded broker's store): the directory of the
// SQLite file, or, for a PostgreSQL URL, which has no directory and whose
// text must not become a path (it may hold a password), the default
// database's directory.
func (c serveConfig) dataDir() string {
	if store.IsPostgresURL(c.DB) {
		return filepath.Dir(defaultDBPath)
	}
	return filepath.Dir(c.DB)
}

// --config file, then flags given explicitly.
func parseServeFlags(args []string) (serveConfig, error) {
	cfg := defaultServeConfig()
	fs := newFlagSet("serve", "[flags]")
	var flags serveConfig
	var lease, window time.Duration
	var total, mc uint
	configFile := fs.String("config", "", "JSON object of any flags below by name (- or _), e.g. {\"total_shards\": 64}; flags on the command line win")
	fs.StringVar(&flags.DB, "db", cfg.DB, "SQLite inventory file, or a postgres:// URL")
	fs.StringVar(&flags.Listen, "listen", cfg.Listen, "HTTP listen address of the API")
	fs.StringVar(&flags.AdminTokenFile, "admin-token-file", "", "where the first start writes the admin token (default: admin.token beside --db; ./var/ for a postgres:// --db)")
	fs.UintVar(&total, "total-shards", uint(cfg.TotalShards), "global shard count")
	fs.UintVar(&mc, "max-concurrency", uint(cfg.MaxConcurrency), "Discord max_concurrency (Identify buckets)")
	fs.DurationVar(&lease, "lease", time.Duration(cfg.Lease), "node lease; nodes renew every third of it")
	fs.DurationVar(&window, "identify-window", time.Duration(cfg.IdentifyWindow), "one Identify per bucket per window")
	fs.IntVar(&flags.SessionBudget, "session-budget", cfg.SessionBudget, "daily session starts until PUT /v1/budget says otherwise")
	fs.IntVar(&flags.SessionReserve, "session-reserve", cfg.SessionReserve, "session starts kept back from Identify grants")
	rotate := fs.Bool("rotate-admin-token", false, "write a new admin token (the old one stops working)")
	for _, p := range serveParts {
		if p.flags != nil {
			p.flags(fs)
		}
	}
	if err := parseFlags(fs, args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	if *configFile != "" {
		if err := applyConfigFile(fs, *configFile); err != nil {
			return cfg, fmt.Errorf("%w: %w", errUsage, err)
		}
	}
	var err error
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "db":
			cfg.DB = flags.DB
		case "listen":
			cfg.Listen = flags.Listen
		case "admin-token-file":
			cfg.AdminTokenFile = flags.AdminTokenFile
		case "total-shards":
			cfg.TotalShards = uint32(min(total, 1<<32-1))
			cfg.totalFixed = true
		case "max-concurrency":
			cfg.MaxConcurrency = uint32(min(mc, 1<<32-1))
			cfg.mcFixed = true
		case "lease":
			cfg.Lease = duration(lease)
		case "identify-window":
			cfg.IdentifyWindow = duration(window)
		case "session-budget":
			cfg.SessionBudget = flags.SessionBudget
		case "session-reserve":
			cfg.SessionReserve = flags.SessionReserve
		}
	})
	if cfg.AdminTokenFile == "" {
		cfg.AdminTokenFile = filepath.Join(cfg.dataDir(), adminTokenName)
	}
	cfg.RotateAdminToken = *rotate
	if cfg.TotalShards == 0 || cfg.MaxConcurrency == 0 {
		return cfg, fmt.Errorf("%w: --total-shards and --max-concurrency must be at least 1", errUsage)
	}
	if err := checkServeCore(cfg); err != nil {
		return cfg, err
	}
	for _, p := range serveParts {
		if p.apply != nil {
			if err := p.apply(fs, &cfg); err != nil {
				return cfg, err
			}
		}
	}
	return cfg, err
}

func (c serveConfig) controllerConfig() controller.Config {
	return controller.Config{TotalShards: c.TotalShards, MaxConcurrency: c.MaxConcurrency,
		Lease: time.Duration(c.Lease), IdentifyWindow: time.Duration(c.IdentifyWindow),
		SessionBudget: c.SessionBudget, SessionReserve: c.SessionReserve, ResumeTTL: time.Duration(c.ResumeTTL),
		// On PostgreSQL every serve is a replica (serve_ha.go): it writes
		// nothing until it leads.
		Replica: store.IsPostgresURL(c.DB)}
}

// fleetApp is the assembled fleet manager: one store, one controller, one
// mux. The netboot services and the dashboard attach to the same three.
type fleetApp struct {
	store      *store.Store
	controller *controller.Controller
	mux        *http.ServeMux
	cfg        serveConfig
	// adminHash is the stored hash of the operator token (for parts that
	// log operators in, such as the dashboard).
	adminHash [32]byte
	// gateway is what the Gateway part attaches with; nil without
	// Gateway settings.
	gateway *gatewayBoot
	// api is the controller API (mounted on mux; the netboot part mounts
	// its node routes on the boot listener too).
	api *api.Server
	// refusals counts and logs, rate-limited, what every part refuses.
	refusals *security.Log
	// boot is the boot network's surface, set by the netboot part; nil
	// without --interface.
	boot *bootRoute
	// netboot is the netboot inventory over the store and the controller,
	// made with the fleet: the netboot part serves it, the dashboard is
	// given it (web.Config.Netboot) whatever order the parts attach in.
	netboot *fleetinv.Inventory
	// ha is the replica layer (serve_ha.go); nil on SQLite.
	ha *replica
	// listenAddr is the --listen socket's address, set before the parts
	// run.
	listenAddr string
	// tls is the controller's TLS identity (serve_tls.go), loaded before
	// the parts attach; nil without --tls-listen or --tls-cert.
	tls *ctlcert.Identity
}

// handler is what the --listen server serves: the operator's mux, and the
// boot network's mux for connections made to the boot address (a wildcard
// --listen accepts those too).
func (a *fleetApp) handler() http.Handler {
	var h http.Handler = a.mux
	if a.ha != nil {
		h = a.ha.forward(h)
	}
	if a.boot == nil {
		return h
	}
	return a.boot.dispatch(h)
}

// servePart is an optional piece of `dpxe serve` that lives in its own file
// (serve_web.go, serve_netboot.go, serve_gateway.go) and registers itself
// from init: it adds its flags, may lay them over the parsed config
// (apply, after --config is read), then attaches to the assembled fleet.
// The run function it returns, if any, runs until ctx ends; its error
// stops the server.
type servePart struct {
	name   string
	flags  func(fs *flag.FlagSet)
	apply  func(fs *flag.FlagSet, cfg *serveConfig) error
	attach func(ctx context.Context, app *fleetApp, log *slog.Logger) (run func(ctx context.Context) error, err error)
}

var serveParts []servePart

// registerServePart adds a part; parts attach in registration order.
func registerServePart(p servePart) { serveParts = append(serveParts, p) }

// buildFleet opens the store, prepares the Gateway settings (which may
// fetch the shard count from Discord), loads the controller, makes sure an
// admin token exists, and mounts the API on a new mux.
func buildFleet(ctx context.Context, cfg serveConfig, log *slog.Logger) (*fleetApp, error) {
	st, err := store.Open(ctx, cfg.DB)
	if err != nil {
		return nil, err
	}
	gw, err := prepareGateway(ctx, &cfg, st, log.With("part", "gateway"))
	if err != nil {
		st.Close()
		return nil, err
	}
	ctrl, err := newGatewayController(ctx, st, &cfg, gw, log.With("part", "controller"))
	if err != nil {
		st.Close()
		return nil, err
	}
	if err := finishGateway(ctx, ctrl, gw); err != nil {
		st.Close()
		return nil, err
	}
	hash, created, err := api.LoadOrCreateAdminToken(ctx, st, cfg.AdminTokenFile, cfg.RotateAdminToken)
	if err != nil {
		st.Close()
		return nil, err
	}
	if created {
		log.Info("admin token created; keep this file secret", "file", cfg.AdminTokenFile)
	} else {
		log.Info("admin token loaded from the store", "token_file", cfg.AdminTokenFile)
	}
	mux := http.NewServeMux()
	refusals := security.New(log.With("part", "security"))
	srv := api.New(ctrl, hash, log.With("part", "api"))
	srv.SetVersion(version())
	srv.SetRefusals(refusals)
	srv.Register(mux)
	return &fleetApp{store: st, controller: ctrl, mux: mux, cfg: cfg, adminHash: hash, gateway: gw,
		api: srv, refusals: refusals, netboot: fleetinv.New(st.Netboot(), ctrl)}, nil
}

// attachParts attaches every registered part and returns their run functions.
func attachParts(ctx context.Context, app *fleetApp, log *slog.Logger) ([]func(context.Context) error, error) {
	var runs []func(context.Context) error
	for _, p := range serveParts {
		run, err := p.attach(ctx, app, log.With("part", p.name))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.name, err)
		}
		if run != nil {
			runs = append(runs, run)
		}
	}
	return runs, nil
}

func runServe(ctx context.Context, args []string) error {
	cfg, err := parseServeFlags(args)
	if err != nil {
		return err
	}
	if cfg.PrintPin {
		return printPin(cfg)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	app, err := buildFleet(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer app.store.Close()
	if cfg.tlsOn() {
		if app.tls, err = loadIdentity(cfg, time.Now()); err != nil {
			return err
		}
		logIdentity(app.tls, cfg, log)
		app.api.SetControllerPin(app.tls.Pin)
	}
	partRuns, err := attachParts(ctx, app, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	app.listenAddr = ln.Addr().String()
	srv := &http.Server{
		Handler:           app.handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		WriteTimeout:      15 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	runCtx, stopRun := context.WithCancel(context.WithoutCancel(ctx))
	runDone := make(chan error, 1)
	go func() { runDone <- app.controller.Run(runCtx, flushEvery) }()
	serveErr := make(chan error, 1+len(partRuns))
	go func() { serveErr <- srv.Serve(ln) }()
	partCtx, stopParts := context.WithCancel(context.WithoutCancel(ctx))
	partsDone := make(chan struct{}, len(partRuns))
	for _, run := range partRuns {
		go func() {
			if err := run(partCtx); err != nil && partCtx.Err() == nil {
				serveErr <- err
			}
			partsDone <- struct{}{}
		}()
	}
	eff := app.controller.Config()
	log.Info("listening", "addr", ln.Addr().String(), "version", version(), "db", store.RedactURL(cfg.DB), "total_shards", eff.TotalShards,
		"max_concurrency", eff.MaxConcurrency, "lease", eff.Lease)

	select {
	case <-ctx.Done():
		log.Info("shutting down", "reason", context.Cause(ctx))
	case err = <-serveErr:
		log.Error("server failed", "err", err)
	}
	shutCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	if serr := srv.Shutdown(shutCtx); serr != nil {
		log.Warn("shutdown", "err", serr)
	}
	stopParts()
	for range partRuns {
		<-partsDone
	}
	stopRun()
	if ferr := <-runDone; ferr != nil {
		log.Error("final flush", "err", ferr)
		err = errors.Join(err, ferr)
	}
	log.Info("stopped")
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
