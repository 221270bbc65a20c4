package inventory

import (
	"errors"
	"strings"
	"testing"
)

// FuzzParseMAC: ParseMAC never panics; it accepts exactly 6-byte MACs,
// whose canonical key (MACKey) parses back to the same address and is the
// lower-case form of the input with '-' separators. Anything else is
// ErrBadMAC.
func FuzzParseMAC(f *testing.F) {
	for _, s := range []string{"52-54-00-12-34-56", "52:54:00:12:34:56", "AA-BB-CC-DD-EE-FF", "52-54:00-12:34-56",
		"5254.0012.3456", "52-54-00-12-34", "52-54-00-12-34-56-78", "zz-54-00-12-34-56", "", "-----------------"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		hw, err := ParseMAC(s)
		if err != nil {
			if !errors.Is(err, ErrBadMAC) {
				t.Fatalf("refusal %v is not ErrBadMAC", err)
			}
			return
		}
		if len(hw) != 6 {
			t.Fatalf("ParseMAC(%q) = %v: %d bytes", s, hw, len(hw))
		}
		key := MACKey(hw)
		if key != strings.ToLower(strings.ReplaceAll(s, ":", "-")) {
			t.Fatalf("ParseMAC(%q) has key %q", s, key)
		}
		again, err := ParseMAC(key)
		if err != nil || MACKey(again) != key {
			t.Fatalf("key %q does not parse back: %v %v", key, again, err)
		}
	})
}
