package events

import (
	"encoding/json"
	"testing"
)

// FuzzCommandScanner: the byte scanner behind CheckCommand never panics, a
// body it accepts is a JSON object whose only members are op (a small
// integer, the one it read) and d (an object) as encoding/json reads it,
// and the reply always encodes.
func FuzzCommandScanner(f *testing.F) {
	for _, s := range commandSeeds() {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		v := readyView()
		v.TotalShards = 0
		cmd, r := CheckCommand(body, v)
		if _, err := json.Marshal(r); err != nil {
			t.Fatal(err)
		}
		if r.Status != CodeOK {
			if cmd.Frame != nil {
				t.Fatalf("%q refused (%s) with a frame", body, r.Status)
			}
			return
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(body, &m); err != nil || len(m) != 2 {
			t.Fatalf("%q accepted: %v %d members", body, err, len(m))
		}
		var op int
		var d map[string]json.RawMessage
		if json.Unmarshal(m["op"], &op) != nil || op != cmd.Op || json.Unmarshal(m["d"], &d) != nil || d == nil {
			t.Fatalf("%q accepted as op %d", body, cmd.Op)
		}
	})
}

// TestCommandCorpus: the kernel's corpus covers every reply code, and its
// section encodes.
func TestCommandCorpus(t *testing.T) {
	cs := CommandCorpus(1)
	seen := map[string]int{}
	for _, c := range cs {
		var r CommandReply
		if err := json.Unmarshal([]byte(CommandLine(c)), &r); err != nil {
			t.Fatal(err)
		}
		seen[r.Status]++
	}
	for _, code := range []string{CodeOK, CodeNotOwner, CodeTooLarge, CodeBadJSON, CodeBadOp, CodeWrongShard, CodeNotReady, CodeRateLimited} {
		if seen[code] == 0 {
			t.Errorf("no case answered %s", code)
		}
	}
	t.Logf("%d cases: %v, section %d bytes", len(cs), seen, len(CommandSection(cs)))
}
