package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/api"
	"github.com/discord-pxe/dpxe/fleet/controller"
)

// The operator's everyday commands against a running controller:
// `dpxe drain NODE`, `dpxe undrain NODE`, `dpxe restart-fatal NODE
// [SHARD...]` and `dpxe route GUILD_ID`. They use the admin token `dpxe
// serve` wrote, print readable text, and print the
// API's JSON with --json.

func init() {
	register(&command{name: "drain", summary: "drain a node: its shards move to other nodes", run: func(ctx context.Context, args []string) error {
		return runDrain(ctx, "drain", args)
	}})
	register(&command{name: "undrain", summary: "take a node back into the shard plan", run: func(ctx context.Context, args []string) error {
		return runDrain(ctx, "undrain", args)
	}})
	register(&command{name: "route", summary: "which shard, node and address serve a guild", run: runRoute})
	register(&command{name: "restart-fatal", summary: "start a node's FATAL shards again (after fixing the token or intents)", run: runRestartFatal})
}

// clientFlags are the flags every command that talks to the controller takes.
type clientFlags struct {
	server, tokenFile *string
	json              *bool
}

func addClientFlags(fs *flag.FlagSet) clientFlags {
	return clientFlags{
		server:    fs.String("server", "http://"+defaultListen, "controller base URL"),
		tokenFile: fs.String("token-file", "./var/"+adminTokenName, "admin token file that dpxe serve wrote"),
		json:      fs.Bool("json", false, "print the API's JSON instead of text"),
	}
}

// client builds the admin client from the flags.
func (f clientFlags) client() (*nodesClient, error) {
	if stopAtClient {
		return nil, errFlagsOnly
	}
	if err := checkServerURL("--server", *f.server); err != nil {
		return nil, err
	}
	tok, err := os.ReadFile(*f.tokenFile)
	if err != nil {
		return nil, fmt.Errorf("admin token: %w (is dpxe serve running here? see --token-file)", err)
	}
	return &nodesClient{base: strings.TrimRight(*f.server, "/"), token: strings.TrimSpace(string(tok)),
		http: &http.Client{Timeout: clientTimeout}}, nil
}

// printJSON writes v indented, for --json.
func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func runDrain(ctx context.Context, verb string, args []string) error {
	fs := newFlagSet(verb, "[flags] NODE")
	cf := addClientFlags(fs)
	var force, dryRun *bool
	if verb == "drain" {
		force = fs.Bool("force", false, "drain even if the other nodes cannot hold every shard (some stay unowned)")
		dryRun = fs.Bool("dry-run", false, "print what the drain would move where, and change nothing")
	}
	rest, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 1 {
		return fmt.Errorf("%w: want one node ID", errUsage)
	}
	if err := appliance.ValidateNodeID(rest[0]); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	path := "/v1/nodes/" + url.PathEscape(rest[0]) + "/" + verb
	if verb == "drain" && *dryRun {
		var p controller.DrainPreview
		if err := c.do(ctx, "GET", path, nil, &p); err != nil {
			return err
		}
		if *cf.json {
			return printJSON(p)
		}
		printDrainPreview(os.Stdout, p)
		return nil
	}
	if verb == "drain" && *force {
		path += "?force=true"
	}
	status, data, err := c.send(ctx, "POST", path, nil)
	if err != nil {
		return err
	}
	if status == http.StatusConflict && verb == "drain" {
		var refusal api.DrainRefusal
		if json.Unmarshal(data, &refusal) == nil && refusal.Preview.NodeID != "" {
			if *cf.json {
				printJSON(refusal)
			} else {
				printDrainPreview(os.Stdout, refusal.Preview)
			}
			return fmt.Errorf("drain %s refused: %d shards would have no owner (add capacity or nodes first, or pass --force to drain anyway)",
				rest[0], refusal.Preview.Strands)
		}
	}
	if status/100 != 2 {
		return apiError("POST", path, status, data)
	}
	var v api.DrainResponse
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	if *cf.json {
		return printJSON(v)
	}
	if v.Preview != nil {
		printDrainPreview(os.Stdout, *v.Preview)
	}
	if v.Draining {
		fmt.Printf("%s is draining: the moves above happen at the next plan; each moving shard stays pending on its new node until %s releases it or its lease ends, and its session resumes there\n", v.ID, v.ID)
	} else {
		fmt.Printf("%s is back in the plan\n", v.ID)
	}
	return nil
}

// printDrainPreview says what a drain moves where, in the controller's
// words: the node's own shards, the shifts of other nodes, and what ends
// up unowned.
func printDrainPreview(w io.Writer, p controller.DrainPreview) {
	switch {
	case p.Draining:
		fmt.Fprintf(w, "%s is already draining.\n", p.NodeID)
		return
	case !p.Live:
		fmt.Fprintf(w, "%s is not live (no lease): it holds no shards, and draining keeps it from getting any when it returns.\n", p.NodeID)
	case p.RangeCount == 0:
		fmt.Fprintf(w, "%s has no shards assigned.\n", p.NodeID)
	default:
		fmt.Fprintf(w, "%s runs shards %s (%d). Draining it changes the plan so:\n", p.NodeID, controller.Range{Start: p.RangeStart, Count: p.RangeCount}.String(), p.RangeCount)
	}
	for _, m := range p.Moves {
		from, to := m.From, m.To
		if from == "" {
			from = "no owner"
		}
		if to == "" {
			to = "NO OWNER"
		}
		fmt.Fprintf(w, "  shards %-13s (%3d)  %s -> %s\n", controller.Range{Start: m.Start, Count: m.Count}.String(), m.Count, from, to)
	}
	if p.Moved > p.Leaving {
		fmt.Fprintf(w, "%d shards change node in all: ranges stay contiguous, so other nodes' shards shift too.\n", p.Moved)
	}
	if p.Strands > 0 {
		fmt.Fprintf(w, "%d shards would have NO OWNER: the other nodes' capacity cannot hold them.\n", p.Strands)
	}
}

// restartFatal is the answer of POST /v1/nodes/{id}/restart-fatal.
type restartFatal struct {
	NodeID        string   `json:"node_id"`
	RestartShards []uint32 `json:"restart_shards"`
}

// runRestartFatal asks the controller to start a node's FATAL shards again:
// all of them, or the shard IDs given after the node.
func runRestartFatal(ctx context.Context, args []string) error {
	fs := newFlagSet("restart-fatal", "[flags] NODE [SHARD...]")
	cf := addClientFlags(fs)
	rest, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(rest) < 1 {
		return fmt.Errorf("%w: want a node ID, then optionally shard IDs", errUsage)
	}
	if err := appliance.ValidateNodeID(rest[0]); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	var body any
	if len(rest) > 1 {
		ids := make([]uint32, 0, len(rest)-1)
		for _, a := range rest[1:] {
			v, err := strconv.ParseUint(a, 10, 32)
			if err != nil || v >= appliance.MaxTotalShards {
				return fmt.Errorf("%w: shard ID %q is not 0..%d", errUsage, a, appliance.MaxTotalShards-1)
			}
			ids = append(ids, uint32(v))
		}
		body = map[string][]uint32{"shards": ids}
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	var r restartFatal
	if err := c.do(ctx, "POST", "/v1/nodes/"+url.PathEscape(rest[0])+"/restart-fatal", body, &r); err != nil {
		return err
	}
	if *cf.json {
		return printJSON(r)
	}
	if len(r.RestartShards) == 0 {
		fmt.Printf("%s has no FATAL shards to restart\n", r.NodeID)
		return nil
	}
	ids := make([]string, len(r.RestartShards))
	for i, id := range r.RestartShards {
		ids[i] = strconv.FormatUint(uint64(id), 10)
	}
	fmt.Printf("%s restarts shards %s at its next check-in (a fresh Identify each)\n", r.NodeID, strings.Join(ids, ", "))
	return nil
}

func runRoute(ctx context.Context, args []string) error {
	fs := newFlagSet("route", "[flags] GUILD_ID")
	cf := addClientFlags(fs)
	rest, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 1 {
		return fmt.Errorf("%w: want one guild ID", errUsage)
	}
	if _, err := appliance.ParseGuildID(rest[0]); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	var r controller.RouteView // a 404 body also carries the shard
	status, err := c.doStatus(ctx, "GET", "/v1/route?guild_id="+url.QueryEscape(rest[0]), &r)
	if err != nil {
		return err
	}
	if *cf.json {
		return printJSON(r)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GUILD\tSHARD\tNODE\tADDRESS\tGENERATION")
	node, addr := r.NodeID, r.Address
	if status == http.StatusNotFound {
		node, addr = "(no live owner now)", "-"
	}
	fmt.Fprintf(tw, "%s\t%d of %d\t%s\t%s\t%d\n", rest[0], r.ShardID, r.TotalShards, node, dash(addr), r.Generation)
	return tw.Flush()
}
