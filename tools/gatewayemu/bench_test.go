package gatewayemu

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// Environment of the benchmarks.
const (
	envBench    = "DPXE_BENCH"        // "1" runs the heavy benchmarks
	envSessions = "DPXE_EMU_SESSIONS" // comma-separated session counts (default 1000,10000)
	envHold     = "DPXE_EMU_HOLD"     // how long sessions are held (default 10s)
	envHelper   = "DPXE_EMU_HELPER"   // "1": this process is the emulator of a benchmark
	envInterval = "DPXE_EMU_INTERVAL" // helper: heartbeat interval
	envMC       = "DPXE_EMU_MC"       // helper: max_concurrency
	envGrace    = "DPXE_EMU_GRACE"    // heartbeat grace (default: the emulator default, interval/4)
	envBeat     = "DPXE_EMU_BEAT"     // heartbeat interval of the benchmark (default 1s)
	benchLimit  = 3 * time.Minute     // hard bound of one benchmark size
	dialWorkers = 128                 // concurrent dials (listen backlog is 4096)
)

// TestEmulatorHelperProcess is not a test: BenchmarkSessions re-runs the
// test binary with DPXE_EMU_HELPER=1 so the emulator lives in its own process,
// whose RSS is then the emulator's alone. It serves until stdin closes.
func TestEmulatorHelperProcess(t *testing.T) {
	if os.Getenv(envHelper) != "1" {
		t.Skip("helper process of BenchmarkSessions")
	}
	interval, err := time.ParseDuration(os.Getenv(envInterval))
	if err != nil {
		t.Fatal(err)
	}
	mc, err := strconv.Atoi(os.Getenv(envMC))
	if err != nil {
		t.Fatal(err)
	}
	var grace time.Duration
	if g := os.Getenv(envGrace); g != "" {
		if grace, err = time.ParseDuration(g); err != nil {
			t.Fatal(err)
		}
	}
	emu, err := Start(context.Background(), "127.0.0.1:0", Options{
		HeartbeatInterval: interval,
		HeartbeatGrace:    grace,
		MaxConcurrency:    mc,
		IdentifyWindow:    time.Nanosecond,
		SessionStarts:     1 << 30,
		Shards:            mc,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer emu.Close()
	fmt.Printf("EMULATOR %s %s\n", emu.URL(), emu.HTTPURL())
	io.Copy(io.Discard, os.Stdin)
}

// BenchmarkSessions holds N identified sessions that heartbeat at a 1 s
// interval (first beat jittered over the interval) for DPXE_EMU_HOLD, with
// the emulator in a child process. It reports heartbeats per second served,
// ACKs that were not back before the next heartbeat was due, emulator
// violations, and the emulator's RSS growth per session.
func BenchmarkSessions(b *testing.B) {
	if os.Getenv(envBench) != "1" {
		b.Skip("heavy benchmark: set DPXE_BENCH=1")
	}
	sizes := []int{1000, 10000}
	if s := os.Getenv(envSessions); s != "" {
		sizes = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				b.Fatalf("%s=%q", envSessions, s)
			}
			sizes = append(sizes, n)
		}
	}
	hold := 10 * time.Second
	if s := os.Getenv(envHold); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			b.Fatal(err)
		}
		hold = d
	}
	interval := time.Second
	if s := os.Getenv(envBeat); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			b.Fatal(err)
		}
		interval = d
	}
	raiseFileLimit(b)
	for _, n := range sizes {
		b.Run(fmt.Sprintf("sessions=%d", n), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				benchSessions(b, n, interval, hold)
			}
		})
	}
}

// raiseFileLimit lifts RLIMIT_NOFILE to its hard limit (inherited by the child).
func raiseFileLimit(b *testing.B) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		b.Fatal(err)
	}
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		b.Logf("raise RLIMIT_NOFILE: %v", err)
	}
	b.Logf("RLIMIT_NOFILE %d", lim.Cur)
}

// benchClient is one heartbeating shard of the benchmark.
type benchClient struct {
	ws    *websocket.Conn
	acked atomic.Bool
}

func benchSessions(b *testing.B, n int, interval, hold time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), benchLimit)
	defer cancel()

	child := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestEmulatorHelperProcess$")
	child.Env = append(os.Environ(), envHelper+"=1", envInterval+"="+interval.String(), envMC+"="+strconv.Itoa(n))
	stdin, err := child.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := child.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { stdin.Close(); child.Wait() }()
	sc := bufio.NewScanner(stdout)
	var wsURL, httpURL string
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 3 && f[0] == "EMULATOR" {
			wsURL, httpURL = f[1], f[2]
			break
		}
	}
	if wsURL == "" {
		b.Fatal("helper did not report its address")
	}
	go io.Copy(io.Discard, stdout)
	rss0 := readRSS(b, child.Process.Pid)

	var (
		missed, sent atomic.Int64
		wg           sync.WaitGroup
		clients      = make([]*benchClient, n)
		jobs         = make(chan int)
		failed       atomic.Int64
	)
	// Each client heartbeats from its Hello on: first beat jittered over
	// one interval, then every interval. A beat due while the previous ACK
	// is still missing is a missed ACK.
	holdCtx, stopHold := context.WithCancel(ctx)
	defer stopHold()
	heartbeat := []byte(`{"op":1,"d":1}`)
	startClient := func(c *benchClient, i int) {
		wg.Add(2)
		go func() { // reader
			defer wg.Done()
			for {
				_, msg, err := c.ws.Read(context.Background()) // ended by CloseNow
				if err != nil {
					return
				}
				if strings.HasPrefix(string(msg), `{"op":11,`) {
					c.acked.Store(true)
				}
			}
		}()
		go func() { // heartbeater
			defer wg.Done()
			next := time.Now().Add(interval * time.Duration(i) / time.Duration(n))
			t := time.NewTimer(time.Until(next))
			defer t.Stop()
			first := true
			for {
				select {
				case <-holdCtx.Done():
					return
				case <-t.C:
				}
				if !first && !c.acked.Load() {
					missed.Add(1)
				}
				first = false
				c.acked.Store(false)
				if err := c.ws.Write(context.Background(), websocket.MessageText, heartbeat); err != nil {
					return
				}
				sent.Add(1)
				next = next.Add(interval) // fixed rate, no drift
				t.Reset(time.Until(next))
			}
		}()
	}
	b.ResetTimer()
	connectStart := time.Now()
	var dialWG sync.WaitGroup
	for w := 0; w < dialWorkers; w++ {
		dialWG.Add(1)
		go func() {
			defer dialWG.Done()
			for i := range jobs {
				c, err := benchConnect(ctx, wsURL, i, n)
				if err != nil {
					if failed.Add(1) == 1 {
						b.Errorf("shard %d: %v", i, err)
					}
					continue
				}
				clients[i] = c
				startClient(c, i)
			}
		}()
	}
	for i := 0; i < n; i++ {
		jobs <- i
	}
	close(jobs)
	dialWG.Wait()
	connectTime := time.Since(connectStart)
	if failed.Load() > 0 {
		b.Fatalf("%d of %d sessions failed to start", failed.Load(), n)
	}

	// Skip the first interval (jittered starts), then measure.
	warm := time.NewTimer(interval)
	<-warm.C
	st0 := fetchState(b, httpURL)
	cpu0 := readCPU(b, child.Process.Pid)
	t0 := time.Now()
	holdTimer := time.NewTimer(hold)
	<-holdTimer.C
	cpu1 := readCPU(b, child.Process.Pid)
	st1 := fetchState(b, httpURL)
	elapsed := time.Since(t0)
	rss1 := readRSS(b, child.Process.Pid)
	stopHold()
	b.StopTimer()
	for _, c := range clients {
		c.ws.CloseNow()
	}
	wg.Wait()

	hbps := float64(st1.Counters.Heartbeats-st0.Counters.Heartbeats) / elapsed.Seconds()
	ackps := float64(st1.Counters.HeartbeatACKs-st0.Counters.HeartbeatACKs) / elapsed.Seconds()
	perSession := float64(rss1-rss0) / float64(n)
	live := 0
	for _, sh := range st1.Shards {
		for _, s := range sh.Sessions {
			if s.State == SessionConnected {
				live++
			}
		}
	}
	b.ReportMetric(float64(live), "live_sessions")
	b.ReportMetric(hbps, "heartbeats/s")
	b.ReportMetric(ackps, "acks/s")
	b.ReportMetric(float64(missed.Load()), "missed_acks")
	b.ReportMetric(float64(len(st1.Violations)), "violations")
	b.ReportMetric(perSession, "rss_bytes/session")
	b.ReportMetric(connectTime.Seconds(), "connect_s")
	cpuShare := (cpu1 - cpu0).Seconds() / elapsed.Seconds()
	b.ReportMetric(cpuShare, "emulator_cpus")
	b.Logf("%d sessions: live %d, connect+identify %v, %.0f heartbeats/s, %.0f ACKs/s over %v, %d missed ACKs of %d beats, %d violations, emulator RSS %d -> %d MiB (%.1f KiB/session), emulator CPU %.2f cores",
		n, live, connectTime.Round(time.Millisecond), hbps, ackps, elapsed.Round(time.Millisecond), missed.Load(), sent.Load(),
		len(st1.Violations), rss0>>20, rss1>>20, perSession/1024, cpuShare)
	kinds := map[Kind]int{}
	for _, v := range st1.Violations {
		kinds[v.Kind]++
	}
	if len(kinds) > 0 {
		b.Logf("violations by kind: %v", kinds)
	}
	if live != n {
		b.Errorf("%d of %d sessions live at the end", live, n)
	}
}

// benchConnect dials, reads Hello, Identifies as [id, n] and reads READY.
func benchConnect(ctx context.Context, url string, id, n int) (*benchClient, error) {
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(dctx, url+"/?v=10&encoding=json", nil)
	if err != nil {
		return nil, err
	}
	ws.SetReadLimit(1 << 20)
	if _, _, err := ws.Read(dctx); err != nil { // Hello
		ws.CloseNow()
		return nil, err
	}
	idf := fmt.Sprintf(`{"op":2,"d":{"token":%q,"intents":513,"properties":{"os":"linux","browser":"bench","device":"bench"},"shard":[%d,%d]}}`,
		DefaultToken, id, n)
	if err := ws.Write(dctx, websocket.MessageText, []byte(idf)); err != nil {
		ws.CloseNow()
		return nil, err
	}
	_, msg, err := ws.Read(dctx)
	if err != nil {
		ws.CloseNow()
		return nil, err
	}
	if !strings.Contains(string(msg), `"t":"READY"`) {
		ws.CloseNow()
		return nil, fmt.Errorf("expected READY, got %.100s", msg)
	}
	return &benchClient{ws: ws}, nil
}

func fetchState(b *testing.B, httpURL string) State {
	resp, err := http.Get(httpURL + StatePath)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var st State
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		b.Fatal(err)
	}
	return st
}

// readCPU returns a process's user+system CPU time from /proc/PID/stat.
func readCPU(b *testing.B, pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the ")" that ends the command name: utime is the 12th, stime the 13th.
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	if len(f) < 13 {
		b.Fatalf("short /proc/%d/stat", pid)
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	const clockTicks = 100 // USER_HZ on Linux
	return time.Duration(ut+st) * time.Second / clockTicks
}

// readRSS returns a process's resident set size in bytes.
func readRSS(b *testing.B, pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	b.Fatal("no VmRSS")
	return 0
}

// BenchmarkDispatch measures the cost of one dispatch (marshal, buffer,
// write) to a connected session, in process.
func BenchmarkDispatch(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	emu, err := Start(ctx, "127.0.0.1:0", Options{HeartbeatInterval: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	defer emu.Close()
	ws, _, err := websocket.Dial(ctx, emu.URL()+"/?v=10&encoding=json", nil)
	if err != nil {
		b.Fatal(err)
	}
	defer ws.CloseNow()
	ws.Read(ctx)
	ws.Write(ctx, websocket.MessageText, []byte(`{"op":2,"d":{"token":"`+DefaultToken+`","intents":513,"properties":{}}}`))
	go func() {
		for {
			if _, _, err := ws.Read(ctx); err != nil {
				return
			}
		}
	}()
	ectx, ecancel := context.WithTimeout(ctx, 10*time.Second)
	defer ecancel()
	if err := emu.Await(ectx, func(s State) bool { return len(s.Shards) == 1 }); err != nil {
		b.Fatal(err)
	}
	s := emu.sessions[emu.Sessions()[0].ID]
	data := messageCreateData(1, 1, emu.Guilds()[0], time.Now())
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		emu.dispatch(s, "MESSAGE_CREATE", data)
	}
}
