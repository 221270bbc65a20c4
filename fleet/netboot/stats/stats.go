// Package stats counts what the netboot services do: requests, answers,
// refusals by reason, failed answers and bytes served, per service (DHCP,
// TFTP, HTTP boot). The services count into one Counters as they work;
// fleet/metrics exports it on /metrics (docs/metrics.md#netboot). Every
// label value comes from a fixed set, so the series count is constant.
package stats

import "sync/atomic"

// Service is a netboot service.
type Service int

// The services, in label order.
const (
	DHCP Service = iota
	TFTP
	HTTP
	numServices
)

// Services lists every service.
var Services = []Service{DHCP, TFTP, HTTP}

// String is the service's label value.
func (s Service) String() string {
	switch s {
	case DHCP:
		return "dhcp"
	case TFTP:
		return "tftp"
	case HTTP:
		return "http"
	}
	return "unknown"
}

// Refusal reasons (the reason label). Each service has its own fixed set
// (Reasons); a reason a service does not list counts as Other.
const (
	// DHCP: not a well-formed BOOTREQUEST with a message type.
	Invalid = "invalid"
	// DHCP: more requests in flight than dhcp.MaxInFlight.
	Overload = "overload"
	// DHCP: no address to offer (pool exhausted, or unapproved MACs hold
	// their share of it).
	NoAddress = "no_address"
	// DHCP: a valid request this server stays silent on by design: not a
	// boot client in proxy mode, another server's offer taken, a relay
	// from a subnet without a pool, DECLINE and RELEASE.
	Unanswered = "unanswered"

	// TFTP: a request that does not parse, or asks a mode other than octet.
	Malformed = "malformed"
	// TFTP: a write request (the server is read-only).
	Write = "write"
	// TFTP and HTTP: a path outside the boot roots, or a file not served.
	Forbidden = "forbidden"
	// TFTP and HTTP: no such file.
	NotFound = "not_found"
	// TFTP: more transfers at once than the server allows.
	Busy = "busy"

	// HTTP: a malformed request (400), such as a bad MAC in the path.
	BadRequest = "bad_request"
	// HTTP: a request for another host name (421).
	Misdirected = "misdirected"
	// HTTP: the inventory or enrollment is unavailable (503).
	Unavailable = "unavailable"
	// HTTP: a server error (500 and other 5xx).
	ServerError = "server_error"

	// Any service: a reason it does not list.
	Other = "other"
)

// Reasons are each service's refusal reasons, in label order.
var Reasons = [numServices][]string{
	DHCP: {Invalid, Overload, NoAddress, Unanswered, Other},
	TFTP: {Malformed, Write, Forbidden, NotFound, Busy, Other},
	HTTP: {BadRequest, Forbidden, NotFound, Misdirected, Unavailable, ServerError, Other},
}

// Counters are the netboot services' counts since the process started.
// The zero value is not usable; call New. A nil *Counters counts nothing,
// so services run without one. Safe for concurrent use.
type Counters struct {
	svc [numServices]service
}

type service struct {
	requests, answers, errors, bytes atomic.Uint64
	refusals                         []atomic.Uint64 // by Reasons index
}

// New returns zeroed counters.
func New() *Counters {
	c := &Counters{}
	for _, s := range Services {
		c.svc[s].refusals = make([]atomic.Uint64, len(Reasons[s]))
	}
	return c
}

// Request counts one request to s.
func (c *Counters) Request(s Service) {
	if c != nil {
		c.svc[s].requests.Add(1)
	}
}

// Answer counts one request s answered with n bytes (a DHCP reply, a TFTP
// transfer, an HTTP response body).
func (c *Counters) Answer(s Service, n int64) {
	if c != nil {
		c.svc[s].answers.Add(1)
		c.svc[s].bytes.Add(uint64(max(n, 0)))
	}
}

// Refuse counts one request s refused (or left unanswered) for reason.
func (c *Counters) Refuse(s Service, reason string) {
	if c == nil {
		return
	}
	rs := Reasons[s]
	i := len(rs) - 1 // Other
	for j, r := range rs {
		if r == reason {
			i = j
			break
		}
	}
	c.svc[s].refusals[i].Add(1)
}

// Error counts one answer of s that failed on the way: a DHCP reply not
// sent, a TFTP transfer or an HTTP body that ended early. The bytes that
// were sent count as served.
func (c *Counters) Error(s Service, sent int64) {
	if c != nil {
		c.svc[s].errors.Add(1)
		c.svc[s].bytes.Add(uint64(max(sent, 0)))
	}
}

// ServiceCounts is a snapshot of one service's counters.
type ServiceCounts struct {
	Service                          Service
	Requests, Answers, Errors, Bytes uint64
	// Refusals by reason, in the order of Reasons[Service].
	Refusals []uint64
}

// Snapshot returns every service's counts.
func (c *Counters) Snapshot() []ServiceCounts {
	out := make([]ServiceCounts, 0, numServices)
	for _, s := range Services {
		sc := &c.svc[s]
		v := ServiceCounts{Service: s, Requests: sc.requests.Load(), Answers: sc.answers.Load(),
			Errors: sc.errors.Load(), Bytes: sc.bytes.Load(), Refusals: make([]uint64, len(sc.refusals))}
		for i := range sc.refusals {
			v.Refusals[i] = sc.refusals[i].Load()
		}
		out = append(out, v)
	}
	return out
}
