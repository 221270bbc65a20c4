package api

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
)

// TestConcurrentClients runs nodes that check in, claim Identify and get
// drained concurrently over loopback (bounded: 40 nodes × 30 rounds), then
// checks the controller's invariants and that the fleet converged to
// owning every shard. Run with -race it also checks the locking.
func TestConcurrentClients(t *testing.T) {
	const nodes, rounds, total = 40, 30, 128
	s := newTestServer(t, controller.Config{TotalShards: total, MaxConcurrency: 4, RebalanceEvery: -1})
	creds := make([]string, nodes)
	for i := range creds {
		creds[i] = s.addNode(fmt.Sprintf("c%02d", i))
	}
	var wg sync.WaitGroup
	errs := make(chan error, nodes)
	for i := 0; i < nodes; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			id := fmt.Sprintf("c%02d", i)
			var gen uint64
			for r := 0; r < rounds; r++ {
				body, _ := json.Marshal(appliance.CheckinRequest{NodeID: id, Capacity: 4 + i%4, Generation: gen})
				var resp appliance.CheckinResponse
				if code := s.call("POST", "/v1/checkin", creds[i], string(body), &resp); code != 200 {
					errs <- fmt.Errorf("%s check-in: %d", id, code)
					return
				}
				gen = resp.Generation
				if len(resp.Assigned) > len(resp.Pending) {
					var ir appliance.IdentifyResponse
					claim := fmt.Sprintf(`{"node_id":%q,"shard_id":%d}`, id, resp.Assigned[0])
					if code := s.call("POST", "/v1/identify", creds[i], claim, &ir); code != 200 {
						errs <- fmt.Errorf("%s identify: %d", id, code)
						return
					}
				}
				if i == 0 && r%10 == 5 {
					var v controller.NodeView
					s.call("POST", fmt.Sprintf("/v1/nodes/c%02d/drain", (r/10)+1), s.admin, "", &v)
				}
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := s.ctrl.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	// Every node acknowledges the final plan twice; then all shards are owned.
	for pass := 0; pass < 2; pass++ {
		gen := s.ctrl.Plan().Generation
		for i := 0; i < nodes; i++ {
			body, _ := json.Marshal(appliance.CheckinRequest{NodeID: fmt.Sprintf("c%02d", i), Capacity: 4 + i%4, Generation: gen})
			if code := s.call("POST", "/v1/checkin", creds[i], string(body), nil); code != 200 {
				t.Fatalf("final check-in: %d", code)
			}
		}
	}
	if p := s.ctrl.Plan(); p.Owned != total {
		t.Fatalf("after convergence %d of %d shards owned: %+v", p.Owned, total, p)
	}
}
