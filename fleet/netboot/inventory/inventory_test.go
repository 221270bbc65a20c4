package inventory

import "testing"

func TestParseMAC(t *testing.T) {
	for _, c := range []struct {
		in string
		ok bool
	}{
		{"52:54:00:12:34:56", true},
		{"52-54-00-12-34-56", true},
		{"52:54:00:12:34", false},
		{"52:54:00:12:34:56:78:9a", false},
		{"../../etc/passwd", false},
		{"zz-54-00-12-34-56", false},
	} {
		hw, err := ParseMAC(c.in)
		if (err == nil) != c.ok {
			t.Errorf("ParseMAC(%q) = %v, %v", c.in, hw, err)
		}
		if c.ok && MACKey(hw) != "52-54-00-12-34-56" {
			t.Errorf("MACKey = %s", MACKey(hw))
		}
	}
}
