package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/discord-pxe/dpxe/fleet/events/natsauth"
)

// `dpxe workers`: the NATS credentials of a bot's workers, for an embedded
// server started with --nats-auth (docs/events.md, "Credentials"). It edits
// the credentials file beside the database directly; a running `dpxe
// serve` rereads it on the next connection.

func init() {
	register(&command{
		name:    "workers",
		summary: "add NAME | list: NATS credentials of bot workers (dpxe serve --nats-auth)",
		run:     runWorkers,
	})
}

func runWorkers(ctx context.Context, args []string) error {
	if len(args) == 0 || (args[0] != "add" && args[0] != "list") {
		return fmt.Errorf("%w: dpxe workers add NAME [--auth-file FILE] [--token-out FILE] | dpxe workers list [--auth-file FILE]", errUsage)
	}
	sub := args[0]
	fs := newFlagSet("workers "+sub, "[flags]")
	authFile := fs.String("auth-file", filepath.Join(filepath.Dir(defaultDBPath), natsauth.FileName), "the NATS credentials file beside dpxe serve's --db")
	tokenOut := fs.String("token-out", "", "add: where to write the worker's password (default: worker-NAME.token beside --auth-file)")
	pos, err := parseInterspersed(fs, args[1:])
	if err != nil {
		return err
	}
	if sub == "list" {
		if len(pos) != 0 {
			return fmt.Errorf("%w: dpxe workers list takes no arguments", errUsage)
		}
		if _, err := os.Stat(*authFile); err != nil {
			return fmt.Errorf("auth-file: %w (dpxe serve --nats-auth creates it)", err)
		}
		f, err := natsauth.Open(*authFile)
		if err != nil {
			return err
		}
		names, err := f.Workers()
		if err != nil {
			return err
		}
		sort.Strings(names)
		for _, n := range names {
			fmt.Println(natsauth.WorkerPrefix + n)
		}
		return nil
	}
	if len(pos) != 1 {
		return fmt.Errorf("%w: dpxe workers add NAME", errUsage)
	}
	name := pos[0]
	out := *tokenOut
	if out == "" {
		out = filepath.Join(filepath.Dir(*authFile), "worker-"+name+".token")
	}
	if _, err := os.Stat(out); err == nil {
		return fmt.Errorf("token-out %s exists: not overwritten", out)
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("token-out: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(*authFile), 0o750); err != nil {
		return err
	}
	f, err := natsauth.Open(*authFile)
	if err != nil {
		return err
	}
	token, err := f.AddWorker(name)
	if errors.Is(err, natsauth.ErrBadName) {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if err != nil {
		return err
	}
	if err := os.WriteFile(out, []byte(token+"\n"), 0o600); err != nil {
		return fmt.Errorf("worker %s was added but its password could not be written (%v); add another name", name, err)
	}
	fmt.Printf("worker %s added: NATS user %s%s, password in %s (keep it secret)\n", name, natsauth.WorkerPrefix, name, out)
	return nil
}
