package history_test

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/history"
	"github.com/discord-pxe/dpxe/fleet/store"
)

func TestPercentiles(t *testing.T) {
	hundred := make([]float64, 100)
	for i := range hundred {
		hundred[i] = float64(100 - i) // 100..1, unsorted
	}
	for _, c := range []struct {
		name string
		in   []float64
		want history.Ping
	}{
		{"none", nil, history.Ping{}},
		{"one", []float64{42}, history.Ping{N: 1, P50: 42, P90: 42, P99: 42, Max: 42}},
		{"two", []float64{30, 10}, history.Ping{N: 2, P50: 10, P90: 30, P99: 30, Max: 30}},
		{"1..100", hundred, history.Ping{N: 100, P50: 50, P90: 90, P99: 99, Max: 100}},
		{"ten", []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 1000}, history.Ping{N: 10, P50: 5, P90: 9, P99: 1000, Max: 1000}},
	} {
		if got := history.Percentiles(c.in); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

// clock is a clock the test moves.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// TestSamplerStoresTheFleet: a real controller over a real SQLite file, one
// node holding 6 of 12 shards in every state; one Sampler.Once stores the
// counts by state and the percentiles of the READY shards' pings.
func TestSamplerStoresTheFleet(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "dpxe.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ck := &clock{t: time.Date(2026, 12, 2, 2, 0, 30, 0, time.UTC)}
	c, err := controller.New(ctx, st, controller.Config{TotalShards: 12, RebalanceEvery: -1}, ck.now, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.AddNode(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	status := map[uint32]appliance.ShardStatus{
		0: {State: appliance.ShardReady, PingMS: 20},
		1: {State: appliance.ShardReady, PingMS: 30},
		2: {State: appliance.ShardReady}, // no ping measured yet
		3: {State: appliance.ShardStarting},
		4: {State: appliance.ShardFatal, CloseCode: 4004},
		// 5: not reported
	}
	var gen uint64
	var run []uint32
	for range 4 { // learn, acknowledge, hold, report
		req := appliance.CheckinRequest{NodeID: "a", Capacity: 6, Generation: gen}
		for _, s := range run {
			if x, ok := status[s]; ok {
				x.ID = s
				req.Shards = append(req.Shards, x)
			}
		}
		resp, err := c.Checkin(ctx, &req, "127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		gen, run = resp.Generation, nil
		pending := map[uint32]bool{}
		for _, p := range resp.Pending {
			pending[p] = true
		}
		for _, s := range resp.Assigned {
			if !pending[s] {
				run = append(run, s)
			}
		}
	}
	// A follower replica (not Acting) stores nothing: its fleet is not
	// the fleet, and its row would replace the leader's minute.
	follower := history.Sampler{Stats: c.FleetStats, Store: st, Acting: func() bool { return false }}
	if err := follower.Once(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := st.History(ctx, time.Time{}); err != nil || len(got) != 0 {
		t.Fatalf("a sampler that is not acting stored %+v, %v", got, err)
	}
	s := history.Sampler{Stats: c.FleetStats, Store: st, Acting: func() bool { return true }}
	if err := s.Once(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := st.History(ctx, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	want := store.HistorySample{At: time.Date(2026, 12, 2, 2, 0, 0, 0, time.UTC), Ready: 3, Starting: 1, Fatal: 1, Assigned: 1,
		Unowned: 6, PingCount: 2, PingP50: 20, PingP90: 30, PingP99: 30, PingMax: 30}
	if len(got) != 1 || got[0] != want {
		t.Fatalf("stored %+v\nwant %+v", got, want)
	}
}

// BenchmarkSample is the sampler's cost at 131,072 shards on 10,000
// nodes, every shard READY with a ping: one pass and a sort.
func BenchmarkSample(b *testing.B) {
	const shards, nodes = 131072, 10000
	fs := controller.FleetStats{At: time.Now(), Shards: make([]controller.ShardStats, shards)}
	r := rand.New(rand.NewPCG(1, 2))
	for i := range fs.Shards {
		fs.Shards[i] = controller.ShardStats{Node: int32(i % nodes), Held: true, Reported: true,
			State: appliance.ShardReady, PingMS: 20 + r.Float64()*200}
	}
	b.ReportAllocs()
	for b.Loop() {
		h := history.Sample(&fs)
		if h.Ready != shards {
			b.Fatal(h.Ready)
		}
	}
}
