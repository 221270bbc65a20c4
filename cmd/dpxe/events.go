package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/discord-pxe/dpxe/fleet/events"
	"github.com/discord-pxe/dpxe/fleet/events/embedded"
	"github.com/discord-pxe/dpxe/sdk/dpxe"
)

func init() {
	register(&command{
		name:    "events",
		summary: "tail [--event NAME] [--shard N] [--json]: print the bot's events live from NATS; stats: per shard and consumer",
		run:     runEvents,
	})
}

// errStopTail ends a tail after --count events.
var errStopTail = errors.New("count reached")

// tailLine is one event in `dpxe events tail --json` (one object a line).
type tailLine struct {
	Shard     uint32          `json:"shard"`
	Seq       uint64          `json:"seq"`
	Event     string          `json:"event"`
	Session   string          `json:"session"`
	Node      string          `json:"node"`
	Received  time.Time       `json:"received"`
	StreamSeq uint64          `json:"stream_seq"`
	Frame     json.RawMessage `json:"frame,omitempty"`      // the Discord frame, when it is JSON
	FrameText string          `json:"frame_text,omitempty"` // otherwise, as text
}

// natsOptions are the connection options every events command takes.
func natsOptions(fs *flag.FlagSet) func(name string) ([]nats.Option, error) {
	creds := fs.String("nats-creds", "", "NATS credentials file (.creds)")
	user := fs.String("nats-user", "", "NATS user (with dpxe serve --nats-auth: worker-NAME)")
	passFile := fs.String("nats-password-file", "", "file holding the NATS password (dpxe workers add writes one)")
	ca := fs.String("nats-ca", "", "PEM file of the CA that signed the broker's certificate (dpxe serve --nats-tls-cert), trusted instead of the system's roots")
	return func(name string) ([]nats.Option, error) {
		opts := []nats.Option{nats.Name(name), nats.MaxReconnects(-1)}
		if *ca != "" {
			if _, err := os.Stat(*ca); err != nil {
				return nil, fmt.Errorf("nats-ca: %w", err)
			}
			opts = append(opts, nats.RootCAs(*ca))
		}
		if *creds != "" {
			opts = append(opts, nats.UserCredentials(*creds))
		}
		if (*user == "") != (*passFile == "") {
			return nil, fmt.Errorf("%w: --nats-user and --nats-password-file go together", errUsage)
		}
		if *user != "" {
			b, err := os.ReadFile(*passFile)
			if err != nil {
				return nil, fmt.Errorf("nats-password-file: %w", err)
			}
			opts = append(opts, nats.UserInfo(*user, strings.TrimSpace(string(b))))
		}
		return opts, nil
	}
}

func runEvents(ctx context.Context, args []string) error {
	if len(args) > 0 && args[0] == "stats" {
		return runEventsStats(ctx, args[1:])
	}
	if len(args) == 0 || args[0] != "tail" {
		return fmt.Errorf("%w: dpxe events tail [--event NAME] [--shard N] [--json] | dpxe events stats [--json]", errUsage)
	}
	fs := newFlagSet("events tail", "[--nats-url URL] [--app NAME] [--event NAME] [--shard N] [--json] [--all] [--count N]")
	natsURL := fs.String("nats-url", "nats://"+embedded.DefaultListen, "NATS server(s) of the fleet (dpxe serve's --nats-listen or --nats-url)")
	natsOpts := natsOptions(fs)
	app := fs.String("app", defaultEventsApp, "the bot's name in subjects (dpxe serve --events-app)")
	event := fs.String("event", "", "only this event, e.g. MESSAGE_CREATE")
	shard := fs.Int64("shard", -1, "only this shard")
	asJSON := fs.Bool("json", false, "one JSON object per event, with the Discord frame")
	all := fs.Bool("all", false, "print what the stream holds first, then live events")
	count := fs.Int("count", 0, "stop after this many events (0: until interrupted)")
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	cfg := dpxe.WatchConfig{App: *app, Event: *event, FromStart: *all}
	if *shard >= 0 {
		if *shard > events.MaxShard {
			return fmt.Errorf("%w: shard %d out of range 0..%d", errUsage, *shard, events.MaxShard)
		}
		s := uint32(*shard)
		cfg.Shard = &s
	}
	if *count < 0 {
		return fmt.Errorf("%w: count %d is negative", errUsage, *count)
	}
	if _, err := events.EventFilter(cfg.App, cfg.Shard, cfg.Event); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if _, err := natsHosts(*natsURL); err != nil {
		return fmt.Errorf("%w: nats-url: %v", errUsage, err)
	}
	opts, err := natsOpts("dpxe events tail")
	if err != nil {
		return err
	}
	nc, err := nats.Connect(*natsURL, opts...)
	if err != nil {
		hosts, _ := natsHosts(*natsURL)
		return fmt.Errorf("nats %v: %w", hosts, err)
	}
	defer nc.Close()
	return tail(ctx, nc, cfg, *asJSON, *count, os.Stdout, os.Stderr)
}

// tail prints events from nc until ctx ends or count events were printed.
func tail(ctx context.Context, nc *nats.Conn, cfg dpxe.WatchConfig, asJSON bool, count int, out, errOut io.Writer) error {
	w := bufio.NewWriter(out)
	defer w.Flush()
	enc := json.NewEncoder(w)
	n := 0
	err := dpxe.Watch(ctx, nc, cfg, func(ev *dpxe.Event) error {
		if asJSON {
			l := tailLine{Shard: ev.Shard, Seq: ev.Seq, Event: ev.Name, Session: ev.Session, Node: ev.Node,
				Received: ev.Received, StreamSeq: ev.StreamSeq}
			if json.Valid(ev.Raw) {
				l.Frame = ev.Raw
			} else {
				l.FrameText = string(ev.Raw)
			}
			if err := enc.Encode(l); err != nil {
				return err
			}
		} else {
			fmt.Fprintf(w, "%s  shard %d  seq %d  %s  node %s  session %s  %d bytes\n",
				ev.Received.UTC().Format("15:04:05.000"), ev.Shard, ev.Seq, ev.Name, ev.Node, ev.Session, len(ev.Raw))
		}
		if err := w.Flush(); err != nil {
			return err
		}
		n++
		if count > 0 && n >= count {
			return errStopTail
		}
		return nil
	}, func(err error) { fmt.Fprintf(errOut, "dpxe events tail: skipped: %v\n", err) })
	if errors.Is(err, errStopTail) {
		return nil
	}
	return err
}
