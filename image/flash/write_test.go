package flash

import (
	"bytes"
	"testing"
)

// recorder is an io.WriterAt that records each write.
type recorder struct {
	img    []byte
	writes [][2]int64 // offset, length
}

func (r *recorder) WriteAt(b []byte, off int64) (int, error) {
	copy(r.img[off:], b)
	r.writes = append(r.writes, [2]int64{off, int64(len(b))})
	return len(b), nil
}

func TestWriteNeeded(t *testing.T) {
	const B = ZeroBlock
	blk := func(v byte) []byte { return bytes.Repeat([]byte{v}, B) }
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	for _, tc := range []struct {
		name   string
		b, cur []byte
		writes [][2]int64
	}{
		{"all data", cat(blk(1), blk(2)), nil, [][2]int64{{100, 2 * B}}},
		{"zeros known", cat(blk(0), blk(0)), nil, nil},
		{"runs coalesce around a zero block", cat(blk(1), blk(0), blk(2), blk(3)), nil, [][2]int64{{100, B}, {100 + 2*B, 2 * B}}},
		{"zero block where the target is not zero", cat(blk(1), blk(0), blk(2)), cat(blk(0), blk(9), blk(0)), [][2]int64{{100, 3 * B}}},
		{"zero block where the target is zero", cat(blk(1), blk(0), blk(2)), cat(blk(7), blk(0), blk(7)), [][2]int64{{100, B}, {100 + 2*B, B}}},
		{"short tail", cat(blk(0), []byte{0, 0, 5}), nil, [][2]int64{{100 + B, 3}}},
		{"one stray byte", cat(blk(0), append(make([]byte, B-1), 1)), cat(blk(0), blk(0)), [][2]int64{{100 + B, B}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &recorder{img: make([]byte, 100+len(tc.b))}
			w, err := writeNeeded(r, tc.b, tc.cur, 100)
			if err != nil {
				t.Fatal(err)
			}
			var sum int64
			for _, x := range tc.writes {
				sum += x[1]
			}
			if w != sum || len(r.writes) != len(tc.writes) {
				t.Fatalf("writes %v (%d bytes), want %v", r.writes, w, tc.writes)
			}
			for i := range tc.writes {
				if r.writes[i] != tc.writes[i] {
					t.Errorf("write %d: %v, want %v", i, r.writes[i], tc.writes[i])
				}
			}
			// What was not written is zeros in b: the result equals b
			// wherever the target did not already hold it.
			for _, x := range r.writes {
				if !bytes.Equal(r.img[x[0]:x[0]+x[1]], tc.b[x[0]-100:x[0]-100+x[1]]) {
					t.Errorf("write at %d carries the wrong bytes", x[0])
				}
			}
		})
	}
}
