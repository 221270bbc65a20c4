package gatewayemu

import (
	"bytes"
	"compress/zlib"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// testTimeout bounds every single wait in the tests.
const testTimeout = 10 * time.Second

// fastOptions are short timings for protocol tests.
func fastOptions() Options {
	return Options{
		HeartbeatInterval:   30 * time.Second, // tests of heartbeat timing set their own
		IdentifyWindow:      time.Nanosecond,  // tests of the bucket window set their own
		IdentifyRejectDelay: 10 * time.Millisecond,
		ReconnectGrace:      time.Second,
	}
}

// startEmu starts an emulator on 127.0.0.1 that is closed with the test.
func startEmu(t *testing.T, o Options) *Emulator {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	emu, err := Start(ctx, "127.0.0.1:0", o)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); emu.Close() })
	return emu
}

// wsClient is a minimal gateway client for protocol tests.
type wsClient struct {
	t      *testing.T
	emu    *Emulator
	ws     *websocket.Conn
	zlibRx bool   // compress=zlib-stream
	zall   []byte // zlib-stream bytes so far
	zdone  int    // decompressed bytes already returned
	lastS  int64
}

// frame is a received payload.
type frame struct {
	Op int             `json:"op"`
	D  json.RawMessage `json:"d"`
	S  *int64          `json:"s"`
	T  *string         `json:"t"`
}

func (f frame) String() string {
	t := ""
	if f.T != nil {
		t = *f.T
	}
	return fmt.Sprintf("op=%d t=%s d=%.80s", f.Op, t, f.D)
}

// dial connects to emu at path+query (e.g. "/?v=10&encoding=json").
func dial(t *testing.T, emu *Emulator, pathQuery string) *wsClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	opts := &websocket.DialOptions{}
	if tc := emu.ClientTLSConfig(); tc != nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = tc
		opts.HTTPClient = &http.Client{Transport: tr}
	}
	ws, _, err := websocket.Dial(ctx, emu.URL()+pathQuery, opts)
	if err != nil {
		t.Fatalf("dial %s: %v", pathQuery, err)
	}
	ws.SetReadLimit(1 << 20)
	t.Cleanup(func() { ws.CloseNow() })
	return &wsClient{t: t, emu: emu, ws: ws, zlibRx: strings.Contains(pathQuery, "zlib-stream")}
}

// connect dials the main URL with v=10 and reads Hello.
func connect(t *testing.T, emu *Emulator) *wsClient {
	t.Helper()
	c := dial(t, emu, "/?v=10&encoding=json")
	c.expectOp(OpHello)
	return c
}

func (c *wsClient) sendRaw(s string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if err := c.ws.Write(ctx, websocket.MessageText, []byte(s)); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

func (c *wsClient) send(op int, d any) {
	c.t.Helper()
	b, err := json.Marshal(map[string]any{"op": op, "d": d})
	if err != nil {
		c.t.Fatal(err)
	}
	c.sendRaw(string(b))
}

// read returns the next payload or the read error.
func (c *wsClient) read() (frame, error) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	typ, b, err := c.ws.Read(ctx)
	if err != nil {
		return frame{}, err
	}
	if typ == websocket.MessageBinary {
		if c.zlibRx {
			c.zall = append(c.zall, b...)
			zr, err := zlib.NewReader(bytes.NewReader(c.zall))
			if err != nil {
				return frame{}, err
			}
			out, err := io.ReadAll(zr)
			if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
				return frame{}, err
			}
			b = out[c.zdone:]
			c.zdone = len(out)
		} else {
			zr, err := zlib.NewReader(bytes.NewReader(b))
			if err != nil {
				return frame{}, err
			}
			if b, err = io.ReadAll(zr); err != nil {
				return frame{}, err
			}
		}
	}
	var f frame
	if err := json.Unmarshal(b, &f); err != nil {
		return frame{}, fmt.Errorf("bad frame %q: %w", b, err)
	}
	if f.S != nil {
		c.lastS = *f.S
	}
	return f, nil
}

func (c *wsClient) next() frame {
	c.t.Helper()
	f, err := c.read()
	if err != nil {
		c.t.Fatalf("read: %v", err)
	}
	return f
}

// expectOp reads the next payload and checks its opcode.
func (c *wsClient) expectOp(op int) frame {
	c.t.Helper()
	f := c.next()
	if f.Op != op {
		c.t.Fatalf("got %v, want op %d", f, op)
	}
	return f
}

// expectDispatch reads the next payload and checks it is dispatch t.
func (c *wsClient) expectDispatch(t string) frame {
	c.t.Helper()
	f := c.expectOp(OpDispatch)
	if f.T == nil || *f.T != t {
		c.t.Fatalf("got %v, want dispatch %s", f, t)
	}
	return f
}

// expectClose reads until the connection closes and checks the close code
// (-1: closed without a close frame).
func (c *wsClient) expectClose(code int) {
	c.t.Helper()
	for i := 0; i < 10000; i++ {
		_, err := c.read()
		if err == nil {
			continue
		}
		if got := int(websocket.CloseStatus(err)); got != code {
			c.t.Fatalf("closed with %d (%v), want %d", got, err, code)
		}
		return
	}
	c.t.Fatal("connection did not close")
}

// identifyPayload is a valid Identify d for shard [id, num].
func identifyPayload(emu *Emulator, id, num int) map[string]any {
	return map[string]any{
		"token":      emu.Token(),
		"intents":    IntentGuilds | IntentGuildMessages,
		"properties": map[string]string{"os": "linux", "browser": "dpxe-test", "device": "dpxe-test"},
		"shard":      []int{id, num},
	}
}

// ready holds what a test needs from READY.
type ready struct {
	V                int              `json:"v"`
	SessionID        string           `json:"session_id"`
	ResumeGatewayURL string           `json:"resume_gateway_url"`
	Shard            []int            `json:"shard"`
	Guilds           []map[string]any `json:"guilds"`
	User             map[string]any   `json:"user"`
	Application      map[string]any   `json:"application"`
}

// identify sends Identify for [id, num], reads READY and the GUILD_CREATEs.
func (c *wsClient) identify(emu *Emulator, id, num int) ready {
	c.t.Helper()
	c.send(OpIdentify, identifyPayload(emu, id, num))
	f := c.expectDispatch("READY")
	var r ready
	if err := json.Unmarshal(f.D, &r); err != nil {
		c.t.Fatal(err)
	}
	for range r.Guilds {
		c.expectDispatch("GUILD_CREATE")
	}
	return r
}

// noViolations fails the test if the emulator recorded any violation.
func noViolations(t *testing.T, emu *Emulator) {
	t.Helper()
	if v := emu.Violations(); len(v) != 0 {
		t.Fatalf("unexpected violations: %+v", v)
	}
}

// violationKinds lists the kinds recorded, in order.
func violationKinds(emu *Emulator) []Kind {
	var out []Kind
	for _, v := range emu.Violations() {
		out = append(out, v.Kind)
	}
	return out
}

// awaitState waits until cond holds.
func awaitState(t *testing.T, emu *Emulator, what string, cond func(State) bool) State {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if err := emu.Await(ctx, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
	return emu.State()
}

func intp(i int) *int { return &i }

// fakeClock is a manual clock for Options.Now.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (f *fakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeClock) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
}
