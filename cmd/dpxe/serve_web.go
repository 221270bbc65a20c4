package main

import (
	"context"
	"flag"
	"log/slog"
	"time"

	"github.com/discord-pxe/dpxe/web"
)

// webFlags are the dashboard's flags of `dpxe serve`.
var webFlags struct {
	off       bool
	liveEvery time.Duration
}

func init() {
	registerServePart(servePart{
		name: "web",
		flags: func(fs *flag.FlagSet) {
			fs.BoolVar(&webFlags.off, "no-dashboard", false, "do not serve the web dashboard at /")
			fs.DurationVar(&webFlags.liveEvery, "dashboard-live", web.DefaultLiveEvery, "how often open dashboard pages get live updates")
		},
		apply:  checkWebFlags,
		attach: attachWeb,
	})
}

// attachWeb mounts the dashboard on the fleet's mux and returns its
// live-update loop. When ctx (the server's signal context) ends, live
// streams close at once, so the HTTP server's graceful shutdown does not
// wait for open dashboards.
func attachWeb(ctx context.Context, app *fleetApp, log *slog.Logger) (func(context.Context) error, error) {
	if webFlags.off {
		log.Info("dashboard disabled")
		return nil, nil
	}
	s := web.New(web.Config{Controller: app.controller, Store: app.store, AdminHash: app.adminHash,
		Netboot: app.netboot, Log: log, Refusals: app.refusals, LiveEvery: webFlags.liveEvery,
		Events: app.api.Metrics().Events})
	s.Register(app.mux)
	context.AfterFunc(ctx, s.CloseStreams)
	log.Info("dashboard at / (log in with the admin token or the dashboard password)")
	return s.Run, nil
}
