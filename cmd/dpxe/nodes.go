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
	"text/tabwriter"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/store"
)

func init() {
	register(&command{
		name:    "nodes",
		summary: "list nodes; add, rotate, drain, undrain, show NAME; machines; approve MAC --id NAME",
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

// send makes one request and returns the status and body; only transport
// failures are errors.
func (c *nodesClient) send(ctx context.Context, method, path string, body any) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	return resp.StatusCode, data, err
}

// apiError turns an error answer into a message with the API's reason.
func apiError(method, path string, status int, data []byte) error {
	var e struct{ Error string }
	if json.Unmarshal(data, &e) == nil && e.Error != "" {
		return fmt.Errorf("%s %s: %d %s: %s", method, path, status, http.StatusText(status), e.Error)
	}
	return fmt.Errorf("%s %s: %d %s", method, path, status, http.StatusText(status))
}

// do sends body as JSON and decodes a 2xx answer into out.
func (c *nodesClient) do(ctx context.Context, method, path string, body, out any) error {
	status, data, err := c.send(ctx, method, path, body)
	if err != nil {
		return err
	}
	if status/100 != 2 {
		return apiError(method, path, status, data)
	}
	return json.Unmarshal(data, out)
}

// doStatus is do for endpoints whose 404 still carries an answer (route).
func (c *nodesClient) doStatus(ctx context.Context, method, path string, out any) (int, error) {
	status, data, err := c.send(ctx, method, path, nil)
	if err != nil {
		return 0, err
	}
	if status != http.StatusOK && status != http.StatusNotFound {
		return status, apiError(method, path, status, data)
	}
	return status, json.Unmarshal(data, out)
}

func runNodes(ctx context.Context, args []string) error {
	fs := newFlagSet("nodes", "[flags] [add|rotate|drain|undrain|show NAME | machines | approve MAC --id NAME | retire MAC]")
	cf := addClientFlags(fs)
	dbPath := fs.String("db", "", "work on this SQLite file directly instead of a running controller (list and add only)")
	id := fs.String("id", "", "with approve: the node ID the machine boots as")
	rest, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	verb, name, mac := "list", "", ""
	switch {
	case len(rest) == 0:
	case len(rest) == 1 && rest[0] == "machines":
		verb = "machines"
	case len(rest) == 2 && (rest[0] == "add" || rest[0] == "rotate" || rest[0] == "drain" || rest[0] == "undrain" || rest[0] == "show"):
		verb, name = rest[0], rest[1]
		if err := appliance.ValidateNodeID(name); err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
	case len(rest) == 2 && rest[0] == "retire":
		verb, mac = rest[0], rest[1]
	case len(rest) == 2 && rest[0] == "approve":
		verb, mac, name = rest[0], rest[1], *id
		if err := appliance.ValidateNodeID(name); err != nil {
			return fmt.Errorf("%w: --id: %v", errUsage, err)
		}
	default:
		return fmt.Errorf("%w: want no arguments, add|rotate|drain|undrain|show NAME, machines, approve MAC --id NAME, or retire MAC", errUsage)
	}
	if *dbPath != "" && verb != "list" && verb != "add" {
		return fmt.Errorf("%w: --db works for list and add only; %s needs the running controller", errUsage, verb)
	}
	if *dbPath != "" {
		return nodesOffline(ctx, *dbPath, verb, name)
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
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
	case "machines":
		return printMachines(ctx, c, "")
	case "approve":
		var out map[string]string
		if err := c.do(ctx, "POST", "/v1/netboot/machines/"+url.PathEscape(mac)+"/approve", map[string]string{"node_id": name}, &out); err != nil {
			return err
		}
		fmt.Printf("%s approved as %s: its next netboot boots the shard kernel (and enrolls it: its first check-in makes the boot's credential its own)\n", out["mac"], out["node_id"])
		return nil
	case "retire":
		var out map[string]string
		if err := c.do(ctx, "POST", "/v1/netboot/machines/"+url.PathEscape(mac)+"/retire", nil, &out); err != nil {
			return err
		}
		fmt.Printf("%s retired: it gets no boot script any more\n", out["mac"])
		return nil
	case "show":
		return showNode(ctx, c, name)
	case "drain", "undrain":
		// The same as `dpxe drain NODE`: the preview, and a refusal that
		// strands shards (`dpxe drain --force` drains anyway).
		again := []string{name, "--server", *cf.server, "--token-file", *cf.tokenFile}
		if *cf.json {
			again = append(again, "--json")
		}
		return runDrain(ctx, verb, again)
	}
	var out struct {
		Nodes []controller.NodeView `json:"nodes"`
	}
	if err := c.do(ctx, "GET", "/v1/nodes", nil, &out); err != nil {
		return err
	}
	if *cf.json {
		return printJSON(out)
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

// netbootMachineView is one row of GET /v1/netboot/machines.
type netbootMachineView struct {
	MAC      string    `json:"mac"`
	State    string    `json:"state"`
	NodeID   string    `json:"node_id"`
	Firmware string    `json:"firmware"`
	IP       string    `json:"ip"`
	LastSeen time.Time `json:"last_seen"`
}

// printMachines lists the machines the netboot services saw (all of them,
// or those booting as nodeID) and returns them.
func printMachines(ctx context.Context, c *nodesClient, nodeID string) error {
	var out struct {
		Machines []netbootMachineView `json:"machines"`
	}
	if err := c.do(ctx, "GET", "/v1/netboot/machines", nil, &out); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MAC\tSTATE\tNODE\tFIRMWARE\tIP\tLAST SEEN")
	n := 0
	for _, m := range out.Machines {
		if nodeID != "" && m.NodeID != nodeID {
			continue
		}
		n++
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", m.MAC, m.State, dash(m.NodeID), dash(m.Firmware), dash(m.IP), m.LastSeen.Format(time.RFC3339))
	}
	if n == 0 {
		fmt.Fprintln(tw, "(no machines: netboot one with dpxe serve --interface IF, then approve it)")
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// showNode prints a node's controller view and, for each machine that
// netboots as it, the boot timeline, so a failed boot names its stage.
func showNode(ctx context.Context, c *nodesClient, id string) error {
	var v controller.NodeView
	if err := c.do(ctx, "GET", "/v1/nodes/"+url.PathEscape(id), nil, &v); err != nil {
		return err
	}
	fmt.Printf("node %s: live=%v draining=%v capacity=%d range=%d+%d pending=%d address=%s\n",
		v.ID, v.Live, v.Draining, v.Capacity, v.RangeStart, v.RangeCount, v.Pending, dash(v.Address))
	var out struct {
		Machines []netbootMachineView `json:"machines"`
	}
	if err := c.do(ctx, "GET", "/v1/netboot/machines", nil, &out); err != nil {
		return err
	}
	for _, m := range out.Machines {
		if m.NodeID != id {
			continue
		}
		var tl struct {
			Timeline []struct {
				Stage  string    `json:"stage"`
				Detail string    `json:"detail"`
				At     time.Time `json:"at"`
			} `json:"timeline"`
		}
		if err := c.do(ctx, "GET", "/v1/netboot/machines/"+url.PathEscape(m.MAC)+"/timeline", nil, &tl); err != nil {
			return err
		}
		fmt.Printf("\nmachine %s (%s, %s): boot timeline\n", m.MAC, dash(m.Firmware), dash(m.IP))
		if len(tl.Timeline) == 0 {
			fmt.Println("  (no boot recorded yet)")
		}
		for _, e := range tl.Timeline {
			fmt.Printf("  %s  %-15s %s\n", e.At.Format("2006-01-02 15:04:05.000"), e.Stage, e.Detail)
		}
	}
	return nil
}
