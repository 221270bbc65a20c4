package dhcp

import "testing"

// TestModeString: every mode prints the word --dhcp takes (the zero mode
// is "off", which serve's log used to print as Mode(0)).
func TestModeString(t *testing.T) {
	for m, want := range map[Mode]string{0: "off", Proxy: "proxy", Authoritative: "authoritative"} {
		if got := m.String(); got != want {
			t.Errorf("Mode(%d).String() = %q, want %q", int(m), got, want)
		}
		if m != 0 {
			if back, err := ParseMode(want); err != nil || back != m {
				t.Errorf("ParseMode(%q) = %v, %v", want, back, err)
			}
		}
	}
}
