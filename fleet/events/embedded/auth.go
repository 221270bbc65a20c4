package embedded

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"net"
	"strconv"

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
	// to refuse the connection; remote is the client's address (host:port,
	// as Users reports it), which names the connection.
	Authorize(user, password, remote string) (Permissions, bool)
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
	remote := ""
	if a := c.RemoteAddress(); a != nil {
		remote = a.String()
	}
	p, ok := x.a.Authorize(o.Username, o.Password, remote)
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

// maxConnz bounds the connections one Users call lists.
const maxConnz = 1 << 16

// Conn is one open client connection as Users reports it.
type Conn struct {
	User   string
	Remote string // host:port of the client ("" in process)
}

// Users returns every open client connection, by connection ID (the
// in-process connections of `dpxe serve` included).
func (s *Server) Users() (map[uint64]Conn, error) {
	out := map[uint64]Conn{}
	for offset := 0; offset < maxConnz; {
		cz, err := s.srv.Connz(&server.ConnzOptions{Username: true, Offset: offset, Limit: 1024})
		if err != nil {
			return nil, err
		}
		for _, c := range cz.Conns {
			remote := ""
			if c.IP != "" {
				remote = net.JoinHostPort(c.IP, strconv.Itoa(c.Port))
			}
			out[c.Cid] = Conn{User: c.AuthorizedUser, Remote: remote}
		}
		if len(cz.Conns) == 0 || offset+len(cz.Conns) >= cz.Total {
			break
		}
		offset += len(cz.Conns)
	}
	return out, nil
}

// Disconnect closes client connection id (the client may reconnect and
// is authenticated again, with its permissions of then).
func (s *Server) Disconnect(id uint64) error { return s.srv.DisconnectClientByID(id) }
