package gatewayemu

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// Framing of server messages (Options.FragmentFrames) and the per-connection
// record (ConnStats): what the emulator sent, how the client used its send
// limit and which of its frames were malformed.

// Reasons a client frame is counted as malformed (ConnStats.MalformedFrames,
// State.MalformedClientFrames). Each such frame is also a violation and
// closes the connection; the counts say by which rule.
const (
	// FrameOversize: a payload over MaxPayloadBytes (4002).
	FrameOversize = "oversize"
	// FrameBinary: a binary frame; clients send JSON text (4002).
	FrameBinary = "binary"
	// FrameNotJSON: a text frame that is not a JSON object (4002).
	FrameNotJSON = "not_json"
	// FrameMissingOp: a JSON object without "op" (4002).
	FrameMissingOp = "missing_op"
	// FrameInvalidD: a `d` that does not fit its opcode (4001).
	FrameInvalidD = "invalid_d"
	// FrameUnknownOpcode: an opcode a client may not send (4001).
	FrameUnknownOpcode = "unknown_opcode"
)

// maxConnRecords is how many closed connections' ConnStats are kept.
const maxConnRecords = 4096

// writeRate is the slowest delivery a write of a large message waits for
// before it gives the client up: writeTimeout plus a second per 256 KiB,
// so an 8 MiB GUILD_CREATE gets 37 s against a slow guest TCP.
const writeRate = 256 << 10

// ConnStats is the record of one connection: what the emulator sent on it,
// how many events the client sent and the most it sent inside one send
// window, and its malformed frames by reason.
type ConnStats struct {
	Conn uint64 `json:"conn"`
	// Shard is [shard_id, num_shards] once Identify or Resume named it.
	Shard *[2]int `json:"shard"`
	// Open is false once the connection ended.
	Open bool `json:"open"`
	// ZlibStream is true with compress=zlib-stream.
	ZlibStream bool `json:"zlib_stream"`
	// Messages counts server messages written whole (a write that failed,
	// to a client gone or stuck, is not counted); PayloadBytes their JSON before any
	// compression; WireBytes their WebSocket payload bytes as sent (after
	// compression, without frame headers); Frames the data frames, first
	// and continuation.
	Messages     uint64 `json:"messages"`
	PayloadBytes uint64 `json:"payload_bytes"`
	WireBytes    uint64 `json:"wire_bytes"`
	Frames       uint64 `json:"frames"`
	// Dispatches and DispatchBytes are the op 0 messages among them (the
	// replayed ones included) and their JSON bytes: what a client's event
	// sink should have counted.
	Dispatches    uint64 `json:"dispatches"`
	DispatchBytes uint64 `json:"dispatch_bytes"`
	// ClientEvents counts client payloads the send limit saw.
	ClientEvents uint64 `json:"client_events"`
	// MaxEventsInWindow is the most client events inside any one
	// SendWindow; over SendLimit the connection was closed with 4008.
	MaxEventsInWindow int `json:"max_events_in_window"`
	SendLimit         int `json:"send_limit"`
	// MaxClientFrameBytes is the largest client payload received.
	MaxClientFrameBytes int `json:"max_client_frame_bytes"`
	// MalformedFrames counts malformed client frames by reason (Frame*).
	MalformedFrames map[string]uint64 `json:"malformed_frames,omitempty"`
}

// connStats is the live record of a connection, guarded by its own lock:
// the read loop and the writers update it.
type connStats struct {
	mu     sync.Mutex
	st     ConnStats
	window []int64 // client event times (unix ns) inside the send window, oldest first
}

// noteSent records one server message.
func (s *connStats) noteSent(payload, wire, frames int, dispatch bool) {
	s.mu.Lock()
	if dispatch {
		s.st.Dispatches++
		s.st.DispatchBytes += uint64(payload)
	}
	s.st.Messages++
	s.st.PayloadBytes += uint64(payload)
	s.st.WireBytes += uint64(wire)
	s.st.Frames += uint64(frames)
	s.mu.Unlock()
}

// noteEvent records one client event at now (unix ns) in window w.
func (s *connStats) noteEvent(now int64, w time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.ClientEvents++
	drop := 0
	for drop < len(s.window) && now-s.window[drop] >= int64(w) {
		drop++
	}
	s.window = append(s.window[drop:], now)
	if n := len(s.window); n > s.st.MaxEventsInWindow {
		s.st.MaxEventsInWindow = n
	}
}

// noteFrame records the size of one client payload.
func (s *connStats) noteFrame(n int) {
	s.mu.Lock()
	if n > s.st.MaxClientFrameBytes {
		s.st.MaxClientFrameBytes = n
	}
	s.mu.Unlock()
}

func (s *connStats) snapshot() ConnStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.st
	st.MalformedFrames = maps.Clone(s.st.MalformedFrames)
	return st
}

// copyShard copies a shard pair so a record does not alias live state.
func copyShard(p *[2]int) *[2]int {
	if p == nil {
		return nil
	}
	s := *p
	return &s
}

// malformed counts a malformed client frame on c and emulator-wide.
func (c *conn) malformed(reason string) {
	c.stats.mu.Lock()
	if c.stats.st.MalformedFrames == nil {
		c.stats.st.MalformedFrames = map[string]uint64{}
	}
	c.stats.st.MalformedFrames[reason]++
	c.stats.mu.Unlock()
	e := c.e
	e.mu.Lock()
	e.malformedFrames[reason]++
	e.mu.Unlock()
}

// frameReason maps a violation kind to the malformed-frame reason it
// stands for ("" for kinds that are not about one frame's form).
func frameReason(k Kind) string {
	switch k {
	case KindInvalidPayload:
		return FrameInvalidD
	case KindUnknownOpcode:
		return FrameUnknownOpcode
	}
	return ""
}

// nextRand steps the connection's fragmentation generator (splitmix64).
func (c *conn) nextRand() uint64 {
	c.fragState += 0x9e3779b97f4a7c15
	return mix64(c.fragState - 0x9e3779b97f4a7c15)
}

// writeMessage writes one WebSocket message of type typ, fragmented when
// Options.FragmentFrames is set, and returns the data frames written.
// c.wmu must be held.
func (c *conn) writeMessage(ctx context.Context, typ websocket.MessageType, data []byte) (int, error) {
	n := c.e.opts.FragmentFrames
	if n == 0 || len(data) == 0 {
		return 1, c.ws.Write(ctx, typ, data)
	}
	cuts := c.fragmentCuts(len(data), n)
	w, err := c.ws.Writer(ctx, typ)
	if err != nil {
		return 0, err
	}
	frames, prev := 0, 0
	for _, cut := range append(cuts, len(data)) {
		if _, err := w.Write(data[prev:cut]); err != nil {
			return frames, err
		}
		frames++
		prev = cut
	}
	// Close sends the final frame: FIN set, no payload (RFC 6455 §5.4
	// allows any fragment, the last included, to be empty).
	return frames + 1, w.Close()
}

// fragmentCuts draws the boundaries of a message of size bytes split into
// 1..max pieces: ascending, distinct offsets strictly inside the message.
func (c *conn) fragmentCuts(size, max int) []int {
	pieces := 1 + int(c.nextRand()%uint64(max))
	if pieces > size {
		pieces = size
	}
	seen := make(map[int]bool, pieces)
	cuts := make([]int, 0, pieces-1)
	for len(cuts) < pieces-1 {
		cut := 1 + int(c.nextRand()%uint64(size-1))
		if !seen[cut] {
			seen[cut] = true
			cuts = append(cuts, cut)
		}
	}
	sort.Ints(cuts)
	return cuts
}

// writeDeadline is how long a write of size bytes may take.
func writeDeadline(size int) time.Duration {
	return writeTimeout + time.Duration(size/writeRate)*time.Second
}

// ConnStats returns the record of every open connection and of the most
// recent closed ones (up to 4096), by connection number.
func (e *Emulator) ConnStats() []ConnStats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.connStatsLocked()
}

func (e *Emulator) connStatsLocked() []ConnStats {
	out := append([]ConnStats{}, e.closedStats...)
	for c := range e.conns {
		st := c.stats.snapshot()
		st.Open = true
		st.Shard = copyShard(c.shard)
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b ConnStats) int { return cmp.Compare(a.Conn, b.Conn) })
	return out
}

// keepStatsLocked moves c's record to the closed list. e.mu must be held.
func (e *Emulator) keepStatsLocked(c *conn) {
	st := c.stats.snapshot()
	st.Open = false
	st.Shard = copyShard(c.shard)
	if len(e.closedStats) >= maxConnRecords {
		e.closedStats = append(e.closedStats[:0], e.closedStats[1:]...)
	}
	e.closedStats = append(e.closedStats, st)
}

// MalformedClientFrames returns the emulator-wide count of malformed client
// frames by reason (Frame*).
func (e *Emulator) MalformedClientFrames() map[string]uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return maps.Clone(e.malformedFrames)
}

// corruptDeflate is a deflate block the inflater must refuse: BFINAL 1 and
// BTYPE 11, the reserved type (RFC 1951 §3.2.3), then the 00 00 ff ff a
// sync flush ends every zlib-stream message with.
var corruptDeflate = []byte{0x07, 0x00, 0x00, 0xff, 0xff}

// writeCorruptZlib sends corruptDeflate as one binary message on a
// zlib-stream connection (fault corrupt_zlib).
func (c *conn) writeCorruptZlib() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	frames, err := c.writeMessage(context.Background(), websocket.MessageBinary, corruptDeflate)
	if err != nil {
		return
	}
	c.stats.noteSent(0, len(corruptDeflate), frames, false)
	c.e.counters.wireBytes.Add(uint64(len(corruptDeflate)))
}
