package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Refresh timings of GET /gateway/bot. Discord says the route "should not
// be cached for extended periods" (research §1.10) and counts it against
// the REST global limit, so a few minutes is the compromise.
const (
	DefaultGatewayRefresh = 5 * time.Minute
	gatewayFirstBackoff   = 2 * time.Second
	gatewayFetchTimeout   = 15 * time.Second
	maxGatewayBotBody     = 64 << 10
	gatewayUserAgent      = "DiscordBot (https://github.com/discord-pxe/dpxe, 1)"
)

// GatewayFetcher fetches GET /gateway/bot. retryAfter, when positive, is
// the least wait the server asked for (HTTP 429).
type GatewayFetcher interface {
	Fetch(ctx context.Context) (g GatewayBot, retryAfter time.Duration, err error)
}

// GatewayBotClient is a GatewayFetcher for Discord's REST API or the
// Gateway emulator. Its errors never contain the token.
type GatewayBotClient struct {
	API   string // REST base, e.g. "https://discord.com/api/v10" or "http://127.0.0.1:9000/api/v10"
	Token secret
	HTTP  *http.Client // nil: a client with a 15 s timeout
}

// NewGatewayBotClient checks the REST base (http or https, no query, no
// user info) and the token.
func NewGatewayBotClient(api, token string) (*GatewayBotClient, error) {
	u, err := url.Parse(api)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("%w: gateway API %q: want http(s)://host[:port]/path without query or user info", ErrConfig, api)
	}
	if err := ValidateBotToken(token); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	return &GatewayBotClient{API: strings.TrimSuffix(api, "/"), Token: secret(token)}, nil
}

// Fetch implements GatewayFetcher.
func (g *GatewayBotClient) Fetch(ctx context.Context) (GatewayBot, time.Duration, error) {
	hc := g.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: gatewayFetchTimeout}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.API+"/gateway/bot", nil)
	if err != nil {
		return GatewayBot{}, 0, err
	}
	req.Header.Set("Authorization", "Bot "+string(g.Token))
	req.Header.Set("User-Agent", gatewayUserAgent)
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return GatewayBot{}, 0, fmt.Errorf("GET /gateway/bot: %w", scrubURLError(err))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxGatewayBotBody+1))
	if err != nil {
		return GatewayBot{}, 0, fmt.Errorf("GET /gateway/bot: reading the answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Message    string  `json:"message"`
			RetryAfter float64 `json:"retry_after"` // seconds (429)
		}
		_ = json.Unmarshal(body, &e)
		var after time.Duration
		if resp.StatusCode == http.StatusTooManyRequests {
			if s, err := strconv.ParseFloat(resp.Header.Get("Retry-After"), 64); err == nil && s > 0 {
				after = time.Duration(s * float64(time.Second))
			}
			if e.RetryAfter > 0 {
				after = max(after, time.Duration(e.RetryAfter*float64(time.Second)))
			}
		}
		msg := clipText(e.Message, 80)
		if msg == "" {
			msg = http.StatusText(resp.StatusCode)
		}
		return GatewayBot{}, after, fmt.Errorf("GET /gateway/bot: HTTP %d (%s)", resp.StatusCode, msg)
	}
	if len(body) > maxGatewayBotBody {
		return GatewayBot{}, 0, fmt.Errorf("GET /gateway/bot: answer over %d bytes", maxGatewayBotBody)
	}
	var gb GatewayBot
	if err := json.Unmarshal(body, &gb); err != nil {
		return GatewayBot{}, 0, fmt.Errorf("GET /gateway/bot: %v", err)
	}
	return gb, 0, nil
}

// scrubURLError drops the URL from a client error (it names only the API
// base, but a base can carry more than it should).
func scrubURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// clipText keeps the printable ASCII of s, at most n bytes.
func clipText(s string, n int) string {
	var b strings.Builder
	for i := 0; i < len(s) && b.Len() < n; i++ {
		if c := s[i]; c >= 0x20 && c < 0x7f {
			b.WriteByte(c)
		}
	}
	return b.String()
}

// FetchGatewayBot fetches once and applies the answer.
func (c *Controller) FetchGatewayBot(ctx context.Context, f GatewayFetcher) (time.Duration, error) {
	g, after, err := f.Fetch(ctx)
	if err != nil {
		if ctx.Err() == nil { // a fetch cut short by shutdown is no failure of Discord's
			c.GatewayFetchFailed(err)
		}
		return after, err
	}
	return 0, c.ApplyGatewayBot(ctx, g)
}

// RunGatewayRefresh fetches GET /gateway/bot every `every` until ctx ends.
// A failure is logged and retried with a doubling backoff from 2 s up to
// `every` (longer if the server asks for it); the last good values stay in
// use meanwhile. It never fails: it returns when ctx ends. When initial is
// set, the first fetch happens at once, otherwise after `every`.
func (c *Controller) RunGatewayRefresh(ctx context.Context, f GatewayFetcher, every time.Duration, initial bool) {
	if every <= 0 {
		every = DefaultGatewayRefresh
	}
	wait := every
	if initial {
		wait = 0
	}
	backoff := gatewayFirstBackoff
	failures := 0
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		after, err := c.FetchGatewayBot(ctx, f)
		switch {
		case err == nil:
			if failures > 0 {
				c.log.Info("GET /gateway/bot works again", "after_failures", failures)
			}
			failures, backoff, wait = 0, gatewayFirstBackoff, every
		case ctx.Err() != nil:
			return
		default:
			failures++
			wait = max(min(backoff, every), after)
			c.log.Warn("GET /gateway/bot failed; keeping the last good values", "err", err, "failures", failures, "retry_in", wait)
			backoff = min(backoff*2, every)
		}
		timer.Reset(wait)
	}
}
