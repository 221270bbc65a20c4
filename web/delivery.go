package web

import (
	"fmt"
	"strconv"

	"github.com/discord-pxe/dpxe/fleet/events"
	"github.com/discord-pxe/dpxe/web/view"
)

// BuildDelivery is the event delivery panel for a stream's state.
func BuildDelivery(st events.StreamState) view.Delivery {
	v := view.Delivery{Connected: st.Connected, Read: st.Read,
		Messages: groupDigits(st.Messages), Bytes: binaryBytes(st.Bytes)}
	for _, c := range st.Consumers {
		v.Services = append(v.Services, view.EventService{Name: c.Name, Pending: groupDigits(c.Pending),
			Unacked: groupDigits(c.Unacked), Lag: groupDigits(c.Lag()), Behind: c.Lag() > 0})
	}
	return v
}

// groupDigits writes n with a comma every three digits: 12,345.
func groupDigits(n uint64) string {
	s := strconv.FormatUint(n, 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// binaryBytes writes n bytes in the largest binary unit that keeps the
// number at least 1: 512 B, 3.2 KiB, 7.0 MiB.
func binaryBytes(n uint64) string {
	if n < 1024 {
		return strconv.FormatUint(n, 10) + " B"
	}
	v, unit := float64(n), ""
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"} {
		v /= 1024
		unit = u
		if v < 1024 {
			break
		}
	}
	return fmt.Sprintf("%.1f %s", v, unit)
}
