// Package security counts and logs what `dpxe serve` refuses before it
// trusts a request: wrong node credentials and admin tokens, failed
// dashboard logins, boot scripts asked for from the wrong address or host,
// refused enrollments, DHCP clients beyond the unapproved cap.
//
// Every refusal is counted by reason (Log.Counts, which the metrics endpoint
// reads); the log line is rate-limited per source and reason, so a flood of
// refused requests costs a counter increment and a map lookup each, not a
// line each. The first refusal of a (source, reason) pair is logged at once;
// later ones within Every are counted and reported as "suppressed" on the
// next line for that pair. docs/security.md has the threat model.
package security

import (
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Reason names why a request was refused. The set is closed: metrics and
// dashboards can list every reason.
type Reason string

// Reasons.
const (
	// AdminToken: an operator endpoint without the admin token.
	AdminToken Reason = "admin_token"
	// NodeCredential: a node request whose credential is not its node's
	// (or names a node that does not exist: both look the same outside).
	NodeCredential Reason = "node_credential"
	// Login: a dashboard login with neither the admin token nor the
	// dashboard password.
	Login Reason = "login"
	// LoginThrottled: a login from a client that failed too often lately.
	LoginThrottled Reason = "login_throttled"
	// LoginLink: a used, expired or unknown one-time login link.
	LoginLink Reason = "login_link"
	// CSRF: a dashboard form without its session's CSRF token.
	CSRF Reason = "csrf"
	// BootHost: a /boot/ request whose Host is not the boot address (DNS
	// rebinding, or a request meant for another server).
	BootHost Reason = "boot_host"
	// BootAddress: a boot script or a node's kernel asked for from an
	// address DHCP did not lease to that MAC.
	BootAddress Reason = "boot_address"
	// BootTicket: an approved machine's script without a fresh DHCP
	// exchange to go with it (too late after the ACK, or fetched already).
	BootTicket Reason = "boot_ticket"
	// BootEnrollOff: an approved machine asked for its script where
	// network enrollment is off (proxy DHCP without --proxy-enroll).
	BootEnrollOff Reason = "boot_enroll_off"
	// EnrollLive: an enrollment of a node that is live (its lease runs).
	EnrollLive Reason = "enroll_live"
	// EnrollAddress: an enrollment credential used from an address other
	// than the one its script went to.
	EnrollAddress Reason = "enroll_address"
	// DHCPUnapproved: a DHCP client not approved in the inventory while
	// unapproved clients already hold their share of the pool.
	DHCPUnapproved Reason = "dhcp_unapproved_cap"
	// DiscoveredCap: a new MAC not recorded because the inventory holds
	// its maximum of discovered machines.
	DiscoveredCap Reason = "discovered_cap"
	// LiveStreams: a dashboard session asked for more live-update streams
	// than it may hold.
	LiveStreams Reason = "live_streams"
)

// Reasons lists every Reason, sorted.
var Reasons = []Reason{AdminToken, BootAddress, BootEnrollOff, BootHost, BootTicket, CSRF,
	DHCPUnapproved, DiscoveredCap, EnrollAddress, EnrollLive, LiveStreams, Login, LoginLink,
	LoginThrottled, NodeCredential}

// DefaultEvery is the least time between two log lines for one source and
// reason.
const DefaultEvery = time.Minute

// maxSources bounds the (source, reason) pairs remembered for rate
// limiting. Beyond it, pairs idle for Every are forgotten; if none is, new
// sources share one pair per reason (source "other"), so a flood from many
// addresses is still one line per reason per Every.
const maxSources = 4096

// otherSource is the shared source once maxSources pairs are remembered.
const otherSource = "other"

type key struct {
	source string
	reason Reason
}

type mark struct {
	logged     time.Time // when the pair's last line was written
	suppressed int64     // refusals since then that wrote no line
}

// Log counts refusals and logs them, rate-limited. The zero value counts
// and logs nothing until Logger is set; a nil *Log ignores everything.
// It is safe for concurrent use.
type Log struct {
	// Logger receives the lines (at Warn); nil counts without logging.
	Logger *slog.Logger
	// Every is the least time between two lines for one source and reason
	// (DefaultEvery when zero).
	Every time.Duration
	// Now is the clock (time.Now when nil).
	Now func() time.Time

	mu     sync.Mutex
	marks  map[key]*mark
	counts map[Reason]uint64
}

// New returns a Log writing to logger.
func New(logger *slog.Logger) *Log { return &Log{Logger: logger} }

// Source returns the source of a request's remote address ("IP:port" or an
// IP) as the log keys it: the IP alone; an IPv6 address as its /64, since
// one host commonly holds a whole /64.
func Source(remote string) string {
	host := remote
	if h, _, err := net.SplitHostPort(remote); err == nil {
		host = h
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	a = a.Unmap()
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p.String()
	}
	return a.String()
}

// Refused counts one refusal for reason from source (see Source) and logs
// msg with attrs unless the same source and reason was logged within
// Every. Attrs must carry no secret.
func (l *Log) Refused(reason Reason, source, msg string, attrs ...any) {
	if l == nil {
		return
	}
	now := time.Now
	if l.Now != nil {
		now = l.Now
	}
	t := now()
	every := l.Every
	if every <= 0 {
		every = DefaultEvery
	}
	l.mu.Lock()
	if l.counts == nil {
		l.counts = map[Reason]uint64{}
		l.marks = map[key]*mark{}
	}
	l.counts[reason]++
	k := key{source, reason}
	m := l.marks[k]
	if m == nil {
		if len(l.marks) >= maxSources {
			l.pruneLocked(t, every)
		}
		if len(l.marks) >= maxSources {
			k.source = otherSource
			m = l.marks[k]
		}
		if m == nil {
			m = &mark{}
			l.marks[k] = m
		}
	}
	if !m.logged.IsZero() && t.Sub(m.logged) < every {
		m.suppressed++
		l.mu.Unlock()
		return
	}
	suppressed := m.suppressed
	m.logged, m.suppressed = t, 0
	l.mu.Unlock()
	if l.Logger == nil {
		return
	}
	args := make([]any, 0, len(attrs)+6)
	args = append(args, "reason", string(reason), "remote", k.source)
	args = append(args, attrs...)
	if suppressed > 0 {
		args = append(args, "suppressed", suppressed)
	}
	l.Logger.Warn(msg, args...)
}

// pruneLocked forgets pairs that wrote no line within every. Caller holds mu.
func (l *Log) pruneLocked(t time.Time, every time.Duration) {
	for k, m := range l.marks {
		if t.Sub(m.logged) >= every {
			delete(l.marks, k)
		}
	}
}

// Counts returns how many refusals each reason has had since the Log was
// made, for every reason in Reasons (zero included). The counts only grow.
func (l *Log) Counts() map[Reason]uint64 {
	out := make(map[Reason]uint64, len(Reasons))
	for _, r := range Reasons {
		out[r] = 0
	}
	if l == nil {
		return out
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for r, n := range l.counts {
		out[r] = n
	}
	return out
}

// Count returns the refusals counted for one reason.
func (l *Log) Count(r Reason) uint64 {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.counts[r]
}
