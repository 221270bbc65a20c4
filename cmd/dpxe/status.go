package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"text/tabwriter"

	"github.com/discord-pxe/dpxe/fleet/metrics"
)

// `dpxe status` prints the fleet's health verdict (GET /v1/health,
// docs/api.md) for a terminal, or its JSON with --json, and exits non-zero
// when the fleet is not ready. It takes the admin token or the read-only
// metrics token (--token-file).

func init() {
	register(&command{name: "status", summary: "is every shard READY on a live node? (exit 1 when not)", run: runStatus})
}

// errNotReady is the error of `dpxe status` for a fleet that is not ready.
var errNotReady = errors.New("fleet not ready")

func runStatus(ctx context.Context, args []string) error {
	fs := newFlagSet("status", "[flags]")
	cf := addClientFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	status, data, err := c.send(ctx, "GET", "/v1/health", nil)
	if err != nil {
		return err
	}
	if status != http.StatusOK && status != http.StatusServiceUnavailable {
		return apiError("GET", "/v1/health", status, data)
	}
	var v metrics.Verdict
	if err := json.Unmarshal(data, &v); err != nil {
		return fmt.Errorf("GET /v1/health: %d answer is not a verdict: %w", status, err)
	}
	if *cf.json {
		if err := printJSON(v); err != nil {
			return err
		}
	} else {
		printVerdict(os.Stdout, v)
	}
	if !v.Ready {
		return fmt.Errorf("%w: %d of %d shards", errNotReady, v.NotReadyCount, v.TotalShards)
	}
	return nil
}

// printVerdict writes the verdict for a terminal: one line of summary,
// then the runs of shards that are not ready.
func printVerdict(w io.Writer, v metrics.Verdict) {
	word := "READY"
	if !v.Ready {
		word = "NOT READY"
	}
	fmt.Fprintf(w, "fleet %s: %d of %d shards ready on %d live nodes (plan generation %d, ping bound %g ms)\n",
		word, v.ReadyShards, v.TotalShards, v.LiveNodes, v.Generation, v.PingBoundMS)
	if len(v.NotReady) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SHARDS\tREASON\tNODE\tSTATE\tPING MAX")
	for _, r := range v.NotReady {
		shards := fmt.Sprint(r.First)
		if r.Last != r.First {
			shards = fmt.Sprintf("%d-%d", r.First, r.Last)
		}
		node, state, ping := r.Node, r.State, ""
		if node == "" {
			node = "-"
		}
		if state == "" {
			state = "-"
		}
		if r.PingMaxMS > 0 {
			ping = fmt.Sprintf("%g ms", r.PingMaxMS)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", shards, r.Reason, node, state, ping)
	}
	tw.Flush()
	if v.Truncated {
		fmt.Fprintf(w, "(list cut at %d runs; %d shards in all are not ready)\n", len(v.NotReady), v.NotReadyCount)
	}
}
