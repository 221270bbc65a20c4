package embedded

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"

	"github.com/nats-io/nats-server/v2/server"
)

// Permissions is what one user may publish and subscribe to. Its fields
// are those of Permissions (which builds the scheme's node and
// worker permissions), so embedded.Permissions(p) converts one; this
// package does not import events, whose tests start this server.
type Permissions struct {
	PublishAllow   []string
	PublishDeny    []string
	SubscribeAllow []string
	Responses      bool // may answer requests, one reply each
}

// Authorizer decides who may connect to the embedded server and with
// which permissions. It is asked once per connection; permissions do not
// change while a connection lasts (a node whose shards move reconnects).
type Authorizer interface {
	// Authorize returns the permissions of user with password, or false
	// to refuse the connection.
	Authorize(user, password string) (Permissions, bool)
}

// adminUser is the in-process user of `dpxe serve` itself (full
// permissions); its password is random per start and never leaves the
// process.
const adminUser = "dpxe-serve"

// authAdapter is the server's CustomClientAuthentication.
type authAdapter struct {
	adminPass string
	a         Authorizer
}

func newAdminPassword() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// Check implements server.Authentication.
func (x *authAdapter) Check(c server.ClientAuthentication) bool {
	o := c.GetOpts()
	if o == nil {
		return false
	}
	if o.Username == adminUser {
		if subtle.ConstantTimeCompare([]byte(o.Password), []byte(x.adminPass)) != 1 {
			return false
		}
		c.RegisterUser(&server.User{Username: adminUser})
		return true
	}
	p, ok := x.a.Authorize(o.Username, o.Password)
	if !ok {
		return false
	}
	c.RegisterUser(&server.User{Username: o.Username, Permissions: serverPermissions(p)})
	return true
}

func serverPermissions(p Permissions) *server.Permissions {
	sp := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: p.PublishAllow, Deny: p.PublishDeny},
		Subscribe: &server.SubjectPermission{Allow: p.SubscribeAllow},
	}
	if p.Responses {
		sp.Response = &server.ResponsePermission{MaxMsgs: 1, Expires: server.DEFAULT_ALLOW_RESPONSE_EXPIRATION}
	}
	return sp
}
