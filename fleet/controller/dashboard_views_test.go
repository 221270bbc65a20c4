package controller

import (
	"testing"

	"github.com/discord-pxe/dpxe/appliance"
)

// TestShardFactKeepsEveryState: a fact gives back every state a node can
// report, and "" for none or for a state appliance does not know.
func TestShardFactKeepsEveryState(t *testing.T) {
	for _, s := range append([]appliance.ShardState{""}, appliance.ShardStates...) {
		for _, held := range []bool{false, true} {
			if f := NewShardFact(held, s); f.Reported() != s || f.Held != held {
				t.Errorf("NewShardFact(%v, %q) gives back held %v, %q", held, s, f.Held, f.Reported())
			}
		}
	}
	if got := NewShardFact(true, "ZOMBIE").Reported(); got != "" {
		t.Errorf("an unknown state comes back as %q, want none", got)
	}
}
