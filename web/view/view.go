// Package view holds the view models of the web dashboard: plain structs
// that the handlers in package web fill in and the templ components in
// web/templates/ render. They carry display-ready values (formatted durations,
// state letters) so templates need no logic beyond formatting.
package view

import (
	"fmt"
	"strconv"
	"time"
)

// Page is what every page's layout needs.
type Page struct {
	Title string
	Nav   string // key of the active navigation entry: fleet, nodes, guild, events, discovered
	CSRF  string // the session's CSRF token, put in every state-changing form
	// LoggedIn shows the navigation and the log-out button.
	LoggedIn bool
	// Live is the server-sent events URL of the page, "" for none.
	Live string
	// Now is the server's clock when the page was rendered, in Unix
	// milliseconds; countdown scripts correct the browser's clock with it.
	Now int64
	// Flash is a one-line confirmation of the last action; Error a
	// readable error shown at the top of the page.
	Flash, Error string
	// Refresh, when set, is a same-site path the page moves on to at once
	// (meta refresh; used after a one-time login link).
	Refresh string
	// Role is this controller replica's role and term ("leader, term 7"),
	// "" when one controller runs alone (docs/ha.md).
	Role string
}

// NavItem is one entry of the navigation bar.
type NavItem struct{ Key, Label, Href string }

// Nav is the navigation bar, in order.
var Nav = []NavItem{
	{"fleet", "Fleet", "/"},
	{"nodes", "Nodes", "/nodes"},
	{"guild", "Guild lookup", "/guild"},
	{"events", "Events", "/events"},
	{"discovered", "Discovered", "/discovered"},
}

// Ago formats the time since t for people: "12 s ago", "4 min ago",
// "never" for the zero time.
func Ago(now, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := now.Sub(t)
	if d < 0 {
		return "just now"
	}
	return Span(d) + " ago"
}

// Span formats a duration coarsely: "850 ms", "12 s", "4 min", "3 h 5 min", "2 d 4 h".
func Span(d time.Duration) string {
	if d < 0 {
		d = -d
	}
	switch {
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + " ms"
	case d < time.Minute:
		return strconv.FormatInt(int64(d/time.Second), 10) + " s"
	case d < time.Hour:
		return strconv.FormatInt(int64(d/time.Minute), 10) + " min"
	case d < 24*time.Hour:
		return fmt.Sprintf("%d h %d min", d/time.Hour, (d%time.Hour)/time.Minute)
	}
	return fmt.Sprintf("%d d %d h", d/(24*time.Hour), (d%(24*time.Hour))/time.Hour)
}

// Stamp formats an absolute time in UTC for tables, "" for the zero time.
func Stamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// ISO formats t for a datetime attribute, with milliseconds, in UTC; the
// countdown script parses it.
func ISO(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

// Countdown is a lease deadline shown as "in 23 s" and kept live by the
// page script from its deadline.
type Countdown struct {
	Deadline time.Time // zero: no lease
	Now      time.Time
	// Stable renders the absolute time instead of the distance from Now,
	// so live updates do not change every second; the page script turns
	// it into "in 23 s" as it arrives.
	Stable bool
}

// Text is the countdown as rendered by the server.
func (c Countdown) Text() string {
	switch {
	case c.Deadline.IsZero():
		return "no lease"
	case c.Stable:
		return "until " + Clock(c.Deadline)
	case !c.Deadline.After(c.Now):
		return "expired"
	}
	return "in " + Span(c.Deadline.Sub(c.Now))
}

// Moment is a past time shown as "3 s ago" and kept current by the page
// script.
type Moment struct {
	At     time.Time // zero: never
	Now    time.Time
	Stable bool // render the absolute time (see Countdown.Stable)
}

// Text is the moment as rendered by the server.
func (m Moment) Text() string {
	switch {
	case m.At.IsZero():
		return "never"
	case m.Stable:
		return "at " + Clock(m.At)
	}
	return Ago(m.Now, m.At)
}

// Clock formats the time of day in UTC, "16:57:21Z".
func Clock(t time.Time) string { return t.UTC().Format("15:04:05Z") }

// Urgent reports whether less than a third of a 30 s lease remains, the
// point where a healthy node should already have renewed.
func (c Countdown) Urgent() bool {
	return !c.Deadline.IsZero() && c.Deadline.Sub(c.Now) < 10*time.Second
}
