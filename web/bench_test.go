package web

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
)

// Shape of the dashboard benchmarks (issue 5): 1,000 nodes of capacity 128
// over 131,072 shards (3,072 stay unowned: the fleet's capacity is 128,000),
// and 50 open dashboards for the fan-out.
const (
	benchNodes      = 1000
	benchShards     = 131072
	benchDashboards = 50
)

// BenchmarkDashboard measures server render time and page weight of the
// fleet and nodes pages, and the cost of one live update fanned out to 50
// open fleet pages over loopback HTTP. Run with DPXE_BENCH=1:
//
//	DPXE_BENCH=1 go test -run '^$' -bench Dashboard -benchtime 20x ./web/
func BenchmarkDashboard(b *testing.B) {
	if os.Getenv("DPXE_BENCH") != "1" {
		b.Skip("set DPXE_BENCH=1 to run the dashboard benchmarks")
	}
	start := time.Now()
	f := newTestFleet(b, fleetOpts{total: benchShards, maxConc: 16, liveEvery: time.Hour})
	ids := make([]string, benchNodes)
	for i := range ids {
		ids[i] = fmt.Sprintf("node-%04d", i)
	}
	f.addNodes(appliance.MaxShardsPerNode, ids...)
	f.settle(ids...)
	b.Logf("seeded %d nodes, %d shards through the controller in %v", benchNodes, benchShards, time.Since(start).Round(time.Millisecond))
	sid, _ := f.web.sess.create(time.Now())
	cookie := &http.Cookie{Name: sessionCookie, Value: sid}

	page := func(b *testing.B, path string) {
		mux := http.NewServeMux()
		f.web.Register(mux)
		var size int
		var last []byte
		for b.Loop() {
			req := httptest.NewRequest("GET", path, nil)
			req.AddCookie(cookie)
			w := httptest.NewRecorder()
			mux.ServeHTTP(w, req)
			if w.Code != http.StatusOK {
				b.Fatalf("GET %s: %d", path, w.Code)
			}
			size = w.Body.Len()
			last = w.Body.Bytes()
		}
		if dir := os.Getenv("DPXE_ARTIFACTS"); dir != "" {
			name := strings.Trim(strings.ReplaceAll(path, "/", "_"), "_")
			_ = os.WriteFile(dir+"/bench-"+name+".html", last, 0o644)
		}
		b.ReportMetric(float64(size), "page-bytes")
		b.ReportMetric(float64(size)/1024, "page-KiB")
	}
	b.Run("fleet-page", func(b *testing.B) { page(b, "/") })
	b.Run("nodes-page", func(b *testing.B) { page(b, "/nodes") })
	b.Run("node-page", func(b *testing.B) { page(b, "/nodes/"+ids[500]) })

	b.Run(fmt.Sprintf("sse-fanout-%d", benchDashboards), func(b *testing.B) {
		var got atomic.Int64
		var bytesIn atomic.Int64
		recv := make(chan struct{}, benchDashboards*4)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var wg sync.WaitGroup
		client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: benchDashboards * 2}}
		for i := 0; i < benchDashboards; i++ {
			// One session each: a session may hold only maxSessionStreams.
			sid, _ := f.web.sess.create(time.Now())
			req, _ := http.NewRequestWithContext(ctx, "GET", f.srv.URL+"/live?topic=fleet", nil)
			req.AddCookie(&http.Cookie{Name: sessionCookie, Value: sid})
			resp, err := client.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer resp.Body.Close()
				sc := bufio.NewScanner(resp.Body)
				sc.Buffer(make([]byte, 1<<20), 16<<20)
				for sc.Scan() {
					line := sc.Text()
					if strings.HasPrefix(line, "data: ") {
						bytesIn.Add(int64(len(line)))
						got.Add(1)
						recv <- struct{}{}
					}
				}
			}()
		}
		// Wait until every stream is subscribed.
		deadline := time.Now().Add(30 * time.Second)
		for {
			f.web.hub.mu.Lock()
			n := f.web.hub.count
			f.web.hub.mu.Unlock()
			if n == benchDashboards {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%d of %d dashboards subscribed", n, benchDashboards)
			}
			time.Sleep(10 * time.Millisecond)
		}
		// Prime: the first publish sends every part.
		f.web.hub.publish(ctx)
		for i := 0; i < benchDashboards; i++ {
			<-recv
		}
		got.Store(0)
		bytesIn.Store(0)
		i := 0
		for b.Loop() {
			b.StopTimer()
			// One shard changes state: the shard map part changes.
			f.mu.Lock()
			f.state["0"] = []appliance.ShardState{appliance.ShardBackoff, appliance.ShardReady}[i%2]
			f.mu.Unlock()
			f.checkin(ids[0])
			i++
			b.StartTimer()
			f.web.hub.publish(ctx)
			for j := 0; j < benchDashboards; j++ {
				select {
				case <-recv:
				case <-time.After(30 * time.Second):
					b.Fatalf("update %d: %d of %d dashboards received it", i, j, benchDashboards)
				}
			}
		}
		b.ReportMetric(float64(bytesIn.Load())/float64(max(got.Load(), 1)), "bytes/dashboard-update")
		cancel()
		wg.Wait()
	})
}
