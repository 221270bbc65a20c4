package security

import (
	"bytes"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newTestLog(buf *bytes.Buffer) (*Log, *clock) {
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	l := &Log{Logger: slog.New(slog.NewTextHandler(buf, nil)), Now: c.now}
	return l, c
}

// TestRefusedRateLimited: a flood from one source is one line per reason
// per minute, every refusal is counted, and the next line says how many
// were suppressed.
func TestRefusedRateLimited(t *testing.T) {
	var buf bytes.Buffer
	l, c := newTestLog(&buf)
	for i := 0; i < 3500; i++ {
		l.Refused(NodeCredential, "10.0.0.66", "node request refused", "node", "n1")
	}
	l.Refused(AdminToken, "10.0.0.66", "admin request refused")
	l.Refused(NodeCredential, "10.0.0.67", "node request refused")
	if got := strings.Count(buf.String(), "\n"); got != 3 {
		t.Fatalf("%d lines for 3502 refusals from 2 sources and 2 reasons, want 3:\n%s", got, buf.String())
	}
	if n := l.Count(NodeCredential); n != 3501 {
		t.Fatalf("counted %d node_credential refusals, want 3501", n)
	}
	c.t = c.t.Add(DefaultEvery)
	buf.Reset()
	l.Refused(NodeCredential, "10.0.0.66", "node request refused")
	if !strings.Contains(buf.String(), "suppressed=3499") || !strings.Contains(buf.String(), "reason=node_credential") ||
		!strings.Contains(buf.String(), "remote=10.0.0.66") {
		t.Fatalf("line after the window: %s", buf.String())
	}
}

// TestRefusedManySources: beyond maxSources pairs, new sources share one
// pair, so addresses chosen by an attacker cannot grow the table or the log.
func TestRefusedManySources(t *testing.T) {
	var buf bytes.Buffer
	l, _ := newTestLog(&buf)
	for i := 0; i < 3*maxSources; i++ {
		l.Refused(Login, fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255), "login failed")
	}
	if len(l.marks) > maxSources+1 {
		t.Fatalf("%d pairs remembered, bound %d", len(l.marks), maxSources)
	}
	if lines := strings.Count(buf.String(), "\n"); lines > maxSources+1 {
		t.Fatalf("%d lines for %d sources", lines, 3*maxSources)
	}
	if l.Count(Login) != 3*maxSources {
		t.Fatalf("count %d", l.Count(Login))
	}
}

func TestSource(t *testing.T) {
	for in, want := range map[string]string{
		"10.0.0.5:4321":            "10.0.0.5",
		"[::ffff:10.0.0.5]:80":     "10.0.0.5",
		"[2001:db8:1:2:3::9]:8080": "2001:db8:1:2::/64",
		"10.0.0.9":                 "10.0.0.9",
		"garbage":                  "garbage",
	} {
		if got := Source(in); got != want {
			t.Errorf("Source(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCountsListEveryReason(t *testing.T) {
	if !slices.IsSorted(Reasons) {
		t.Fatal("Reasons must stay sorted")
	}
	var nilLog *Log
	nilLog.Refused(Login, "x", "ignored")
	if c := nilLog.Counts(); len(c) != len(Reasons) {
		t.Fatalf("nil log counts %v", c)
	}
	l := &Log{}
	l.Refused(BootHost, "10.0.0.1", "no logger: counted only")
	c := l.Counts()
	if len(c) != len(Reasons) || c[BootHost] != 1 || c[Login] != 0 {
		t.Fatalf("counts %v", c)
	}
}
