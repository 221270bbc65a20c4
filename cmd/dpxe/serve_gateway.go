package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// The Gateway part of `dpxe serve`: the settings nodes need to open their
// Discord Gateway sessions (docs/protocol.md, "Gateway settings"). The bot
// token is read from a file here and handed to authenticated nodes in
// their check-in answers, so it is never on boot media or in a netboot
// script. With --gateway-api the controller fetches GET /gateway/bot at
// start and every --gateway-refresh.

// gatewayConfig is the Gateway part of serveConfig (its JSON names are
// promoted into the --config file).
type gatewayConfig struct {
	GatewayAPI     string   `json:"gateway_api"`
	GatewayURL     string   `json:"gateway_url"`
	BotTokenFile   string   `json:"bot_token_file"`
	Intents        uint32   `json:"intents"`
	GatewayRefresh duration `json:"gateway_refresh"`
	ResumeTTL      duration `json:"resume_ttl"`
}

// Limits of the Gateway settings.
const (
	maxBotTokenFile   = 4096
	minGatewayRefresh = 10 * time.Second
)

// gatewayFlags are the Gateway flags as parsed; gatewayVisited names the
// ones given on the command line.
var gatewayFlags struct {
	api, url, tokenFile string
	intents             uint
	refresh, resumeTTL  time.Duration
}

func init() {
	registerServePart(servePart{
		name: "gateway",
		flags: func(fs *flag.FlagSet) {
			f := &gatewayFlags
			fs.StringVar(&f.api, "gateway-api", "", "Discord REST base to fetch GET /gateway/bot from (e.g. https://discord.com/api/v10, or http://127.0.0.1:9000/api/v10 for the emulator); needs --bot-token-file")
			fs.StringVar(&f.url, "gateway-url", "", "Gateway URL handed to nodes, ws:// or wss:// (default: the url of GET /gateway/bot)")
			fs.StringVar(&f.tokenFile, "bot-token-file", "", "file holding the bot token (mode 0600 or stricter; read at start)")
			fs.UintVar(&f.intents, "intents", controller.DefaultIntents, "Gateway intents for Identify (513 = GUILDS | GUILD_MESSAGES)")
			fs.DurationVar(&f.refresh, "gateway-refresh", controller.DefaultGatewayRefresh, "how often to fetch GET /gateway/bot")
			fs.DurationVar(&f.resumeTTL, "resume-ttl", controller.DefaultResumeTTL, "how long a released session is offered to the shard's next owner")
		},
		apply:  applyGatewayFlags,
		attach: attachGateway,
	})
}

// applyGatewayFlags lays the Gateway flags given on the command line over
// cfg (defaults and --config) and checks the result.
func applyGatewayFlags(fs *flag.FlagSet, cfg *serveConfig) error {
	f := &gatewayFlags
	g := &cfg.gatewayConfig
	fs.Visit(func(fl *flag.Flag) {
		switch fl.Name {
		case "gateway-api":
			g.GatewayAPI = f.api
		case "gateway-url":
			g.GatewayURL = f.url
		case "bot-token-file":
			g.BotTokenFile = f.tokenFile
		case "intents":
			g.Intents = uint32(min(f.intents, 1<<32-1))
			if f.intents > 1<<31-1 {
				g.Intents = 0 // refused below
			}
		case "gateway-refresh":
			g.GatewayRefresh = duration(f.refresh)
		case "resume-ttl":
			g.ResumeTTL = duration(f.resumeTTL)
		}
	})
	return g.check()
}

// check validates the Gateway settings (not the token file's contents,
// which are read at start).
func (g *gatewayConfig) check() error {
	switch {
	case g.Intents == 0 || g.Intents > 1<<31-1:
		return fmt.Errorf("%w: intents must be 1..2147483647 (a Gateway intents bitmask; 0 would receive no events)", errUsage)
	case time.Duration(g.GatewayRefresh) < minGatewayRefresh || time.Duration(g.GatewayRefresh) > 24*time.Hour:
		return fmt.Errorf("%w: gateway-refresh %v out of range %v..24h", errUsage, time.Duration(g.GatewayRefresh), minGatewayRefresh)
	case time.Duration(g.ResumeTTL) < time.Second || time.Duration(g.ResumeTTL) > 10*time.Minute:
		return fmt.Errorf("%w: resume-ttl %v out of range 1s..10m", errUsage, time.Duration(g.ResumeTTL))
	}
	if g.GatewayURL != "" {
		if _, err := appliance.GatewayDialURL(g.GatewayURL); err != nil {
			return fmt.Errorf("%w: gateway-url %q: %v", errUsage, g.GatewayURL, err)
		}
	}
	if g.GatewayAPI != "" {
		// The token is checked when the file is read; a placeholder
		// checks the URL alone here.
		if _, err := controller.NewGatewayBotClient(g.GatewayAPI, "x"); err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
	}
	enabled := g.GatewayAPI != "" || g.GatewayURL != ""
	switch {
	case enabled && g.BotTokenFile == "":
		return fmt.Errorf("%w: --gateway-api and --gateway-url need --bot-token-file (nodes Identify with the token, and GET /gateway/bot needs it)", errUsage)
	case !enabled && g.BotTokenFile != "":
		return fmt.Errorf("%w: --bot-token-file needs --gateway-api or --gateway-url (nodes would get a token but no Gateway)", errUsage)
	}
	return nil
}

// enabled reports whether nodes get Gateway settings at all.
func (g *gatewayConfig) enabled() bool { return g.GatewayAPI != "" || g.GatewayURL != "" }

// readBotToken reads the bot token file: a regular file that neither group
// nor others may read or write (like ssh's private keys), holding the token
// alone (surrounding white space and a "Bot " prefix are dropped). Errors
// never contain the file's contents.
func readBotToken(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("bot token file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("bot token file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("bot token file %s: not a regular file", path)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return "", fmt.Errorf("bot token file %s: mode %04o lets group or others read it; run chmod 600 %s", path, perm, path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxBotTokenFile+1))
	if err != nil {
		return "", fmt.Errorf("bot token file %s: %w", path, err)
	}
	if len(b) > maxBotTokenFile {
		return "", fmt.Errorf("bot token file %s: larger than %d bytes", path, maxBotTokenFile)
	}
	tok := strings.TrimSpace(string(b))
	tok = strings.TrimSpace(strings.TrimPrefix(tok, "Bot "))
	if err := controller.ValidateBotToken(tok); err != nil {
		return "", fmt.Errorf("bot token file %s: %w", path, err)
	}
	return tok, nil
}

// gatewayBoot is what buildFleet prepared for the Gateway part.
type gatewayBoot struct {
	settings controller.GatewaySettings
	client   *controller.GatewayBotClient // nil without --gateway-api
	first    *controller.GatewayBot       // a fetch made before the controller existed
}

// prepareGateway reads the token and, when the shard total follows
// Discord (--gateway-api without --total-shards), fetches GET /gateway/bot
// before the controller is built and sets cfg.TotalShards from it. When the
// fetch fails, the stored plan's total is used if there is one; otherwise
// it keeps trying with backoff until it succeeds or ctx ends, since no
// sensible plan exists without a shard count.
func prepareGateway(ctx context.Context, cfg *serveConfig, st *store.Store, log *slog.Logger) (*gatewayBoot, error) {
	g := &cfg.gatewayConfig
	if !g.enabled() {
		return nil, nil
	}
	tok, err := readBotToken(g.BotTokenFile)
	if err != nil {
		return nil, err
	}
	b := &gatewayBoot{settings: controller.GatewaySettings{URL: g.GatewayURL, Token: tok, Intents: g.Intents,
		MaxConcurrencyFixed: cfg.mcFixed, TotalShardsFixed: cfg.totalFixed}}
	if g.GatewayAPI == "" {
		return b, nil
	}
	if b.client, err = controller.NewGatewayBotClient(g.GatewayAPI, tok); err != nil {
		return nil, err
	}
	if cfg.totalFixed {
		return b, nil
	}
	plan, havePlan, err := st.LoadPlan(ctx)
	if err != nil {
		return nil, err
	}
	wait := 2 * time.Second
	for attempt := 1; ; attempt++ {
		gb, after, err := b.client.Fetch(ctx)
		if err == nil {
			err = gb.Validate()
		}
		if err == nil {
			b.first = &gb
			cfg.TotalShards = uint32(gb.Shards)
			log.Info("total shards from GET /gateway/bot", "total_shards", gb.Shards)
			return b, nil
		}
		if havePlan {
			cfg.TotalShards = plan.TotalShards
			log.Warn("GET /gateway/bot failed; using the stored plan's shard count and retrying in the background",
				"err", err, "total_shards", plan.TotalShards)
			return b, nil
		}
		wait = max(wait, after)
		log.Warn("GET /gateway/bot failed; the shard count comes from it (or give --total-shards)", "err", err,
			"attempt", attempt, "retry_in", wait)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for GET /gateway/bot: %w", context.Cause(ctx))
		case <-time.After(wait):
		}
		wait = min(wait*2, time.Minute)
	}
}

// newGatewayController builds the controller; when the total came from
// Discord and the store's plan has another total that nodes still hold,
// it keeps the stored total (resharding waits until the fleet lets go) and
// says so.
func newGatewayController(ctx context.Context, st *store.Store, cfg *serveConfig, b *gatewayBoot, log *slog.Logger) (*controller.Controller, error) {
	ctrl, err := controller.New(ctx, st, cfg.controllerConfig(), time.Now, log)
	if err == nil || b == nil || b.first == nil || !errors.Is(err, controller.ErrTotalChanged) {
		return ctrl, err
	}
	plan, ok, perr := st.LoadPlan(ctx)
	if perr != nil || !ok {
		return nil, err
	}
	log.Warn("Discord recommends another shard count, but nodes still hold shards of the stored plan; keeping it until they let go (drain them, or stop them and wait a lease, then restart)",
		"recommended", cfg.TotalShards, "total_shards", plan.TotalShards)
	cfg.TotalShards = plan.TotalShards
	return controller.New(ctx, st, cfg.controllerConfig(), time.Now, log)
}

// finishGateway installs the settings in the controller and applies the
// answer fetched before it existed.
func finishGateway(ctx context.Context, ctrl *controller.Controller, b *gatewayBoot) error {
	if b == nil {
		return nil
	}
	if err := ctrl.SetGateway(b.settings); err != nil {
		return err
	}
	if b.first != nil {
		return ctrl.ApplyGatewayBot(ctx, *b.first)
	}
	return nil
}

// attachGateway returns the refresh loop of GET /gateway/bot.
func attachGateway(ctx context.Context, app *fleetApp, log *slog.Logger) (func(context.Context) error, error) {
	b := app.gateway
	if b == nil {
		log.Info("no Gateway settings: nodes get no gateway_url or bot_token (give --gateway-api or --gateway-url with --bot-token-file)")
		return nil, nil
	}
	g := app.cfg.gatewayConfig
	log.Info("Gateway settings for nodes", "gateway_api", g.GatewayAPI, "gateway_url", g.GatewayURL,
		"bot_token_file", g.BotTokenFile, "intents", g.Intents, "resume_ttl", time.Duration(g.ResumeTTL))
	if b.client == nil {
		return nil, nil
	}
	every := time.Duration(g.GatewayRefresh)
	initial := b.first == nil
	return func(ctx context.Context) error {
		app.controller.RunGatewayRefresh(ctx, b.client, every, initial)
		return nil
	}, nil
}
