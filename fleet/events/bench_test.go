package events

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/discord-pxe/dpxe/fleet/events/embedded"
)

// BenchmarkPublishAck measures dispatches of 1 KiB stored and
// acknowledged per second by the embedded server on its file store, from
// 1 and 16 sessions at once (each with the default window), over TCP
// loopback as nodes connect. b.N counts dispatches; every one is
// acknowledged (Flush) before the clock stops.
func BenchmarkPublishAck(b *testing.B) {
	for _, sessions := range []int{1, 16} {
		b.Run(fmt.Sprintf("sessions=%d", sessions), func(b *testing.B) {
			srv, err := embedded.Start(embedded.ServerConfig{Listen: "127.0.0.1:0", StoreDir: b.TempDir()})
			if err != nil {
				b.Fatal(err)
			}
			defer srv.Shutdown()
			nc, err := nats.Connect(srv.ClientURL())
			if err != nil {
				b.Fatal(err)
			}
			defer nc.Close()
			testStreamB(b, nc)
			p, err := NewPublisher(nc, PublisherConfig{App: "bot", Node: "bench"})
			if err != nil {
				b.Fatal(err)
			}
			payload := make([]byte, 1024)
			b.SetBytes(int64(len(payload)))
			b.ResetTimer()
			var wg sync.WaitGroup
			for s := range sessions {
				sp, err := p.Session(uint32(s), fmt.Sprintf("bench-%d", s), 0)
				if err != nil {
					b.Fatal(err)
				}
				n := b.N / sessions
				if s == 0 {
					n += b.N % sessions
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx := context.Background()
					for seq := uint64(1); seq <= uint64(n); seq++ {
						if err := sp.Publish(ctx, Dispatch{Seq: seq, Event: "MESSAGE_CREATE", Payload: payload, Received: time.Now()}); err != nil {
							b.Error(err)
							return
						}
					}
					if err := sp.Flush(ctx); err != nil {
						b.Error(err)
					}
					if st := sp.Stats(); st.Acked != uint64(n) {
						b.Errorf("session %d: acked %d of %d (%+v)", s, st.Acked, n, st)
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

func testStreamB(b *testing.B, nc *nats.Conn) {
	b.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	if _, err := EnsureStream(ctx, js, "bot", DefaultStreamLimits()); err != nil {
		b.Fatal(err)
	}
}
