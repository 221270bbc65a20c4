package templates

import (
	"context"
	"html"
	"io"
	"strings"

	"github.com/a-h/templ"

	"github.com/discord-pxe/dpxe/web/view"
)

// LatencyCells renders a run of latency-map cells, each with its range and
// ping as a title. Like Cells it writes the markup directly (a large map
// has thousands of cells); titles are escaped.
func LatencyCells(cells []view.LatencyCell) templ.Component {
	return templ.ComponentFunc(func(_ context.Context, w io.Writer) error {
		var b strings.Builder
		for _, c := range cells {
			b.WriteString(`<i class=`)
			b.WriteString(c.Band.Class())
			b.WriteString(` title="`)
			b.WriteString(html.EscapeString(c.Title))
			b.WriteString(`"></i>`)
		}
		_, err := io.WriteString(w, b.String())
		return err
	})
}
