package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/discord-pxe/dpxe/fleet/events"
	"github.com/discord-pxe/dpxe/fleet/events/eventstest"
	"github.com/discord-pxe/dpxe/fleet/metrics/promtest"
	"github.com/discord-pxe/dpxe/sdk/dpxe"
)

// startNATSCluster starts three routed NATS servers with JetStream on
// loopback (stand-ins for an operator's cluster) and returns their client
// URLs.
func startNATSCluster(t *testing.T) []string {
	t.Helper()
	return eventstest.StartEmbedded(t, "ext").URLs
}

// TestServeEventsExternalCluster: with --nats-url, `dpxe serve` starts no
// embedded server, creates the R3 event stream on the given cluster, and
// events published there reach `dpxe events tail`.
func TestServeEventsExternalCluster(t *testing.T) {
	dir := t.TempDir()
	bin := sharedDpxe(t)
	urls := startNATSCluster(t)
	list := strings.Join(urls, ",")
	// The cluster elects its JetStream leader in a few seconds after
	// start; serve retries creating the stream meanwhile.
	p := startServe(t, bin, "--db", filepath.Join(dir, "dpxe.db"), "--no-dashboard", "--nats-url", list, "--events-replicas", "3")
	logs := p.logs()
	if !strings.Contains(logs, "embedded=false") || !strings.Contains(logs, "stream=DPXE_EVENTS_bot") {
		t.Fatalf("serve did not use the cluster:\n%s", logs)
	}
	if _, err := os.Stat(filepath.Join(dir, "nats")); !os.IsNotExist(err) {
		t.Errorf("an embedded store was created with --nats-url: %v", err)
	}
	nc, err := nats.Connect(list)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), e2eDeadline)
	defer cancel()
	st, err := js.Stream(ctx, "DPXE_EVENTS_bot")
	if err != nil {
		t.Fatal(err)
	}
	if r := st.CachedInfo().Config.Replicas; r != 3 {
		t.Errorf("stream replicas %d, want 3", r)
	}
	pub, _ := events.NewPublisher(nc, events.PublisherConfig{App: "bot", Node: "n1"})
	sp, _ := pub.Session(1, "s1", 0)
	if err := sp.Publish(ctx, events.Dispatch{Seq: 1, Event: "READY", Payload: []byte(`{"op":0,"t":"READY","s":1,"d":{}}`), Received: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := sp.Flush(ctx); err != nil || sp.Acked() != 1 {
		t.Fatalf("not acknowledged: %v %+v", err, sp.Stats())
	}
	out, err := exec.CommandContext(ctx, bin, "events", "tail", "--nats-url", urls[2], "--all", "--count", "1").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "shard 1  seq 1  READY") {
		t.Fatalf("tail from the third server: %v\n%s", err, out)
	}

	// The event metrics: a bot service that has read nothing lags by the
	// one stored event, as serve's /metrics and a real Prometheus scraping
	// it say; the shipped dashboard's event panels evaluate with data.
	if _, err := dpxe.NewService(ctx, nc, dpxe.Config{App: "bot", Service: "svc", FromStart: true}); err != nil {
		t.Fatal(err)
	}
	tokFile := filepath.Join(dir, metricsTokenName)
	body := scrape(t, p.url, tokFile)
	for _, want := range []string{"dpxe_events_broker_connected 1", "dpxe_events_stream_read 1",
		"dpxe_events_stream_messages 1", `dpxe_events_consumer_pending{consumer="svc"} 1`, `dpxe_events_consumer_unacked{consumer="svc"} 0`} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	prom := promtest.Start(t, promtest.Job{Name: "dpxe", Target: strings.TrimPrefix(p.url, "http://"), TokenFile: tokFile})
	prom.WaitFor(t, promtest.Startup+10*promtest.ScrapeInterval, map[string]string{
		`dpxe_events_consumer_pending{job="dpxe",consumer="svc"}`: "1",
	})
	promtest.CheckDashboard(t, prom, "../../docs/grafana/dpxe-fleet.json", "dpxe", promtest.Reads("dpxe_events_"))

	// A stream the broker no longer serves: connected, but not read.
	js.DeleteStream(ctx, "DPXE_EVENTS_bot")
	if body := scrape(t, p.url, tokFile); !strings.Contains(body, "dpxe_events_stream_read 0\n") || strings.Contains(body, "dpxe_events_stream_messages") {
		t.Errorf("after the stream was deleted, /metrics still reads it:\n%s", grepPrefix(body, "dpxe_events_"))
	}
	p.stop(t)
}

// scrape returns serve's /metrics read with the metrics token in tokFile.
func scrape(t *testing.T, base, tokFile string) string {
	t.Helper()
	tok, err := os.ReadFile(tokFile)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", base+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET /metrics: %d %s", resp.StatusCode, b)
	}
	return string(b)
}

// grepPrefix returns the lines of text starting with prefix.
func grepPrefix(text, prefix string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
