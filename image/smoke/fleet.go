package smoke

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
)

// GuestHost is the host as a guest on QEMU's user-mode network reaches it:
// slirp's gateway address, which it translates to the host's loopback.
const GuestHost = "10.0.2.2"

// Bounds of the fleet's start-up.
const (
	peerStartTimeout = 20 * time.Second
	peerStopTimeout  = 5 * time.Second
	peerLogLimit     = 64 << 10
	// gatewayHeartbeat is the Hello interval the emulator sends: the
	// kernel's first heartbeat comes after interval/20 for shard 0
	// (seeds/000), 250 ms, and a starved machine keeps a 1.25 s grace.
	gatewayHeartbeat = 5 * time.Second
	// fleetLease is dpxe serve's node lease: the kernel checks in every
	// third of it, so the controller sees READY within about 2 s.
	fleetLease = 6 * time.Second
)

// fleet is the far side of a netboot path: a Gateway emulator and a
// `dpxe serve` on loopback, each a child process with its files in dir,
// reachable from the guest as GuestHost. One fleet serves one path.
type fleet struct {
	dir       string
	api       string // dpxe serve, as the host reaches it: http://127.0.0.1:PORT
	guestAPI  string // the same, as the guest reaches it: http://10.0.2.2:PORT
	state     string // the emulator's GET /debug/state, host side
	adminFile string
	client    *http.Client

	cancel context.CancelFunc
	procs  []*peer
	logs   *capBuffer
}

// peer is one child process of the fleet.
type peer struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when it exited
	err  error         // its Wait error, once done
}

// capBuffer keeps the first limit bytes written to it; safe for concurrent use.
type capBuffer struct {
	mu    sync.Mutex
	b     bytes.Buffer
	limit int
}

func (c *capBuffer) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if room := c.limit - c.b.Len(); room > 0 {
		c.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (c *capBuffer) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.b.String()
}

// listenRE finds the address in dpxe serve's "listening" log line.
var listenRE = regexp.MustCompile(`msg=listening addr=(\S+)`)

// startFleet starts the Gateway emulator and dpxe serve in dir. The
// emulator listens on 127.0.0.1:0 and writes 10.0.2.2:PORT into its
// gateway URLs (what /gateway/bot and READY tell the kernel); dpxe serve
// listens on 127.0.0.1:0, fetches /gateway/bot from the emulator with a
// random bot token and hands nodes that URL.
func startFleet(ctx context.Context, o *Options, dir string) (_ *fleet, err error) {
	fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	f := &fleet{dir: dir, cancel: cancel, logs: &capBuffer{limit: peerLogLimit},
		adminFile: filepath.Join(dir, "admin.token"), client: &http.Client{Timeout: 5 * time.Second}}
	defer func() {
		if err != nil {
			f.stop()
		}
	}()
	token, err := randomToken()
	if err != nil {
		return nil, err
	}
	tokenFile := filepath.Join(dir, "bot.token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		return nil, err
	}

	// The emulator reports its URLs on stdout, one "name: value" per line.
	emu, emuOut, err := f.start(fctx, "gateway emulator", o.GatewayEmulator,
		"-listen", "127.0.0.1:0", "-public-host", GuestHost, "-token", token, "-shards", "1",
		"-heartbeat-interval", gatewayHeartbeat.String(), "-log-level", "warn")
	if err != nil {
		return nil, err
	}
	rest, err := f.waitLine(ctx, emu, emuOut, func(l string) (string, bool) { return strings.CutPrefix(l, "rest: ") })
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(rest)
	if err != nil || u.Port() == "" {
		return nil, fmt.Errorf("gateway emulator: cannot read its port from %q", rest)
	}
	emuHost := "127.0.0.1:" + u.Port()
	f.state = "http://" + emuHost + "/debug/state"

	srv, srvErr, err := f.start(fctx, "dpxe serve", o.DPXE, "serve",
		"--db", filepath.Join(dir, "dpxe.db"), "--admin-token-file", f.adminFile,
		"--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--no-dashboard", "--total-shards", "1", "--lease", fleetLease.String(),
		"--gateway-api", "http://"+emuHost+"/api/v10", "--bot-token-file", tokenFile)
	if err != nil {
		return nil, err
	}
	addr, err := f.waitLine(ctx, srv, srvErr, func(l string) (string, bool) {
		if m := listenRE.FindStringSubmatch(l); m != nil {
			return m[1], true
		}
		return "", false
	})
	if err != nil {
		return nil, err
	}
	_, port, ok := strings.Cut(addr, "127.0.0.1:")
	if !ok || port == "" {
		return nil, fmt.Errorf("dpxe serve: listening on %q, want 127.0.0.1:PORT", addr)
	}
	f.api = "http://127.0.0.1:" + port
	f.guestAPI = "http://" + GuestHost + ":" + port
	return f, nil
}

// start runs bin with args and returns its process and the pipe of the
// stream it announces itself on (stdout for the emulator, stderr for
// dpxe serve); everything else goes to the fleet's log.
func (f *fleet) start(ctx context.Context, name, bin string, args ...string) (*peer, io.Reader, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = f.dir
	cmd.Env = append(os.Environ(), "HOME="+f.dir)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = peerStopTimeout
	// The peers end with dpxe smoke even when it is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	pr, pw := io.Pipe()
	lw := &prefixWriter{prefix: name + ": ", w: f.logs}
	if name == "gateway emulator" {
		cmd.Stdout, cmd.Stderr = io.MultiWriter(pw, lw), lw
	} else {
		cmd.Stdout, cmd.Stderr = lw, io.MultiWriter(pw, lw)
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	p := &peer{name: name, cmd: cmd, done: make(chan struct{})}
	f.procs = append(f.procs, p)
	go func() {
		p.err = cmd.Wait()
		pw.Close()
		close(p.done)
	}()
	return p, pr, nil
}

// waitLine reads lines from r until match accepts one, the peer exits or
// peerStartTimeout passes. It keeps draining r afterwards.
func (f *fleet) waitLine(ctx context.Context, p *peer, r io.Reader, match func(string) (string, bool)) (string, error) {
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		sent := false
		for sc.Scan() {
			if v, ok := match(sc.Text()); ok && !sent {
				found <- v
				sent = true
			}
		}
		io.Copy(io.Discard, r)
	}()
	t := time.NewTimer(peerStartTimeout)
	defer t.Stop()
	select {
	case v := <-found:
		return v, nil
	case <-p.done:
		return "", fmt.Errorf("%s exited while starting (%v): %s", p.name, p.err, lastLines(f.logs.String(), 5))
	case <-t.C:
		return "", fmt.Errorf("%s did not start within %v: %s", p.name, peerStartTimeout, lastLines(f.logs.String(), 5))
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// stop ends the peers (SIGTERM, then SIGKILL after peerStopTimeout) and
// waits for them.
func (f *fleet) stop() {
	f.cancel()
	for _, p := range f.procs {
		<-p.done
	}
}

// addNode creates node id at the controller (POST /v1/nodes, admin) and
// returns its credential.
func (f *fleet) addNode(ctx context.Context, id string) (string, error) {
	var out struct {
		Credential string `json:"credential"`
	}
	if err := f.call(ctx, "POST", "/v1/nodes", map[string]string{"node_id": id}, &out); err != nil {
		return "", err
	}
	if out.Credential == "" {
		return "", fmt.Errorf("dpxe serve: POST /v1/nodes answered no credential")
	}
	return out.Credential, nil
}

// nodeShards is GET /v1/nodes/{id}: whether the node is live and its
// shards as it last reported them.
func (f *fleet) nodeShards(ctx context.Context, id string) (bool, []appliance.ShardStatus, error) {
	var out struct {
		Live   bool                    `json:"live"`
		Shards []appliance.ShardStatus `json:"shards"`
	}
	err := f.call(ctx, "GET", "/v1/nodes/"+url.PathEscape(id), nil, &out)
	return out.Live, out.Shards, err
}

// call is an admin request to dpxe serve's API.
func (f *fleet) call(ctx context.Context, method, path string, body, out any) error {
	tok, err := os.ReadFile(f.adminFile)
	if err != nil {
		return fmt.Errorf("dpxe serve: admin token: %w", err)
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, f.api+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	req.Header.Set("Content-Type", "application/json")
	return doJSON(f.client, req, out)
}

// gatewayState is the part of the emulator's GET /debug/state
// (docs/gateway-emulator.md) the netboot path reads.
type gatewayState struct {
	Counters struct {
		HeartbeatAcks int64 `json:"heartbeat_acks"`
	} `json:"counters"`
	Shards []struct {
		Shard    [2]int `json:"shard"`
		Sessions []struct {
			ID         string `json:"session_id"`
			State      string `json:"state"`
			Heartbeats int64  `json:"heartbeats"`
		} `json:"sessions"`
	} `json:"shards"`
	Violations []json.RawMessage `json:"violations"`
}

func (f *fleet) gateway(ctx context.Context) (*gatewayState, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", f.state, nil)
	if err != nil {
		return nil, err
	}
	var s gatewayState
	if err := doJSON(f.client, req, &s); err != nil {
		return nil, fmt.Errorf("gateway emulator: %w", err)
	}
	return &s, nil
}

func doJSON(c *http.Client, req *http.Request, out any) error {
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s: %s", req.Method, req.URL.Path, resp.Status, strings.TrimSpace(string(b)))
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s %s: %w", req.Method, req.URL.Path, err)
	}
	return nil
}

// prefixWriter prefixes every line it passes on.
type prefixWriter struct {
	mu     sync.Mutex
	prefix string
	w      io.Writer
	mid    bool // inside a line
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []byte
	for _, c := range b {
		if !p.mid {
			out = append(out, p.prefix...)
			p.mid = true
		}
		out = append(out, c)
		if c == '\n' {
			p.mid = false
		}
	}
	if _, err := p.w.Write(out); err != nil {
		return 0, err
	}
	return len(b), nil
}

func randomToken() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return "smoke-" + base64.RawURLEncoding.EncodeToString(b), nil
}

// lastLines returns the last n non-blank lines of s joined with " | ".
func lastLines(s string, n int) string {
	t := Tail(s, n)
	if len(t) == 0 {
		return "no output"
	}
	return strings.Join(t, " | ")
}

// errNotFound marks a binary the netboot paths need that is not there.
var errNotFound = errors.New("not found")
