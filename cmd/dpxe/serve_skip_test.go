package main

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/discord-pxe/dpxe/appliance"
)

// TestServeEventsSkip: --events-skip and the config key events_skip set
// (the same comma-separated string) the names the nodes' broker access carries (NATSAccess.Skip); a bad name
// or too many stop dpxe serve with a usage error naming the flag and the
// name; withSkip adds the list to every access and leaves a nil one nil.
func TestServeEventsSkip(t *testing.T) {
	cfg, err := parseServeFlags([]string{"--events-skip", "TYPING_START,PRESENCE_UPDATE"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"TYPING_START", "PRESENCE_UPDATE"}; !reflect.DeepEqual(cfg.EventsSkip, want) {
		t.Errorf("--events-skip: %q, want %q", cfg.EventsSkip, want)
	}
	file := filepath.Join(t.TempDir(), "serve.json")
	if err := os.WriteFile(file, []byte(`{"events_skip": "GUILD_CREATE"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if cfg, err = parseServeFlags([]string{"--config", file}); err != nil || !reflect.DeepEqual(cfg.EventsSkip, []string{"GUILD_CREATE"}) {
		t.Errorf("events_skip in --config: %q, %v", cfg.EventsSkip, err)
	}
	if cfg, err = parseServeFlags([]string{"--config", file, "--events-skip", "READY"}); err != nil || !reflect.DeepEqual(cfg.EventsSkip, []string{"READY"}) {
		t.Errorf("the flag over the config key: %q, %v", cfg.EventsSkip, err)
	}
	many := strings.Repeat("A,", appliance.MaxNATSSkip) + "B"
	for _, c := range []struct{ v, want string }{
		{"typing_start", `name 1 "typing_start"`},
		{"TYPING_START,,READY", `name 2 ""`},
		{"TYPING_START,A B", `name 2 "A B"`},
		{strings.Repeat("X", appliance.MaxNATSSkipLen+1), "65 bytes"},
		{many, "33 names"},
	} {
		_, err := parseServeFlags([]string{"--events-skip", c.v})
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "events-skip") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--events-skip %.40q: %v, want a usage error naming %q", c.v, err, c.want)
		}
	}
	fn := withSkip(func(id string) *appliance.NATSAccess {
		if id == "none" {
			return nil
		}
		return &appliance.NATSAccess{URLs: []string{"nats://10.0.0.1:4222"}, User: "node-" + id, Password: "p", App: "bot"}
	}, []string{"TYPING_START"})
	if a := fn("n1"); a == nil || !reflect.DeepEqual(a.Skip, []string{"TYPING_START"}) || a.Validate() != nil {
		t.Errorf("withSkip: %+v", a)
	}
	if a := fn("none"); a != nil {
		t.Errorf("withSkip made an access from none: %+v", a)
	}
}
