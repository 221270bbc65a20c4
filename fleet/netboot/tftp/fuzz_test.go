package tftp

import (
	"testing"
)

func FuzzParseRequest(f *testing.F) {
	f.Add(rrq("kernel.bin", "octet", "blksize", "1468", "tsize", "0", "windowsize", "16"))
	f.Add(rrq("undionly.kpxe", "octet"))
	f.Add([]byte("\x00\x02x\x00netascii\x00"))
	f.Add([]byte("\x00\x01\x00\x00"))
	f.Fuzz(func(t *testing.T, p []byte) {
		r, err := ParseRequest(p)
		if err != nil {
			return
		}
		// A parsed request survives a round trip.
		r2, err := ParseRequest(r.Marshal())
		if err != nil || r2.Filename != r.Filename || r2.Mode != r.Mode || len(r2.Options) != len(r.Options) {
			t.Fatalf("round trip of %q: %+v vs %+v (%v)", p, r, r2, err)
		}
		for _, o := range (Limits{}).Negotiate(r) {
			if o.Name == OptBlksize && (len(o.Value) > 4 || o.Value > "1468" && len(o.Value) == 4) {
				t.Fatalf("blksize %s above the clamp", o.Value)
			}
		}
	})
}
