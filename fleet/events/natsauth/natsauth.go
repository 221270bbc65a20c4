// Package natsauth keeps the credentials of the embedded NATS server
// (docs/events.md, "Credentials"): one file beside the database with a
// secret that node passwords are derived from and the hashes of the
// workers' tokens (`dpxe workers add NAME`). Its Authorizer gives a node
// the permissions of the shards it holds (events.NodePermissions) and a
// worker those of a bot worker (events.WorkerPermissions); its Decide is
// the one decision behind both the embedded server (Authorize) and an
// external cluster's auth callout (fleet/events/natscallout).
package natsauth

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/events"
	"github.com/discord-pxe/dpxe/fleet/events/embedded"
)

// FileName is the credentials file's name beside the database.
const FileName = "nats-auth.json"

// User name prefixes: a node connects as node-<node ID>, a worker as
// worker-<name>.
const (
	NodePrefix   = "node-"
	WorkerPrefix = "worker-"
)

// Errors.
var (
	// ErrBadName means a worker name breaks the app-name rules.
	ErrBadName = errors.New("worker name must be 1-32 bytes of a-z, 0-9, '-', '_', starting with a letter or digit")
	// ErrExists means a worker of that name exists.
	ErrExists = errors.New("worker exists")
	// ErrBadFile means the credentials file is malformed.
	ErrBadFile = errors.New("malformed NATS credentials file")
)

// fileData is the file's JSON.
type fileData struct {
	// NodeSecret (base64, 32 bytes) keys the node passwords.
	NodeSecret string            `json:"node_secret"`
	Workers    map[string]worker `json:"workers"`
}

type worker struct {
	SHA256  string    `json:"sha256"` // hex SHA-256 of the token
	Created time.Time `json:"created"`
}

// File is the credentials file. Safe for concurrent use; it rereads the
// file when it changed on disk (a worker added by the CLI while `dpxe
// serve` runs).
type File struct {
	path string

	mu     sync.Mutex
	mod    time.Time
	size   int64
	data   fileData
	secret []byte
}

// Open reads the credentials file at path, creating it (mode 0600) with a
// new node secret when it does not exist.
func Open(path string) (*File, error) {
	f := &File{path: path}
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		secret := make([]byte, 32)
		if _, err := rand.Read(secret); err != nil {
			return nil, err
		}
		f.data = fileData{NodeSecret: base64.StdEncoding.EncodeToString(secret), Workers: map[string]worker{}}
		if err := f.writeLocked(); err != nil {
			return nil, err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.reloadLocked(); err != nil {
		return nil, err
	}
	return f, nil
}

// reloadLocked rereads the file if its time or size changed.
func (f *File) reloadLocked() error {
	st, err := os.Stat(f.path)
	if err != nil {
		return err
	}
	if f.secret != nil && st.ModTime().Equal(f.mod) && st.Size() == f.size {
		return nil
	}
	b, err := os.ReadFile(f.path)
	if err != nil {
		return err
	}
	var d fileData
	if err := json.Unmarshal(b, &d); err != nil {
		return fmt.Errorf("%s: %w: %v", f.path, ErrBadFile, err)
	}
	secret, err := base64.StdEncoding.DecodeString(d.NodeSecret)
	if err != nil || len(secret) < 32 {
		return fmt.Errorf("%s: node_secret: %w: want 32 bytes of base64", f.path, ErrBadFile)
	}
	for name, w := range d.Workers {
		if events.ValidateApp(name) != nil {
			return fmt.Errorf("%s: workers: %q: %w", f.path, name, ErrBadName)
		}
		if h, err := hex.DecodeString(w.SHA256); err != nil || len(h) != sha256.Size {
			return fmt.Errorf("%s: workers: %q: sha256: %w", f.path, name, ErrBadFile)
		}
	}
	if d.Workers == nil {
		d.Workers = map[string]worker{}
	}
	f.data, f.secret, f.mod, f.size = d, secret, st.ModTime(), st.Size()
	return nil
}

// writeLocked replaces the file (0600) with f.data.
func (f *File) writeLocked() error {
	b, err := json.MarshalIndent(f.data, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(f.path), ".nats-auth-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), f.path)
}

// AddWorker creates worker name and returns its token, which is shown
// once: the file keeps only its hash.
func (f *File) AddWorker(name string) (string, error) {
	if events.ValidateApp(name) != nil {
		return "", fmt.Errorf("worker %q: %w", name, ErrBadName)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.reloadLocked(); err != nil {
		return "", err
	}
	if _, ok := f.data.Workers[name]; ok {
		return "", fmt.Errorf("worker %q: %w", name, ErrExists)
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	token := base64.RawURLEncoding.EncodeToString(b)
	sum := sha256.Sum256([]byte(token))
	f.data.Workers[name] = worker{SHA256: hex.EncodeToString(sum[:]), Created: time.Now().UTC()}
	if err := f.writeLocked(); err != nil {
		delete(f.data.Workers, name)
		return "", err
	}
	f.secret = nil // reread (and restat) on next use
	return token, f.reloadLocked()
}

// Workers lists the workers' names.
func (f *File) Workers() ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.reloadLocked(); err != nil {
		return nil, err
	}
	var out []string
	for n := range f.data.Workers {
		out = append(out, n)
	}
	return out, nil
}

// NodePassword is node nodeID's NATS password: HMAC-SHA256 of its ID under
// the node secret. The controller can hand it out with the check-in
// answer without storing it; rotating the secret revokes every node's.
func (f *File) NodePassword(nodeID string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return nodePassword(f.secret, nodeID)
}

func nodePassword(secret []byte, nodeID string) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("dpxe-nats-node\x00" + nodeID))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// ShardsOf returns the shards node holds now, and false for a node that
// may not connect (unknown, deleted, lease lapsed).
type ShardsOf func(nodeID string) ([]uint32, bool)

// Authorizer authenticates nodes (node-<ID> with NodePassword, given the
// shards shardsOf says it holds) and workers (worker-<name> with its
// token) for app. It is an embedded.Authorizer.
func (f *File) Authorizer(app string, shardsOf ShardsOf) (*Authorizer, error) {
	if err := events.ValidateApp(app); err != nil {
		return nil, err
	}
	return &Authorizer{f: f, app: app, shardsOf: shardsOf, granted: map[string]grant{}}, nil
}

// Authorizer is File.Authorizer's result. Safe for concurrent use.
type Authorizer struct {
	f        *File
	app      string
	shardsOf ShardsOf

	mu sync.Mutex
	// granted is, per node connection of the embedded server (its remote
	// address), the user and the permissions tag it was let in with.
	granted map[string]grant
}

type grant struct {
	user, tag string
	at        time.Time
}

// Refusals: why Decide let a user not in. They name no secret, so they
// may be logged and sent to the broker.
var (
	// ErrUnknownUser means the user is neither node-<ID> nor a worker
	// of the credentials file.
	ErrUnknownUser = errors.New("unknown user")
	// ErrBadPassword means the password is not the user's.
	ErrBadPassword = errors.New("wrong password")
	// ErrNoLease means the node is unknown to the controller, deleted,
	// or its lease lapsed.
	ErrNoLease = errors.New("node holds no live lease")
)

// Grant is one decision of the Authorizer: the user let in, what it may
// publish and subscribe to, and a tag naming those permissions.
type Grant struct {
	User        string
	Permissions events.Permissions
	// Tag is a short digest of Permissions (PermissionsTag): a
	// connection let in with another tag than its user's of now is stale.
	Tag string
}

// PermissionsTag is a short digest of p, the same for equal permissions:
// 16 hex digits of SHA-256 over their description.
func PermissionsTag(p events.Permissions) string {
	sum := sha256.Sum256([]byte(p.String()))
	return hex.EncodeToString(sum[:8])
}

// Decide is the one decision of who may connect with which permissions,
// for the embedded server (Authorize) and for a cluster's auth callout
// (fleet/events/natscallout): node-<ID> with NodePassword(ID) while the
// controller has the node live, with its shards' permissions; a worker
// with its token, with a bot worker's. A refusal wraps ErrUnknownUser,
// ErrBadPassword or ErrNoLease.
func (a *Authorizer) Decide(user, password string) (Grant, error) {
	switch {
	case strings.HasPrefix(user, NodePrefix):
		id := strings.TrimPrefix(user, NodePrefix)
		if id == "" || a.shardsOf == nil {
			return Grant{}, fmt.Errorf("%q: %w", user, ErrUnknownUser)
		}
		want := a.f.NodePassword(id)
		if subtle.ConstantTimeCompare([]byte(password), []byte(want)) != 1 {
			return Grant{}, fmt.Errorf("%q: %w", user, ErrBadPassword)
		}
		shards, ok := a.shardsOf(id)
		if !ok {
			return Grant{}, fmt.Errorf("%q: %w", user, ErrNoLease)
		}
		p, err := events.NodePermissions(a.app, shards)
		if err != nil {
			return Grant{}, fmt.Errorf("%q: %w", user, err)
		}
		return Grant{User: user, Permissions: p, Tag: PermissionsTag(p)}, nil
	case strings.HasPrefix(user, WorkerPrefix):
		name := strings.TrimPrefix(user, WorkerPrefix)
		a.f.mu.Lock()
		err := a.f.reloadLocked()
		w, ok := a.f.data.Workers[name]
		a.f.mu.Unlock()
		if err != nil {
			return Grant{}, fmt.Errorf("%q: %w", user, err)
		}
		if !ok {
			return Grant{}, fmt.Errorf("%q: %w", user, ErrUnknownUser)
		}
		sum := sha256.Sum256([]byte(password))
		if subtle.ConstantTimeCompare([]byte(hex.EncodeToString(sum[:])), []byte(w.SHA256)) != 1 {
			return Grant{}, fmt.Errorf("%q: %w", user, ErrBadPassword)
		}
		p, err := events.WorkerPermissions(a.app)
		if err != nil {
			return Grant{}, fmt.Errorf("%q: %w", user, err)
		}
		return Grant{User: user, Permissions: p, Tag: PermissionsTag(p)}, nil
	}
	return Grant{}, fmt.Errorf("%q: %w", user, ErrUnknownUser)
}

// Current returns the tag of the permissions user would be let in with
// now (its password aside), and false for a user that may not connect
// now: a node the controller does not have live, a removed worker. Other
// users (not node- or worker-) are the broker's own and always true, with
// an empty tag.
func (a *Authorizer) Current(user string) (tag string, ok bool) {
	switch {
	case strings.HasPrefix(user, NodePrefix):
		shards, ok := a.shardsOf(strings.TrimPrefix(user, NodePrefix))
		if !ok {
			return "", false
		}
		p, err := events.NodePermissions(a.app, shards)
		if err != nil {
			return "", false
		}
		return PermissionsTag(p), true
	case strings.HasPrefix(user, WorkerPrefix):
		a.f.mu.Lock()
		defer a.f.mu.Unlock()
		if err := a.f.reloadLocked(); err != nil {
			return "", true // keep what works while the file is being rewritten
		}
		if _, ok := a.f.data.Workers[strings.TrimPrefix(user, WorkerPrefix)]; !ok {
			return "", false
		}
		p, err := events.WorkerPermissions(a.app)
		if err != nil {
			return "", false
		}
		return PermissionsTag(p), true
	}
	return "", true
}

// Stale reports whether the embedded server's connection of user from
// remote no longer has the permissions it would get now: a node whose
// lease lapsed, that was deleted, or whose shards changed since it
// connected, a worker that was removed from the file. Other users are
// never stale.
func (a *Authorizer) Stale(user, remote string) bool {
	tag, ok := a.Current(user)
	switch {
	case strings.HasPrefix(user, NodePrefix):
		a.mu.Lock()
		g, seen := a.granted[remote]
		a.mu.Unlock()
		return !ok || !seen || g.user != user || g.tag != tag
	case strings.HasPrefix(user, WorkerPrefix):
		return !ok
	}
	return false
}

// Sweep disconnects every connection of srv whose user is Stale, so a
// node that lost shards or its lease loses its permissions at once (a
// client that reconnects is authenticated again). It returns the users
// it disconnected.
func (a *Authorizer) Sweep(srv *embedded.Server) ([]string, error) {
	conns, err := srv.Users()
	if err != nil {
		return nil, err
	}
	var out []string
	live := map[string]bool{}
	for id, c := range conns {
		live[c.Remote] = true
		if a.Stale(c.User, c.Remote) {
			if err := srv.Disconnect(id); err == nil {
				out = append(out, c.User)
			}
		}
	}
	a.mu.Lock()
	for remote := range a.granted {
		if g := a.granted[remote]; !live[remote] && time.Since(g.at) > time.Minute {
			delete(a.granted, remote) // closed (not just being opened)
		}
	}
	a.mu.Unlock()
	return out, nil
}

// Authorize implements embedded.Authorizer with Decide.
func (a *Authorizer) Authorize(user, password, remote string) (embedded.Permissions, bool) {
	g, err := a.Decide(user, password)
	if err != nil {
		return embedded.Permissions{}, false
	}
	if strings.HasPrefix(user, NodePrefix) {
		a.mu.Lock()
		a.granted[remote] = grant{user: user, tag: g.Tag, at: time.Now()}
		a.mu.Unlock()
	}
	return embedded.Permissions(g.Permissions), true
}

// NodeAccess returns what a node's check-in answer carries with
// --nats-auth (controller.SetNATSAccess): the broker URLs, user
// node-<node ID>, its derived password and the app. The password is
// computed at each call, so a rotated secret takes effect at the node's
// next check-in.
func (f *File) NodeAccess(app string, urls []string) func(nodeID string) *appliance.NATSAccess {
	urls = append([]string(nil), urls...)
	return func(nodeID string) *appliance.NATSAccess {
		return &appliance.NATSAccess{URLs: append([]string(nil), urls...), User: NodePrefix + nodeID, Password: f.NodePassword(nodeID), App: app}
	}
}
