// Package natscallout lets `dpxe serve` decide who may connect to an
// external NATS cluster it does not run (docs/events.md, "An external
// cluster"): it answers the cluster's authorization callout requests with
// the same decision the embedded server makes (natsauth.Authorizer.Decide)
// and disconnects, through the cluster's system account, the clients
// whose permissions changed since they connected (Sweep).
//
// The contract, from nats-server 2.10 and later in configuration (not
// operator) mode: a server that must authenticate a client publishes an
// authorization request JWT, signed by the server's own key, on
// $SYS.REQ.USER.AUTH in the callout account; the service answers with an
// authorization response JWT signed by the issuer account key named in
// the server's auth_callout block, whose subject is the user key the
// request named and whose audience is the requesting server's ID. The
// response carries a user JWT (same issuer, same subject) whose audience
// names the account the user is placed in, with its permissions and
// expiry; or an error, which refuses the client.
package natscallout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/discord-pxe/dpxe/fleet/events"
	"github.com/discord-pxe/dpxe/fleet/events/natsauth"
)

// Subjects and names of the callout protocol (nats-server's
// auth_callout.go, docs.nats.io "Auth Callout").
const (
	// Subject is where servers publish authorization requests, in the
	// callout account.
	Subject = "$SYS.REQ.USER.AUTH"
	// requestAudience is the audience of every authorization request.
	requestAudience = "nats-authorization-request"
	// xkeyHeader marks a request encrypted for the service's xkey, which
	// this service does not have.
	xkeyHeader = "Nats-Server-Xkey"
	// QueueGroup is the queue group the service subscribes in, so each
	// request is answered by one of several dpxe serve processes.
	QueueGroup = "dpxe-auth-callout"
)

// Expiry bounds.
const (
	// DefaultExpiry is how long a user JWT is valid: the server closes
	// the connection then and the client authenticates again. Revocation
	// does not wait for it (Sweep); it bounds how long a client keeps
	// permissions while no dpxe serve runs.
	DefaultExpiry = time.Hour
	// MinExpiry and MaxExpiry bound Config.Expiry.
	MinExpiry = 10 * time.Second
	MaxExpiry = 24 * time.Hour
	// responseExpiry is the validity of an authorization response: the
	// server waits for one only its auth timeout (2 s by default).
	responseExpiry = time.Minute
	// responseTTL is how long a node may answer a command it received
	// (one reply each), as the embedded server allows.
	responseTTL = 2 * time.Minute
)

// Errors.
var (
	// ErrIssuer means the issuer key is not an account seed.
	ErrIssuer = errors.New("callout issuer must be an account nkey seed (SA...)")
	// ErrRequest means an authorization request was malformed or not
	// for this service's issuer.
	ErrRequest = errors.New("bad authorization request")
)

// Decider decides who may connect (natsauth.Authorizer is one).
type Decider interface {
	// Decide returns user's grant, or an error that names no secret.
	Decide(user, password string) (natsauth.Grant, error)
	// Current returns the tag of the permissions user would get now,
	// and false for a user that may not connect now.
	Current(user string) (tag string, ok bool)
}

// Config configures a Service.
type Config struct {
	// Issuer is the account key (its seed) the auth_callout block's
	// issuer names: it signs every answer.
	Issuer nkeys.KeyPair
	// Account is the account users are placed in: the one the event
	// stream is in (AccountOf finds dpxe serve's own).
	Account string
	// Expiry is the user JWTs' lifetime (0: DefaultExpiry).
	Expiry time.Duration
	// Auth decides.
	Auth Decider
	// Log gets one line per refusal and per answer failure (never a
	// password); nil discards.
	Log *slog.Logger
}

// Stats counts a Service's answers.
type Stats struct {
	Granted, Refused, Failed uint64
}

// Service answers authorization requests. Safe for concurrent use.
type Service struct {
	cfg       Config
	issuerPub string
	sub       *nats.Subscription
	granted   atomic.Uint64
	refused   atomic.Uint64
	failed    atomic.Uint64
}

// New checks cfg and returns a Service that Start subscribes.
func New(cfg Config) (*Service, error) {
	if cfg.Issuer == nil {
		return nil, ErrIssuer
	}
	pub, err := cfg.Issuer.PublicKey()
	if err != nil || !nkeys.IsValidPublicAccountKey(pub) {
		return nil, ErrIssuer
	}
	if _, err := cfg.Issuer.Seed(); err != nil {
		return nil, ErrIssuer // a public key alone cannot sign
	}
	if cfg.Account == "" {
		return nil, errors.New("callout account: empty")
	}
	if cfg.Expiry == 0 {
		cfg.Expiry = DefaultExpiry
	}
	if cfg.Expiry < MinExpiry || cfg.Expiry > MaxExpiry {
		return nil, fmt.Errorf("callout expiry %v out of range %v..%v", cfg.Expiry, MinExpiry, MaxExpiry)
	}
	if cfg.Auth == nil {
		return nil, errors.New("callout: no Decider")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Service{cfg: cfg, issuerPub: pub}, nil
}

// IssuerPublicKey is the issuer's public key, for the auth_callout
// block's issuer.
func (s *Service) IssuerPublicKey() string { return s.issuerPub }

// Start subscribes to Subject in QueueGroup on nc, a connection of a user
// of the callout account listed in its auth_users.
func (s *Service) Start(nc *nats.Conn) error {
	sub, err := nc.QueueSubscribe(Subject, QueueGroup, s.handle)
	if err != nil {
		return fmt.Errorf("auth callout: subscribe %s: %w", Subject, err)
	}
	if err := nc.Flush(); err != nil {
		sub.Unsubscribe()
		return fmt.Errorf("auth callout: subscribe %s: %w", Subject, err)
	}
	if err := nc.LastError(); err != nil {
		sub.Unsubscribe()
		return fmt.Errorf("auth callout: subscribe %s: %w", Subject, err)
	}
	s.sub = sub
	return nil
}

// Stop unsubscribes.
func (s *Service) Stop() {
	if s.sub != nil {
		s.sub.Unsubscribe()
	}
}

// Stats returns the answers so far.
func (s *Service) Stats() Stats {
	return Stats{Granted: s.granted.Load(), Refused: s.refused.Load(), Failed: s.failed.Load()}
}

// handle answers one request. A request the service cannot read is not
// answered: the server refuses the client when its auth timeout passes.
func (s *Service) handle(m *nats.Msg) {
	if m.Header.Get(xkeyHeader) != "" {
		s.failed.Add(1)
		s.cfg.Log.Warn("nats callout: request encrypted with an xkey, which dpxe serve does not use: remove xkey from the auth_callout block")
		return
	}
	answer, err := s.Answer(string(m.Data), time.Now())
	if err != nil {
		s.failed.Add(1)
		s.cfg.Log.Warn("nats callout: unanswered request", "err", err)
		return
	}
	if err := m.Respond([]byte(answer)); err != nil {
		s.failed.Add(1)
		s.cfg.Log.Warn("nats callout: answer not sent", "err", err)
	}
}

// Answer returns the signed authorization response to request (a JWT),
// granting or refusing; an error means the request itself is unusable.
// now is the issue time of the user JWT, which expires Expiry later.
func (s *Service) Answer(request string, now time.Time) (string, error) {
	rc, err := jwt.DecodeAuthorizationRequestClaims(request)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrRequest, err)
	}
	switch {
	case !nkeys.IsValidPublicServerKey(rc.Issuer):
		return "", fmt.Errorf("%w: not signed by a server key", ErrRequest)
	case rc.Audience != requestAudience:
		return "", fmt.Errorf("%w: audience %q", ErrRequest, rc.Audience)
	case rc.Subject != s.issuerPub:
		return "", fmt.Errorf("%w: for issuer %s, not this service's %s", ErrRequest, rc.Subject, s.issuerPub)
	case !nkeys.IsValidPublicUserKey(rc.UserNkey):
		return "", fmt.Errorf("%w: user_nkey is not a user key", ErrRequest)
	case !nkeys.IsValidPublicServerKey(rc.Server.ID):
		return "", fmt.Errorf("%w: server_id.id is not a server key", ErrRequest)
	}
	resp := jwt.NewAuthorizationResponseClaims(rc.UserNkey)
	resp.Audience = rc.Server.ID
	resp.Expires = now.Add(responseExpiry).Unix()
	user := rc.ConnectOptions.Username
	g, err := s.cfg.Auth.Decide(user, rc.ConnectOptions.Password)
	if err != nil {
		s.refused.Add(1)
		resp.Error = err.Error() // names the user and the reason, never the password
		s.cfg.Log.Info("nats callout: refused", "reason", err, "server", rc.Server.Name, "client", rc.ClientInformation.Host)
	} else {
		uc := jwt.NewUserClaims(rc.UserNkey)
		uc.Name = ConnName(g.User, g.Tag)
		uc.Audience = s.cfg.Account // placement, in configuration mode
		uc.Expires = now.Add(s.cfg.Expiry).Unix()
		uc.Permissions = jwtPermissions(g.Permissions)
		ujwt, err := uc.Encode(s.cfg.Issuer)
		if err != nil {
			return "", fmt.Errorf("user JWT: %w", err)
		}
		resp.Jwt = ujwt
		s.granted.Add(1)
	}
	return resp.Encode(s.cfg.Issuer)
}

// jwtPermissions turns the scheme's permissions into a user JWT's.
func jwtPermissions(p events.Permissions) jwt.Permissions {
	out := jwt.Permissions{
		Pub: jwt.Permission{Allow: append(jwt.StringList(nil), p.PublishAllow...), Deny: append(jwt.StringList(nil), p.PublishDeny...)},
		Sub: jwt.Permission{Allow: append(jwt.StringList(nil), p.SubscribeAllow...)},
	}
	if p.Responses {
		out.Resp = &jwt.ResponsePermission{MaxMsgs: 1, Expires: responseTTL}
	}
	return out
}

// tagSep separates the user from its permissions tag in the name a
// callout user is connected under; neither node IDs nor worker names may
// contain it.
const tagSep = "#"

// ConnName is the name a granted client is connected under (the broker's
// authorized user, as its connection listings show): user#tag. Sweep
// reads the tag back, so revocation needs no state in dpxe serve and
// works across its restarts and replicas.
func ConnName(user, tag string) string { return user + tagSep + tag }

// SplitConnName undoes ConnName; false for a name without a tag (a user
// of the broker's own configuration, such as dpxe serve's).
func SplitConnName(name string) (user, tag string, ok bool) {
	i := strings.LastIndex(name, tagSep)
	if i <= 0 || i == len(name)-1 {
		return "", "", false
	}
	return name[:i], name[i+1:], true
}

// AccountOf returns the account nc's user is in, asked of the broker
// ($SYS.REQ.USER.INFO, which needs a system account on the cluster).
func AccountOf(ctx context.Context, nc *nats.Conn) (string, error) {
	m, err := nc.RequestWithContext(ctx, "$SYS.REQ.USER.INFO", nil)
	if err != nil {
		return "", fmt.Errorf("user info: %w", err)
	}
	var r struct {
		Data struct {
			Account string `json:"account"`
		} `json:"data"`
		Error *apiError `json:"error"`
	}
	if err := decodeJSON(m.Data, &r); err != nil {
		return "", fmt.Errorf("user info: %w", err)
	}
	if r.Error != nil {
		return "", fmt.Errorf("user info: %s", r.Error)
	}
	if r.Data.Account == "" {
		return "", errors.New("user info: no account in the answer")
	}
	return r.Data.Account, nil
}
