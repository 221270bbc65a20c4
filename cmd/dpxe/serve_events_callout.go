package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/discord-pxe/dpxe/fleet/events/natscallout"
)

// The external cluster's auth callout (docs/events.md, "An external
// cluster"): with --nats-callout-key, dpxe serve answers the --nats-url
// cluster's authorization requests with the decision the embedded
// server's --nats-auth makes (fleet/events/natscallout), gives nodes
// their broker access in check-in answers (the --nats-node-url URLs), and
// disconnects clients whose permissions changed through a system account
// user (--nats-system-nkey).

// validCallout checks the callout flags against the rest: a cluster,
// URLs for nodes, serve's own user and a system user.
func validCallout(e *eventsConfig) error {
	if e.NATSNKey != "" && e.NATSURL == "" {
		return fmt.Errorf("%w: nats-nkey is for --nats-url", errUsage)
	}
	if e.NATSNKey != "" && e.NATSCreds != "" {
		return fmt.Errorf("%w: nats-nkey and nats-creds both name serve's NATS user: give one", errUsage)
	}
	if e.NATSSystemNKey != "" && e.NATSCalloutKey == "" {
		return fmt.Errorf("%w: nats-system-nkey is for --nats-callout-key", errUsage)
	}
	if e.NATSCalloutKey == "" {
		return nil
	}
	switch {
	case e.NATSURL == "":
		return fmt.Errorf("%w: nats-callout-key needs --nats-url (the embedded server authorizes clients itself with --nats-auth)", errUsage)
	case len(e.NATSNodeURLs) == 0:
		return fmt.Errorf("%w: nats-node-url is required with --nats-callout-key: the cluster URLs nodes dial", errUsage)
	case e.NATSNKey == "" && e.NATSCreds == "":
		return fmt.Errorf("%w: nats-callout-key needs serve's own NATS user (--nats-nkey or --nats-creds), listed in the callout's auth_users", errUsage)
	case e.NATSSystemNKey == "":
		return fmt.Errorf("%w: nats-system-nkey is required with --nats-callout-key: serve disconnects clients whose permissions changed through the system account", errUsage)
	}
	return nil
}

// secretMode is the permission bits a seed file may not have: any for
// group or others.
const secretMode = 0o077

// readSeed reads the nkey seed in path (flag names it in errors),
// refusing a file others may read, and returns its key pair, which must
// be of kind want (nkeys.PrefixByteAccount, nkeys.PrefixByteUser).
func readSeed(flag, path string, want nkeys.PrefixByte) (nkeys.KeyPair, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	if m := st.Mode().Perm(); m&secretMode != 0 {
		return nil, fmt.Errorf("%s %s: mode %04o lets others read a secret key; chmod 600 it", flag, path, m)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	seed := strings.TrimSpace(string(b))
	kp, err := nkeys.FromSeed([]byte(seed))
	if err != nil {
		return nil, fmt.Errorf("%s %s: not an nkey seed: %v", flag, path, err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %v", flag, path, err)
	}
	if pk := nkeys.Prefix(pub); pk != want {
		return nil, fmt.Errorf("%s %s: a seed of kind %v, want %v", flag, path, pk, want)
	}
	return kp, nil
}

// nkeyOption is the nats.Connect option of the user whose seed is in
// path.
func nkeyOption(flag, path string) (nats.Option, error) {
	kp, err := readSeed(flag, path, nkeys.PrefixByteUser)
	if err != nil {
		return nil, err
	}
	pub, _ := kp.PublicKey()
	return nats.Nkey(pub, kp.Sign), nil
}

// calloutSetupTimeout bounds the questions serve asks the cluster at
// start (its own account).
const calloutSetupTimeout = 10 * time.Second

// calloutKeys are the keys the callout needs, read before serve
// connects to the cluster.
type calloutKeys struct {
	issuer nkeys.KeyPair
	sys    nats.Option
}

// loadCalloutKeys reads --nats-callout-key and --nats-system-nkey.
func loadCalloutKeys(e eventsConfig) (*calloutKeys, error) {
	issuer, err := readSeed("nats-callout-key", e.NATSCalloutKey, nkeys.PrefixByteAccount)
	if err != nil {
		return nil, err
	}
	sys, err := nkeyOption("nats-system-nkey", e.NATSSystemNKey)
	if err != nil {
		return nil, err
	}
	return &calloutKeys{issuer: issuer, sys: sys}, nil
}

// callout is the running callout part: its sweep and its stop.
type callout struct {
	sweep func(context.Context) ([]string, error)
	stop  func()
}

// attachCallout starts answering nc's cluster's authorization requests,
// in the account of nc's user, and gives nodes their access.
func attachCallout(ctx context.Context, app *fleetApp, e eventsConfig, keys *calloutKeys, nc *nats.Conn, log *slog.Logger) (*callout, error) {
	issuer, sysOpt := keys.issuer, keys.sys
	authFile, auth, err := natsAuthorizer(app, e.EventsApp)
	if err != nil {
		return nil, err
	}
	actx, cancel := context.WithTimeout(ctx, calloutSetupTimeout)
	account, err := natscallout.AccountOf(actx, nc)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("nats-callout-key: serve's own account on the cluster: %w", err)
	}
	svc, err := natscallout.New(natscallout.Config{Issuer: issuer, Account: account, Auth: auth, Log: log})
	if err != nil {
		return nil, fmt.Errorf("nats-callout-key: %w", err)
	}
	sys, err := nats.Connect(e.NATSURL, nats.Name("dpxe serve system"), sysOpt, nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("nats-system-nkey: %w", err)
	}
	if err := svc.Start(nc); err != nil {
		sys.Close()
		return nil, err
	}
	app.controller.SetNATSAccess(withSkip(authFile.NodeAccess(e.EventsApp, e.NATSNodeURLs), e.EventsSkip))
	log.Info("nats callout: answering the cluster's authorization requests", "issuer", svc.IssuerPublicKey(), "account", account,
		"user_expiry", natscallout.DefaultExpiry)
	return &callout{
		sweep: func(ctx context.Context) ([]string, error) { return svc.Sweep(ctx, sys, clusterSize(nc)) },
		stop:  func() { svc.Stop(); sys.Close() },
	}, nil
}

// clusterSize is how many servers nc knows of (given and discovered, by
// host and port): how many connection lists a sweep waits for.
func clusterSize(nc *nats.Conn) int {
	hosts := map[string]bool{}
	for _, s := range nc.Servers() {
		if u, err := url.Parse(s); err == nil {
			hosts[u.Host] = true
		}
	}
	return len(hosts)
}
