package appliance

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// This file holds the wire types a node and the controller exchange over
// HTTP (seed 004, DESIGN §5): the check-in request and response, the
// per-shard status a check-in may carry, the shard state names, and the
// Identify claim request and response. The kernel builds and parses exactly
// these JSON documents.

// MaxCheckinBody is the largest check-in or Identify request body, in bytes.
const MaxCheckinBody = 64 << 10

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
}

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
	// NextCheckinMS is when the controller wants the next check-in, in
	// milliseconds: a third of the lease normally, sooner while shards are
	// pending or the plan is settling.
	NextCheckinMS uint32 `json:"next_checkin_ms"`
}

// IdentifyRequest is the body of POST /v1/identify: a node asks whether
// shard ShardID may send Identify now.
type IdentifyRequest struct {
	NodeID  string `json:"node_id"`
	ShardID uint32 `json:"shard_id"`
}

// IdentifyReason says why an Identify claim was refused.
type IdentifyReason string

// Refusal reasons.
const (
	ReasonNotOwner   IdentifyReason = "not_owner"   // the node is not the shard's live, non-pending owner
	ReasonBucketBusy IdentifyReason = "bucket_busy" // the shard's bucket identified within the window
	ReasonBudget     IdentifyReason = "budget"      // the daily session-start budget is down to its reserve
)

// IdentifyResponse answers an Identify claim: Granted, or a Reason and
// RetryAfterMS.
type IdentifyResponse struct {
	Granted      bool           `json:"granted"`
	ShardID      uint32         `json:"shard_id"`
	Bucket       uint32         `json:"bucket"`
	Reason       IdentifyReason `json:"reason,omitempty"`
	RetryAfterMS int64          `json:"retry_after_ms,omitempty"`
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
var ErrBodyTooLarge = errors.New("request body larger than 65536 bytes")

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
// sum no larger than the capacity, and each per-shard status. Errors are
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
	if sum > r.Capacity {
		return &FieldError{Field: "ready_shards", Reason: fmt.Sprintf("health counts sum to %d, more than capacity %d", sum, r.Capacity)}
	}
	if len(r.Shards) > MaxShardsPerNode {
		return &FieldError{Field: "shards", Reason: fmt.Sprintf("%d entries, at most %d", len(r.Shards), MaxShardsPerNode)}
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
	if s.CloseCode != 0 && (s.CloseCode < minCloseCode || s.CloseCode > maxCloseCode) {
		return &FieldError{Field: "close_code", Reason: fmt.Sprintf("%d is neither 0 nor in %d..%d", s.CloseCode, minCloseCode, maxCloseCode)}
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
