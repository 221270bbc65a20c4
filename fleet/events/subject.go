// Package events owns event delivery through NATS JetStream: the subject
// scheme (dpxe.<app>.events.<shard>.<EVENT_NAME> for dispatches,
// dpxe.<app>.commands.<shard> for Gateway commands back to a shard), the
// one stream that stores a bot's events, the headers every dispatch
// carries, the Publisher that turns PubAcks into a Resume sequence that
// never skips an unstored event (the server `dpxe serve` embeds is in
// package embedded).
// docs/events.md has the design and the no-loss argument.
package events

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Subject tokens. NATS subjects are tokens separated by '.'; '*' matches
// one token and '>' the rest (docs.nats.io, "Subject-Based Messaging").
const (
	subjectRoot     = "dpxe"
	eventsToken     = "events"
	commandsToken   = "commands"
	maxAppLen       = 32 // keeps the stream name and subjects short
	maxEventNameLen = 64 // Discord's longest dispatch name is under 50 bytes
	// MaxShard is the largest shard ID a subject may carry (Discord shard
	// IDs are below the shard count, a 32-bit number in this project).
	MaxShard = 1<<32 - 1
)

// Errors of the subject scheme. Each is wrapped with the offending value.
var (
	// ErrBadApp means an app name is empty, too long, or has a byte other
	// than a-z, 0-9, '-' and '_' (or starts with '-' or '_').
	ErrBadApp = errors.New("app name must be 1-32 bytes of a-z, 0-9, '-', '_', starting with a letter or digit")
	// ErrBadEvent means an event name is empty, too long, or has a byte
	// other than A-Z, 0-9 and '_' (Discord's dispatch names).
	ErrBadEvent = errors.New("event name must be 1-64 bytes of A-Z, 0-9, '_'")
	// ErrBadShard means a shard token is not a decimal number in 0..MaxShard
	// without leading zeros.
	ErrBadShard = errors.New("shard must be a decimal number 0..4294967295 without leading zeros")
	// ErrWildcard means a concrete subject token is '*' or '>' or contains
	// one; publishers never publish to wildcards.
	ErrWildcard = errors.New("wildcard in a concrete subject")
	// ErrNotOurSubject means a subject does not start with dpxe.<app> and
	// events or commands, or has the wrong number of tokens.
	ErrNotOurSubject = errors.New("not a dpxe events or commands subject")
)

// SubjectKind says which half of the scheme a subject belongs to.
type SubjectKind uint8

const (
	// KindEvent is dpxe.<app>.events.<shard>.<EVENT_NAME>.
	KindEvent SubjectKind = iota + 1
	// KindCommand is dpxe.<app>.commands.<shard>.
	KindCommand
)

// Subject is a parsed subject of the scheme. Event is empty for commands.
type Subject struct {
	Kind  SubjectKind
	App   string
	Shard uint32
	Event string
}

// String formats s as a NATS subject; it does not validate (use
// EventSubject or CommandSubject to build one from untrusted parts).
func (s Subject) String() string {
	if s.Kind == KindCommand {
		return subjectRoot + "." + s.App + "." + commandsToken + "." + strconv.FormatUint(uint64(s.Shard), 10)
	}
	return subjectRoot + "." + s.App + "." + eventsToken + "." + strconv.FormatUint(uint64(s.Shard), 10) + "." + s.Event
}

// hasWildcard reports a '*' or '>' byte anywhere in tok.
func hasWildcard(tok string) bool { return strings.ContainsAny(tok, "*>") }

// ValidateApp checks an app name (the bot's name in subjects and the
// stream name).
func ValidateApp(app string) error {
	if hasWildcard(app) {
		return fmt.Errorf("app %q: %w", app, ErrWildcard)
	}
	if len(app) == 0 || len(app) > maxAppLen || app[0] == '-' || app[0] == '_' {
		return fmt.Errorf("app %q: %w", app, ErrBadApp)
	}
	for i := 0; i < len(app); i++ {
		c := app[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return fmt.Errorf("app %q: byte 0x%02x at %d: %w", app, c, i, ErrBadApp)
		}
	}
	return nil
}

// ValidateEvent checks a Discord dispatch name such as MESSAGE_CREATE.
func ValidateEvent(name string) error {
	if hasWildcard(name) {
		return fmt.Errorf("event %q: %w", name, ErrWildcard)
	}
	if len(name) == 0 || len(name) > maxEventNameLen {
		return fmt.Errorf("event %q: %w", name, ErrBadEvent)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return fmt.Errorf("event %q: byte 0x%02x at %d: %w", name, c, i, ErrBadEvent)
		}
	}
	return nil
}

// parseShard reads a shard token.
func parseShard(tok string) (uint32, error) {
	if hasWildcard(tok) {
		return 0, fmt.Errorf("shard %q: %w", tok, ErrWildcard)
	}
	if tok == "" || len(tok) > 10 || (len(tok) > 1 && tok[0] == '0') {
		return 0, fmt.Errorf("shard %q: %w", tok, ErrBadShard)
	}
	for i := 0; i < len(tok); i++ {
		if tok[i] < '0' || tok[i] > '9' {
			return 0, fmt.Errorf("shard %q: %w", tok, ErrBadShard)
		}
	}
	n, err := strconv.ParseUint(tok, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("shard %q: %w", tok, ErrBadShard)
	}
	return uint32(n), nil
}

// EventSubject is the subject a dispatch of event on shard is published to.
func EventSubject(app string, shard uint32, event string) (string, error) {
	if err := ValidateApp(app); err != nil {
		return "", err
	}
	if err := ValidateEvent(event); err != nil {
		return "", err
	}
	return Subject{Kind: KindEvent, App: app, Shard: shard, Event: event}.String(), nil
}

// CommandSubject is the subject workers send a shard's Gateway commands to.
func CommandSubject(app string, shard uint32) (string, error) {
	if err := ValidateApp(app); err != nil {
		return "", err
	}
	return Subject{Kind: KindCommand, App: app, Shard: shard}.String(), nil
}

// StreamSubjects is the subject filter of app's event stream.
func StreamSubjects(app string) (string, error) {
	if err := ValidateApp(app); err != nil {
		return "", err
	}
	return subjectRoot + "." + app + "." + eventsToken + ".>", nil
}

// EventFilter is a consumer filter over app's events: one shard or all
// (shard nil), one event name or all (event ""). It is the only place a
// wildcard enters a subject, and only in the place of a whole token.
func EventFilter(app string, shard *uint32, event string) (string, error) {
	if err := ValidateApp(app); err != nil {
		return "", err
	}
	shardTok := "*"
	if shard != nil {
		shardTok = strconv.FormatUint(uint64(*shard), 10)
	}
	eventTok := "*"
	if event != "" {
		if err := ValidateEvent(event); err != nil {
			return "", err
		}
		eventTok = event
	}
	return subjectRoot + "." + app + "." + eventsToken + "." + shardTok + "." + eventTok, nil
}

// ParseSubject reads a concrete subject of the scheme. It refuses
// wildcards, empty tokens and any byte the builders would refuse, so
// ParseSubject(s.String()) round-trips exactly the subjects the builders
// produce.
func ParseSubject(subject string) (Subject, error) {
	toks := strings.Split(subject, ".")
	if len(toks) < 4 || toks[0] != subjectRoot {
		return Subject{}, fmt.Errorf("subject %q: %w", subject, ErrNotOurSubject)
	}
	var s Subject
	switch {
	case toks[2] == eventsToken && len(toks) == 5:
		s.Kind = KindEvent
	case toks[2] == commandsToken && len(toks) == 4:
		s.Kind = KindCommand
	default:
		return Subject{}, fmt.Errorf("subject %q: %w", subject, ErrNotOurSubject)
	}
	if err := ValidateApp(toks[1]); err != nil {
		return Subject{}, fmt.Errorf("subject %q: %w", subject, err)
	}
	s.App = toks[1]
	shard, err := parseShard(toks[3])
	if err != nil {
		return Subject{}, fmt.Errorf("subject %q: %w", subject, err)
	}
	s.Shard = shard
	if s.Kind == KindEvent {
		if err := ValidateEvent(toks[4]); err != nil {
			return Subject{}, fmt.Errorf("subject %q: %w", subject, err)
		}
		s.Event = toks[4]
	}
	return s, nil
}
