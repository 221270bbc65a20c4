package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// `dpxe replicas` lists the controller replicas sharing the server's
// PostgreSQL database (GET /v1/replicas, docs/ha.md): each one's ID,
// advertised URL, role, term, heartbeat age, the pin of its HTTPS key
// and the URLs nodes on the boot network reach it by (--json: every node
// URL, by route), and warns on stderr when the replicas' keys differ.

func init() {
	register(&command{name: "replicas", summary: "list the controller replicas on one PostgreSQL (leader, followers, heartbeats)", run: runReplicas})
}

// errNoReplicas: the server has no replica layer.
var errNoReplicas = errors.New("the server has no replicas: it runs on SQLite, one process (docs/ha.md)")

func runReplicas(ctx context.Context, args []string) error {
	fs := newFlagSet("replicas", "[flags]")
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
	status, data, err := c.send(ctx, "GET", "/v1/replicas", nil)
	if err != nil {
		return err
	}
	if status == http.StatusNotFound {
		return errNoReplicas
	}
	if status != http.StatusOK {
		return apiError("GET", "/v1/replicas", status, data)
	}
	var v replicasResponse
	if err := json.Unmarshal(data, &v); err != nil {
		return fmt.Errorf("GET /v1/replicas: answer is not a replica list: %w", err)
	}
	if *cf.json {
		return printJSON(v)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REPLICA\tURL\tROLE\tTERM\tHEARTBEAT\tTLS PIN\tBOOT NETWORK URLS")
	for _, r := range v.Replicas {
		var boot []string
		for _, route := range []controller.Route{controller.RouteBootHTTP, controller.RouteBootHTTPS} {
			if u := r.NodeURLs[string(route)]; u != "" {
				boot = append(boot, u)
			}
		}
		if len(boot) == 0 {
			boot = []string{"-"}
		}
		pin := "-"
		if r.TLSPin != "" {
			pin = shortPin(r.TLSPin)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s ago\t%s\t%s\n", r.ID, r.URL, r.Role, r.Term, r.Age.Round(time.Millisecond), pin, strings.Join(boot, " "))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if pins := tlsPins(v.Replicas); len(pins) > 1 {
		fmt.Fprintf(os.Stderr, "warning: the replicas serve HTTPS with %d different keys (%s): a node pinned to one refuses the others, so it cannot move between them; give every replica the same --tls-cert and --tls-key (docs/ha.md)\n",
			len(pins), strings.Join(pins, ", "))
	}
	return nil
}

// pinWarnAge bounds the heartbeat age of the replicas whose keys the
// warning compares: a replica heartbeats every third of its leader lease
// (at most 2 minutes), so a row older than this is a replica that died,
// whose key no node is moving to.
const pinWarnAge = time.Minute

// tlsPins lists the distinct TLS pins of the replicas of rs that
// heartbeat, in order of first appearance, each shortened to its first
// 16 digits.
func tlsPins(rs []store.Replica) []string {
	var pins []string
	for _, r := range rs {
		if r.TLSPin != "" && r.Age <= pinWarnAge && !slices.Contains(pins, r.TLSPin) {
			pins = append(pins, r.TLSPin)
		}
	}
	for i, p := range pins {
		pins[i] = shortPin(p)
	}
	return pins
}

// shortPin is a pin's first 16 hex digits, enough to tell keys apart on
// a terminal.
func shortPin(p string) string {
	if len(p) <= 16 {
		return p
	}
	return p[:16] + "..."
}
