package appliance

import (
	"encoding/json"
	"errors"
	"testing"
)

// FuzzParseIdentifyRequest: any body either parses to a claim whose node
// ID is valid and whose shard is below MaxTotalShards, and which survives a
// JSON round trip unchanged, or is refused with a *FieldError (or
// ErrBodyTooLarge); it never panics.
func FuzzParseIdentifyRequest(f *testing.F) {
	for _, s := range []string{
		`{"node_id":"n1","shard_id":5}`,
		`{"node_id":"compaq-01","shard_id":0}`,
		`{"node_id":"n1","shard_id":5,"x":1}`,
		`{"node_id":"n1","shard_id":-1}`,
		`{"node_id":"n1","shard_id":4294967295}`,
		`{"node_id":"","shard_id":1}`,
		`{"node_id":"n1","shard_id":1} {}`,
		`{"node_id":"n1","shard_id":1.5}`,
		`[1,2]`, ``, `{`, `null`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := ParseIdentifyRequest(data)
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) && !errors.Is(err, ErrBodyTooLarge) {
				t.Fatalf("error %T %v is neither *FieldError nor ErrBodyTooLarge", err, err)
			}
			return
		}
		if ValidateNodeID(r.NodeID) != nil || r.ShardID >= MaxTotalShards {
			t.Fatalf("accepted out-of-bounds claim %+v", r)
		}
		again, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := ParseIdentifyRequest(again)
		if err != nil || r2 != r {
			t.Fatalf("round trip of %+v: %+v, %v", r, r2, err)
		}
	})
}
