package controller

import (
	"slices"
	"testing"
)

// FuzzDecodeHeld checks that the stored held-set parser never panics, that
// what it accepts is sorted, unique and below the limit, and that encoding
// it again gives a text that decodes to the same set.
func FuzzDecodeHeld(f *testing.F) {
	for _, s := range []string{"", "0", "0-15,40,42-43", "5-3", "1,1", "131071", "0-131071", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ids, err := decodeHeld(s, 4096)
		if err != nil {
			return
		}
		for i, v := range ids {
			if v >= 4096 || (i > 0 && ids[i-1] >= v) {
				t.Fatalf("decodeHeld(%q) = %v: not sorted, unique and below the limit", s, ids)
			}
		}
		back, err := decodeHeld(encodeHeld(ids), 4096)
		if err != nil || !slices.Equal(back, ids) {
			t.Fatalf("round trip of %q: %v, %v", s, back, err)
		}
	})
}
