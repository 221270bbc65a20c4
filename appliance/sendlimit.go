package appliance

// This file is the Go reference of a shard's Gateway send budget (issue
// 18): Discord allows 120 events per connection in 60 s and disconnects
// (4008) a client that sends more, heartbeats included (research §1.11).
// The kernel's copy is sendlog_note and sendlog_allows
// (kernel/gateway/budget.inc), compared by the self-test digest "budget".
//
// Every event a connection sends is noted with its TSC. Heartbeats, and the
// Identify or Resume that opens the connection, are always sent; any other
// command is sent only if the events of the last 60 s, itself, and the
// reserve for heartbeats stay within the limit:
//
//	in_window + 1 + SendReserve(interval) <= 120
//
// Why that suffices: take any 60 s window and the last command c sent in
// it. When c was sent, the events of the 60 s before it, c included, were
// at most 120 - reserve; the window's events up to c are among them. After
// c only heartbeats (and nothing else that is gated) are sent in the
// window, and scheduled heartbeats are at least an interval apart
// (gw_send_heartbeat sets the next one a full interval after any
// heartbeat), so at most 60000/interval + 1 of them fall in it, plus the
// heartbeats the Gateway asks for with op 1, which a client must answer at
// once: SendSpareBeats of them are reserved. So no window holds more than
// 120 events as long as the Gateway asks for at most SendSpareBeats
// heartbeats in it.

// Discord's send limit (research §1.11).
const (
	SendLimitEvents   = 120   // events per connection per window
	SendLimitWindowMS = 60000 // the window
	// SendSpareBeats is how many heartbeats requested by the Gateway (op 1)
	// the reserve covers in one window.
	SendSpareBeats = 2
)

// SendReserve is the room kept for heartbeats in any window at a heartbeat
// interval: the scheduled ones that can fall in 60 s, and SendSpareBeats.
// Before Hello (interval 0) the whole limit is kept: nothing is gated yet.
func SendReserve(heartbeatMS uint32) uint32 {
	if heartbeatMS == 0 {
		return SendLimitEvents
	}
	return SendLimitWindowMS/heartbeatMS + 1 + SendSpareBeats
}

// SendLog is the kernel's struc SENDLOG: the TSC of the last
// SendLimitEvents events a connection sent, oldest overwritten first.
type SendLog struct {
	Count uint32 // events noted, at most SendLimitEvents
	Head  uint32 // where the next one goes
	Times [SendLimitEvents]uint64
}

// Note records an event sent at nowTSC.
func (l *SendLog) Note(nowTSC uint64) {
	l.Times[l.Head] = nowTSC
	l.Head = (l.Head + 1) % SendLimitEvents
	l.Count = min(l.Count+1, SendLimitEvents)
}

// newest returns the k-th newest noted time (k = 0: the last one).
func (l *SendLog) newest(k uint32) uint64 {
	return l.Times[(l.Head+SendLimitEvents-1-k)%SendLimitEvents]
}

// InWindow counts the events sent in the 60 s up to nowTSC: those whose age
// is under the window (an event stamped after now counts too). Events are
// noted in time order, so the count stops at the first older one.
func (l *SendLog) InWindow(nowTSC, cyclesPerMS uint64) uint32 {
	window := msToCycles(SendLimitWindowMS, cyclesPerMS)
	var n uint32
	for n < l.Count {
		t := l.newest(n)
		if t <= nowTSC && nowTSC-t >= window {
			break
		}
		n++
	}
	return n
}

// Allows reports whether a command (anything but a heartbeat or the
// connection's Identify or Resume) may be sent at nowTSC on a connection
// heartbeating every heartbeatMS. When it may not, waitMS is how long until
// it may (rounded up), or all ones when the interval leaves no room at all.
func (l *SendLog) Allows(nowTSC, cyclesPerMS uint64, heartbeatMS uint32) (ok bool, waitMS uint64) {
	reserve := SendReserve(heartbeatMS)
	if reserve >= SendLimitEvents {
		return false, ^uint64(0)
	}
	room := SendLimitEvents - 1 - reserve // events the window may hold before this one
	n := l.InWindow(nowTSC, cyclesPerMS)
	if n <= room {
		return true, 0
	}
	// n - room events must leave the window: the (n - room)-th oldest in
	// it, which is the (room)-th newest, leaves it one window after it
	// was sent.
	t := l.newest(room)
	window := msToCycles(SendLimitWindowMS, cyclesPerMS)
	perMS := cyclesPerMSOrGuess(cyclesPerMS)
	var wait uint64
	if t > nowTSC {
		wait = window // stamped ahead of now: a whole window from now
	} else {
		wait = window - (nowTSC - t) // in the window: nowTSC - t < window
	}
	waitMS = wait / perMS
	if wait%perMS != 0 {
		waitMS++ // rounded up: the room is there once the wait is over
	}
	return false, waitMS
}
