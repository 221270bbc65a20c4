package appliance

// This file is the Go reference of the capacity rule a node applies to a
// check-in answer (issue 22): whatever an answer assigns, a node never runs
// more shards than the capacity it reported. The kernel's copy is
// shard_capacity_cut (kernel/shard/shard.inc), compared by the self-test
// digest "capacity"; node/checkin.inc applies it to every plan.
//
// The check-in's health counts (ready, starting, backoff and fatal shards)
// must not exceed the capacity (CheckinRequest.Validate). A FATAL shard is
// counted and stays FATAL until an operator restarts it, so it keeps its
// unit of capacity; the rest of the capacity goes to the startable shards
// (assigned, not pending) with the lowest shard IDs, and the others are
// held: not started, reported ASSIGNED, and stopped (their session kept)
// if they were running. Pending shards take no capacity: they are not
// started either.

// Kinds of an assigned shard for the capacity rule (the kernel's CAP_*).
const (
	CapStartable uint8 = 0 // assigned, not pending, not FATAL: may start
	CapPending   uint8 = 1 // its previous owner has not released it
	CapFatal     uint8 = 2 // FATAL on this node: counted, never started
	CapHeld      uint8 = 3 // startable, but beyond the capacity: not started
)

// CapacityCut applies a capacity to the assigned shards ids, whose kinds
// are CapStartable, CapPending or CapFatal (CapHeld counts as startable, so
// the cut may be applied again; any other kind is left alone). It marks
// every startable entry whose rank among the startable entries by shard ID
// is at or past capacity minus the FATAL entries as CapHeld, the others
// CapStartable, and returns how many it held. Ranks count the startable
// entries with a smaller ID, so the lowest IDs run whatever the order of
// ids, and equal IDs share a rank.
func CapacityCut(ids []uint32, kinds []uint8, capacity int) (held int) {
	budget := capacity
	for _, k := range kinds {
		if k == CapFatal {
			budget--
		}
	}
	startable := func(k uint8) bool { return k == CapStartable || k == CapHeld }
	for i, k := range kinds {
		if !startable(k) {
			continue
		}
		rank := 0
		for j, kj := range kinds {
			if startable(kj) && ids[j] < ids[i] {
				rank++
			}
		}
		if rank >= budget {
			kinds[i] = CapHeld
			held++
		} else {
			kinds[i] = CapStartable
		}
	}
	return held
}

// RunnableShards applies a node's capacity to the shards an answer assigns
// it: run are the startable shards the node may run (assigned, not
// pending, not FATAL, within capacity), held the startable ones beyond it.
// fatal lists the assigned shards that are FATAL on the node.
func RunnableShards(assigned, pending, fatal []uint32, capacity int) (run, held []uint32) {
	in := func(set []uint32, id uint32) bool {
		for _, s := range set {
			if s == id {
				return true
			}
		}
		return false
	}
	kinds := make([]uint8, len(assigned))
	for i, id := range assigned {
		switch {
		case in(pending, id):
			kinds[i] = CapPending
		case in(fatal, id):
			kinds[i] = CapFatal
		}
	}
	CapacityCut(assigned, kinds, capacity)
	for i, id := range assigned {
		switch kinds[i] {
		case CapStartable:
			run = append(run, id)
		case CapHeld:
			held = append(held, id)
		}
	}
	return run, held
}
