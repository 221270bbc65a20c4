package smoke

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"sync"
	"time"
)

// console collects a guest's serial output and when each line arrived, so
// a path can report the time to the line it waited for. It is an
// io.Writer for qemu.Options.Serial and safe for concurrent use.
type console struct {
	start time.Time

	mu      sync.Mutex
	text    bytes.Buffer
	lines   []stampedLine
	partial []byte
	changed chan struct{} // gets a token after every write
}

type stampedLine struct {
	at   time.Duration // since start
	text string        // without the line break
}

func newConsole(start time.Time) *console {
	return &console{start: start, changed: make(chan struct{}, 1)}
}

func (c *console) Write(p []byte) (int, error) {
	now := time.Since(c.start)
	c.mu.Lock()
	c.text.Write(p)
	c.partial = append(c.partial, p...)
	for {
		i := bytes.IndexByte(c.partial, '\n')
		if i < 0 {
			break
		}
		c.lines = append(c.lines, stampedLine{now, strings.TrimRight(string(c.partial[:i]), "\r")})
		c.partial = c.partial[i+1:]
	}
	c.mu.Unlock()
	select {
	case c.changed <- struct{}{}:
	default:
	}
	return len(p), nil
}

// String returns everything written so far.
func (c *console) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.text.String()
}

// At returns when the first complete line containing s arrived.
func (c *console) At(s string) (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range c.lines {
		if strings.Contains(l.text, s) {
			return l.at, true
		}
	}
	return 0, false
}

// Line returns the first complete line containing s.
func (c *console) Line(s string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range c.lines {
		if strings.Contains(l.text, s) {
			return l.text, true
		}
	}
	return "", false
}

// Wait blocks until a complete line contains s or ctx ends.
func (c *console) Wait(ctx context.Context, s string) (string, error) {
	for {
		if l, ok := c.Line(s); ok {
			return l, nil
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-c.changed:
		}
	}
}

// Tail returns the last n non-blank lines of serial output, cleaned for a
// terminal or a report (see cleanLine).
func Tail(serial string, n int) []string {
	var out []string
	lines := strings.Split(serial, "\n")
	for i := len(lines) - 1; i >= 0 && len(out) < n; i-- {
		if l := cleanLine(lines[i]); l != "" {
			out = append(out, l)
		}
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// ansiEscape matches the terminal control sequences firmware and iPXE
// write to the serial console (cursor moves, colours, screen clears).
var ansiEscape = regexp.MustCompile(`\x1b(\[[0-9;=?]*[A-Za-z]|[()][0-9A-Za-z]|.)`)

// cleanLine removes terminal escapes and other control characters from a
// console line and trims it.
func cleanLine(s string) string {
	s = ansiEscape.ReplaceAllString(s, "")
	s = strings.Map(func(r rune) rune {
		if r == '\t' || (r >= 0x20 && r != 0x7f) {
			return r
		}
		return -1
	}, s)
	return strings.TrimSpace(s)
}
