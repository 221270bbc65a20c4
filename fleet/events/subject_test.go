package events

import (
	"errors"
	"strings"
	"testing"
)

func TestEventSubject(t *testing.T) {
	cases := []struct {
		app, event string
		shard      uint32
		want       string
		err        error
	}{
		{"pingbot", "MESSAGE_CREATE", 3, "dpxe.pingbot.events.3.MESSAGE_CREATE", nil},
		{"a", "READY", 0, "dpxe.a.events.0.READY", nil},
		{"my-bot_2", "GUILD_CREATE", MaxShard, "dpxe.my-bot_2.events.4294967295.GUILD_CREATE", nil},
		{"", "READY", 0, "", ErrBadApp},
		{"Bot", "READY", 0, "", ErrBadApp},
		{"-bot", "READY", 0, "", ErrBadApp},
		{"b.ot", "READY", 0, "", ErrBadApp},
		{"b ot", "READY", 0, "", ErrBadApp},
		{strings.Repeat("a", 33), "READY", 0, "", ErrBadApp},
		{"bo*", "READY", 0, "", ErrWildcard},
		{">", "READY", 0, "", ErrWildcard},
		{"bot", "", 0, "", ErrBadEvent},
		{"bot", "message_create", 0, "", ErrBadEvent},
		{"bot", "A.B", 0, "", ErrBadEvent},
		{"bot", "READY\r\n", 0, "", ErrBadEvent},
		{"bot", "*", 0, "", ErrWildcard},
		{"bot", "A>", 0, "", ErrWildcard},
		{"bot", strings.Repeat("A", 65), 0, "", ErrBadEvent},
	}
	for _, c := range cases {
		got, err := EventSubject(c.app, c.shard, c.event)
		if !errors.Is(err, c.err) || got != c.want {
			t.Errorf("EventSubject(%q, %d, %q) = %q, %v; want %q, %v", c.app, c.shard, c.event, got, err, c.want, c.err)
		}
	}
	if got, err := CommandSubject("pingbot", 7); err != nil || got != "dpxe.pingbot.commands.7" {
		t.Errorf("CommandSubject = %q, %v", got, err)
	}
	if _, err := CommandSubject("x*", 7); !errors.Is(err, ErrWildcard) {
		t.Errorf("CommandSubject(x*) err = %v, want ErrWildcard", err)
	}
}

func TestParseSubject(t *testing.T) {
	good := []struct {
		in   string
		want Subject
	}{
		{"dpxe.bot.events.12.MESSAGE_CREATE", Subject{KindEvent, "bot", 12, "MESSAGE_CREATE"}},
		{"dpxe.bot.commands.0", Subject{Kind: KindCommand, App: "bot", Shard: 0}},
		{"dpxe.b-1.events.4294967295.READY", Subject{KindEvent, "b-1", MaxShard, "READY"}},
	}
	for _, c := range good {
		got, err := ParseSubject(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseSubject(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
		if got.String() != c.in {
			t.Errorf("String() = %q, want %q", got.String(), c.in)
		}
	}
	bad := []struct {
		in  string
		err error
	}{
		{"", ErrNotOurSubject},
		{"dpxe.bot.events.1", ErrNotOurSubject},
		{"dpxe.bot.events.1.READY.X", ErrNotOurSubject},
		{"dpxe.bot.commands.1.X", ErrNotOurSubject},
		{"nats.bot.events.1.READY", ErrNotOurSubject},
		{"dpxe.bot.evts.1.READY", ErrNotOurSubject},
		{"dpxe.bot.events.*.READY", ErrWildcard},
		{"dpxe.bot.events.1.*", ErrWildcard},
		{"dpxe.*.events.1.READY", ErrWildcard},
		{"dpxe.bot.events.>", ErrNotOurSubject},
		{"dpxe.bot.events.01.READY", ErrBadShard},
		{"dpxe.bot.events.-1.READY", ErrBadShard},
		{"dpxe.bot.events.4294967296.READY", ErrBadShard},
		{"dpxe.bot.events.1x.READY", ErrBadShard},
		{"dpxe.bot.events..READY", ErrBadShard},
		{"dpxe.bot.events.1.ready", ErrBadEvent},
		{"dpxe.bot.events.1.RE\x00DY", ErrBadEvent},
		{"dpxe.BOT.events.1.READY", ErrBadApp},
		{"dpxe..events.1.READY", ErrBadApp},
	}
	for _, c := range bad {
		if got, err := ParseSubject(c.in); !errors.Is(err, c.err) {
			t.Errorf("ParseSubject(%q) = %+v, %v; want %v", c.in, got, err, c.err)
		}
	}
}

func TestEventFilter(t *testing.T) {
	three := uint32(3)
	cases := []struct {
		shard *uint32
		event string
		want  string
	}{
		{nil, "", "dpxe.bot.events.*.*"},
		{&three, "", "dpxe.bot.events.3.*"},
		{nil, "MESSAGE_CREATE", "dpxe.bot.events.*.MESSAGE_CREATE"},
		{&three, "READY", "dpxe.bot.events.3.READY"},
	}
	for _, c := range cases {
		if got, err := EventFilter("bot", c.shard, c.event); err != nil || got != c.want {
			t.Errorf("EventFilter(%v, %q) = %q, %v; want %q", c.shard, c.event, got, err, c.want)
		}
	}
	if _, err := EventFilter("bot", nil, "*"); !errors.Is(err, ErrWildcard) {
		t.Errorf("EventFilter(*) err = %v, want ErrWildcard", err)
	}
}

// FuzzParseSubject checks that the parser never panics, that everything
// it accepts is a concrete subject without odd bytes, and that it
// round-trips through String.
func FuzzParseSubject(f *testing.F) {
	for _, s := range []string{"dpxe.bot.events.12.MESSAGE_CREATE", "dpxe.bot.commands.0", "dpxe.bot.events.*.READY",
		"dpxe.bot.events.01.READY", "dpxe..events.1.A", "dpxe.bot.events.4294967296.A", "dpxe.a.events.1.A\r\nPUB x 1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		s, err := ParseSubject(in)
		if err != nil {
			return
		}
		if s.String() != in {
			t.Fatalf("ParseSubject(%q).String() = %q", in, s.String())
		}
		for i := 0; i < len(in); i++ {
			if c := in[i]; c == '*' || c == '>' || c <= ' ' || c >= 0x7f {
				t.Fatalf("accepted %q with byte 0x%02x", in, c)
			}
		}
		switch s.Kind {
		case KindEvent:
			if got, err := EventSubject(s.App, s.Shard, s.Event); err != nil || got != in {
				t.Fatalf("EventSubject disagrees on %q: %q, %v", in, got, err)
			}
		case KindCommand:
			if got, err := CommandSubject(s.App, s.Shard); err != nil || got != in {
				t.Fatalf("CommandSubject disagrees on %q: %q, %v", in, got, err)
			}
		default:
			t.Fatalf("kind %d", s.Kind)
		}
	})
}
