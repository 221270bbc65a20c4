package controller

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/store"
	"github.com/discord-pxe/dpxe/tools/gatewayemu"
)

// The client against the Gateway emulator's REST routes: the answer sets
// URL, max_concurrency and budget; a wrong token is an error that does not
// repeat it.
func TestGatewayBotClientEmulator(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	emu, err := gatewayemu.Start(ctx, "127.0.0.1:0", gatewayemu.Options{Token: "emu-token.abc", Shards: 4, MaxConcurrency: 2, SessionStarts: 50})
	if err != nil {
		t.Fatal(err)
	}
	defer emu.Close()
	h := newHarness(t, Config{TotalShards: 4})
	cl, err := NewGatewayBotClient(emu.HTTPURL()+"/api/v10/", "emu-token.abc")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.c.FetchGatewayBot(ctx, cl); err != nil {
		t.Fatal(err)
	}
	v := h.c.Gateway()
	if v.URL != emu.URL()+"/?v=10&encoding=json" || v.MaxConcurrency != 2 || v.DiscordShards != 4 || v.URLSource != "gateway_bot" {
		t.Fatalf("view %+v", v)
	}
	if b := h.c.Budget(); b.Total != 50 || b.Remaining != 50 {
		t.Fatalf("budget %+v", b)
	}
	bad, _ := NewGatewayBotClient(emu.HTTPURL()+"/api/v10", "wrong-token")
	_, err = h.c.FetchGatewayBot(ctx, bad)
	if err == nil || !strings.Contains(err.Error(), "401") || strings.Contains(err.Error(), "wrong-token") {
		t.Fatalf("wrong token: %v", err)
	}
	if v := h.c.Gateway(); v.URL == "" || v.Failures != 1 {
		t.Fatalf("last good values lost: %+v", v)
	}
	for _, api := range []string{"ftp://h/api", "http://u:p@h/api", "http://h/api?x=1", "h/api", "http:///api"} {
		if _, err := NewGatewayBotClient(api, "t"); err == nil {
			t.Errorf("API %q accepted", api)
		}
	}
}

// RunGatewayRefresh retries failures with backoff (honouring Retry-After),
// keeps the last good values, recovers, and never logs the token.
func TestRunGatewayRefresh(t *testing.T) {
	const tok = "refresh.secret.TOKEN-value"
	var calls atomic.Int32
	var mu sync.Mutex
	var times []time.Time
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		mu.Lock()
		times = append(times, time.Now())
		mu.Unlock()
		if r.URL.Path != "/api/v10/gateway/bot" || r.Header.Get("Authorization") != "Bot "+tok || !strings.HasPrefix(r.Header.Get("User-Agent"), "DiscordBot ") {
			http.Error(w, `{"message":"bad request"}`, http.StatusBadRequest)
			return
		}
		switch n {
		case 2:
			w.Header().Set("Retry-After", "0.3")
			w.WriteHeader(http.StatusTooManyRequests)
			w.Write([]byte(`{"message":"You are being rate limited.","retry_after":0.3,"global":false}`))
			return
		case 3:
			http.Error(w, "boom", http.StatusBadGateway)
			return
		}
		w.Write([]byte(`{"url":"ws://gw.test:9000","shards":2,"session_start_limit":{"total":1000,"remaining":` +
			map[bool]string{true: "999", false: "998"}[n == 1] + `,"reset_after":60000,"max_concurrency":1},"extra":true}`))
	}))
	defer srv.Close()
	var logs bytes.Buffer
	var logMu sync.Mutex
	h := newHarness(t, Config{TotalShards: 2})
	h.c.log = slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logs}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cl, err := NewGatewayBotClient(srv.URL+"/api/v10", tok)
	if err != nil {
		t.Fatal(err)
	}
	cl.HTTP = srv.Client()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.c.RunGatewayRefresh(ctx, cl, 200*time.Millisecond, true); close(done) }()
	deadline := time.Now().Add(10 * time.Second)
	for calls.Load() < 5 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	// One loop fetches, so the fifth fetch reaching the server means the
	// fourth (the recovery) has been applied. The view is read now, before
	// the loop is stopped: stopping it can cut the fifth fetch short, and
	// a fetch cut short counts as a failed one (context canceled).
	v, budget := h.c.Gateway(), h.c.Budget()
	cancel()
	<-done
	if calls.Load() < 5 {
		t.Fatalf("%d fetches", calls.Load())
	}
	mu.Lock()
	if gap := times[2].Sub(times[1]); gap < 300*time.Millisecond {
		t.Errorf("retry %v after a 429 asking for 300 ms", gap)
	}
	mu.Unlock()
	if v.URL != "ws://gw.test:9000/?v=10&encoding=json" || v.Failures != 0 || budget.Remaining != 998 {
		t.Fatalf("after recovery: %+v %+v", v, budget)
	}
	logMu.Lock()
	defer logMu.Unlock()
	out := logs.String()
	if !strings.Contains(out, "HTTP 429") || !strings.Contains(out, "HTTP 502") || !strings.Contains(out, "works again") {
		t.Errorf("logs do not tell the story:\n%s", out)
	}
	if strings.Contains(out, tok) || strings.Contains(out, "TOKEN-value") {
		t.Fatalf("token in logs:\n%s", out)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// errFetcher fails every GET /gateway/bot: with ctx's error once ctx
// ends (a fetch cut short by shutdown), else with err.
type errFetcher struct{ err error }

func (f errFetcher) Fetch(ctx context.Context) (GatewayBot, time.Duration, error) {
	if ctx.Err() != nil {
		return GatewayBot{}, 0, ctx.Err()
	}
	return GatewayBot{}, 0, f.err
}

// A fetch cut short by shutdown is not counted or shown as a failure of
// GET /gateway/bot; a real failure is.
func TestFetchCancelledIsNoFailure(t *testing.T) {
	st, err := store.Open(context.Background(), newStorePath(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	c, err := New(context.Background(), st, Config{TotalShards: 4, MaxConcurrency: 1}, time.Now, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := errFetcher{err: errors.New("503 from Discord")}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.FetchGatewayBot(cancelled, f); err == nil {
		t.Fatal("the cancelled fetch succeeded")
	}
	if v := c.Gateway(); v.Failures != 0 || v.LastError != "" {
		t.Fatalf("a fetch cancelled by shutdown counted as a failure: %d, %q", v.Failures, v.LastError)
	}
	if _, err := c.FetchGatewayBot(context.Background(), f); err == nil {
		t.Fatal("the failing fetch succeeded")
	}
	if v := c.Gateway(); v.Failures != 1 || !strings.Contains(v.LastError, "503 from Discord") {
		t.Fatalf("a real failure: %d, %q; want 1 and its error", v.Failures, v.LastError)
	}
}
