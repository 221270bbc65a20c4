package controller

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// A node's held set, the shards it may be running, is kept as a sorted
// slice of shard IDs and persisted as ranges text: "0-15,40,42-43".

// ErrHeldSyntax is returned for malformed held-set text in the store.
var ErrHeldSyntax = errors.New("held set: malformed ranges")

// encodeHeld renders sorted shard IDs as ranges text.
func encodeHeld(ids []uint32) string {
	var b strings.Builder
	for i := 0; i < len(ids); {
		j := i
		for j+1 < len(ids) && ids[j+1] == ids[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatUint(uint64(ids[i]), 10))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.FormatUint(uint64(ids[j]), 10))
		}
		i = j + 1
	}
	return b.String()
}

// decodeHeld parses ranges text into sorted shard IDs below limit.
func decodeHeld(s string, limit uint32) ([]uint32, error) {
	if s == "" {
		return nil, nil
	}
	var out []uint32
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.ParseUint(lo, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%w: %q", ErrHeldSyntax, part)
		}
		b := a
		if isRange {
			if b, err = strconv.ParseUint(hi, 10, 32); err != nil || b < a {
				return nil, fmt.Errorf("%w: %q", ErrHeldSyntax, part)
			}
		}
		if b >= uint64(limit) {
			return nil, fmt.Errorf("%w: shard %d not below %d", ErrHeldSyntax, b, limit)
		}
		if len(out) > 0 && uint64(out[len(out)-1]) >= a {
			return nil, fmt.Errorf("%w: %q not ascending", ErrHeldSyntax, part)
		}
		for v := a; v <= b; v++ {
			out = append(out, uint32(v))
		}
	}
	return out, nil
}
