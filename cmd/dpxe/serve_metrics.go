package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"time"

	"github.com/discord-pxe/dpxe/fleet/api"
	"github.com/discord-pxe/dpxe/fleet/metrics"
)

// metricsTokenName is the metrics token file, beside the database unless
// --metrics-token-file says otherwise.
const metricsTokenName = "metrics.token"

// maxPingBound bounds --ready-ping-bound: the kernel reports at most
// appliance.MaxPingMS (about 71 minutes); a bound past a minute says
// nothing about readiness.
const maxPingBound = time.Minute

// metricsConfig is the metrics part of serveConfig (docs/metrics.md); its
// JSON names are promoted into the --config file.
type metricsConfig struct {
	// MetricsListen is a separate listener serving GET /metrics,
	// /healthz and /readyz without authentication ("" for none).
	MetricsListen    string `json:"metrics_listen"`
	MetricsTokenFile string `json:"metrics_token_file"`
	// ReadyPingBound is the readiness bound on a shard's last ping.
	ReadyPingBound duration `json:"ready_ping_bound"`
	// MetricsNodeSeries: the series labelled by node (nil: while the
	// inventory has at most MetricsNodeSeriesLimit nodes; true: always;
	// false: never).
	MetricsNodeSeries *bool `json:"metrics_node_series"`
	// MetricsNodeSeriesLimit is that node count (0:
	// metrics.DefaultNodeSeriesLimit).
	MetricsNodeSeriesLimit int `json:"metrics_node_series_limit"`
	// RotateMetricsToken replaces the metrics token at start (flag only).
	RotateMetricsToken bool `json:"-"`
}

var metricsFlags struct {
	listen, tokenFile string
	bound             time.Duration
	nodeSeries        bool
	nodeSeriesLimit   int
	rotate            bool
}

func init() {
	registerServePart(servePart{
		name: "metrics",
		flags: func(fs *flag.FlagSet) {
			fs.StringVar(&metricsFlags.listen, "metrics-listen", "", "also serve /metrics, /healthz and /readyz here, without a token (e.g. 127.0.0.1:9464)")
			fs.StringVar(&metricsFlags.tokenFile, "metrics-token-file", "", "where the first start writes the read-only metrics token (default: metrics.token beside --db; ./var/ for a postgres:// --db)")
			fs.DurationVar(&metricsFlags.bound, "ready-ping-bound", metrics.DefaultPingBound, "a READY shard whose last ping is over this is not ready (GET /readyz)")
			fs.BoolVar(&metricsFlags.nodeSeries, "metrics-node-series", false, "export the series labelled by node, most of a large fleet's scrape: true always, false never (default: while the inventory has at most --metrics-node-series-limit nodes)")
			fs.IntVar(&metricsFlags.nodeSeriesLimit, "metrics-node-series-limit", metrics.DefaultNodeSeriesLimit, "without --metrics-node-series, the node count up to which the series labelled by node are exported")
			fs.BoolVar(&metricsFlags.rotate, "rotate-metrics-token", false, "write a new metrics token (the old one stops working)")
		},
		apply:  applyMetricsFlags,
		attach: attachMetrics,
	})
}

// applyMetricsFlags lays the metrics flags given on the command line over
// cfg (defaults and --config) and checks the result.
func applyMetricsFlags(fs *flag.FlagSet, cfg *serveConfig) error {
	m := &cfg.metricsConfig
	if m.ReadyPingBound == 0 {
		m.ReadyPingBound = duration(metrics.DefaultPingBound)
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "metrics-listen":
			m.MetricsListen = metricsFlags.listen
		case "metrics-token-file":
			m.MetricsTokenFile = metricsFlags.tokenFile
		case "ready-ping-bound":
			m.ReadyPingBound = duration(metricsFlags.bound)
		case "metrics-node-series":
			on := metricsFlags.nodeSeries
			m.MetricsNodeSeries = &on
		case "metrics-node-series-limit":
			m.MetricsNodeSeriesLimit = metricsFlags.nodeSeriesLimit
		}
	})
	m.RotateMetricsToken = metricsFlags.rotate
	if m.MetricsTokenFile == "" {
		m.MetricsTokenFile = filepath.Join(cfg.dataDir(), metricsTokenName)
	}
	if b := time.Duration(m.ReadyPingBound); b <= 0 || b > maxPingBound {
		return fmt.Errorf("%w: ready_ping_bound %v out of range 1ns..%v", errUsage, b, maxPingBound)
	}
	if m.MetricsNodeSeriesLimit < 0 {
		return fmt.Errorf("%w: metrics_node_series_limit %d: want a node count, 0 for the default %d", errUsage, m.MetricsNodeSeriesLimit, metrics.DefaultNodeSeriesLimit)
	}
	if m.MetricsListen != "" {
		if _, _, err := net.SplitHostPort(m.MetricsListen); err != nil {
			return fmt.Errorf("%w: metrics_listen %q: %v", errUsage, m.MetricsListen, err)
		}
	}
	return nil
}

// attachMetrics sets up the metrics token and the readiness bound on the
// API (GET /metrics, /v1/health), and returns the separate metrics
// listener's server when --metrics-listen is set.
func attachMetrics(ctx context.Context, app *fleetApp, log *slog.Logger) (func(context.Context) error, error) {
	m := app.cfg.metricsConfig
	hash, created, err := api.LoadOrCreateMetricsToken(ctx, app.store, m.MetricsTokenFile, m.RotateMetricsToken)
	if err != nil {
		return nil, err
	}
	if created {
		log.Info("metrics token created; GET /metrics and /v1/health accept it (read-only)", "file", m.MetricsTokenFile)
	}
	app.api.SetMetricsToken(hash)
	app.api.SetPingBound(time.Duration(m.ReadyPingBound))
	mode := metrics.NodeSeriesAuto
	if m.MetricsNodeSeries != nil {
		mode = metrics.NodeSeriesOff
		if *m.MetricsNodeSeries {
			mode = metrics.NodeSeriesOn
		}
	}
	app.api.Metrics().SetNodeSeries(mode, m.MetricsNodeSeriesLimit)
	if m.MetricsListen == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", m.MetricsListen)
	if err != nil {
		return nil, fmt.Errorf("metrics_listen: %w", err)
	}
	mux := http.NewServeMux()
	app.api.RegisterMetricsListener(mux)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, WriteTimeout: 30 * time.Second,
		IdleTimeout: 2 * time.Minute, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	log.Info("metrics listening without authentication", "addr", ln.Addr().String())
	return func(ctx context.Context) error {
		done := make(chan error, 1)
		go func() { done <- srv.Serve(ln) }()
		select {
		case err := <-done:
			return err
		case <-ctx.Done():
		}
		shut, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
		defer cancel()
		err := srv.Shutdown(shut)
		if serr := <-done; !errors.Is(serr, http.ErrServerClosed) {
			err = errors.Join(err, serr)
		}
		return err
	}, nil
}
