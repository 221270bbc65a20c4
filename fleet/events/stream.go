package events

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Defaults of the event stream.
const (
	// DefaultMaxBytes bounds the stream's file store: 1 GiB.
	DefaultMaxBytes = 1 << 30
	// DefaultMaxAge keeps events for a day, long enough for a worker
	// fleet that was down overnight to catch up.
	DefaultMaxAge = 24 * time.Hour
	// DefaultDuplicateWindow is how long a Nats-Msg-Id is remembered.
	// It must outlast the longest Resume gap: the time from a dispatch's
	// first publish to its replay after a Resume. A session is resumed
	// either by its own node (seconds) or, after a crash or drain, by the
	// shard's next owner, which the controller allows only within the
	// lease (at most 10 min, --lease) plus the resume TTL (at most 10 min,
	// --resume-ttl); Discord itself drops a session "after a few minutes".
	// 15 minutes covers the defaults (30 s + 1 min) with a wide margin and
	// Discord's own timeout; `dpxe serve` refuses a window not longer than
	// its lease + resume TTL. The cost is memory: JetStream keeps every ID
	// of the window in a map (≈ 222 ev/s for a whole mid-size bot → about
	// 200,000 IDs).
	DefaultDuplicateWindow = 15 * time.Minute
	// DefaultMaxMsgSize admits the largest GUILD_CREATE or member chunk
	// seen in the wild (over 1 MiB) with room: 8 MiB, the payload limit
	// NATS calls the upper end of sane.
	DefaultMaxMsgSize  = 8 << 20
	minDuplicateWindow = time.Second
)

// ErrBadStreamConfig means a stream limit is out of range; wrapped with the
// field at fault.
var ErrBadStreamConfig = errors.New("stream limit out of range")

// StreamLimits are the operator's settings of the event stream.
type StreamLimits struct {
	MaxBytes        int64         // total bytes kept; oldest dropped first
	MaxAge          time.Duration // events older than this are dropped
	DuplicateWindow time.Duration // how long a Nats-Msg-Id is remembered
	MaxMsgSize      int32         // largest single dispatch stored
	Replicas        int           // 1 embedded; 3 on a JetStream cluster
}

// DefaultStreamLimits returns the defaults above with one replica.
func DefaultStreamLimits() StreamLimits {
	return StreamLimits{MaxBytes: DefaultMaxBytes, MaxAge: DefaultMaxAge,
		DuplicateWindow: DefaultDuplicateWindow, MaxMsgSize: DefaultMaxMsgSize, Replicas: 1}
}

// Validate checks the limits.
func (l StreamLimits) Validate() error {
	switch {
	case l.MaxBytes < 1<<20:
		return fmt.Errorf("max_bytes %d: at least 1 MiB: %w", l.MaxBytes, ErrBadStreamConfig)
	case l.MaxAge < time.Minute:
		return fmt.Errorf("max_age %v: at least 1m: %w", l.MaxAge, ErrBadStreamConfig)
	case l.DuplicateWindow < minDuplicateWindow || l.DuplicateWindow > l.MaxAge:
		return fmt.Errorf("duplicate_window %v: between %v and max_age %v: %w", l.DuplicateWindow, minDuplicateWindow, l.MaxAge, ErrBadStreamConfig)
	case l.MaxMsgSize < 1024 || int64(l.MaxMsgSize) > l.MaxBytes:
		return fmt.Errorf("max_msg_size %d: between 1 KiB and max_bytes: %w", l.MaxMsgSize, ErrBadStreamConfig)
	case l.Replicas != 1 && l.Replicas != 3 && l.Replicas != 5:
		return fmt.Errorf("replicas %d: 1, 3 or 5: %w", l.Replicas, ErrBadStreamConfig)
	}
	return nil
}

// StreamName is the name of app's event stream (stream names may not hold
// '.', '*', '>' or path separators; a valid app name has none).
func StreamName(app string) (string, error) {
	if err := ValidateApp(app); err != nil {
		return "", err
	}
	return "DPXE_EVENTS_" + app, nil
}

// StreamConfig is the one stream that stores app's events: file storage,
// limits retention (workers' consumers do not delete events, so several
// bot services can read the same events), oldest discarded first.
func StreamConfig(app string, l StreamLimits) (jetstream.StreamConfig, error) {
	if err := l.Validate(); err != nil {
		return jetstream.StreamConfig{}, err
	}
	name, err := StreamName(app)
	if err != nil {
		return jetstream.StreamConfig{}, err
	}
	subj, _ := StreamSubjects(app)
	return jetstream.StreamConfig{
		Name:        name,
		Description: "Discord dispatches of " + app + " (Discord-PXE)",
		Subjects:    []string{subj},
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		Storage:     jetstream.FileStorage,
		MaxBytes:    l.MaxBytes,
		MaxAge:      l.MaxAge,
		MaxMsgSize:  l.MaxMsgSize,
		Duplicates:  l.DuplicateWindow,
		Replicas:    l.Replicas,
	}, nil
}

// EnsureStream creates app's event stream or updates its limits.
func EnsureStream(ctx context.Context, js jetstream.JetStream, app string, l StreamLimits) (jetstream.Stream, error) {
	cfg, err := StreamConfig(app, l)
	if err != nil {
		return nil, err
	}
	s, err := js.CreateOrUpdateStream(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", cfg.Name, err)
	}
	return s, nil
}
