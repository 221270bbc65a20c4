package events

import (
	"errors"
	"slices"
	"testing"
)

// TestPermissionsScheme: a node may publish only its shards' event
// subjects and subscribe only their command subjects; a node without
// shards may publish nothing (an empty allow list would allow all); a
// worker may send commands and use the app's stream, never publish an
// event; a bad app is refused.
func TestPermissionsScheme(t *testing.T) {
	p, err := NodePermissions("bot", []uint32{3, 40})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.PublishAllow, []string{"dpxe.bot.events.3.*", "dpxe.bot.events.40.*"}) ||
		!slices.Equal(p.SubscribeAllow, []string{"_INBOX.>", "dpxe.bot.commands.3", "dpxe.bot.commands.40"}) || !p.Responses {
		t.Errorf("node: %s", p)
	}
	none, _ := NodePermissions("bot", nil)
	if len(none.PublishAllow) == 0 || !slices.Contains(none.PublishDeny, ">") {
		t.Errorf("node without shards: %s", none)
	}
	w, err := WorkerPermissions("bot")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(w.PublishAllow, "dpxe.bot.commands.*") || !slices.Contains(w.PublishDeny, "dpxe.bot.events.>") || w.Responses {
		t.Errorf("worker: %s", w)
	}
	for _, s := range w.PublishAllow {
		if s == ">" || s == "$JS.API.>" || s == "dpxe.>" {
			t.Errorf("worker may publish %s", s)
		}
	}
	if _, err := NodePermissions("Bot", nil); !errors.Is(err, ErrBadApp) {
		t.Errorf("bad app: %v", err)
	}
	if _, err := WorkerPermissions("a.b"); !errors.Is(err, ErrBadApp) {
		t.Errorf("bad app: %v", err)
	}
}
