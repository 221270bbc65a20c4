package controller

import (
	"slices"
	"strconv"
	"strings"
)

// Member is a live node as the rebalance sees it.
type Member struct {
	ID       string
	Capacity uint32 // 1..MaxShardsPerNode
	Draining bool
}

// Range is a contiguous run of shards [Start, Start+Count).
type Range struct {
	Start, Count uint32
}

// Contains reports whether shard s is in r.
func (r Range) Contains(s uint32) bool { return s >= r.Start && s-r.Start < r.Count }

// String is the range as operators read it everywhere (dashboard, logs,
// errors, the held-shards text): "16-31", "16" for one shard, "none" for
// an empty range.
func (r Range) String() string {
	switch r.Count {
	case 0:
		return "none"
	case 1:
		return strconv.FormatUint(uint64(r.Start), 10)
	}
	return strconv.FormatUint(uint64(r.Start), 10) + "-" + strconv.FormatUint(uint64(r.Start)+uint64(r.Count)-1, 10)
}

// Rebalance computes the shard plan of seed 004 for members, which must be
// sorted by ID with no duplicates (step 1). It returns one range per member,
// in the same order:
//
//  2. sum the capacity of non-draining members;
//  3. give each a target of floor(total × capacity / sum), draining ones 0;
//  4. cap each target at the member's capacity;
//  5. hand out the remainder one shard at a time in member order, skipping
//     draining and full members, while spare capacity exists;
//  6. lay the targets out as contiguous ranges in member order.
//
// Step 7 (bump the generation only when the assignment changed) is the
// caller's, see SameAssignment. When the fleet's capacity is below total,
// the highest shards stay unassigned. Rebalance is deterministic and runs
// in O(len(members)).
func Rebalance(members []Member, total uint32) []Range {
	out := make([]Range, len(members))
	var sum uint64
	for _, m := range members {
		if !m.Draining {
			sum += uint64(m.Capacity)
		}
	}
	if sum == 0 || total == 0 {
		return out
	}
	targets := make([]uint32, len(members))
	var given uint64
	for i, m := range members {
		if m.Draining {
			continue
		}
		t := uint64(total) * uint64(m.Capacity) / sum
		t = min(t, uint64(m.Capacity))
		targets[i] = uint32(t)
		given += t
	}
	remainder := uint64(total) - given
	for remainder > 0 {
		progress := false
		for i, m := range members {
			if remainder == 0 {
				break
			}
			if m.Draining || targets[i] >= m.Capacity {
				continue
			}
			targets[i]++
			remainder--
			progress = true
		}
		if !progress {
			break // no spare capacity left
		}
	}
	var next uint32
	for i, t := range targets {
		if t > 0 {
			out[i] = Range{Start: next, Count: t}
		}
		next += t
	}
	return out
}

// SameAssignment reports whether two plans map every shard to the same
// node. Plans are given as member IDs with their ranges; members with an
// empty range do not matter.
func SameAssignment(aIDs []string, a []Range, bIDs []string, b []Range) bool {
	i, j := 0, 0
	for {
		for i < len(a) && a[i].Count == 0 {
			i++
		}
		for j < len(b) && b[j].Count == 0 {
			j++
		}
		if i == len(a) || j == len(b) {
			return i == len(a) && j == len(b)
		}
		if aIDs[i] != bIDs[j] || a[i] != b[j] {
			return false
		}
		i++
		j++
	}
}

// sortMembers sorts members by ID (seed 004 step 1).
func sortMembers(ms []Member) {
	slices.SortFunc(ms, func(a, b Member) int { return strings.Compare(a.ID, b.ID) })
}
