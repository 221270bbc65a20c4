package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/tools/gatewayemu"
)

func TestServeGatewayFlagsAndConfig(t *testing.T) {
	dir := t.TempDir()
	tokFile := filepath.Join(dir, "bot.token")
	os.WriteFile(tokFile, []byte("tok\n"), 0o600)

	// Defaults: no Gateway; intents 513.
	cfg, err := parseServeFlags(nil)
	if err != nil || cfg.enabled() || cfg.Intents != 513 || cfg.totalFixed || cfg.mcFixed {
		t.Fatalf("defaults %+v %v", cfg.gatewayConfig, err)
	}
	// The file, then flags over it.
	f := filepath.Join(dir, "gw.json")
	os.WriteFile(f, []byte(`{"gateway_api": "http://127.0.0.1:9000/api/v10", "bot_token_file": "`+tokFile+`",
		"intents": 1, "gateway_refresh": "1m", "resume_ttl": "90s", "max_concurrency": 4}`), 0o644)
	cfg, err = parseServeFlags([]string{"--config", f, "--intents", "32769", "--gateway-url", "ws://10.0.0.5:9000/"})
	if err != nil {
		t.Fatal(err)
	}
	g := cfg.gatewayConfig
	if g.GatewayAPI != "http://127.0.0.1:9000/api/v10" || g.GatewayURL != "ws://10.0.0.5:9000/" || g.BotTokenFile != tokFile ||
		g.Intents != 32769 || time.Duration(g.GatewayRefresh) != time.Minute || time.Duration(g.ResumeTTL) != 90*time.Second ||
		cfg.totalFixed || !cfg.mcFixed || cfg.controllerConfig().ResumeTTL != 90*time.Second {
		t.Fatalf("config %+v fixed %v %v", g, cfg.totalFixed, cfg.mcFixed)
	}
	if cfg, err = parseServeFlags([]string{"--config", f, "--total-shards", "8"}); err != nil || !cfg.totalFixed {
		t.Fatalf("--total-shards not fixed: %v", err)
	}

	bad := map[string][]string{
		"WSS":               {"--gateway-url", "WSS://gateway.discord.gg", "--bot-token-file", tokFile},
		"http url":          {"--gateway-url", "http://h/", "--bot-token-file", tokFile},
		"url without token": {"--gateway-url", "ws://h/"},
		"api without token": {"--gateway-api", "http://h/api/v10"},
		"token alone":       {"--bot-token-file", tokFile},
		"api scheme":        {"--gateway-api", "ws://h/api/v10", "--bot-token-file", tokFile},
		"intents 0":         {"--gateway-url", "ws://h/", "--bot-token-file", tokFile, "--intents", "0"},
		"intents huge":      {"--gateway-url", "ws://h/", "--bot-token-file", tokFile, "--intents", "4294967296"},
		"refresh short":     {"--gateway-api", "http://h/", "--bot-token-file", tokFile, "--gateway-refresh", "1s"},
		"resume ttl":        {"--gateway-url", "ws://h/", "--bot-token-file", tokFile, "--resume-ttl", "1h"},
	}
	for name, args := range bad {
		_, err := parseServeFlags(args)
		if !errors.Is(err, errUsage) {
			t.Errorf("%s accepted: %v", name, err)
		}
		if name == "WSS" && (err == nil || !strings.Contains(err.Error(), "wss://")) {
			t.Errorf("WSS error does not say why: %v", err)
		}
	}
	unknown := filepath.Join(dir, "unknown.json")
	os.WriteFile(unknown, []byte(`{"gateway_url": "ws://h/", "bot_token": "inline"}`), 0o644)
	if _, err := parseServeFlags([]string{"--config", unknown}); !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "bot_token") {
		t.Errorf("inline bot_token accepted: %v", err)
	}
}

func TestReadBotToken(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(body), mode)
		os.Chmod(p, mode)
		return p
	}
	for body, want := range map[string]string{"abc.def-ghi\n": "abc.def-ghi", "Bot abc\r\n": "abc", "  x  ": "x"} {
		got, err := readBotToken(write("ok", body, 0o600))
		if err != nil || got != want {
			t.Errorf("%q: %q %v", body, got, err)
		}
	}
	if _, err := readBotToken(write("ro", "tok", 0o400)); err != nil {
		t.Errorf("0400: %v", err)
	}
	_, err := readBotToken(write("open", "sekrit-token", 0o644))
	if err == nil || !strings.Contains(err.Error(), "chmod 600") || strings.Contains(err.Error(), "sekrit") {
		t.Errorf("0644: %v", err)
	}
	if _, err := readBotToken(write("group", "tok", 0o640)); err == nil {
		t.Error("0640 accepted")
	}
	for _, body := range []string{"", "two words-sekrit", `quo"te-sekrit`} {
		_, err := readBotToken(write("bad", body, 0o600))
		if err == nil || strings.Contains(err.Error(), "sekrit") {
			t.Errorf("%q: %v", body, err)
		}
	}
	if _, err := readBotToken(dir); err == nil {
		t.Error("a directory accepted")
	}
	if _, err := readBotToken(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing file accepted")
	}
}

// TestServeGatewayEndToEnd runs `dpxe serve --gateway-api` against the
// Gateway emulator: the shard count, max_concurrency and budget come from
// GET /gateway/bot, a node's check-in answer carries gateway_url,
// bot_token and intents, GET /v1/gateway shows where they came from, and
// the token never reaches the log.
func TestServeGatewayEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*e2eDeadline)
	defer cancel()
	const botToken = "MTIz.emulated-bot.TOKEN_e2e"
	emu, err := gatewayemu.Start(ctx, "127.0.0.1:0", gatewayemu.Options{Token: botToken, Shards: 3, MaxConcurrency: 2, SessionStarts: 77})
	if err != nil {
		t.Fatal(err)
	}
	defer emu.Close()
	dir := t.TempDir()
	bin := sharedDpxe(t)
	tokFile := filepath.Join(dir, "bot.token")
	os.WriteFile(tokFile, []byte(botToken+"\n"), 0o600)
	adminFile := filepath.Join(dir, "var", "admin.token")
	p := startServe(t, bin, "--db", filepath.Join(dir, "var", "dpxe.db"), "--no-dashboard",
		"--gateway-api", emu.HTTPURL()+"/api/v10", "--bot-token-file", tokFile, "--intents", "513")
	defer p.stop(t)
	admin, _ := os.ReadFile(adminFile)
	out, err := exec.Command(bin, "nodes", "--server", p.url, "--token-file", adminFile, "add", "gw-node").CombinedOutput()
	if err != nil {
		t.Fatalf("dpxe nodes add: %v\n%s", err, out)
	}
	cred := strings.TrimSpace(strings.Split(string(out), "\n")[1])

	var r appliance.CheckinResponse
	if code := httpJSON(t, "POST", p.url+"/v1/checkin", cred, `{"node_id":"gw-node","capacity":4}`, &r); code != 200 {
		t.Fatalf("check-in %d", code)
	}
	if r.TotalShards != 3 || r.MaxConcurrency != 2 || r.GatewayURL != emu.URL()+"/?v=10&encoding=json" || r.BotToken != botToken || r.Intents != 513 {
		t.Fatalf("check-in answer %+v", r)
	}
	var gv controller.GatewayView
	if code := httpJSON(t, "GET", p.url+"/v1/gateway", strings.TrimSpace(string(admin)), "", &gv); code != 200 ||
		gv.URLSource != "gateway_bot" || !gv.TokenSet || gv.DiscordShards != 3 || gv.FetchedAt.IsZero() {
		t.Fatalf("GET /v1/gateway %d %+v", code, gv)
	}
	var b controller.Budget
	if httpJSON(t, "GET", p.url+"/v1/budget", strings.TrimSpace(string(admin)), "", &b); b.Total != 77 {
		t.Fatalf("budget %+v", b)
	}
	if logs := p.logs(); strings.Contains(logs, botToken) || strings.Contains(logs, "TOKEN_e2e") {
		t.Fatalf("the bot token reached the log:\n%s", logs)
	}
	if !strings.Contains(p.logs(), "total shards from GET /gateway/bot") {
		t.Fatalf("log does not say where the total came from:\n%s", p.logs())
	}
}
