package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/tools/gatewayemu"
)

func TestParseFlags(t *testing.T) {
	cases := []struct {
		name  string
		args  []string
		ok    bool
		check func(config) bool
	}{
		{"defaults", nil, true, func(c config) bool {
			return c.listen == DefaultListen && c.opts.Token == gatewayemu.DefaultToken &&
				c.opts.HeartbeatInterval == gatewayemu.DefaultHeartbeatInterval && !c.opts.TLS
		}},
		{"all knobs", []string{"-listen", "127.0.0.1:0", "-token", "t", "-shards", "32", "-max-concurrency", "16",
			"-identify-window", "1s", "-heartbeat-interval", "2s", "-budget", "20", "-guilds", "100",
			"-message-rate", "2.5", "-message-bytes", "1024", "-tls", "-ca-out", "/tmp/x.pem", "-log-level", "debug"}, true, func(c config) bool {
			o := c.opts
			return o.Token == "t" && o.Shards == 32 && o.MaxConcurrency == 16 && o.IdentifyWindow == time.Second &&
				o.HeartbeatInterval == 2*time.Second && o.SessionStarts == 20 && o.Guilds == 100 &&
				o.MessagesPerSecond == 2.5 && o.MessageBytes == 1024 && o.TLS && c.caOut == "/tmp/x.pem"
		}},
		{"shapes and hosts", []string{"-public-host", "gateway.discord.gg", "-resume-host", "gateway-us-east1-b.discord.gg",
			"-resume-unavailable", "2", "-seed", "7", "-ready-unavailable-guilds", "4600", "-guild-create-bytes", "8MiB, 64KiB,3000",
			"-guild-members", "60000", "-member-request-window", "5s", "-fragment-frames", "16"}, true, func(c config) bool {
			o := c.opts
			return o.PublicHost == "gateway.discord.gg" && o.ResumeHost == "gateway-us-east1-b.discord.gg" &&
				o.ResumeUnavailable == 2 && o.Seed == 7 && o.ReadyUnavailableGuilds == 4600 &&
				len(o.GuildCreateBytes) == 3 && o.GuildCreateBytes[0] == 8<<20 && o.GuildCreateBytes[1] == 64<<10 &&
				o.GuildCreateBytes[2] == 3000 && o.GuildMembers == 60000 && o.MemberRequestWindow == 5*time.Second &&
				o.FragmentFrames == 16
		}},
		{"bad size", []string{"-guild-create-bytes", "8GiB"}, false, nil},
		{"size too large", []string{"-guild-create-bytes", "65MiB"}, false, nil},
		{"negative size", []string{"-guild-create-bytes", "-1"}, false, nil},
		{"bad duration", []string{"-identify-window", "soon"}, false, nil},
		{"bad int", []string{"-shards", "many"}, false, nil},
		{"extra argument", []string{"serve"}, false, nil},
		{"ca-out without tls", []string{"-ca-out", "x.pem"}, false, nil},
		{"bad listen", []string{"-listen", "7878"}, false, nil},
		{"bad log level", []string{"-log-level", "loud"}, false, nil},
		{"help", []string{"-h"}, true, func(c config) bool { return c.showUsage }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parseFlags(tc.args, io.Discard)
			if tc.ok != (err == nil) {
				t.Fatalf("err = %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, errUsage) {
				t.Fatalf("error %v is not a usage error", err)
			}
			if tc.check != nil && !tc.check(cfg) {
				t.Fatalf("config %+v", cfg)
			}
		})
	}
}

// TestRunServesWithTLSAndScript runs the command on port 0 with TLS, a CA
// file and a fault script, then uses the printed URLs.
func TestRunServesWithTLSAndScript(t *testing.T) {
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.pem")
	script := filepath.Join(dir, "faults.jsonl")
	if err := os.WriteFile(script, []byte("# stop ACKing shard 3 at once\n{\"at_ms\":0,\"kind\":\"stop_ack\",\"shard\":3}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := parseFlags([]string{"-listen", "127.0.0.1:0", "-tls", "-ca-out", caFile, "-script", script,
		"-token", "cmd-token", "-shards", "4", "-log-level", "error"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, pw, io.Discard); pw.Close() }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("run did not stop")
		}
	}()

	urls := map[string]string{}
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ": ")
		urls[k] = v
		if k == "ca" {
			break
		}
	}
	go io.Copy(io.Discard, pr)
	if !strings.HasPrefix(urls["gateway"], "wss://127.0.0.1:") || !strings.HasPrefix(urls["rest"], "https://") {
		t.Fatalf("printed %v", urls)
	}
	pemBytes, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemBytes) {
		t.Fatal("CA file is not PEM")
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: 10 * time.Second}
	req, _ := http.NewRequest(http.MethodGet, urls["rest"]+"gateway/bot", nil)
	req.Header.Set("Authorization", "Bot cmd-token")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var gb struct {
		URL    string `json:"url"`
		Shards int    `json:"shards"`
	}
	json.NewDecoder(resp.Body).Decode(&gb)
	resp.Body.Close()
	if resp.StatusCode != 200 || gb.Shards != 4 || !strings.HasPrefix(urls["gateway"], gb.URL) {
		t.Fatalf("gateway/bot %d %+v", resp.StatusCode, gb)
	}
	// The script ran: shard 3 is under stop_ack.
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := hc.Get(urls["state"])
		if err != nil {
			t.Fatal(err)
		}
		var st gatewayemu.State
		json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if len(st.AckSuppressed) == 1 && st.AckSuppressed[0] == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("script not applied: %+v", st.AckSuppressed)
		}
		time.Sleep(20 * time.Millisecond) // poll with a deadline
	}
	// And the fault API answers.
	resp, err = hc.Post(urls["fault"], "application/json", strings.NewReader(`{"kind":"resume_ack","shard":3}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("fault status %d", resp.StatusCode)
	}
}

// TestRunPrintsHostNames runs the command with Discord's host names and
// checks the printed URLs carry them (the resume URL without a path) and
// that the shape flags reached the emulator: /gateway/bot answers through
// the listener with the public name in its url.
func TestRunPrintsHostNames(t *testing.T) {
	cfg, err := parseFlags([]string{"-listen", "127.0.0.1:0", "-public-host", "gateway.discord.gg",
		"-resume-host", "gateway-us-east1-b.discord.gg", "-guild-create-bytes", "1MiB", "-fragment-frames", "4",
		"-log-level", "error"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, pw, io.Discard); pw.Close() }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("run did not stop")
		}
	}()
	urls := map[string]string{}
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ": ")
		urls[k] = v
		if k == "fault" {
			break
		}
	}
	go io.Copy(io.Discard, pr)
	port := strings.TrimSuffix(strings.TrimPrefix(urls["gateway"], "ws://gateway.discord.gg:"), "/?v=10&encoding=json")
	if port == urls["gateway"] || urls["resume"] != "ws://gateway-us-east1-b.discord.gg:"+port {
		t.Fatalf("printed %v", urls)
	}
	req, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1:"+port+"/api/v10/gateway/bot", nil)
	req.Header.Set("Authorization", "Bot "+gatewayemu.DefaultToken)
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var gb struct {
		URL string `json:"url"`
	}
	json.NewDecoder(resp.Body).Decode(&gb)
	resp.Body.Close()
	if gb.URL != "ws://gateway.discord.gg:"+port {
		t.Fatalf("gateway/bot url %q", gb.URL)
	}
}
