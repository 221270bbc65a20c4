package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/discord-pxe/dpxe/fleet/events"
	"github.com/discord-pxe/dpxe/fleet/events/embedded"
)

// `dpxe events stats`: what the event stream holds per shard (stored
// dispatches, that is acknowledged ones; the last session, sequence and
// its age) and how far each bot service's consumer is behind.

// shardStats is one shard's line.
type shardStats struct {
	Shard   uint32    `json:"shard"`
	Stored  uint64    `json:"stored"` // dispatches in the stream (acknowledged)
	Session string    `json:"session"`
	LastSeq uint64    `json:"last_seq"` // Dpxe-Seq of the newest stored dispatch
	Node    string    `json:"node"`
	Last    time.Time `json:"last_received"`
}

// consumerStats is one consumer's line.
type consumerStats struct {
	Name string `json:"name"`
	// Pending: stored and not yet delivered; Unacked: delivered and not
	// yet acknowledged. Their sum is the service's lag in events.
	Pending uint64 `json:"pending"`
	Unacked int    `json:"unacked"`
	Acked   uint64 `json:"acked_stream_seq"`
}

// eventStats is the whole `dpxe events stats --json` document.
type eventStats struct {
	Stream    string          `json:"stream"`
	Messages  uint64          `json:"messages"`
	Bytes     uint64          `json:"bytes"`
	FirstSeq  uint64          `json:"first_seq"`
	LastSeq   uint64          `json:"last_seq"`
	Shards    []shardStats    `json:"shards"`
	Consumers []consumerStats `json:"consumers"`
}

func runEventsStats(ctx context.Context, args []string) error {
	fs := newFlagSet("events stats", "[--nats-url URL] [--app NAME] [--json]")
	natsURL := fs.String("nats-url", "nats://"+embedded.DefaultListen, "NATS server(s) of the fleet")
	natsOpts := natsOptions(fs)
	app := fs.String("app", defaultEventsApp, "the bot's name in subjects (dpxe serve --events-app)")
	asJSON := fs.Bool("json", false, "one JSON document")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	if err := events.ValidateApp(*app); err != nil {
		return fmt.Errorf("%w: app: %v", errUsage, err)
	}
	if _, err := natsHosts(*natsURL); err != nil {
		return fmt.Errorf("%w: nats-url: %v", errUsage, err)
	}
	opts, err := natsOpts("dpxe events stats")
	if err != nil {
		return err
	}
	nc, err := nats.Connect(*natsURL, opts...)
	if err != nil {
		hosts, _ := natsHosts(*natsURL)
		return fmt.Errorf("nats %v: %w", hosts, err)
	}
	defer nc.Close()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := collectStats(cctx, nc, *app)
	if err != nil {
		return err
	}
	return printStats(os.Stdout, st, *asJSON, time.Now())
}

// maxStatsShards bounds the per-shard reads of one stats run.
const maxStatsShards = 1 << 16

// collectStats reads the stream's per-subject counts, the newest message
// of every shard and the consumers.
func collectStats(ctx context.Context, nc *nats.Conn, app string) (eventStats, error) {
	name, _ := events.StreamName(app)
	subj, _ := events.StreamSubjects(app)
	js, err := jetstream.New(nc)
	if err != nil {
		return eventStats{}, err
	}
	stream, err := js.Stream(ctx, name)
	if err != nil {
		return eventStats{}, fmt.Errorf("stream %s: %w", name, err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(subj))
	if err != nil {
		return eventStats{}, fmt.Errorf("stream %s: %w", name, err)
	}
	out := eventStats{Stream: name, Messages: info.State.Msgs, Bytes: info.State.Bytes,
		FirstSeq: info.State.FirstSeq, LastSeq: info.State.LastSeq, Shards: []shardStats{}, Consumers: []consumerStats{}}
	byShard := map[uint32]*shardStats{}
	for s, n := range info.State.Subjects {
		p, err := events.ParseSubject(s)
		if err != nil || p.Kind != events.KindEvent {
			continue
		}
		if byShard[p.Shard] == nil {
			if len(byShard) >= maxStatsShards {
				break
			}
			byShard[p.Shard] = &shardStats{Shard: p.Shard}
		}
		byShard[p.Shard].Stored += n
	}
	for id, ss := range byShard {
		filter, _ := events.EventFilter(app, &id, "")
		m, err := stream.GetLastMsgForSubject(ctx, filter)
		if err == nil {
			if meta, err := events.ParseHeader(m.Header); err == nil {
				ss.Session, ss.LastSeq, ss.Node, ss.Last = meta.Session, meta.Seq, meta.Node, meta.Received
			}
		} else if !errors.Is(err, jetstream.ErrMsgNotFound) {
			return out, fmt.Errorf("shard %d: newest message: %w", id, err)
		}
		out.Shards = append(out.Shards, *ss)
	}
	sort.Slice(out.Shards, func(i, j int) bool { return out.Shards[i].Shard < out.Shards[j].Shard })
	lister := stream.ListConsumers(ctx)
	for ci := range lister.Info() {
		out.Consumers = append(out.Consumers, consumerStats{Name: ci.Name, Pending: ci.NumPending,
			Unacked: ci.NumAckPending, Acked: ci.AckFloor.Stream})
	}
	if err := lister.Err(); err != nil {
		return out, fmt.Errorf("consumers of %s: %w", name, err)
	}
	sort.Slice(out.Consumers, func(i, j int) bool { return out.Consumers[i].Name < out.Consumers[j].Name })
	return out, nil
}

func printStats(w io.Writer, st eventStats, asJSON bool, now time.Time) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	fmt.Fprintf(w, "stream %s: %d events, %d bytes (stream seq %d-%d)\n\n", st.Stream, st.Messages, st.Bytes, st.FirstSeq, st.LastSeq)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SHARD\tSTORED\tLAST SEQ\tSESSION\tNODE\tLAST EVENT")
	for _, s := range st.Shards {
		age := "-"
		if !s.Last.IsZero() {
			age = now.Sub(s.Last).Round(time.Millisecond).String() + " ago"
		}
		fmt.Fprintf(tw, "%d\t%d\t%d\t%s\t%s\t%s\n", s.Shard, s.Stored, s.LastSeq, dashIfEmpty(s.Session), dashIfEmpty(s.Node), age)
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONSUMER\tPENDING\tUNACKED\tLAG\tACKED UP TO")
	for _, c := range st.Consumers {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\n", c.Name, c.Pending, c.Unacked, c.Pending+uint64(c.Unacked), strconv.FormatUint(c.Acked, 10))
	}
	return tw.Flush()
}

func dashIfEmpty(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
