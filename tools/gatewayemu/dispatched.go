package gatewayemu

import "time"

// DispatchRecord is one dispatch a session sent: its sequence number, the
// frame exactly as written (before compression) and Sent, when the session
// made it and handed it to its connection's writer (the host's clock; a
// Resume's replay keeps the first time).
type DispatchRecord struct {
	Seq   int64
	Frame []byte
	Sent  time.Time
}

// Dispatched returns what session id still keeps for replay, oldest first:
// every dispatch it sent while fewer than Options.ReplayLimit were sent,
// and at least the newest ReplayLimit after that. A test that compares a
// fleet's output with what the emulator sent sets ReplayLimit above the
// dispatches it counts on. ok is false for an unknown session.
func (e *Emulator) Dispatched(id string) (recs []DispatchRecord, ok bool) {
	e.mu.Lock()
	s := e.sessions[id]
	e.mu.Unlock()
	if s == nil {
		return nil, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	recs = make([]DispatchRecord, len(s.buf))
	for i, b := range s.buf {
		recs[i] = DispatchRecord{Seq: b.seq, Frame: append([]byte(nil), b.frame...), Sent: b.sent}
	}
	return recs, true
}
