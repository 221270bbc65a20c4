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
	"github.com/discord-pxe/dpxe/fleet/api"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/store"
)

func init() {
	register(&command{
		name:    "nodes",
		summary: "list nodes; add, rotate, show, drain, undrain, delete NAME; machines; approve MAC --id NAME; retire MAC",
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
	fs := newFlagSet("nodes", "[flags] [add|rotate|show|drain|undrain|delete NAME | machines | approve MAC --id NAME | retire MAC]")
	cf := addClientFlags(fs)
	dbPath := fs.String("db", "", "work on this SQLite file directly instead of a running controller (list and add only)")
	id := fs.String("id", "", "with approve: the node ID the machine boots as")
	ctrlURL := fs.String("controller", "", "with add and rotate: the controller URL the node uses, for the boot config line (default: --server)")
	rest, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	verb, name, mac := "list", "", ""
	switch {
	case len(rest) == 0:
	case len(rest) == 1 && rest[0] == "machines":
		verb = "machines"
	case len(rest) == 2 && (rest[0] == "add" || rest[0] == "rotate" || rest[0] == "drain" || rest[0] == "undrain" || rest[0] == "show" || rest[0] == "delete"):
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
		return fmt.Errorf("%w: want no arguments, add|rotate|show|drain|undrain|delete NAME, machines, approve MAC --id NAME, or retire MAC", errUsage)
	}
	if *id != "" && verb != "approve" {
		return fmt.Errorf("%w: --id is for approve only", errUsage)
	}
	if *ctrlURL != "" && verb != "add" && verb != "rotate" {
		return fmt.Errorf("%w: --controller is for add and rotate only", errUsage)
	}
	if *dbPath != "" && verb != "list" && verb != "add" {
		return fmt.Errorf("%w: --db works for list and add only; %s needs the running controller", errUsage, verb)
	}
	if *ctrlURL != "" {
		var bc appliance.BootConfig
		if err := bc.Set("controller=" + *ctrlURL); err != nil {
			return fmt.Errorf("%w: --controller %q: %v (the node's boot config takes http://HOST[:PORT] only)", errUsage, *ctrlURL, err)
		}
		if err := checkPinScheme(bc); err != nil {
			return fmt.Errorf("%w: --controller %q: a node refuses an https:// controller without controller_pin=, which this line does not carry; "+
				"write both with dpxe flash --controller-pin or dpxe config set (docs/security.md)", errUsage, *ctrlURL)
		}
	}
	if *dbPath != "" {
		if stopAtClient {
			return errFlagsOnly
		}
		return nodesOffline(ctx, *dbPath, verb, name, *ctrlURL, *cf.json)
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	switch verb {
	case "add", "rotate":
		ctrl := *ctrlURL
		if ctrl == "" {
			// --server, if a node could use it as controller=.
			var bc appliance.BootConfig
			if bc.Set("controller="+c.base) == nil && checkPinScheme(bc) == nil {
				ctrl = c.base
			}
		}
		var out api.AddNodeResponse
		method, path, body := "POST", "/v1/nodes", any(map[string]string{"node_id": name})
		if verb == "rotate" {
			path, body = "/v1/nodes/"+url.PathEscape(name)+"/credential", nil
		}
		if err := c.do(ctx, method, path, body, &out); err != nil {
			return err
		}
		return printCredential(out, ctrl, *cf.json)
	case "machines":
		return printMachines(ctx, c, *cf.json)
	case "approve", "retire":
		var out map[string]string
		path, body := "/v1/netboot/machines/"+url.PathEscape(mac)+"/"+verb, any(nil)
		if verb == "approve" {
			body = map[string]string{"node_id": name}
		}
		if err := c.do(ctx, "POST", path, body, &out); err != nil {
			return err
		}
		if *cf.json {
			return printJSON(out)
		}
		if verb == "approve" {
			fmt.Printf("%s approved as %s: its next netboot boots the shard kernel (and enrolls it: its first check-in makes the boot's credential its own)\n", macText(out["mac"]), out["node_id"])
		} else {
			fmt.Printf("%s retired: it gets no boot script any more\n", macText(out["mac"]))
		}
		return nil
	case "show":
		return showNode(ctx, c, name, *cf.json)
	case "delete":
		return deleteNode(ctx, c, name, *cf.json)
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
			rng = controller.Range{Start: n.RangeStart, Count: n.RangeCount}.String()
		}
		// A node whose lease ended runs nothing the controller knows of:
		// its last counts would read as running shards.
		counts := "-"
		if n.Live {
			counts = fmt.Sprintf("%d/%d/%d/%d", n.ReadyShards, n.StartingShards, n.BackoffShards, n.FatalShards)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%d\t%s\t%s\t%s\n", n.ID, yesNo(n.Live), yesNo(n.Draining), n.Capacity, rng, n.Pending,
			counts, dash(n.Address), timeText(n.LastSeen))
	}
	return tw.Flush()
}

// deleteNode removes a node that is not live (the controller refuses a
// live one) and names the machines still approved to boot as it.
func deleteNode(ctx context.Context, c *nodesClient, id string, asJSON bool) error {
	var out struct {
		NodeID  string `json:"node_id"`
		Deleted bool   `json:"deleted"`
	}
	if err := c.do(ctx, "DELETE", "/v1/nodes/"+url.PathEscape(id), nil, &out); err != nil {
		return err
	}
	if asJSON {
		return printJSON(out)
	}
	fmt.Printf("node %s deleted: its credential no longer works and it gets no shards\n", out.NodeID)
	var ms machineList
	if err := c.do(ctx, "GET", "/v1/netboot/machines", nil, &ms); err != nil {
		return err
	}
	for _, m := range ms.Machines {
		if m.NodeID == id && m.State == "approved" {
			fmt.Printf("machine %s is still approved as %s and cannot enroll now: dpxe nodes retire %s, or approve it under another name\n",
				macText(m.MAC), id, macText(m.MAC))
		}
	}
	return nil
}

// timeText is t in RFC 3339 (UTC, seconds), or "never".
func timeText(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.UTC().Format(time.RFC3339)
}

// macText writes a MAC the way the docs and `ip link` do (52:54:00:12:34:56);
// the API's path form uses dashes.
func macText(mac string) string { return strings.ReplaceAll(mac, "-", ":") }

// credentialOut is what add and rotate print with --json: the API's answer
// and the boot config line that carries it.
type credentialOut struct {
	api.AddNodeResponse
	BootConfig string `json:"boot_config"`
}

// printCredential shows a new credential once, with a boot config line
// ready to use on a kernel command line or in DPXE.CFG.
func printCredential(r api.AddNodeResponse, controllerURL string, asJSON bool) error {
	bc := appliance.BootConfig{NodeID: r.NodeID, Controller: controllerURL, Credential: r.Credential}
	line := bc.String()
	if _, err := appliance.ParseBootConfig([]byte(line)); err != nil {
		return fmt.Errorf("the controller's answer makes no valid boot config: %w", err)
	}
	if asJSON {
		return printJSON(credentialOut{r, line})
	}
	fmt.Printf("node %s: new credential, shown only now:\n%s\nboot config: %s\n", r.NodeID, r.Credential, line)
	if controllerURL == "" {
		fmt.Fprintln(os.Stderr, "warning: the boot config line has no controller=: pass --controller http://ADDRESS:PORT, the address nodes use")
	} else if u, err := url.Parse(controllerURL); err == nil && isLoopback(u.Hostname()) {
		fmt.Fprintf(os.Stderr, "warning: controller=%s is a loopback address: a node cannot reach it (pass --controller http://ADDRESS:PORT, the address nodes use)\n", controllerURL)
	}
	return nil
}

// nodesOffline lists or adds nodes directly in a database file. A running
// controller picks up added nodes on their first check-in.
func nodesOffline(ctx context.Context, path, verb, name, controllerURL string, asJSON bool) error {
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
		if controllerURL == "" {
			controllerURL = "http://" + defaultListen
		}
		return printCredential(api.AddNodeResponse{NodeID: name, Credential: cred}, controllerURL, asJSON)
	}
	rows, err := st.Nodes(ctx)
	if err != nil {
		return err
	}
	if asJSON {
		type row struct {
			ID       string    `json:"id"`
			Live     bool      `json:"live"` // as last persisted
			Draining bool      `json:"draining"`
			Capacity int       `json:"capacity"`
			LastSeen time.Time `json:"last_seen,omitzero"`
		}
		out := make([]row, 0, len(rows))
		for _, n := range rows {
			out = append(out, row{n.ID, n.Live, n.Draining, n.Capacity, n.LastSeen})
		}
		return printJSON(map[string]any{"nodes": out})
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tLIVE (as last persisted)\tDRAINING\tCAPACITY\tLAST SEEN")
	for _, n := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", n.ID, yesNo(n.Live), yesNo(n.Draining), n.Capacity, timeText(n.LastSeen))
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

// machineList is GET /v1/netboot/machines.
type machineList struct {
	Machines []netbootMachineView `json:"machines"`
}

// printMachines lists the machines the netboot services saw.
func printMachines(ctx context.Context, c *nodesClient, asJSON bool) error {
	var out machineList
	if err := c.do(ctx, "GET", "/v1/netboot/machines", nil, &out); err != nil {
		return err
	}
	if asJSON {
		return printJSON(out)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MAC\tSTATE\tNODE\tFIRMWARE\tIP\tLAST SEEN")
	for _, m := range out.Machines {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", macText(m.MAC), m.State, dash(m.NodeID), dash(m.Firmware), dash(m.IP), timeText(m.LastSeen))
	}
	if len(out.Machines) == 0 {
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

// bootStep is one step of a machine's boot timeline.
type bootStep struct {
	Stage  string    `json:"stage"`
	Detail string    `json:"detail,omitempty"`
	At     time.Time `json:"at"`
}

// machineDetail is a machine that netboots as a node, with its timeline.
type machineDetail struct {
	netbootMachineView
	Timeline []bootStep `json:"timeline"`
}

// nodeShow is what `dpxe nodes show NAME --json` prints.
type nodeShow struct {
	Node     controller.NodeDetail `json:"node"`
	Machines []machineDetail       `json:"machines"`
}

// showNode prints what the controller knows of a node (plan, lease, last
// check-in, every shard's state with its close code and last error) and,
// for each machine that netboots as it, the boot timeline, so a failed
// boot names its stage.
func showNode(ctx context.Context, c *nodesClient, id string, asJSON bool) error {
	var v nodeShow
	if err := c.do(ctx, "GET", "/v1/nodes/"+url.PathEscape(id), nil, &v.Node); err != nil {
		return err
	}
	var ms machineList
	if err := c.do(ctx, "GET", "/v1/netboot/machines", nil, &ms); err != nil {
		return err
	}
	for _, m := range ms.Machines {
		if m.NodeID != id {
			continue
		}
		var tl struct {
			Timeline []bootStep `json:"timeline"`
		}
		if err := c.do(ctx, "GET", "/v1/netboot/machines/"+url.PathEscape(m.MAC)+"/timeline", nil, &tl); err != nil {
			return err
		}
		v.Machines = append(v.Machines, machineDetail{m, tl.Timeline})
	}
	if asJSON {
		if v.Machines == nil {
			v.Machines = []machineDetail{}
		}
		return printJSON(v)
	}
	printNodeDetail(os.Stdout, v, time.Now())
	return nil
}

// printNodeDetail writes `dpxe nodes show` as text; now dates the "ago"s.
func printNodeDetail(w io.Writer, v nodeShow, now time.Time) {
	n := v.Node
	state := "live"
	if !n.Live {
		state = "NOT LIVE (no lease)"
	}
	if n.Draining {
		state += ", draining"
	}
	fmt.Fprintf(w, "node %s: %s, capacity %d, address %s\n", n.ID, state, n.Capacity, dash(n.Address))
	if n.RangeCount > 0 {
		fmt.Fprintf(w, "  shards     %s (%d), %d pending (still held by their previous node)\n", controller.Range{Start: n.RangeStart, Count: n.RangeCount}.String(), n.RangeCount, n.Pending)
	} else {
		fmt.Fprintln(w, "  shards     none assigned")
	}
	fmt.Fprintf(w, "  check-in   %s\n", agoText(n.LastSeen, now))
	if n.Live {
		fmt.Fprintf(w, "  lease      until %s (in %s), generation %d acknowledged\n", timeText(n.LeaseDeadline), n.LeaseDeadline.Sub(now).Round(time.Second), n.AckedGeneration)
	} else {
		fmt.Fprintln(w, "  lease      none: the node runs no shard the controller counts")
	}
	if len(n.RestartShards) > 0 {
		fmt.Fprintf(w, "  restart    FATAL shards to start again at the next check-in: %v\n", n.RestartShards)
	}
	if len(n.Shards) > 0 {
		when := "reported " + agoText(n.StatusAt, now)
		if !n.Live {
			when += "; STALE: the node is not live"
		}
		fmt.Fprintf(w, "\nshard status (%s):\n", when)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fatal := 0
		fmt.Fprintln(tw, "  SHARD\tSTATE\tCLOSE\tRECONNECTS\tACKS/MISSES\tPING MS\tLAST ERROR")
		for _, s := range n.Shards {
			closeCode, ping := "-", "-"
			if s.CloseCode != 0 {
				closeCode = fmt.Sprint(s.CloseCode)
			}
			if s.PingMS > 0 {
				ping = fmt.Sprintf("%.1f", s.PingMS)
			}
			if s.State == appliance.ShardFatal {
				fatal++
			}
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%d\t%d/%d\t%s\t%s\n", s.ID, s.State, closeCode, s.Reconnects, s.HeartbeatAcks, s.HeartbeatMisses, ping, dash(s.LastError))
		}
		tw.Flush()
		if fatal > 0 {
			fmt.Fprintf(w, "FATAL shards are never retried: fix the cause (4004 bot token, 4013/4014 intents; docs/operations.md), then dpxe restart-fatal %s\n", n.ID)
		}
	} else if n.Live {
		fmt.Fprintln(w, "\nshard status: none reported yet")
	}
	for _, m := range v.Machines {
		fmt.Fprintf(w, "\nmachine %s (%s, %s): boot timeline\n", macText(m.MAC), dash(m.Firmware), dash(m.IP))
		if len(m.Timeline) == 0 {
			fmt.Fprintln(w, "  (no boot recorded yet)")
		}
		for _, e := range m.Timeline {
			fmt.Fprintf(w, "  %s  %-15s %s\n", e.At.UTC().Format("2006-01-02 15:04:05.000"), e.Stage, e.Detail)
		}
	}
}

// agoText is "TIME (D ago)", or "never".
func agoText(t, now time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return fmt.Sprintf("%s (%s ago)", timeText(t), now.Sub(t).Round(time.Second))
}
