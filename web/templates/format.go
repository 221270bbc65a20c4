// Package templates holds the dashboard's templ components. Each component
// renders one view model from web/view; the handlers in web choose which.
// Run `go tool templ generate -path web/templates` after editing a .templ file.
package templates

import (
	"context"
	"io"
	"strconv"

	"github.com/a-h/templ"

	"github.com/discord-pxe/dpxe/web/view"
)

func itoa(v int) string     { return strconv.Itoa(v) }
func itoa64(v int64) string { return strconv.FormatInt(v, 10) }
func utoa(v uint32) string  { return strconv.FormatUint(uint64(v), 10) }

// fatalWhy says why a FATAL shard stopped, as far as its node reported:
// " closed with 4004 authentication failed (fatal), last error: ...".
func fatalWhy(s view.ShardRow) string {
	out := ""
	if s.CloseCode != 0 {
		out = " closed with " + strconv.Itoa(int(s.CloseCode))
		if s.CloseText != "" {
			out += " " + s.CloseText
		}
	}
	if s.LastError != "" {
		if out != "" {
			out += ","
		}
		out += " last error: " + s.LastError
	}
	return out
}

// count is "1 shard", "2 shards": n and a noun in the number n needs.
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

// cellOpen and cellClose frame one shard-map cell; precomputed per state
// because a large map has thousands of cells.
var cellHTML = func() (out [view.NumStates]string) {
	for s := view.State(0); s < view.NumStates; s++ {
		out[s] = `<i class=` + s.Class() + `>` + s.Letter() + `</i>`
	}
	return out
}()

// Cells renders a run of shard-map cells. It writes the markup directly:
// a 131,072-shard map has up to a few thousand cells, and this is the hot
// loop of the fleet page. Cell content is fixed text, so nothing needs
// escaping.
func Cells(cells []view.State) templ.Component {
	return templ.ComponentFunc(func(_ context.Context, w io.Writer) error {
		sw, ok := w.(io.StringWriter)
		for _, c := range cells {
			s := cellHTML[c%view.NumStates]
			var err error
			if ok {
				_, err = sw.WriteString(s)
			} else {
				_, err = io.WriteString(w, s)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
}
