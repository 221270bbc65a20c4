package ndp

import (
	"testing"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv6"
)

func TestAdvertisementSaysNoRouter(t *testing.T) {
	b := Advertisement()
	m, err := icmp.ParseMessage(58, b)
	if err != nil {
		t.Fatal(err)
	}
	if m.Type != ipv6.ICMPTypeRouterAdvertisement || m.Code != 0 {
		t.Fatalf("type %v code %d", m.Type, m.Code)
	}
	if len(b) != 4+raBodyLen {
		t.Fatalf("length %d: options present?", len(b))
	}
	for i, v := range b[4:] {
		if v != 0 {
			t.Fatalf("byte %d of the body is %d: lifetime, flags and timers must all be 0", 4+i, v)
		}
	}
}

func FuzzIsSolicitation(f *testing.F) {
	f.Add([]byte{133, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{133, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0x52, 0x54, 0, 0, 0, 1})
	f.Add([]byte{134, 0, 0, 0})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		if IsSolicitation(b) && (len(b) < rsMinLen || b[0] != 133 || b[1] != 0) {
			t.Fatalf("accepted %x", b)
		}
	})
}
