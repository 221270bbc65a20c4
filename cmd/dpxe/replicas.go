package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/discord-pxe/dpxe/fleet/controller"
)

// `dpxe replicas` lists the controller replicas sharing the server's
// PostgreSQL database (GET /v1/replicas, docs/ha.md): each one's ID,
// advertised URL, role, term, heartbeat age and the URLs nodes on the
// boot network reach it by (--json: every node URL, by route).

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
	fmt.Fprintln(tw, "REPLICA\tURL\tROLE\tTERM\tHEARTBEAT\tBOOT NETWORK URLS")
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s ago\t%s\n", r.ID, r.URL, r.Role, r.Term, r.Age.Round(time.Millisecond), strings.Join(boot, " "))
	}
	return tw.Flush()
}
