package gatewayemu

import (
	"context"
	"runtime"
	"testing"
	"time"
)

// TestCloseReleasesEverything checks that Close ends every goroutine the
// emulator started: connections, sessions with message generators, timers.
// It is not parallel, so no other test's goroutines come and go meanwhile.
func TestCloseReleasesEverything(t *testing.T) {
	before := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	o := fastOptions()
	o.MessagesPerSecond = 50
	o.MaxConcurrency = 8
	emu, err := Start(ctx, "127.0.0.1:0", o)
	if err != nil {
		t.Fatal(err)
	}
	var clients []*wsClient
	for i := 0; i < 8; i++ {
		c := connect(t, emu)
		c.identify(emu, i, 8)
		clients = append(clients, c)
	}
	if n := runtime.NumGoroutine(); n < before+8 {
		t.Fatalf("only %d goroutines with 8 sessions (%d before)", n, before)
	}
	clients[0].ws.CloseNow() // one detached, resumable session with a live generator
	awaitState(t, emu, "one detached", func(s State) bool { return s.Counters.OpenConnections == 7 })
	emu.Close()
	for _, c := range clients {
		c.ws.CloseNow()
	}
	deadline := time.Now().Add(testTimeout)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines after Close, %d before:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond) // poll with a deadline
	}
	if _, err := emu.Inject(Fault{Kind: FaultDrop}); err != ErrNoTarget {
		t.Fatalf("fault after Close: %v", err)
	}
}
