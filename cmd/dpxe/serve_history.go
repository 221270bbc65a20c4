package main

import (
	"context"
	"log/slog"

	"github.com/discord-pxe/dpxe/fleet/history"
)

// The history part samples the fleet once a minute into the store's
// 24-hour history (fleet/history), which the dashboard draws. It has no
// flags: a sample costs one pass over the shards and one small write.
func init() {
	registerServePart(servePart{name: "history", attach: attachHistory})
}

// attachHistory returns the sampler's loop.
func attachHistory(_ context.Context, app *fleetApp, log *slog.Logger) (func(context.Context) error, error) {
	c := app.controller
	s := &history.Sampler{Stats: c.FleetStats, Store: app.store, Log: log,
		// Replicas: only the leader samples (a follower's fleet is empty).
		Acting: func() bool { r := c.Role(); return !r.HA || r.Leading }}
	return s.Run, nil
}
