// Command pingbot is a small bot on Discord-PXE: it reads MESSAGE_CREATE
// events from the fleet's NATS JetStream stream with the Go SDK
// (sdk/dpxe) and answers every "!ping" with "pong" through Discord's REST
// API (POST /channels/{id}/messages), waiting as long as a 429 says.
//
//	pingbot -token-file bot.token [-nats-url nats://127.0.0.1:4222]
//	        [-api https://discord.com/api/v10] [-app bot] [-service pingbot]
//	        [-nats-user worker-pingbot -nats-password-file worker-pingbot.token]
//
// Start as many as you like: they share the durable consumer named by
// -service, so each event goes to one of them. `make run` starts one
// against the Gateway emulator (docs/events.md, "pingbot").
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/discord-pxe/dpxe/sdk/dpxe"
)

func main() {
	natsURL := flag.String("nats-url", "nats://127.0.0.1:4222", "the fleet's NATS server (dpxe serve --nats-listen)")
	creds := flag.String("nats-creds", "", "NATS credentials file (.creds), if the server asks for one")
	user := flag.String("nats-user", "", "NATS user (dpxe serve --nats-auth: worker-NAME from dpxe workers add)")
	passFile := flag.String("nats-password-file", "", "file holding the NATS user's password")
	api := flag.String("api", "https://discord.com/api/v10", "Discord's REST API base")
	tokenFile := flag.String("token-file", "", "file holding the bot token (required)")
	app := flag.String("app", "bot", "the app name in subjects (dpxe serve --events-app)")
	service := flag.String("service", "pingbot", "the durable consumer this bot reads with")
	caFile := flag.String("ca-file", "", "PEM file of CA certificates to trust for -api besides the system's (make run's Gateway emulator CA)")
	natsCA := flag.String("nats-ca", "", "PEM file of the CA that signed the NATS server's certificate (dpxe serve --nats-tls-cert)")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	opts := []nats.Option{nats.Name("pingbot"), nats.MaxReconnects(-1)}
	if *natsCA != "" {
		opts = append(opts, nats.RootCAs(*natsCA)) // checked at Connect: a bad file stops pingbot there
	}
	if *creds != "" {
		opts = append(opts, nats.UserCredentials(*creds))
	}
	if *user != "" {
		pass, err := os.ReadFile(*passFile)
		if err != nil {
			log.Error("-nats-password-file", "err", err)
			os.Exit(2)
		}
		opts = append(opts, nats.UserInfo(*user, strings.TrimSpace(string(pass))))
	}
	hc, err := restClient(*caFile)
	if err != nil {
		log.Error("pingbot cannot start", "err", err)
		os.Exit(2)
	}
	if err := run(*natsURL, opts, *api, *tokenFile, *app, *service, hc, log); err != nil {
		log.Error("pingbot stopped", "err", err)
		os.Exit(1)
	}
}

// restClient is the HTTP client of the REST API: the system's roots, plus
// the certificates of caFile when given (the lab's emulator serves https
// from a test CA). Verification stays on.
func restClient(caFile string) (*http.Client, error) {
	hc := &http.Client{Timeout: 10 * time.Second}
	if caFile == "" {
		return hc, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("-ca-file: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("-ca-file %s: no PEM certificate in it", caFile)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	hc.Transport = tr
	return hc, nil
}

func run(natsURL string, opts []nats.Option, api, tokenFile, app, service string, hc *http.Client, log *slog.Logger) error {
	if tokenFile == "" {
		return errors.New("-token-file: required (a file with the bot token)")
	}
	tok, err := os.ReadFile(tokenFile)
	if err != nil {
		return fmt.Errorf("-token-file: %w", err)
	}
	nc, err := nats.Connect(natsURL, opts...)
	if err != nil {
		return fmt.Errorf("NATS %s: %w", natsURL, err)
	}
	defer nc.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	svc, err := dpxe.NewService(ctx, nc, dpxe.Config{App: app, Service: service, Events: []string{"MESSAGE_CREATE"}})
	if err != nil {
		return err
	}
	b := newBot(api, strings.TrimSpace(string(tok)), log)
	b.hc = hc
	log.Info("pingbot is reading MESSAGE_CREATE", "nats", natsURL, "app", app, "service", service, "api", api)
	return svc.Run(ctx, b.handle, func(err error) { log.Warn("not an event", "err", err) })
}

// bot answers pings. Safe for concurrent use.
type bot struct {
	api, token string
	hc         *http.Client
	log        *slog.Logger
	// maxWait bounds one wait for a 429's retry_after.
	maxWait time.Duration

	mu       sync.Mutex
	answered map[string]bool // message IDs answered, so a redelivery is not answered twice
	order    []string        // the same IDs, oldest first, to forget the oldest
}

// rememberAnswers bounds the answered set.
const rememberAnswers = 10000

func newBot(api, token string, log *slog.Logger) *bot {
	return &bot{api: strings.TrimSuffix(api, "/"), token: token, hc: &http.Client{Timeout: 10 * time.Second},
		log: log, maxWait: time.Minute, answered: map[string]bool{}}
}

// message is the part of a MESSAGE_CREATE the bot reads.
type message struct {
	ID        string `json:"id"`
	ChannelID string `json:"channel_id"`
	Content   string `json:"content"`
	Author    struct {
		Bot bool `json:"bot"`
	} `json:"author"`
}

// handle answers one MESSAGE_CREATE. Returning nil acknowledges the event;
// an error has it delivered again.
func (b *bot) handle(ctx context.Context, ev *dpxe.Event) error {
	var m message
	if err := ev.Decode(&m); err != nil || m.Author.Bot || strings.TrimSpace(m.Content) != "!ping" {
		return nil // not for us
	}
	if b.wasAnswered(m.ID) {
		return nil
	}
	if err := b.reply(ctx, m.ChannelID, m.ID, "pong"); err != nil {
		b.log.Warn("no reply yet", "message", m.ID, "shard", ev.Shard, "err", err)
		return err
	}
	b.markAnswered(m.ID)
	b.log.Info("pong", "message", m.ID, "channel", m.ChannelID, "shard", ev.Shard, "seq", ev.Seq)
	return nil
}

func (b *bot) wasAnswered(id string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.answered[id]
}

func (b *bot) markAnswered(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.answered[id] = true
	b.order = append(b.order, id)
	if len(b.order) > rememberAnswers {
		delete(b.answered, b.order[0])
		b.order = b.order[1:]
	}
}

// reply posts content as a reply to message msgID in channel. A 429 is
// waited out (its retry_after) and tried again, up to 5 attempts; a 5xx
// too, after a second. Any other refusal is logged and dropped: retrying
// would not help.
func (b *bot) reply(ctx context.Context, channel, msgID, content string) error {
	body, _ := json.Marshal(map[string]any{"content": content,
		"message_reference": map[string]string{"message_id": msgID, "channel_id": channel}})
	url := b.api + "/channels/" + channel + "/messages"
	for attempt := 1; ; attempt++ {
		req, err := http.NewRequestWithContext(ctx, "POST", url, bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bot "+b.token)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("User-Agent", "DiscordBot (https://github.com/discord-pxe/dpxe, 1) pingbot")
		resp, err := b.hc.Do(req)
		if err != nil {
			return err
		}
		answer, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		var wait time.Duration
		switch {
		case resp.StatusCode/100 == 2:
			return nil
		case resp.StatusCode == http.StatusTooManyRequests:
			wait = retryAfter(resp.Header, answer)
			b.log.Info("rate limited", "channel", channel, "retry_after", wait)
		case resp.StatusCode >= 500:
			wait = time.Second
		default:
			b.log.Warn("Discord refused the reply", "status", resp.StatusCode, "body", string(answer))
			return nil // acknowledged: the same request would be refused again
		}
		if attempt == 5 {
			return fmt.Errorf("POST %s: %d after %d attempts", "/channels/"+channel+"/messages", resp.StatusCode, attempt)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(min(wait, b.maxWait)):
		}
	}
}

// maxRetryAfter caps what a 429 may ask for (the bot waits at most
// maxWait anyway; this keeps the conversion in range).
const maxRetryAfter = time.Hour

// retryAfter reads a 429: the body's retry_after (seconds, fractional),
// else the Retry-After header (whole seconds), else one second; always
// between 1 ms and maxRetryAfter.
func retryAfter(h http.Header, body []byte) time.Duration {
	var r struct {
		RetryAfter float64 `json:"retry_after"`
	}
	if json.Unmarshal(body, &r) == nil && r.RetryAfter > 0 {
		if r.RetryAfter >= maxRetryAfter.Seconds() {
			return maxRetryAfter
		}
		return max(time.Duration(r.RetryAfter*float64(time.Second)), time.Millisecond)
	}
	if s, err := strconv.Atoi(h.Get("Retry-After")); err == nil && s > 0 {
		return min(time.Duration(min(s, int(maxRetryAfter.Seconds())))*time.Second, maxRetryAfter)
	}
	return time.Second
}
