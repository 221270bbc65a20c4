package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
)

// The operator's everyday commands against a running controller:
// `dpxe drain NODE`, `dpxe undrain NODE` and `dpxe route GUILD_ID`. They use
// the admin token `dpxe serve` wrote, print readable text, and print the
// API's JSON with --json.

func init() {
	register(&command{name: "drain", summary: "drain a node: its shards move to other nodes", run: func(ctx context.Context, args []string) error {
		return runDrain(ctx, "drain", args)
	}})
	register(&command{name: "undrain", summary: "take a node back into the shard plan", run: func(ctx context.Context, args []string) error {
		return runDrain(ctx, "undrain", args)
	}})
	register(&command{name: "route", summary: "which shard, node and address serve a guild", run: runRoute})
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
	if u, err := url.Parse(*f.server); err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("%w: --server %q is not an http(s) URL", errUsage, *f.server)
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
	var v controller.NodeView
	if err := c.do(ctx, "POST", "/v1/nodes/"+url.PathEscape(rest[0])+"/"+verb, nil, &v); err != nil {
		return err
	}
	if *cf.json {
		return printJSON(v)
	}
	if v.Draining {
		fmt.Printf("%s is draining: its shards move to other nodes at the next plan (pending until %s releases them or its lease ends)\n", v.ID, v.ID)
	} else {
		fmt.Printf("%s is back in the plan\n", v.ID)
	}
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
