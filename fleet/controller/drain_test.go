package controller

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
)

// planOwners maps each shard to its owner in the current plan ("" none).
func planOwners(c *Controller) []string {
	p := c.Plan()
	out := make([]string, p.TotalShards)
	for _, r := range p.Ranges {
		for s := r.Start; s < r.Start+r.Count; s++ {
			out[s] = r.NodeID
		}
	}
	return out
}

// applyMoves is the plan a preview's moves lead to from owners.
func applyMoves(owners []string, moves []ShardMove) []string {
	out := append([]string(nil), owners...)
	for _, m := range moves {
		for s := m.Start; s < m.Start+m.Count; s++ {
			out[s] = m.To
		}
	}
	return out
}

// TestDrainStrands is issue 23's case: two nodes of capacity 8, 16 shards.
// Draining one cannot move its shards anywhere without dropping others:
// the preview says exactly what moves and what becomes unowned, Drain
// refuses without force and changes nothing, and with force it applies the
// plan the preview showed.
func TestDrainStrands(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 16})
	h.add("a", "b")
	ra, rb := h.checkin("a", 8, 0), h.checkin("b", 8, 0)
	h.checkin("a", 8, ra.Generation)
	h.checkin("b", 8, rb.Generation)
	before := planOwners(h.c)
	p, err := h.c.PreviewDrain("a")
	if err != nil {
		t.Fatal(err)
	}
	want := []ShardMove{{From: "a", To: "b", Start: 0, Count: 8}, {From: "b", To: "", Start: 8, Count: 8}}
	if !reflect.DeepEqual(p.Moves, want) || p.Strands != 8 || p.Leaving != 8 || p.Moved != 16 || p.UnownedAfter != 8 {
		t.Fatalf("preview %+v, want moves %+v and 8 stranded", p, want)
	}
	if _, err := h.c.Drain(context.Background(), "a", false); !errors.Is(err, ErrDrainStrands) {
		t.Fatalf("drain without force: %v, want ErrDrainStrands", err)
	}
	if d, _ := h.c.Node(context.Background(), "a"); d.Draining || !reflect.DeepEqual(planOwners(h.c), before) {
		t.Fatalf("a refused drain changed something: draining %v", d.Draining)
	}
	if _, err := h.c.Drain(context.Background(), "a", true); err != nil {
		t.Fatal(err)
	}
	if got := planOwners(h.c); !reflect.DeepEqual(got, applyMoves(before, p.Moves)) {
		t.Fatalf("plan after the forced drain %v, the preview said %v", got, applyMoves(before, p.Moves))
	}
}

// TestDrainPreviewIsThePlan: over random fleets the preview's moves turn
// the current plan into exactly the plan the drain produces, and Strands
// is the growth of the unowned count.
func TestDrainPreviewIsThePlan(t *testing.T) {
	for seed := uint64(1); seed <= 40; seed++ {
		rng := rand.New(rand.NewPCG(seed, 5))
		total := uint32(1 + rng.IntN(300))
		h := newHarness(t, Config{TotalShards: total})
		k := 1 + rng.IntN(8)
		caps := map[string]int{}
		for i := 0; i < k; i++ {
			id := fmt.Sprintf("n%d", i)
			h.add(id)
			caps[id] = 1 + rng.IntN(128)
			if rng.IntN(5) == 0 {
				h.c.SetDraining(context.Background(), id, true)
			}
		}
		for round := 0; round < 2; round++ {
			for i := 0; i < k; i++ {
				id := fmt.Sprintf("n%d", i)
				h.checkin(id, caps[id], h.c.Plan().Generation)
			}
		}
		victim := fmt.Sprintf("n%d", rng.IntN(k))
		before := planOwners(h.c)
		p, err := h.c.PreviewDrain(victim)
		if err != nil {
			t.Fatal(err)
		}
		unowned := func(o []string) (n uint32) {
			for _, x := range o {
				if x == "" {
					n++
				}
			}
			return n
		}
		if p.UnownedBefore != unowned(before) {
			t.Fatalf("seed %d: unowned before %d, plan has %d", seed, p.UnownedBefore, unowned(before))
		}
		if _, err := h.c.Drain(context.Background(), victim, true); err != nil {
			t.Fatal(err)
		}
		after := planOwners(h.c)
		if !reflect.DeepEqual(after, applyMoves(before, p.Moves)) {
			t.Fatalf("seed %d: drain of %s: plan %v, preview %+v", seed, victim, after, p)
		}
		if grow := int(unowned(after)) - int(unowned(before)); p.Strands != uint32(max(grow, 0)) {
			t.Fatalf("seed %d: strands %d, unowned grew by %d", seed, p.Strands, grow)
		}
		for _, m := range p.Moves {
			if m.From == m.To || m.Count == 0 {
				t.Fatalf("seed %d: empty or no-op move %+v", seed, m)
			}
		}
	}
}
