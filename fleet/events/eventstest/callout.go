package eventstest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// CalloutAccount is the account of the event stream, of dpxe serve's user
// and of every user the callout lets in, in StartCallout's clusters.
const CalloutAccount = "DPXE"

// CalloutKeys are the keys of a cluster that delegates authentication to
// an auth callout service (fleet/events/natscallout): the issuer account
// key the service signs with, dpxe serve's user (in CalloutAccount) and a
// system account user, both listed in the callout's auth_users so they
// bypass it.
type CalloutKeys struct {
	Issuer, Serve, System nkeys.KeyPair
}

// NewCalloutKeys makes new keys.
func NewCalloutKeys(t testing.TB) *CalloutKeys {
	t.Helper()
	issuer, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	serve, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	sys, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	return &CalloutKeys{Issuer: issuer, Serve: serve, System: sys}
}

// public returns kp's public key.
func public(t testing.TB, kp nkeys.KeyPair) string {
	t.Helper()
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return pub
}

// SeedFile writes kp's seed to a new 0600 file in dir and returns its
// path (for dpxe serve's --nats-callout-key, --nats-nkey,
// --nats-system-nkey).
func SeedFile(t testing.TB, dir, name string, kp nkeys.KeyPair) string {
	t.Helper()
	seed, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, append(seed, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// NkeyOption is the nats.Connect option of a user with key kp.
func NkeyOption(t testing.TB, kp nkeys.KeyPair) nats.Option {
	t.Helper()
	return nats.Nkey(public(t, kp), kp.Sign)
}

// CalloutConfig is the part of a nats-server config file that makes it
// delegate authentication to the callout of keys: the accounts (the event
// stream's, with JetStream, and the system account), and the
// auth_callout block.
func CalloutConfig(t testing.TB, keys *CalloutKeys) string {
	t.Helper()
	return fmt.Sprintf(`accounts {
  %s { jetstream: enabled, users: [ { nkey: %q } ] }
  SYS { users: [ { nkey: %q } ] }
}
system_account: SYS
authorization {
  auth_callout {
    issuer: %q
    account: %s
    auth_users: [ %q, %q ]
  }
}
`, CalloutAccount, public(t, keys.Serve), public(t, keys.System), public(t, keys.Issuer), CalloutAccount,
		public(t, keys.Serve), public(t, keys.System))
}

// BuildServer builds nats-server from the module go.mod requires (auth
// callout needs 2.10 or later; Debian's is 2.9) into a directory of the
// test and returns the binary's path. The Go build cache makes every
// build after the first a link.
func BuildServer(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "nats-server")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/nats-io/nats-server/v2")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build nats-server: %v\n%s", err, out)
	}
	return bin
}

// StartCallout starts three nats-server processes of bin (BuildServer)
// as a routed JetStream cluster that asks an auth callout service with
// keys.Issuer about every client but dpxe serve's and the system user.
// The servers refuse every other client until a service answers.
func StartCallout(t testing.TB, bin, prefix string, keys *CalloutKeys) *Cluster {
	t.Helper()
	return startProcesses(t, bin, prefix, procConfig{extra: CalloutConfig(t, keys), ready: []nats.Option{NkeyOption(t, keys.System)}})
}

// StartCalloutIn is StartCallout with the servers listening on host (for
// clients and routes), run by command (a network namespace's), and
// reached through dialer while they start.
func StartCalloutIn(t testing.TB, bin, prefix string, keys *CalloutKeys, host string,
	command func(name string, arg ...string) *exec.Cmd, dialer nats.CustomDialer) *Cluster {
	t.Helper()
	return startProcesses(t, bin, prefix, procConfig{extra: CalloutConfig(t, keys), host: host, command: command,
		ready: []nats.Option{NkeyOption(t, keys.System), nats.SetCustomDialer(dialer)}})
}
