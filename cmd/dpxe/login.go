package main

import (
	"context"
	"fmt"
	"time"
)

// `dpxe login-link`: a one-time link that logs a browser in to the
// dashboard of a running `dpxe serve` (see docs/dashboard.md). It needs the
// admin token; the link works once, for ten minutes.

func init() {
	register(&command{name: "login-link", summary: "print a one-time link that logs a browser in to the dashboard", run: runLoginLink})
}

func runLoginLink(ctx context.Context, args []string) error {
	fs := newFlagSet("login-link", "[flags]")
	cf := addClientFlags(fs)
	rest, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 0 {
		return fmt.Errorf("%w: login-link takes no arguments", errUsage)
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	// The API's fields, and the link made from --server and the path.
	var out struct {
		Path      string    `json:"path"`
		ExpiresAt time.Time `json:"expires_at"`
		URL       string    `json:"url"`
	}
	if err := c.do(ctx, "POST", "/v1/dashboard/login-links", nil, &out); err != nil {
		return err
	}
	out.URL = c.base + out.Path
	if *cf.json {
		return printJSON(out)
	}
	fmt.Printf("%s\n(works once, until %s; keep it to yourself: it logs in as the operator)\n",
		c.base+out.Path, out.ExpiresAt.Local().Format("15:04:05 MST"))
	return nil
}
