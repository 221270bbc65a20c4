package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/store"
)

func init() {
	register(&command{
		name:    "nodes",
		summary: "list nodes, add one (prints its credential), drain or undrain",
		run:     runNodes,
	})
}

// clientTimeout bounds one request of `dpxe nodes` to the controller.
const clientTimeout = 10 * time.Second

// nodesClient talks to a running controller with the admin token.
type nodesClient struct {
	base  string
	token string
	http  *http.Client
}

func (c *nodesClient) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		var e struct{ Error string }
		if json.Unmarshal(data, &e) == nil && e.Error != "" {
			return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, e.Error)
		}
		return fmt.Errorf("%s %s: %s", method, path, resp.Status)
	}
	return json.Unmarshal(data, out)
}

func runNodes(ctx context.Context, args []string) error {
	fs := newFlagSet("nodes", "[flags] [add NAME | rotate NAME | drain NAME | undrain NAME]")
	server := fs.String("server", "http://"+defaultListen, "controller base URL")
	tokenFile := fs.String("token-file", "./var/"+adminTokenName, "admin token file written by `dpxe serve`")
	dbPath := fs.String("db", "", "work on this SQLite file directly instead of a running controller (list and add only)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	rest := fs.Args()
	verb, name := "list", ""
	switch {
	case len(rest) == 0:
	case len(rest) == 2 && (rest[0] == "add" || rest[0] == "rotate" || rest[0] == "drain" || rest[0] == "undrain"):
		verb, name = rest[0], rest[1]
		if err := appliance.ValidateNodeID(name); err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
	default:
		return fmt.Errorf("%w: want no arguments, or add|rotate|drain|undrain NAME", errUsage)
	}
	if *dbPath != "" {
		return nodesOffline(ctx, *dbPath, verb, name)
	}
	if _, err := url.Parse(*server); err != nil {
		return fmt.Errorf("%w: --server: %v", errUsage, err)
	}
	tok, err := os.ReadFile(*tokenFile)
	if err != nil {
		return fmt.Errorf("admin token: %w", err)
	}
	c := &nodesClient{base: strings.TrimRight(*server, "/"), token: strings.TrimSpace(string(tok)),
		http: &http.Client{Timeout: clientTimeout}}
	switch verb {
	case "add":
		var out struct {
			NodeID     string `json:"node_id"`
			Credential string `json:"credential"`
		}
		if err := c.do(ctx, "POST", "/v1/nodes", map[string]string{"node_id": name}, &out); err != nil {
			return err
		}
		printCredential(out.NodeID, out.Credential)
		return nil
	case "rotate":
		var out struct {
			NodeID     string `json:"node_id"`
			Credential string `json:"credential"`
		}
		if err := c.do(ctx, "POST", "/v1/nodes/"+url.PathEscape(name)+"/credential", nil, &out); err != nil {
			return err
		}
		printCredential(out.NodeID, out.Credential)
		return nil
	case "drain", "undrain":
		var v controller.NodeView
		if err := c.do(ctx, "POST", "/v1/nodes/"+url.PathEscape(name)+"/"+verb, nil, &v); err != nil {
			return err
		}
		fmt.Printf("%s: draining=%v\n", v.ID, v.Draining)
		return nil
	}
	var out struct {
		Nodes []controller.NodeView `json:"nodes"`
	}
	if err := c.do(ctx, "GET", "/v1/nodes", nil, &out); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tLIVE\tDRAINING\tCAPACITY\tRANGE\tPENDING\tREADY/STARTING/BACKOFF/FATAL\tADDRESS\tLAST SEEN")
	for _, n := range out.Nodes {
		rng := "-"
		if n.RangeCount > 0 {
			rng = fmt.Sprintf("%d-%d", n.RangeStart, n.RangeStart+n.RangeCount-1)
		}
		seen := "never"
		if !n.LastSeen.IsZero() {
			seen = n.LastSeen.Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%v\t%v\t%d\t%s\t%d\t%d/%d/%d/%d\t%s\t%s\n", n.ID, n.Live, n.Draining, n.Capacity, rng, n.Pending,
			n.ReadyShards, n.StartingShards, n.BackoffShards, n.FatalShards, n.Address, seen)
	}
	return tw.Flush()
}

// printCredential shows a new credential once, with the boot config
// tokens that carry it.
func printCredential(id, cred string) {
	fmt.Printf("node %s: new credential, shown only now:\n%s\nboot config: node=%s cred=%s\n", id, cred, id, cred)
}

// nodesOffline lists or adds nodes directly in a database file. A running
// controller picks up added nodes on their first check-in.
func nodesOffline(ctx context.Context, path, verb, name string) error {
	if verb != "list" && verb != "add" {
		return fmt.Errorf("%w: --db supports list and add; %s needs the running controller", errUsage, verb)
	}
	if _, err := os.Stat(path); err != nil {
		return err
	}
	st, err := store.Open(ctx, path)
	if err != nil {
		return err
	}
	defer st.Close()
	if verb == "add" {
		cred, err := controller.NewCredential()
		if err != nil {
			return err
		}
		h := controller.HashCredential(cred)
		if err := st.CreateNode(ctx, name, h[:], time.Now()); err != nil {
			if errors.Is(err, store.ErrExists) {
				return fmt.Errorf("node %s already exists", name)
			}
			return err
		}
		printCredential(name, cred)
		return nil
	}
	rows, err := st.Nodes(ctx)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tLIVE (as last persisted)\tDRAINING\tCAPACITY\tLAST SEEN")
	for _, n := range rows {
		seen := "never"
		if !n.LastSeen.IsZero() {
			seen = n.LastSeen.Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%v\t%v\t%d\t%s\n", n.ID, n.Live, n.Draining, n.Capacity, seen)
	}
	return tw.Flush()
}
