package appliance

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
)

// This file holds the wire types a node and the controller exchange over
// HTTP (seed 004, DESIGN §5): the check-in request and response, the
// per-shard status a check-in may carry, the shard state names, and the
// Identify claim request and response. The kernel builds and parses exactly
// these JSON documents.

// MaxCheckinBody is the largest check-in or Identify request body, in
// bytes. A node's largest check-in (128 live statuses, each with its
// resumable session, and 128 released sessions, kernel/node/checkin.inc
// CTL_BODY_MAX) is about 136 KiB (TestKernelCheckinBodyWorstCase).
const MaxCheckinBody = 192 << 10

// MaxLastErrorLen bounds ShardStatus.LastError, in bytes.
const MaxLastErrorLen = 200

// Close codes a shard may report: 0 (none), or a WebSocket close code in
// 1000..4999 (RFC 6455 §7.4 plus Discord's 4000-range codes).
const (
	minCloseCode = 1000
	maxCloseCode = 4999
)

// ShardState is a shard's lifecycle state on a node (seed 001, DESIGN §6).
type ShardState string

// The shard states, as the kernel names them on the wire.
const (
	ShardAssigned ShardState = "ASSIGNED" // in the plan, not started yet
	ShardStarting ShardState = "STARTING" // connecting, identifying or resuming
	ShardReady    ShardState = "READY"    // READY or RESUMED received
	ShardBackoff  ShardState = "BACKOFF"  // waiting out the fixed backoff
	ShardFatal    ShardState = "FATAL"    // non-retryable close code; never retried
)

// ShardStates lists every state in lifecycle order.
var ShardStates = []ShardState{ShardAssigned, ShardStarting, ShardReady, ShardBackoff, ShardFatal}

// Valid reports whether s is one of ShardStates.
func (s ShardState) Valid() bool {
	for _, v := range ShardStates {
		if s == v {
			return true
		}
	}
	return false
}

// ShardStatus is one shard's status as a node reports it in a check-in.
type ShardStatus struct {
	ID              uint32     `json:"id"`                   // global shard ID
	State           ShardState `json:"state"`                // one of ShardStates
	SeqValid        bool       `json:"seq_valid"`            // the saved sequence may be used to Resume
	HeartbeatAcks   uint32     `json:"heartbeat_acks"`       // heartbeat ACKs received
	HeartbeatMisses uint32     `json:"heartbeat_misses"`     // heartbeats sent while still awaiting an ACK
	Reconnects      uint32     `json:"reconnects"`           // transport resets so far
	LastError       string     `json:"last_error,omitempty"` // short printable ASCII text
	CloseCode       uint16     `json:"close_code,omitempty"` // last Gateway close code, 0 for none
	// SessionID, Seq and ResumeURL are the shard's resumable Gateway
	// session (resume hand-off, docs/handoff.md): the session_id and
	// resume_gateway_url of its READY and the last dispatch sequence. A
	// node reports them for a shard it stopped because it left its
	// assignment (closed with a non-1000 code, so the session stays
	// resumable), and for running shards (the kernel does, with Seq the
	// sequence it would hand over from: the acknowledged one while later
	// dispatches await their PubAck), which the controller hands over if
	// the node's lease lapses. SessionID and ResumeURL come together; Seq
	// counts only with SeqValid.
	SessionID string `json:"session_id,omitempty"` // ValidateSessionID
	Seq       uint32 `json:"seq,omitempty"`        // last sequence; the kernel keeps 32 bits
	ResumeURL string `json:"resume_url,omitempty"` // the Gateway URL grammar, at most MaxDialURLLen bytes (a dial URL)
	// PingMS is the time from the shard's last heartbeat to its ACK, in
	// milliseconds with microsecond resolution (what Discord libraries call
	// ping); PingAvgMS and PingMaxMS are the mean and the largest of the
	// last PingWindow. All three are absent before the first ACK, and at
	// most MaxPingMS (ping.go).
	PingMS    float64 `json:"ping_ms,omitempty"`
	PingAvgMS float64 `json:"ping_avg_ms,omitempty"`
	PingMaxMS float64 `json:"ping_max_ms,omitempty"`
	// AckSlow: the shard's last ACK took, or the one it awaits is taking,
	// longer than AckBoundMS. A shard is flagged so before the zombie rule
	// (an ACK still missing when the next heartbeat is due) ends its
	// connection.
	AckSlow bool `json:"ack_slow,omitempty"`
	// Events* are the shard's slot's event delivery (issue 19,
	// docs/events.md "The kernel's publisher"), present while the node
	// publishes to NATS: HPUBs written (resends after a reconnect
	// included), Discord's sequence of the last dispatch of the contiguous
	// run of acknowledged ones (JetStream's PubAck is the commit),
	// dispatches waiting for their PubAck, and dispatches not published
	// (over the broker's max_payload, no room in the node's pool). The
	// counters are the slot's: they go on when the slot takes another
	// shard. The kernel saturates each at 2^32 - 1.
	EventsPublished uint32 `json:"events_published,omitempty"`
	EventsAckedSeq  uint32 `json:"events_acked_seq,omitempty"`
	EventsInFlight  uint32 `json:"events_in_flight,omitempty"`
	EventsLost      uint32 `json:"events_lost,omitempty"`
	// EventsSkipped counts dispatches not published because their type is
	// in the check-in answer's nats.skip (they count as acknowledged).
	EventsSkipped uint32 `json:"events_skipped,omitempty"`
}

// CheckinRequest is the body of POST /v1/checkin (seed 004 plus DESIGN §5).
type CheckinRequest struct {
	NodeID   string `json:"node_id"`  // ValidateNodeID
	Capacity int    `json:"capacity"` // shards this node offers, 1..MaxShardsPerNode
	// Generation is the plan generation the node has applied: it runs no
	// shard outside that generation's assigned list. 0 before the first
	// response.
	Generation     uint64        `json:"generation"`
	ReadyShards    int           `json:"ready_shards"`
	StartingShards int           `json:"starting_shards"`
	BackoffShards  int           `json:"backoff_shards"`
	FatalShards    int           `json:"fatal_shards"`
	Shards         []ShardStatus `json:"shards,omitempty"` // optional per-shard status
	// NATS is the node's connection to the event broker, present while
	// the check-in answer gives it broker access (docs/events.md, "The
	// kernel's publisher").
	NATS *BrokerStatus `json:"nats,omitempty"`
}

// BrokerStatus is a node's connection to the event broker as the node
// reports it: what the kernel keeps in NN (kernel/node/natsnode.inc) and
// prints every 5 s. The counters run from the node's boot.
type BrokerStatus struct {
	State    string `json:"state"`    // BrokerUp or BrokerDown
	Connects uint64 `json:"connects"` // connections that got up
	Drops    uint64 `json:"drops"`    // connections given up: lost, silent, refused
	Refused  uint64 `json:"refused"`  // -ERR 'Permissions Violation' received
}

// BrokerStatus.State: up while connected and publishing, down otherwise
// (waiting to retry, connecting, the TLS handshake).
const (
	BrokerUp   = "up"
	BrokerDown = "down"
)

// CheckinResponse is the controller's answer to a check-in.
type CheckinResponse struct {
	Generation  uint64   `json:"generation"`   // plan generation this answer belongs to
	TotalShards uint32   `json:"total_shards"` // global shard count
	Assigned    []uint32 `json:"assigned"`     // the node's shards, ascending
	RangeStart  uint32   `json:"range_start"`  // first assigned shard (0 when none)
	RangeCount  uint32   `json:"range_count"`  // number of assigned shards
	// Pending lists assigned shards the node must not start yet: their
	// previous owner has not released them (safe hand-off).
	Pending        []uint32 `json:"pending"`
	LeaseSeconds   uint32   `json:"lease_seconds"`   // lease length; the node stops all shards this long after it sent the check-in
	MaxConcurrency uint32   `json:"max_concurrency"` // Discord's max_concurrency
	// TimeMS is the controller's UTC clock as Unix milliseconds when it
	// built the answer, always sent. A node keeps it with its TSC as the
	// trusted time for certificate validity (wss:// Gateway sessions), but
	// only from a check-in over pinned https:// (docs/security.md).
	TimeMS uint64 `json:"time_ms"`
	// NextCheckinMS is when the controller wants the next check-in, in
	// milliseconds: a third of the lease normally, sooner while shards are
	// pending or the plan is settling.
	NextCheckinMS uint32 `json:"next_checkin_ms"`
	// GatewayURL is the Discord Gateway URL to dial, ready to use:
	// "ws://host[:port]/path?v=10&encoding=json" (GatewayDialURL). Absent
	// while the controller has no Gateway settings.
	GatewayURL string `json:"gateway_url,omitempty"`
	// BotToken is the bot token for Identify and Resume (without "Bot ").
	// It is only ever sent to an authenticated node and never stored on
	// boot media.
	BotToken string `json:"bot_token,omitempty"`
	// Intents is the Gateway intents bitmask for Identify.
	Intents uint32 `json:"intents,omitempty"`
	// Resume lists shards of this node's assignment, startable now, whose
	// previous owner handed over a resumable session: the node starts them
	// with Resume on ResumeURL instead of Identify, and falls back to a
	// claimed Identify if the Resume fails.
	Resume []ResumeState `json:"resume,omitempty"`
	// RestartShards lists FATAL shards of this node's assignment that an
	// operator asked to start again: the node moves each listed shard that
	// it holds in state FATAL back to ASSIGNED (it then starts it with a
	// fresh Identify through a claim) and ignores the others. The
	// controller repeats the list in every answer until the node reports
	// the shard in another state, or the shard leaves the node's
	// assignment. Ascending, no duplicates, each in Assigned.
	RestartShards []uint32 `json:"restart_shards,omitempty"`
	// Term is the leader term of the controller replica that answered
	// (docs/ha.md); present only when several replicas may run. A node
	// ignores an answer whose term, or whose generation, is older than
	// one it has already applied.
	Term uint64 `json:"term,omitempty"`
	// Controllers lists the URLs every live controller replica
	// advertises, the answering one included; a node that gets no answer
	// from one replica within a fraction of its lease asks the next.
	// Present only when several replicas may run.
	Controllers []string `json:"controllers,omitempty"`
	// NATS is the node's access to the event broker: present when dpxe
	// serve runs its embedded NATS server with --nats-auth. Like
	// BotToken it is only ever sent to an authenticated node and never
	// logged.
	NATS *NATSAccess `json:"nats,omitempty"`
}

// NATSAccess tells a node where its event broker is and how to log in
// (docs/events.md, "Credentials").
type NATSAccess struct {
	// URLs are the broker's client URLs, nats://HOST:PORT, tried in order.
	URLs []string `json:"urls"`
	// User and Password go into CONNECT's user and pass: node-<node ID>
	// and the password derived from the node secret.
	User     string `json:"user"`
	Password string `json:"password"`
	// App is the subject prefix's <app>: dpxe.<app>.events.<shard>.<EVENT>.
	App string `json:"app"`
	// Skip names Discord event types (a dispatch's t) the node must not
	// publish, to save bandwidth: at most MaxNATSSkip names of 1 to
	// MaxNATSSkipLen bytes of A-Z 0-9 _. A skipped dispatch is counted
	// (ShardStatus.EventsSkipped) and counts as acknowledged for the
	// shard's acknowledged sequence (docs/events.md "Skipping event types").
	Skip []string `json:"skip,omitempty"`
}

// MaxNATSSkip and MaxNATSSkipLen bound NATSAccess.Skip (the kernel's
// NN_SKIP_MAX and NN_SKIP_LEN).
const (
	MaxNATSSkip    = 32
	MaxNATSSkipLen = 64
)

// ValidateEventName checks one name of NATSAccess.Skip: 1 to
// MaxNATSSkipLen bytes of A-Z, 0-9 and '_'.
func ValidateEventName(name string) error {
	if len(name) < 1 || len(name) > MaxNATSSkipLen {
		return fmt.Errorf("%d bytes, want 1..%d", len(name), MaxNATSSkipLen)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return fmt.Errorf("byte at position %d is not A-Z, 0-9 or '_'", i)
		}
	}
	return nil
}

// MaxNATSURLs bounds the broker URLs in a check-in answer.
const MaxNATSURLs = 8

// Validate checks what the kernel's NATS client relies on: 1 to
// MaxNATSURLs URLs nats://HOST:PORT or tls://HOST:PORT (TLS 1.3, the
// certificate checked against the image's anchors and HOST; HOST a name or
// an IPv4 address, a port 1..65535, nothing else; what ParseNATSURL, the
// kernel's parser, takes), and user, password and app of 1 to 128
// visible ASCII bytes other than '"' and '\' (they go into CONNECT's JSON
// and subjects unescaped). Errors are *FieldError naming the field.
func (a *NATSAccess) Validate() error {
	if len(a.URLs) < 1 || len(a.URLs) > MaxNATSURLs {
		return &FieldError{Field: "nats.urls", Reason: fmt.Sprintf("%d URLs, want 1..%d", len(a.URLs), MaxNATSURLs)}
	}
	for i, u := range a.URLs {
		if err := validNATSURL(u); err != nil {
			return &FieldError{Field: fmt.Sprintf("nats.urls[%d]", i), Reason: fmt.Sprintf("%q: %v", clip(u), err)}
		}
	}
	if len(a.Skip) > MaxNATSSkip {
		return &FieldError{Field: "nats.skip", Reason: fmt.Sprintf("%d names, want at most %d", len(a.Skip), MaxNATSSkip)}
	}
	for i, name := range a.Skip {
		if err := ValidateEventName(name); err != nil {
			return &FieldError{Field: fmt.Sprintf("nats.skip[%d]", i), Reason: fmt.Sprintf("%q: %v", clip(name), err)}
		}
	}
	for _, f := range []struct{ name, v string }{{"nats.user", a.User}, {"nats.password", a.Password}, {"nats.app", a.App}} {
		if len(f.v) < 1 || len(f.v) > 128 {
			return &FieldError{Field: f.name, Reason: fmt.Sprintf("%d bytes, want 1..128", len(f.v))}
		}
		for i := 0; i < len(f.v); i++ {
			if c := f.v[i]; c < 0x21 || c > 0x7e || c == '"' || c == '\\' {
				return &FieldError{Field: f.name, Reason: fmt.Sprintf("byte at position %d is not visible ASCII other than '\"' and '\\'", i)}
			}
		}
	}
	return nil
}

func validNATSURL(u string) error {
	rest, ok := strings.CutPrefix(u, "nats://")
	if !ok {
		rest, ok = strings.CutPrefix(u, "tls://")
	}
	if !ok {
		return errors.New("want nats://HOST:PORT or tls://HOST:PORT")
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil || host == "" || strings.ContainsAny(host, "/?#@[]") {
		return errors.New("want nats://HOST:PORT or tls://HOST:PORT")
	}
	for i := 0; i < len(host); i++ {
		if c := host[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-') {
			return fmt.Errorf("host byte at position %d", i)
		}
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 || port[0] == '0' {
		return errors.New("port: want 1..65535")
	}
	// What the kernel takes (ParseNATSURL): the host's length, the URL's;
	// a loopback literal is only skipped by nodes (serve lists its own last).
	if _, err := ParseNATSURL(u); err != nil && err != ErrNATSURLLoopback {
		return err
	}
	return nil
}

// ResumeState is a resumable Gateway session the controller hands to a
// shard's new owner (resume hand-off, docs/handoff.md).
type ResumeState struct {
	ShardID   uint32 `json:"shard_id"`
	SessionID string `json:"session_id"`
	Seq       uint32 `json:"seq"`
	ResumeURL string `json:"resume_url"` // ready to dial, as GatewayDialURL returns it
}

// IdentifyRequest is the body of POST /v1/identify: a node asks whether
// shard ShardID may send Identify now.
type IdentifyRequest struct {
	NodeID  string `json:"node_id"`
	ShardID uint32 `json:"shard_id"`
	// UnusedGrant says the node discarded its last grant for this shard
	// because the answer arrived later than its use_within_ms: no Identify
	// was sent, so the shard has not started (start-group order).
	UnusedGrant bool `json:"unused_grant,omitempty"`
}

// IdentifyReason says why an Identify claim was refused.
type IdentifyReason string

// Refusal reasons.
const (
	ReasonNotOwner   IdentifyReason = "not_owner"   // the node is not the shard's live, non-pending owner
	ReasonBucketBusy IdentifyReason = "bucket_busy" // the shard's bucket identified within the window
	ReasonBudget     IdentifyReason = "budget"      // the daily session-start budget is down to its reserve
	// ReasonOrder: a shard of an earlier start group (shard_id /
	// max_concurrency smaller) has never identified, and Discord requires
	// start groups to begin in order. Retry after retry_after_ms.
	ReasonOrder IdentifyReason = "order"
)

// IdentifyResponse answers an Identify claim: Granted, or a Reason and
// RetryAfterMS.
type IdentifyResponse struct {
	Granted      bool           `json:"granted"`
	ShardID      uint32         `json:"shard_id"`
	Bucket       uint32         `json:"bucket"`
	Reason       IdentifyReason `json:"reason,omitempty"`
	RetryAfterMS int64          `json:"retry_after_ms,omitempty"`
	// UseWithinMS bounds a grant's validity: the node uses it only if the
	// answer arrived within this many milliseconds of the moment it started
	// the claim (GrantUsable); 0 or absent means DefaultGrantUseWithinMS.
	UseWithinMS uint32 `json:"use_within_ms,omitempty"`
}

// FieldError names the JSON field of a request that is at fault.
type FieldError struct {
	Field  string // e.g. "capacity" or "shards[3].state"; "" for the document itself
	Reason string
}

func (e *FieldError) Error() string {
	if e.Field == "" {
		return "request: " + e.Reason
	}
	return e.Field + ": " + e.Reason
}

// ErrBodyTooLarge is returned for a request body over MaxCheckinBody bytes.
var ErrBodyTooLarge = fmt.Errorf("request body larger than %d bytes", MaxCheckinBody)

// IdentifyBucket is Discord's rate-limit key of a shard:
// shard_id % max(max_concurrency, 1).
func IdentifyBucket(shardID, maxConcurrency uint32) uint32 {
	return shardID % max(maxConcurrency, 1)
}

// decodeStrict decodes one JSON object from data into v, rejecting unknown
// fields, trailing data and oversized bodies, and turns decoder errors into
// a *FieldError.
func decodeStrict(data []byte, v any) error {
	if len(data) > MaxCheckinBody {
		return ErrBodyTooLarge
	}
	if t := bytes.TrimLeft(data, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return &FieldError{Reason: "body is not a JSON object"}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonFieldError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return &FieldError{Reason: "data after the JSON object"}
	}
	return nil
}

// DecodeStrict decodes one JSON object from data into v the way the
// check-in parsers do: bodies over MaxCheckinBody bytes (ErrBodyTooLarge),
// non-objects, unknown fields and trailing data are refused, and decoder
// errors become a *FieldError naming the field. The API uses it for its
// operator request bodies.
func DecodeStrict(data []byte, v any) error { return decodeStrict(data, v) }

// jsonFieldError maps an encoding/json error to a *FieldError.
func jsonFieldError(err error) error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		f := te.Field
		if f == "" {
			f = "(document)"
		}
		return &FieldError{Field: f, Reason: fmt.Sprintf("must be %s, got JSON %s", jsonKind(te.Type.Kind().String()), te.Value)}
	case errors.As(err, &se):
		return &FieldError{Reason: fmt.Sprintf("malformed JSON at byte %d: %v", se.Offset, se)}
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return &FieldError{Field: strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`), Reason: "unknown field"}
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
		return &FieldError{Reason: "truncated JSON"}
	default:
		return &FieldError{Reason: err.Error()}
	}
}

func jsonKind(k string) string {
	switch k {
	case "int", "int64", "uint16", "uint32", "uint64":
		return "an integer in range (" + k + ")"
	case "slice":
		return "an array"
	case "struct":
		return "an object"
	}
	return "a " + k
}

// ParseCheckinRequest decodes and validates a check-in body: JSON shape,
// unknown fields, node ID, capacity 1..128, health counts 0..128 with a
// sum no larger than 128, and each per-shard status (at most 256:
// 128 live and 128 released with a session). Errors are
// *FieldError naming the field, or ErrBodyTooLarge. Shard IDs are checked
// against MaxTotalShards only; the controller checks them against its total.
func ParseCheckinRequest(data []byte) (CheckinRequest, error) {
	var r CheckinRequest
	if err := decodeStrict(data, &r); err != nil {
		return CheckinRequest{}, err
	}
	if err := r.Validate(); err != nil {
		return CheckinRequest{}, err
	}
	return r, nil
}

// Validate checks a decoded check-in request; see ParseCheckinRequest.
func (r *CheckinRequest) Validate() error {
	if err := ValidateNodeID(r.NodeID); err != nil {
		return &FieldError{Field: "node_id", Reason: err.Error()}
	}
	if r.Capacity < 1 || r.Capacity > MaxShardsPerNode {
		return &FieldError{Field: "capacity", Reason: fmt.Sprintf("%d out of range 1..%d", r.Capacity, MaxShardsPerNode)}
	}
	counts := []struct {
		name string
		v    int
	}{{"ready_shards", r.ReadyShards}, {"starting_shards", r.StartingShards}, {"backoff_shards", r.BackoffShards}, {"fatal_shards", r.FatalShards}}
	sum := 0
	for _, c := range counts {
		if c.v < 0 || c.v > MaxShardsPerNode {
			return &FieldError{Field: c.name, Reason: fmt.Sprintf("%d out of range 0..%d", c.v, MaxShardsPerNode)}
		}
		sum += c.v
	}
	// The sum may exceed the capacity: a node that restarted with a smaller
	// capacity still runs what its last answer assigned until the next
	// answer, which the controller sizes to the new capacity (so the node
	// recovers instead of being refused until its lease lapses).
	if sum > MaxShardsPerNode {
		return &FieldError{Field: "ready_shards", Reason: fmt.Sprintf("health counts sum to %d, more than %d", sum, MaxShardsPerNode)}
	}
	// A node reports its live shards and, once, the shards it released
	// with a session: up to 128 of each in one check-in.
	if len(r.Shards) > 2*MaxShardsPerNode {
		return &FieldError{Field: "shards", Reason: fmt.Sprintf("%d entries, at most %d", len(r.Shards), 2*MaxShardsPerNode)}
	}
	if r.NATS != nil && r.NATS.State != BrokerUp && r.NATS.State != BrokerDown {
		return &FieldError{Field: "nats.state", Reason: fmt.Sprintf("%q is neither %q nor %q", clip(r.NATS.State), BrokerUp, BrokerDown)}
	}
	seen := make(map[uint32]int, len(r.Shards))
	for i := range r.Shards {
		if err := r.Shards[i].validate(); err != nil {
			err.Field = fmt.Sprintf("shards[%d].%s", i, err.Field)
			return err
		}
		if j, dup := seen[r.Shards[i].ID]; dup {
			return &FieldError{Field: fmt.Sprintf("shards[%d].id", i), Reason: fmt.Sprintf("shard %d already reported in shards[%d]", r.Shards[i].ID, j)}
		}
		seen[r.Shards[i].ID] = i
	}
	return nil
}

func (s *ShardStatus) validate() *FieldError {
	if s.ID >= MaxTotalShards {
		return &FieldError{Field: "id", Reason: fmt.Sprintf("%d out of range 0..%d", s.ID, MaxTotalShards-1)}
	}
	if !s.State.Valid() {
		return &FieldError{Field: "state", Reason: fmt.Sprintf("%q is not one of ASSIGNED, STARTING, READY, BACKOFF, FATAL", clip(string(s.State)))}
	}
	if len(s.LastError) > MaxLastErrorLen {
		return &FieldError{Field: "last_error", Reason: fmt.Sprintf("%d bytes, at most %d", len(s.LastError), MaxLastErrorLen)}
	}
	for i := 0; i < len(s.LastError); i++ {
		if b := s.LastError[i]; b < 0x20 || b > 0x7e {
			return &FieldError{Field: "last_error", Reason: fmt.Sprintf("byte 0x%02x at position %d is not printable ASCII", b, i)}
		}
	}
	for _, p := range []struct {
		name string
		v    float64
	}{{"ping_ms", s.PingMS}, {"ping_avg_ms", s.PingAvgMS}, {"ping_max_ms", s.PingMaxMS}} {
		if !(p.v >= 0 && p.v <= MaxPingMS) { // NaN fails too
			return &FieldError{Field: p.name, Reason: fmt.Sprintf("%v is not in 0..%v ms", p.v, MaxPingMS)}
		}
	}
	if s.CloseCode != 0 && (s.CloseCode < minCloseCode || s.CloseCode > maxCloseCode) {
		return &FieldError{Field: "close_code", Reason: fmt.Sprintf("%d is neither 0 nor in %d..%d", s.CloseCode, minCloseCode, maxCloseCode)}
	}
	if s.SessionID != "" || s.ResumeURL != "" {
		if err := ValidateSessionID(s.SessionID); err != nil {
			return &FieldError{Field: "session_id", Reason: err.Error()}
		}
		if s.ResumeURL == "" {
			return &FieldError{Field: "resume_url", Reason: "missing: session_id and resume_url come together"}
		}
		// A node reports the URL it would dial: what GatewayDialURL made
		// of resume_gateway_url, up to MaxDialURLLen bytes.
		if err := validateGatewayURL(s.ResumeURL, MaxDialURLLen); err != nil {
			return &FieldError{Field: "resume_url", Reason: err.Error()}
		}
	}
	return nil
}

// ParseCheckinResponse decodes a check-in answer the way a strict client
// does, unknown fields being errors, and checks it with Validate. Errors
// are *FieldError naming the field, or ErrBodyTooLarge.
func ParseCheckinResponse(data []byte) (CheckinResponse, error) {
	var r CheckinResponse
	if err := decodeStrict(data, &r); err != nil {
		return CheckinResponse{}, err
	}
	if err := r.Validate(); err != nil {
		return CheckinResponse{}, err
	}
	return r, nil
}

// Validate checks what nodes rely on in a check-in answer (docs/api.md):
// total_shards is 1..MaxTotalShards; assigned is exactly the shards
// range_start, ..., range_start+range_count-1, at most MaxShardsPerNode of
// them and all below total_shards (range_start is 0 when there are none);
// lease_seconds and max_concurrency are at least 1; pending is ascending,
// without duplicates, and within assigned; gateway_url, when present, is a
// dial URL (GatewayDialURL maps it to itself); each resume entry is for a
// distinct shard of assigned that is not pending, with a valid session ID,
// and a dial URL; restart_shards is ascending, without duplicates, and
// within assigned. Errors are *FieldError naming the field.
func (r *CheckinResponse) Validate() error {
	if r.TotalShards < 1 || r.TotalShards > MaxTotalShards {
		return &FieldError{Field: "total_shards", Reason: fmt.Sprintf("%d out of range 1..%d", r.TotalShards, MaxTotalShards)}
	}
	if r.RangeCount > MaxShardsPerNode {
		return &FieldError{Field: "range_count", Reason: fmt.Sprintf("%d out of range 0..%d", r.RangeCount, MaxShardsPerNode)}
	}
	if r.RangeCount == 0 && r.RangeStart != 0 {
		return &FieldError{Field: "range_start", Reason: fmt.Sprintf("%d with an empty range, want 0", r.RangeStart)}
	}
	if uint64(r.RangeStart)+uint64(r.RangeCount) > uint64(r.TotalShards) {
		return &FieldError{Field: "range_count", Reason: fmt.Sprintf("range %d+%d runs past total_shards %d", r.RangeStart, r.RangeCount, r.TotalShards)}
	}
	if len(r.Assigned) != int(r.RangeCount) {
		return &FieldError{Field: "assigned", Reason: fmt.Sprintf("%d shards, range_count says %d", len(r.Assigned), r.RangeCount)}
	}
	for i, s := range r.Assigned {
		if s != r.RangeStart+uint32(i) {
			return &FieldError{Field: fmt.Sprintf("assigned[%d]", i), Reason: fmt.Sprintf("%d, want %d: assigned is the range from range_start", s, r.RangeStart+uint32(i))}
		}
	}
	if r.LeaseSeconds < 1 {
		return &FieldError{Field: "lease_seconds", Reason: "0, want at least 1"}
	}
	if r.MaxConcurrency < 1 {
		return &FieldError{Field: "max_concurrency", Reason: "0, want at least 1"}
	}
	inRange := func(s uint32) bool { return s >= r.RangeStart && s-r.RangeStart < r.RangeCount }
	ascendingIn := func(field string, ids []uint32) error {
		for i, s := range ids {
			if i > 0 && s <= ids[i-1] {
				return &FieldError{Field: fmt.Sprintf("%s[%d]", field, i), Reason: fmt.Sprintf("%d after %d: want ascending shard IDs without duplicates", s, ids[i-1])}
			}
			if !inRange(s) {
				return &FieldError{Field: fmt.Sprintf("%s[%d]", field, i), Reason: fmt.Sprintf("shard %d is not in assigned", s)}
			}
		}
		return nil
	}
	if err := ascendingIn("pending", r.Pending); err != nil {
		return err
	}
	if r.GatewayURL != "" {
		if d, err := GatewayDialURL(r.GatewayURL); err != nil || d != r.GatewayURL {
			return &FieldError{Field: "gateway_url", Reason: fmt.Sprintf("%q is not a dial URL (ws://HOST[:PORT]/PATH?%s)", clip(r.GatewayURL), GatewayQuery)}
		}
	}
	seen := make(map[uint32]int, len(r.Resume))
	for i, rs := range r.Resume {
		field := fmt.Sprintf("resume[%d]", i)
		if !inRange(rs.ShardID) {
			return &FieldError{Field: field + ".shard_id", Reason: fmt.Sprintf("shard %d is not in assigned", rs.ShardID)}
		}
		if _, pending := slices.BinarySearch(r.Pending, rs.ShardID); pending {
			return &FieldError{Field: field + ".shard_id", Reason: fmt.Sprintf("shard %d is pending: it may not start yet", rs.ShardID)}
		}
		if j, dup := seen[rs.ShardID]; dup {
			return &FieldError{Field: field + ".shard_id", Reason: fmt.Sprintf("shard %d already in resume[%d]", rs.ShardID, j)}
		}
		seen[rs.ShardID] = i
		if err := ValidateSessionID(rs.SessionID); err != nil {
			return &FieldError{Field: field + ".session_id", Reason: err.Error()}
		}
		if d, err := GatewayDialURL(rs.ResumeURL); err != nil || d != rs.ResumeURL {
			return &FieldError{Field: field + ".resume_url", Reason: fmt.Sprintf("%q is not a dial URL (ws://HOST[:PORT]/PATH?%s)", clip(rs.ResumeURL), GatewayQuery)}
		}
	}
	if err := ascendingIn("restart_shards", r.RestartShards); err != nil {
		return err
	}
	if r.NATS != nil {
		return r.NATS.Validate()
	}
	return nil
}

// ParseIdentifyRequest decodes and validates an Identify claim body.
func ParseIdentifyRequest(data []byte) (IdentifyRequest, error) {
	var r IdentifyRequest
	if err := decodeStrict(data, &r); err != nil {
		return IdentifyRequest{}, err
	}
	if err := ValidateNodeID(r.NodeID); err != nil {
		return IdentifyRequest{}, &FieldError{Field: "node_id", Reason: err.Error()}
	}
	if r.ShardID >= MaxTotalShards {
		return IdentifyRequest{}, &FieldError{Field: "shard_id", Reason: fmt.Sprintf("%d out of range 0..%d", r.ShardID, MaxTotalShards-1)}
	}
	return r, nil
}

// Gateway session and URL limits (resume hand-off and Gateway settings).
const (
	// MaxSessionIDLen bounds a Gateway session ID, in bytes (Discord's are
	// 32 hex digits).
	MaxSessionIDLen = 64
	// MaxGatewayURLLen bounds a Gateway or resume URL as reported or
	// configured, in bytes; GatewayDialURL adds at most
	// len(GatewayQuery)+2 bytes to it.
	MaxGatewayURLLen = 200
	// GatewayQuery is the query every Gateway connection carries: API v10,
	// JSON encoding, no transport compression (docs/protocol.md).
	GatewayQuery = "v=10&encoding=json"
)

// ValidateSessionID checks a Gateway session ID as nodes report it: 1..64
// bytes of visible ASCII (0x21-0x7e) other than '"' and '\', so the
// kernel's JSON writer needs no escapes.
func ValidateSessionID(id string) error {
	if len(id) == 0 || len(id) > MaxSessionIDLen {
		return fmt.Errorf("%d bytes, want 1..%d", len(id), MaxSessionIDLen)
	}
	for i := 0; i < len(id); i++ {
		if b := id[i]; b < 0x21 || b > 0x7e || b == '"' || b == '\\' {
			return fmt.Errorf("byte 0x%02x at position %d is not visible ASCII other than '\"' and '\\\\'", b, i)
		}
	}
	return nil
}

// ValidateGatewayURL checks a Gateway URL against the grammar the kernel
// parses: "ws://" or "wss://" HOST [":" PORT] [PATH] ["?" QUERY], at most
// MaxGatewayURLLen bytes, where HOST is 1..253 of A-Za-z0-9.- (a DNS name
// or an IPv4 address), PORT is 1..65535 in decimal, PATH starts with '/',
// and PATH and QUERY are visible ASCII without '"', '\' or '#'. No user
// info, no fragment, no IPv6 literal. The scheme is lower case; wss://
// makes the node speak TLS 1.3 to the Gateway (kernel/gateway/tls.inc).
func ValidateGatewayURL(u string) error { return validateGatewayURL(u, MaxGatewayURLLen) }

// validateGatewayURL is ValidateGatewayURL with a length limit.
func validateGatewayURL(u string, limit int) error {
	if len(u) > limit {
		return fmt.Errorf("%d bytes, at most %d", len(u), limit)
	}
	scheme := "ws://"
	rest, ok := strings.CutPrefix(u, scheme)
	if !ok {
		scheme = "wss://"
		if rest, ok = strings.CutPrefix(u, scheme); !ok {
			return fmt.Errorf("%q does not start with ws:// or wss://", clip(u))
		}
	}
	end := strings.IndexAny(rest, "/?")
	if end < 0 {
		end = len(rest)
	}
	host, port, hasPort := strings.Cut(rest[:end], ":")
	if len(host) == 0 || len(host) > 253 {
		return fmt.Errorf("host of %d bytes, want 1..253", len(host))
	}
	for i := 0; i < len(host); i++ {
		b := host[i]
		if !(b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || b == '.' || b == '-') {
			return fmt.Errorf("host byte 0x%02x at position %d is not one of A-Za-z0-9.-", b, i)
		}
	}
	if hasPort {
		if len(port) == 0 || len(port) > 5 {
			return fmt.Errorf("port %q is not 1..65535", clip(port))
		}
		v := 0
		for i := 0; i < len(port); i++ {
			if port[i] < '0' || port[i] > '9' {
				return fmt.Errorf("port %q is not 1..65535", clip(port))
			}
			v = v*10 + int(port[i]-'0')
		}
		if v < 1 || v > 65535 {
			return fmt.Errorf("port %q is not 1..65535", clip(port))
		}
	}
	for i := end; i < len(rest); i++ {
		if b := rest[i]; b < 0x21 || b > 0x7e || b == '"' || b == '\\' || b == '#' {
			return fmt.Errorf("byte 0x%02x at position %d is not allowed in a path or query", b, len(scheme)+i)
		}
	}
	return nil
}

// MaxDialURLLen bounds a URL GatewayDialURL returns: a base of at most
// MaxGatewayURLLen bytes, '?' and GatewayQuery.
const MaxDialURLLen = MaxGatewayURLLen + 1 + len(GatewayQuery)

// GatewayDialURL turns a Gateway URL (GET /gateway/bot's url, READY's
// resume_gateway_url, or the operator's --gateway-url) into the URL a node
// dials: it checks u's grammar (ValidateGatewayURL, up to MaxDialURLLen
// bytes), drops any query, makes the path "/" when there is none, and
// appends "?" + GatewayQuery. The part before '?' must then be at most
// MaxGatewayURLLen bytes. It is idempotent. The kernel applies the same
// rule to a resume URL it keeps for its own Resumes.
func GatewayDialURL(u string) (string, error) {
	if err := validateGatewayURL(u, MaxDialURLLen); err != nil {
		return "", err
	}
	base, _, _ := strings.Cut(u, "?")
	if !strings.Contains(base[strings.Index(base, "://")+3:], "/") {
		base += "/"
	}
	if len(base) > MaxGatewayURLLen {
		return "", fmt.Errorf("%d bytes before the query, at most %d", len(base), MaxGatewayURLLen)
	}
	return base + "?" + GatewayQuery, nil
}
