// Command gateway-emulator runs the Discord Gateway emulator of package
// tools/gatewayemu as a stand-alone server, for the kernel in QEMU, for
// end-to-end tests and for poking at by hand.
//
// It serves, on one address: GET /api/v10|v9/gateway[/bot], the WebSocket
// gateway on / (and /resume for resume_gateway_url), GET /debug/state (the
// violation record), POST /debug/fault (fault injection) and, with -tls,
// GET /debug/ca.pem. See docs/gateway-emulator.md.
//
// Usage:
//
//	gateway-emulator [-listen 127.0.0.1:7878] [-token T] [-shards N] [-max-concurrency N] ...
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/discord-pxe/dpxe/tools/gatewayemu"
)

// DefaultListen is the default listen address: loopback only.
const DefaultListen = "127.0.0.1:7878"

// config is everything the flags set.
type config struct {
	listen    string
	caOut     string
	script    string
	logLevel  slog.Level
	opts      gatewayemu.Options
	showUsage bool
}

// errUsage marks bad command-line arguments (exit status 2).
var errUsage = errors.New("usage")

// parseFlags turns arguments into a config.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("gateway-emulator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &cfg.opts
	fs.StringVar(&cfg.listen, "listen", DefaultListen, "listen address (host:port; port 0 picks one)")
	fs.StringVar(&o.PublicHost, "public-host", "", "host:port written into gateway URLs (default: the listen address; a host alone keeps the listen port)")
	fs.StringVar(&o.ResumeHost, "resume-host", "", "host[:port] of resume_gateway_url, e.g. gateway-us-east1-b.discord.gg (default: the public host with path /resume)")
	fs.IntVar(&o.ResumeUnavailable, "resume-unavailable", 0, "answer this many handshakes on the resume URL with HTTP 503")
	fs.Uint64Var(&o.Seed, "seed", 0, "seed of the synthetic payload shapes and fragment boundaries")
	fs.IntVar(&o.ReadyUnavailableGuilds, "ready-unavailable-guilds", 0, "extra unavailable guilds listed in every READY (about 45 bytes each)")
	fs.Var((*sizeList)(&o.GuildCreateBytes), "guild-create-bytes", "sizes of the first GUILD_CREATEs of each session, comma-separated, with an optional KiB or MiB suffix (e.g. 8MiB,64KiB)")
	fs.IntVar(&o.GuildMembers, "guild-members", gatewayemu.DefaultGuildMembers, "members of every synthetic guild (Request Guild Members answers from them)")
	fs.DurationVar(&o.MemberRequestWindow, "member-request-window", gatewayemu.DefaultMemberRequestWindow, "window of the one-per-guild all-members Request Guild Members limit")
	fs.IntVar(&o.FragmentFrames, "fragment-frames", 0, "send every message in 1..N data frames plus an empty final frame (0: one frame)")
	fs.StringVar(&o.Token, "token", gatewayemu.DefaultToken, "the bot token the emulator accepts")
	fs.IntVar(&o.Shards, "shards", 1, "recommended shard count returned by /gateway/bot")
	fs.IntVar(&o.ShardMultiple, "shard-multiple", 0, "large-bot mode: num_shards must be a multiple of this (0 = off)")
	fs.IntVar(&o.MaxConcurrency, "max-concurrency", 1, "session_start_limit.max_concurrency")
	fs.DurationVar(&o.IdentifyWindow, "identify-window", gatewayemu.DefaultIdentifyWindow, "per-bucket Identify window")
	fs.DurationVar(&o.IdentifyRejectDelay, "identify-reject-delay", gatewayemu.DefaultIdentifyRejectDelay, "delay before op 9 for an Identify refused by its bucket")
	fs.DurationVar(&o.HeartbeatInterval, "heartbeat-interval", gatewayemu.DefaultHeartbeatInterval, "heartbeat_interval sent in Hello")
	fs.DurationVar(&o.HeartbeatGrace, "heartbeat-grace", 0, "extra time after the interval before a silent client is closed with 4009 (default interval/4)")
	fs.IntVar(&o.SessionStarts, "budget", gatewayemu.DefaultSessionStarts, "daily session-start budget (session_start_limit.total)")
	fs.DurationVar(&o.BudgetPeriod, "budget-period", gatewayemu.DefaultBudgetPeriod, "how often the session-start budget resets")
	fs.BoolVar(&o.KeepTokenOnExhaust, "keep-token", false, "keep the token valid after the budget is exceeded")
	fs.IntVar(&o.Guilds, "guilds", gatewayemu.DefaultGuilds, "number of synthetic guilds")
	fs.Float64Var(&o.MessagesPerSecond, "message-rate", 0, "synthetic MESSAGE_CREATE per second per ready session")
	fs.IntVar(&o.MessageBytes, "message-bytes", 0, "pad each synthetic MESSAGE_CREATE so that its op-0 frame is about N bytes (0: unpadded, about 490)")
	fs.IntVar(&o.PingEvery, "ping-every", 0, "make every N-th synthetic guild MESSAGE_CREATE of a session a \"!ping\" (0 = none)")
	fs.IntVar(&o.RESTMessageLimit, "rest-message-limit", gatewayemu.DefaultRESTMessageLimit, "messages per channel per -rest-message-window through POST /channels/{id}/messages; more get 429")
	fs.DurationVar(&o.RESTMessageWindow, "rest-message-window", gatewayemu.DefaultRESTMessageWindow, "window of -rest-message-limit")
	fs.DurationVar(&o.ResumeTimeout, "resume-timeout", gatewayemu.DefaultResumeTimeout, "how long a disconnected session stays resumable")
	fs.DurationVar(&o.ReconnectGrace, "reconnect-grace", gatewayemu.DefaultReconnectGrace, "after an injected op 7, close the connection after this long")
	fs.DurationVar(&o.SendWindow, "send-window", 0, "window of the 120-event send limit (default 60s, scaled down with a short heartbeat interval)")
	fs.Int64Var(&o.ApprovedIntents, "approved-intents", 0, "privileged intents enabled for the app (bits 1, 8, 15)")
	fs.BoolVar(&o.AllowUnknownFields, "allow-unknown-fields", false, "accept unknown fields in Identify/Resume d instead of closing with 4001")
	fs.BoolVar(&o.SkipBucketOrder, "skip-bucket-order", false, "do not record bucket_out_of_order violations")
	fs.BoolVar(&o.TLS, "tls", false, "serve https/wss with a CA generated at start (plain http/ws otherwise)")
	fs.StringVar(&cfg.caOut, "ca-out", "", "with -tls: write the CA certificate (PEM) to this file")
	fs.StringVar(&cfg.script, "script", "", "fault script to run after start (JSON lines, see docs)")
	level := fs.String("log-level", "info", "log level: debug, info, warn, error")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			cfg.showUsage = true
			return cfg, nil
		}
		return cfg, fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() != 0 {
		return cfg, fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	if err := cfg.logLevel.UnmarshalText([]byte(*level)); err != nil {
		return cfg, fmt.Errorf("%w: -log-level: %v", errUsage, err)
	}
	if cfg.caOut != "" && !o.TLS {
		return cfg, fmt.Errorf("%w: -ca-out needs -tls", errUsage)
	}
	if _, _, err := net.SplitHostPort(cfg.listen); err != nil {
		return cfg, fmt.Errorf("%w: -listen %q: %v", errUsage, cfg.listen, err)
	}
	return cfg, nil
}

// sizeList is a flag of comma-separated byte sizes with an optional KiB or
// MiB suffix.
type sizeList []int

func (l *sizeList) String() string {
	if l == nil {
		return ""
	}
	parts := make([]string, len(*l))
	for i, n := range *l {
		parts[i] = strconv.Itoa(n)
	}
	return strings.Join(parts, ",")
}

func (l *sizeList) Set(s string) error {
	var out []int
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		mult := 1
		switch {
		case strings.HasSuffix(part, "MiB"):
			mult, part = 1<<20, strings.TrimSuffix(part, "MiB")
		case strings.HasSuffix(part, "KiB"):
			mult, part = 1<<10, strings.TrimSuffix(part, "KiB")
		}
		n, err := strconv.Atoi(part)
		if err != nil || n < 0 || n > gatewayemu.MaxGuildCreateBytes/mult {
			return fmt.Errorf("size %q: want a byte count up to %d, optionally with KiB or MiB", part, gatewayemu.MaxGuildCreateBytes)
		}
		out = append(out, n*mult)
	}
	*l = out
	return nil
}

// run starts the emulator and serves until ctx ends. It reports the URLs on
// stdout once listening, one "name: value" per line.
func run(ctx context.Context, cfg config, stdout, stderr io.Writer) error {
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: cfg.logLevel}))
	cfg.opts.Logger = log
	e, err := gatewayemu.Start(ctx, cfg.listen, cfg.opts)
	if err != nil {
		return err
	}
	defer e.Close()

	if cfg.caOut != "" {
		if err := os.WriteFile(cfg.caOut, e.CAPEM(), 0o644); err != nil {
			return fmt.Errorf("write CA: %w", err)
		}
	}
	fmt.Fprintf(stdout, "gateway: %s/?v=10&encoding=json\nresume: %s\nrest: %s\nstate: %s%s\nfault: %s%s\n",
		e.URL(), e.ResumeURL(), e.APIBase(10), e.HTTPURL(), gatewayemu.StatePath, e.HTTPURL(), gatewayemu.FaultPath)
	if cfg.opts.TLS {
		fmt.Fprintf(stdout, "ca: %s%s\n", e.HTTPURL(), gatewayemu.CAPath)
	}
	if cfg.script != "" {
		f, err := os.Open(cfg.script)
		if err != nil {
			return fmt.Errorf("fault script: %w", err)
		}
		go func() {
			defer f.Close()
			if err := e.RunScript(ctx, f); err != nil && !errors.Is(err, context.Canceled) {
				log.Error("fault script", "err", err)
			}
		}()
	}
	<-ctx.Done()
	return nil
}

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	switch {
	case err != nil:
		fmt.Fprintln(os.Stderr, "gateway-emulator:", err)
		os.Exit(2)
	case cfg.showUsage:
		os.Exit(0)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	if err := run(ctx, cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "gateway-emulator:", err)
		os.Exit(1)
	}
	slog.Info("gateway emulator stopped", "uptime", time.Since(start).Round(time.Second))
}
