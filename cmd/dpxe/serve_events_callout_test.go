package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/events/eventstest"
)

// TestServeEventsCallout runs `dpxe serve --nats-url` against three
// nats-server processes that delegate authentication to serve's auth
// callout (--nats-callout-key): a node's check-in answer carries the
// --nats-node-url URLs and its credentials, with which it publishes its
// shard's dispatches into the R3 stream, not another shard's; a wrong
// password is refused (and not logged); a worker added with `dpxe workers
// add` reads the stream. When the node stops checking in, its lease
// lapses and serve disconnects it through the system account; it cannot
// connect again.
func TestServeEventsCallout(t *testing.T) {
	if testing.Short() {
		t.Skip("builds nats-server and starts a three-server cluster")
	}
	dir := t.TempDir()
	bin := sharedDpxe(t)
	keys := eventstest.NewCalloutKeys(t)
	c := eventstest.StartCallout(t, eventstest.BuildServer(t), "sc", keys)
	calloutSeed := eventstest.SeedFile(t, dir, "callout.nk", keys.Issuer)
	serveSeed := eventstest.SeedFile(t, dir, "serve.nk", keys.Serve)
	sysSeed := eventstest.SeedFile(t, dir, "sys.nk", keys.System)
	if out, err := exec.Command(bin, "workers", "add", "w1", "--auth-file", filepath.Join(dir, "nats-auth.json")).CombinedOutput(); err != nil {
		t.Fatalf("workers add: %v\n%s", err, out)
	}
	// Nodes get host names (the kernel's parser refuses loopback); the
	// test's dialer takes broker-N.test to loopback.
	nodeURLs := strings.ReplaceAll(c.URLs[1], "127.0.0.1", "broker-2.test") + "," + strings.ReplaceAll(c.URLs[2], "127.0.0.1", "broker-3.test")
	const lease = 5 * time.Second
	p := startServe(t, bin, "--db", filepath.Join(dir, "dpxe.db"), "--no-dashboard", "--total-shards", "2", "--lease", lease.String(),
		"--nats-url", c.ClientURLs(), "--events-replicas", "3", "--nats-nkey", serveSeed,
		"--nats-callout-key", calloutSeed, "--nats-system-nkey", sysSeed, "--nats-node-url", nodeURLs)
	if logs := p.logs(); !strings.Contains(logs, "callout=true") || !strings.Contains(logs, "account="+eventstest.CalloutAccount) {
		t.Fatalf("serve did not start the callout:\n%s", logs)
	}

	out, err := exec.Command(bin, "nodes", "--server", p.url, "--token-file", filepath.Join(dir, "admin.token"), "add", "n1").CombinedOutput()
	if err != nil {
		t.Fatalf("dpxe nodes add: %v\n%s", err, out)
	}
	cred := strings.TrimSpace(strings.Split(string(out), "\n")[1])
	r := nodeCheckin(t, p.url, "n1", cred, appliance.CheckinRequest{Capacity: 1})
	if r.NATS == nil || strings.Join(r.NATS.URLs, ",") != nodeURLs || r.NATS.User != "node-n1" || r.NATS.Password == "" {
		t.Fatalf("check-in answer's nats: %+v, want %s", r.NATS, nodeURLs)
	}
	if len(r.Assigned) != 1 {
		t.Fatalf("node n1 assigned %v, want one shard", r.Assigned)
	}
	var bad []string
	failed := make(chan struct{}, 16)
	closed := make(chan struct{})
	nc, err := nats.Connect(strings.Join(r.NATS.URLs, ","), nats.UserInfo(r.NATS.User, r.NATS.Password), nats.NoReconnect(), nats.SetCustomDialer(testLoopback{}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			bad = append(bad, err.Error())
			failed <- struct{}{}
		}),
		nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	if err != nil {
		t.Fatalf("node n1 with its answer's credentials: %v", err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	own := r.Assigned[0]
	ack, err := js.Publish(ctx, fmt.Sprintf("dpxe.bot.events.%d.MESSAGE_CREATE", own), []byte(`{}`), jetstream.WithMsgID("s1:1"))
	if err != nil || ack.Stream != "DPXE_EVENTS_bot" {
		t.Fatalf("publish to n1's shard %d: %+v %v", own, ack, err)
	}
	other := fmt.Sprintf("dpxe.bot.events.%d.MESSAGE_CREATE", 1-own)
	nc.Publish(other, []byte(`{}`))
	select {
	case <-failed:
		if !strings.Contains(bad[0], "Permissions Violation") || !strings.Contains(bad[0], other) {
			t.Errorf("publish to the other shard: %q", bad[0])
		}
	case <-ctx.Done():
		t.Fatalf("publish to %s was not refused", other)
	}

	if w, err := nats.Connect(nodeURLs, nats.UserInfo("node-n1", "wrong"), nats.NoReconnect(), nats.SetCustomDialer(testLoopback{})); err == nil {
		w.Close()
		t.Error("a wrong password connected")
	}
	tok, err := os.ReadFile(filepath.Join(dir, "worker-w1.token"))
	if err != nil {
		t.Fatal(err)
	}
	out, err = exec.CommandContext(ctx, bin, "events", "stats", "--nats-url", c.URLs[0], "--nats-user", "worker-w1",
		"--nats-password-file", filepath.Join(dir, "worker-w1.token")).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "stream DPXE_EVENTS_bot: 1 events") {
		t.Errorf("the worker's events stats: %v\n%s", err, out)
	}

	// No more check-ins: the lease lapses and serve kicks n1.
	select {
	case <-closed:
	case <-time.After(lease + 20*time.Second):
		t.Fatalf("n1 still connected %v after its last check-in:\n%s", lease+20*time.Second, p.logs())
	}
	// serve logs the kick once the sweep is over.
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(grepLine(p.logs(), "disconnected clients"), "node-n1"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("serve's log does not say it disconnected node-n1:\n%s", p.logs())
		}
	}
	if again, err := nats.Connect(nodeURLs, nats.UserInfo(r.NATS.User, r.NATS.Password), nats.NoReconnect(), nats.SetCustomDialer(testLoopback{})); err == nil {
		again.Close()
		t.Error("n1 connected again after its lease lapsed")
	} else if !errors.Is(err, nats.ErrAuthorization) && !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Errorf("n1 after its lease: %v, want an authorization violation", err)
	}
	logs := p.logs()
	if !strings.Contains(logs, "nats callout: refused") {
		t.Errorf("serve did not log the refusals:\n%s", logs)
	}
	for _, secret := range []string{r.NATS.Password, strings.TrimSpace(string(tok))} {
		if strings.Contains(logs, secret) {
			t.Error("a NATS password is in serve's log")
		}
	}
	p.stop(t)
}

// testLoopback dials any host NAME.test on loopback: the test's stand-in
// for DNS records of the brokers.
type testLoopback struct{}

func (testLoopback) Dial(network, address string) (net.Conn, error) {
	if host, port, err := net.SplitHostPort(address); err == nil && strings.HasSuffix(host, ".test") {
		address = net.JoinHostPort("127.0.0.1", port)
	}
	return net.DialTimeout(network, address, 5*time.Second)
}

// grepLine returns the first line of text containing sub ("" if none).
func grepLine(text, sub string) string {
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}

// TestServeCalloutFlags: the callout flags are refused at start, naming
// the flag, when they cannot work; a seed file others may read stops serve
// naming the file.
func TestServeCalloutFlags(t *testing.T) {
	cluster := []string{"--nats-url", "nats://127.0.0.1:4222"}
	full := slices.Concat(cluster, []string{"--nats-nkey", "s.nk", "--nats-callout-key", "c.nk", "--nats-system-nkey", "y.nk", "--nats-node-url", "nats://10.0.0.1:4222"})
	without := func(flag string) []string {
		var out []string
		for i := 0; i < len(full); i += 2 {
			if full[i] != flag {
				out = append(out, full[i], full[i+1])
			}
		}
		return out
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--nats-callout-key", "c.nk", "--nats-nkey", "s.nk"}, "nats-nkey is for --nats-url"},
		{without("--nats-url"), "nats-nkey is for --nats-url"},
		{[]string{"--nats-callout-key", "c.nk"}, "nats-callout-key needs --nats-url"},
		{without("--nats-node-url"), "nats-node-url is required with --nats-callout-key"},
		{without("--nats-nkey"), "nats-callout-key needs serve's own NATS user"},
		{without("--nats-system-nkey"), "nats-system-nkey is required with --nats-callout-key"},
		{without("--nats-callout-key"), "nats-system-nkey is for --nats-callout-key"},
		{slices.Concat(full, []string{"--nats-creds", "x.creds"}), "nats-nkey and nats-creds both"},
		{slices.Concat(full, []string{"--nats-auth"}), "nats-auth is for the embedded server"},
	} {
		_, err := parseServeFlags(c.args)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want a usage error with %q", c.args, err, c.want)
		}
	}
	if _, err := parseServeFlags(full); err != nil {
		t.Errorf("the full set: %v", err)
	}

	// Seed files: readable by others, of the wrong kind, not a seed.
	dir := t.TempDir()
	keys := eventstest.NewCalloutKeys(t)
	open := eventstest.SeedFile(t, dir, "open.nk", keys.Issuer)
	if err := os.Chmod(open, 0o644); err != nil {
		t.Fatal(err)
	}
	user := eventstest.SeedFile(t, dir, "user.nk", keys.Serve)
	junk := filepath.Join(dir, "junk.nk")
	os.WriteFile(junk, []byte("not a seed\n"), 0o600)
	for _, c := range []struct {
		path, want string
	}{
		{open, "nats-callout-key " + open + ": mode 0644 lets others read a secret key"},
		{user, "nats-callout-key " + user + ": a seed of kind"},
		{junk, "nats-callout-key " + junk + ": not an nkey seed"},
		{filepath.Join(dir, "missing.nk"), "nats-callout-key: stat"},
	} {
		if _, err := readSeed("nats-callout-key", c.path, nkeys.PrefixByteAccount); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.path, err, c.want)
		}
	}
	// serve itself stops at start on the open file, naming it.
	out, err := exec.Command(sharedDpxe(t), append([]string{"serve", "--db", filepath.Join(dir, "dpxe.db"), "--listen", "127.0.0.1:0", "--no-dashboard"},
		append(without("--nats-callout-key"), "--nats-callout-key", open)...)...).CombinedOutput()
	if err == nil || !strings.Contains(string(out), open) {
		t.Errorf("serve with a world-readable callout key: %v\n%s", err, out)
	}
}
