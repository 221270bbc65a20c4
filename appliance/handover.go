package appliance

// HandoverSeq is the sequence a node hands a shard's session over from
// (kernel/node/natsnode.inc nn_handover): the Resume sequence of the
// shard's next owner after a release, and the seq of the resumable session
// every check-in status reports for a crash hand-off.
//
// With nothing in flight it is the sequence received: every dispatch
// received is stored, skipped or counted lost. Otherwise it is the sequence
// before the first dispatch in flight, because every dispatch received
// before that one is acknowledged, skipped or counted lost; that is 0 when
// the first in flight is the session's first dispatch (nothing is
// acknowledged yet, so the next owner's Resume from 0 asks Discord for all
// of it). It is never above the sequence received: a first in flight above
// it belongs to an older session of the slot and says nothing about this
// one.
func HandoverSeq(received uint32, inFlight bool, firstInFlight uint32) uint32 {
	if !inFlight {
		return received
	}
	if firstInFlight == 0 {
		return 0
	}
	return min(firstInFlight-1, received)
}

// DeliveryLag is a shard's event delivery lag as its status reports it:
// the sequence received minus the acknowledged one (EventsAckedSeq). A
// status reports no received sequence as such: a shard with a resumable
// session reports its hand-over sequence (Seq, HandoverSeq), which is
// the received one when nothing is in flight and the one before the
// first dispatch in flight otherwise, the dispatches in flight following
// it one sequence each, so the received sequence is Seq plus
// EventsInFlight. ok is false without a resumable session (SessionID and
// SeqValid), or with an acknowledged sequence above the received one (an
// older session's): then there is no lag to tell.
func DeliveryLag(st *ShardStatus) (lag uint64, ok bool) {
	received := uint64(st.Seq) + uint64(st.EventsInFlight)
	if !st.SeqValid || st.SessionID == "" || received < uint64(st.EventsAckedSeq) {
		return 0, false
	}
	return received - uint64(st.EventsAckedSeq), true
}
