package events

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
)

// Header names every published dispatch carries. Nats-Msg-Id is
// JetStream's own deduplication header (docs.nats.io, "Headers"); the
// others are ours, so a worker knows where and when an event came from
// without parsing the body.
const (
	HeaderMsgID    = "Nats-Msg-Id"   // <session>:<seq>, unique per dispatch of a session
	HeaderShard    = "Dpxe-Shard"    // decimal shard ID
	HeaderSeq      = "Dpxe-Seq"      // Discord's sequence number s of the dispatch
	HeaderSession  = "Dpxe-Session"  // the Gateway session_id the dispatch arrived on
	HeaderNode     = "Dpxe-Node"     // the node ID that received it
	HeaderReceived = "Dpxe-Received" // RFC 3339 UTC with nanoseconds, when the node read it
)

// Limits of header values.
const (
	maxSessionLen = 128 // Discord session IDs are 32 hex digits
	maxNodeLen    = 64
)

// Errors of the headers; each is wrapped with the header at fault.
var (
	// ErrMissingHeader means a header the scheme requires is absent.
	ErrMissingHeader = errors.New("missing header")
	// ErrBadHeader means a header value is malformed.
	ErrBadHeader = errors.New("malformed header value")
	// ErrMsgIDMismatch means Nats-Msg-Id is not <Dpxe-Session>:<Dpxe-Seq>.
	ErrMsgIDMismatch = errors.New("Nats-Msg-Id does not match Dpxe-Session and Dpxe-Seq")
)

// Meta is what the headers say about one dispatch.
type Meta struct {
	Shard    uint32
	Seq      uint64 // Discord's s, from 1 in each session
	Session  string
	Node     string
	Received time.Time
}

// MsgID is the JetStream message ID of the dispatch: the same event
// replayed by Discord after a Resume gets the same ID and is dropped by
// the stream as a duplicate.
func (m Meta) MsgID() string { return m.Session + ":" + strconv.FormatUint(m.Seq, 10) }

// checkToken checks a session or node value: printable ASCII without
// spaces or ':', at most max bytes.
func checkToken(name, v string, max int) error {
	if v == "" {
		return fmt.Errorf("%s: %w", name, ErrMissingHeader)
	}
	if len(v) > max {
		return fmt.Errorf("%s: %d bytes, more than %d: %w", name, len(v), max, ErrBadHeader)
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c <= ' ' || c >= 0x7f || c == ':' {
			return fmt.Errorf("%s: byte 0x%02x at %d: %w", name, c, i, ErrBadHeader)
		}
	}
	return nil
}

// Validate checks m before it is published.
func (m Meta) Validate() error {
	if m.Seq == 0 {
		return fmt.Errorf("%s: 0 (Discord sequences start at 1): %w", HeaderSeq, ErrBadHeader)
	}
	if err := checkToken(HeaderSession, m.Session, maxSessionLen); err != nil {
		return err
	}
	if err := checkToken(HeaderNode, m.Node, maxNodeLen); err != nil {
		return err
	}
	if m.Received.IsZero() {
		return fmt.Errorf("%s: %w", HeaderReceived, ErrMissingHeader)
	}
	return nil
}

// Header renders m as NATS headers.
func (m Meta) Header() (nats.Header, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	h := nats.Header{}
	h.Set(HeaderMsgID, m.MsgID())
	h.Set(HeaderShard, strconv.FormatUint(uint64(m.Shard), 10))
	h.Set(HeaderSeq, strconv.FormatUint(m.Seq, 10))
	h.Set(HeaderSession, m.Session)
	h.Set(HeaderNode, m.Node)
	h.Set(HeaderReceived, m.Received.UTC().Format(time.RFC3339Nano))
	return h, nil
}

// ParseHeader reads the headers of a stored dispatch, refusing anything
// Header would not have written.
func ParseHeader(h nats.Header) (Meta, error) {
	get := func(name string) (string, error) {
		vs := h.Values(name)
		switch len(vs) {
		case 0:
			return "", fmt.Errorf("%s: %w", name, ErrMissingHeader)
		case 1:
			return vs[0], nil
		}
		return "", fmt.Errorf("%s: %d values: %w", name, len(vs), ErrBadHeader)
	}
	var m Meta
	v, err := get(HeaderShard)
	if err != nil {
		return m, err
	}
	if m.Shard, err = parseShard(v); err != nil {
		return m, fmt.Errorf("%s: %w", HeaderShard, err)
	}
	if v, err = get(HeaderSeq); err != nil {
		return m, err
	}
	if m.Seq, err = parseSeq(v); err != nil {
		return m, err
	}
	if m.Session, err = get(HeaderSession); err != nil {
		return m, err
	}
	if m.Node, err = get(HeaderNode); err != nil {
		return m, err
	}
	if v, err = get(HeaderReceived); err != nil {
		return m, err
	}
	if m.Received, err = time.Parse(time.RFC3339Nano, v); err != nil {
		return m, fmt.Errorf("%s %q: %w", HeaderReceived, v, ErrBadHeader)
	}
	if err := m.Validate(); err != nil {
		return m, err
	}
	id, err := get(HeaderMsgID)
	if err != nil {
		return m, err
	}
	if id != m.MsgID() {
		return m, fmt.Errorf("%s %q: %w", HeaderMsgID, id, ErrMsgIDMismatch)
	}
	return m, nil
}

// parseSeq reads a sequence number: decimal, no sign or leading zero.
func parseSeq(v string) (uint64, error) {
	if v == "" || len(v) > 20 || (len(v) > 1 && v[0] == '0') {
		return 0, fmt.Errorf("%s %q: %w", HeaderSeq, v, ErrBadHeader)
	}
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, fmt.Errorf("%s %q: %w", HeaderSeq, v, ErrBadHeader)
		}
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s %q: %w", HeaderSeq, v, ErrBadHeader)
	}
	return n, nil
}
