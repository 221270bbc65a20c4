package appliance

import (
	"slices"
	"testing"
)

func span(from, n uint32) []uint32 {
	s := make([]uint32, n)
	for i := range s {
		s[i] = from + uint32(i)
	}
	return s
}

func TestRunnableShards(t *testing.T) {
	for _, c := range []struct {
		name                     string
		assigned, pending, fatal []uint32
		capacity                 int
		run, held                []uint32
	}{
		// Issue 22's reproduction: capacity 16, then a reboot with capacity
		// 4 still answered with range 0+16: only 0..3 run.
		{"shrunk", span(0, 16), nil, nil, 4, span(0, 4), span(4, 12)},
		{"fits", span(8, 4), nil, nil, 4, span(8, 4), nil},
		{"pending takes no capacity", span(0, 6), []uint32{0, 1}, nil, 4, span(2, 4), nil},
		{"pending and beyond", span(0, 8), []uint32{1}, nil, 4, []uint32{0, 2, 3, 4}, []uint32{5, 6, 7}},
		{"fatal keeps its unit", span(0, 8), nil, []uint32{6}, 4, span(0, 3), []uint32{3, 4, 5, 7}},
		{"all fatal", span(0, 3), nil, span(0, 3), 2, nil, nil},
		{"capacity 0", span(5, 2), nil, nil, 0, nil, span(5, 2)},
		{"none assigned", nil, nil, nil, 4, nil, nil},
	} {
		run, held := RunnableShards(c.assigned, c.pending, c.fatal, c.capacity)
		if !slices.Equal(run, c.run) || !slices.Equal(held, c.held) {
			t.Errorf("%s: run %v held %v, want run %v held %v", c.name, run, held, c.run, c.held)
		}
		// The invariant: what a node reports in its health counts (the
		// shards it runs and its FATAL ones) never exceeds its capacity.
		if c.capacity >= len(c.fatal) && len(run)+len(c.fatal) > c.capacity {
			t.Errorf("%s: %d running + %d FATAL > capacity %d", c.name, len(run), len(c.fatal), c.capacity)
		}
	}
}

func TestCapacityCutOrder(t *testing.T) {
	// The lowest IDs run whatever the order of the list; a second cut
	// changes nothing.
	ids := []uint32{9, 3, 7, 1, 5}
	kinds := make([]uint8, len(ids))
	if held := CapacityCut(ids, kinds, 2); held != 3 {
		t.Fatalf("held %d, want 3", held)
	}
	want := []uint8{CapHeld, CapStartable, CapHeld, CapStartable, CapHeld}
	if !slices.Equal(kinds, want) {
		t.Errorf("kinds %v, want %v", kinds, want)
	}
	if held := CapacityCut(ids, kinds, 2); held != 3 || !slices.Equal(kinds, want) {
		t.Errorf("a second cut: held %d kinds %v", held, kinds)
	}
	if held := CapacityCut(ids, kinds, 5); held != 0 || slices.Contains(kinds, CapHeld) {
		t.Errorf("a larger capacity releases every held shard: held %d kinds %v", held, kinds)
	}
}
