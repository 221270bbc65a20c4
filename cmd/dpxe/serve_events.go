package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/ctlcert"
	"github.com/discord-pxe/dpxe/fleet/events"
	"github.com/discord-pxe/dpxe/fleet/events/embedded"
	"github.com/discord-pxe/dpxe/fleet/events/natsauth"
)

// The events part of `dpxe serve` (docs/events.md): an embedded NATS
// server with JetStream on a file store beside the database, listening on
// --nats-listen, or an existing NATS cluster (--nats-url), and the event
// stream of the bot (--events-app) with its limits.

// eventsConfig is the events part of serveConfig (its JSON names are
// promoted into the --config file). Zero values mean the defaults.
type eventsConfig struct {
	NoEvents        bool     `json:"no_events"`
	NATSListen      string   `json:"nats_listen"`
	NATSURL         string   `json:"nats_url"`
	NATSCreds       string   `json:"nats_creds"`
	NATSStore       string   `json:"nats_store"`
	EventsApp       string   `json:"events_app"`
	EventsMaxBytes  int64    `json:"events_max_bytes"`
	EventsMaxAge    duration `json:"events_max_age"`
	EventsDupWindow duration `json:"events_duplicate_window"`
	EventsReplicas  int      `json:"events_replicas"`
	NATSAuth        bool     `json:"nats_auth"`
	// EventsSkip names event types nodes do not publish (NATSAccess.Skip).
	EventsSkip []string `json:"events_skip"`
	// NATSNodeURLs, when set, are the broker URLs check-in answers give
	// nodes, instead of the embedded server's listener addresses.
	NATSNodeURLs []string `json:"nats_node_url"`
	// NATSTLSCert and NATSTLSKey are the embedded server's TLS identity
	// (PEM files); with them every client must speak TLS.
	NATSTLSCert string `json:"nats_tls_cert"`
	NATSTLSKey  string `json:"nats_tls_key"`
	// NATSNKey is the seed file of serve's own NATS user on --nats-url.
	NATSNKey string `json:"nats_nkey"`
	// NATSCalloutKey, the issuer account's seed file, makes serve the
	// auth callout service of the --nats-url cluster
	// (serve_events_callout.go); NATSSystemNKey is the seed file of a
	// system account user it disconnects clients with.
	NATSCalloutKey string `json:"nats_callout_key"`
	NATSSystemNKey string `json:"nats_system_nkey"`
}

// defaultEventsApp is the app name in subjects when none is given.
const defaultEventsApp = "bot"

var eventsFlags struct {
	off                       bool
	listen, url, creds, store string
	app                       string
	maxBytes                  int64
	maxAge, dupWindow         time.Duration
	replicas                  int
	auth                      bool
	skip                      string
	nodeURLs                  string
	tlsCert, tlsKey           string
	nkey, calloutKey, sysNKey string
}

func init() {
	registerServePart(servePart{
		name: "events",
		flags: func(fs *flag.FlagSet) {
			f := &eventsFlags
			d := events.DefaultStreamLimits()
			fs.BoolVar(&f.off, "no-events", false, "no event delivery: neither the embedded NATS server nor a stream")
			fs.StringVar(&f.listen, "nats-listen", "", "host:port of the embedded NATS server (port 0 picks one); default "+embedded.DefaultListen+", or with --interface and --nats-auth the boot interface's address:4222 with "+embedded.DefaultListen+" relayed to it")
			fs.StringVar(&f.url, "nats-url", "", "use this NATS cluster instead of the embedded server (nats://a:4222,nats://b:4222)")
			fs.StringVar(&f.creds, "nats-creds", "", "NATS credentials file (.creds) for --nats-url")
			fs.StringVar(&f.nkey, "nats-nkey", "", "seed file (SU..., mode 0600) of serve's own NATS user for --nats-url, instead of --nats-creds")
			fs.StringVar(&f.calloutKey, "nats-callout-key", "", "seed file (SA..., mode 0600) of the issuer account of the --nats-url cluster's auth_callout: serve answers its authorization requests, so nodes and workers get the permissions --nats-auth gives them (docs/events.md); needs --nats-node-url, --nats-system-nkey and serve's own user (--nats-nkey or --nats-creds) in the callout's auth_users")
			fs.StringVar(&f.sysNKey, "nats-system-nkey", "", "seed file (SU..., mode 0600) of a user of the --nats-url cluster's system account, in the callout's auth_users: with --nats-callout-key, serve disconnects clients whose permissions changed through it")
			fs.StringVar(&f.store, "nats-store", "", "JetStream file store of the embedded server (default: nats/ beside --db; ./var/ for a postgres:// --db)")
			fs.StringVar(&f.app, "events-app", defaultEventsApp, "the bot's name in event subjects dpxe.<app>.events.<shard>.<EVENT>")
			fs.Int64Var(&f.maxBytes, "events-max-bytes", d.MaxBytes, "bytes the event stream keeps (oldest dropped first)")
			fs.DurationVar(&f.maxAge, "events-max-age", d.MaxAge, "how long the event stream keeps an event")
			fs.DurationVar(&f.dupWindow, "events-duplicate-window", d.DuplicateWindow, "how long a Nats-Msg-Id is remembered; must exceed --lease + --resume-ttl")
			fs.IntVar(&f.replicas, "events-replicas", d.Replicas, "stream replicas (3 on a JetStream cluster)")
			fs.StringVar(&f.skip, "events-skip", "", "comma-separated Discord event types nodes do not publish (TYPING_START,PRESENCE_UPDATE); they still count as acknowledged; sent with the nodes' broker access, so only with --nats-auth or --nats-callout-key")
			fs.BoolVar(&f.auth, "nats-auth", false, "the embedded NATS server requires credentials: nodes get their own shards' subjects, workers (dpxe workers add) commands and the stream; kept in "+natsauth.FileName+" beside --db")
			fs.StringVar(&f.nodeURLs, "nats-node-url", "", "comma-separated broker URLs check-in answers give nodes, verbatim, instead of the embedded server's addresses (tls://broker.lan:4222): when nodes reach it by a DNS name or through TLS; needs --nats-auth, or --nats-callout-key (then required: the cluster URLs nodes dial)")
			fs.StringVar(&f.tlsCert, "nats-tls-cert", "", "PEM certificate chain of the embedded NATS server; with it every client must speak TLS (nodes check it against the image's trust anchors, docs/security.md)")
			fs.StringVar(&f.tlsKey, "nats-tls-key", "", "PEM private key of --nats-tls-cert")
		},
		apply:  applyEventsFlags,
		attach: attachEvents,
	})
}

// applyEventsFlags lays the events flags given on the command line over
// cfg, fills in defaults and checks the result.
func applyEventsFlags(fs *flag.FlagSet, cfg *serveConfig) error {
	f, e := &eventsFlags, &cfg.eventsConfig
	fs.Visit(func(fl *flag.Flag) {
		switch fl.Name {
		case "no-events":
			e.NoEvents = f.off
		case "nats-listen":
			e.NATSListen = f.listen
		case "nats-url":
			e.NATSURL = f.url
		case "nats-creds":
			e.NATSCreds = f.creds
		case "nats-store":
			e.NATSStore = f.store
		case "events-app":
			e.EventsApp = f.app
		case "events-max-bytes":
			e.EventsMaxBytes = f.maxBytes
		case "events-max-age":
			e.EventsMaxAge = duration(f.maxAge)
		case "events-duplicate-window":
			e.EventsDupWindow = duration(f.dupWindow)
		case "events-replicas":
			e.EventsReplicas = f.replicas
		case "nats-auth":
			e.NATSAuth = f.auth
		case "events-skip":
			e.EventsSkip = splitList(f.skip)
		case "nats-node-url":
			e.NATSNodeURLs = splitList(f.nodeURLs)
		case "nats-tls-cert":
			e.NATSTLSCert = f.tlsCert
		case "nats-tls-key":
			e.NATSTLSKey = f.tlsKey
		case "nats-nkey":
			e.NATSNKey = f.nkey
		case "nats-callout-key":
			e.NATSCalloutKey = f.calloutKey
		case "nats-system-nkey":
			e.NATSSystemNKey = f.sysNKey
		}
	})
	d := events.DefaultStreamLimits()
	// An empty NATSListen is resolved at attach (natsListen), where the
	// boot interface's address is known.
	if e.NATSStore == "" {
		e.NATSStore = filepath.Join(cfg.dataDir(), "nats")
	}
	if e.EventsApp == "" {
		e.EventsApp = defaultEventsApp
	}
	if e.EventsMaxBytes == 0 {
		e.EventsMaxBytes = d.MaxBytes
	}
	if e.EventsMaxAge == 0 {
		e.EventsMaxAge = duration(d.MaxAge)
	}
	if e.EventsDupWindow == 0 {
		e.EventsDupWindow = duration(d.DuplicateWindow)
	}
	if e.EventsReplicas == 0 {
		e.EventsReplicas = d.Replicas
	}
	if e.NoEvents {
		return nil
	}
	if err := events.ValidateApp(e.EventsApp); err != nil {
		return fmt.Errorf("%w: events-app: %v", errUsage, err)
	}
	if err := e.limits().Validate(); err != nil {
		return fmt.Errorf("%w: events: %v", errUsage, err)
	}
	if e.NATSURL == "" && e.EventsReplicas != 1 {
		return fmt.Errorf("%w: events-replicas %d needs --nats-url (the embedded server is one machine)", errUsage, e.EventsReplicas)
	}
	if e.NATSAuth && e.NATSURL != "" {
		return fmt.Errorf("%w: nats-auth is for the embedded server (a cluster given with --nats-url has its own accounts)", errUsage)
	}
	if e.NATSCreds != "" && e.NATSURL == "" {
		return fmt.Errorf("%w: nats-creds is for --nats-url", errUsage)
	}
	if _, err := natsHosts(e.NATSURL); err != nil {
		return fmt.Errorf("%w: nats-url: %v", errUsage, err)
	}
	if err := validSkip(e.EventsSkip); err != nil {
		return fmt.Errorf("%w: events-skip: %v", errUsage, err)
	}
	if (e.NATSTLSCert == "") != (e.NATSTLSKey == "") {
		return fmt.Errorf("%w: nats-tls-cert and nats-tls-key go together", errUsage)
	}
	if e.NATSTLSCert != "" && e.NATSURL != "" {
		return fmt.Errorf("%w: nats-tls-cert is for the embedded server (a cluster given with --nats-url has its own TLS)", errUsage)
	}
	if err := validCallout(e); err != nil {
		return err
	}
	if len(e.NATSNodeURLs) > 0 && !e.NATSAuth && e.NATSCalloutKey == "" {
		return fmt.Errorf("%w: nats-node-url needs --nats-auth or --nats-callout-key (nodes get broker access only with one)", errUsage)
	}
	if err := validNodeURLs(e.NATSNodeURLs); err != nil {
		return fmt.Errorf("%w: nats-node-url: %v", errUsage, err)
	}
	return nil
}

// validNodeURLs checks --nats-node-url with the kernel's parser
// (appliance.ParseNATSURL), so a URL nodes would skip stops dpxe serve at
// start rather than leaving nodes without a broker.
func validNodeURLs(urls []string) error {
	if len(urls) > appliance.MaxNATSURLs {
		return fmt.Errorf("%d URLs, want at most %d", len(urls), appliance.MaxNATSURLs)
	}
	for _, u := range urls {
		if _, err := appliance.ParseNATSURL(u); err != nil {
			return fmt.Errorf("%q: %v", redactURL(u), err)
		}
	}
	return nil
}

// splitList splits a comma-separated flag (--events-skip,
// --nats-node-url) at commas; an empty value is none.
func splitList(v string) []string {
	if v == "" {
		return nil
	}
	return strings.Split(v, ",")
}

// validSkip applies NATSAccess.Validate's rule for skip to the names, so
// a bad one stops dpxe serve at start rather than every check-in answer.
func validSkip(names []string) error {
	if len(names) > appliance.MaxNATSSkip {
		return fmt.Errorf("%d names, want at most %d", len(names), appliance.MaxNATSSkip)
	}
	for i, n := range names {
		if err := appliance.ValidateEventName(n); err != nil {
			return fmt.Errorf("name %d %q: %v", i+1, n, err)
		}
	}
	return nil
}

// withSkip adds the skip list to every access fn returns.
func withSkip(fn controller.NATSAccessFunc, skip []string) controller.NATSAccessFunc {
	if len(skip) == 0 {
		return fn
	}
	return func(nodeID string) *appliance.NATSAccess {
		a := fn(nodeID)
		if a != nil {
			a.Skip = append([]string(nil), skip...)
		}
		return a
	}
}

func (e eventsConfig) limits() events.StreamLimits {
	l := events.DefaultStreamLimits()
	l.MaxBytes, l.MaxAge, l.DuplicateWindow, l.Replicas = e.EventsMaxBytes, time.Duration(e.EventsMaxAge), time.Duration(e.EventsDupWindow), e.EventsReplicas
	return l
}

// natsHosts checks a comma-separated list of nats:// (or tls://) URLs and
// returns them without user information, for the log.
func natsHosts(list string) ([]string, error) {
	if list == "" {
		return nil, nil
	}
	var hosts []string
	for _, s := range strings.Split(list, ",") {
		u, err := url.Parse(strings.TrimSpace(s))
		if err != nil || u.Host == "" || (u.Scheme != "nats" && u.Scheme != "tls") {
			return nil, fmt.Errorf("%q is not a nats:// or tls:// URL with a host", redactURL(s))
		}
		hosts = append(hosts, u.Scheme+"://"+u.Host)
	}
	return hosts, nil
}

// redactURL drops anything after "://" up to '@' (user and password) from a
// URL before it is printed: a database or broker URL in a refusal.
func redactURL(s string) string {
	if i, j := strings.Index(s, "://"), strings.LastIndex(s, "@"); i >= 0 && j > i {
		return s[:i+3] + "…@" + s[j+1:]
	}
	return s
}

// streamSetupTimeout bounds how long serve retries creating the event
// stream: a cluster that has just started elects its JetStream leader
// first and refuses meanwhile.
const streamSetupTimeout = 30 * time.Second

// ensureStream creates or updates the event stream, retrying every half
// second until streamSetupTimeout.
func ensureStream(ctx context.Context, js jetstream.JetStream, e eventsConfig, log *slog.Logger) (jetstream.Stream, error) {
	deadline := time.Now().Add(streamSetupTimeout)
	logged := false
	for {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := events.EnsureStream(sctx, js, e.EventsApp, e.limits())
		cancel()
		if err == nil {
			return st, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("events: %w", err)
		}
		if !logged {
			log.Warn("event stream not ready, retrying", "err", err)
			logged = true
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// attachEvents starts the embedded server (or connects to the cluster),
// makes sure the event stream exists with the configured limits, and
// returns a run function that closes both at shutdown.
func attachEvents(ctx context.Context, app *fleetApp, log *slog.Logger) (func(context.Context) error, error) {
	e := app.cfg.eventsConfig
	if e.NoEvents {
		log.Info("event delivery disabled")
		return nil, nil
	}
	eff := app.controller.Config()
	if gap := eff.Lease + eff.ResumeTTL; time.Duration(e.EventsDupWindow) <= gap {
		return nil, fmt.Errorf("%w: events-duplicate-window %v must exceed lease + resume-ttl (%v): a session can be resumed that long after its last publish",
			errUsage, time.Duration(e.EventsDupWindow), gap)
	}
	var srv *embedded.Server
	var auth *natsauth.Authorizer
	var authFile *natsauth.File
	var nc *nats.Conn
	var err error
	where := ""
	var relayed []string // the embedded server's loopback relay
	var coKeys *calloutKeys
	if e.NATSURL != "" {
		if e.NATSCalloutKey != "" {
			if coKeys, err = loadCalloutKeys(e); err != nil {
				return nil, err
			}
		}
		opts := []nats.Option{nats.Name("dpxe serve"), nats.MaxReconnects(-1)}
		if e.NATSCreds != "" {
			if _, err := os.Stat(e.NATSCreds); err != nil {
				return nil, fmt.Errorf("nats-creds: %w", err)
			}
			opts = append(opts, nats.UserCredentials(e.NATSCreds))
		}
		if e.NATSNKey != "" {
			o, err := nkeyOption("nats-nkey", e.NATSNKey)
			if err != nil {
				return nil, err
			}
			opts = append(opts, o)
		}
		if nc, err = nats.Connect(e.NATSURL, opts...); err != nil {
			hosts, _ := natsHosts(e.NATSURL)
			return nil, fmt.Errorf("nats-url %s: %w", strings.Join(hosts, ","), err)
		}
		hosts, _ := natsHosts(e.NATSURL)
		where = strings.Join(hosts, ",")
	} else {
		if err := os.MkdirAll(e.NATSStore, 0o700); err != nil {
			return nil, fmt.Errorf("nats-store: %w", err)
		}
		// With netboot, the boot interface's address comes first among
		// the node URLs of a broker listening on every interface, and
		// is where the broker listens by default with --nats-auth.
		var bootIP netip.Addr
		if netbootFlags.iface != "" {
			bootIP, _ = interfaceIPv4(netbootFlags.iface)
		}
		listen, relay := natsListen(e.NATSListen, e.NATSAuth, bootIP)
		sc := embedded.ServerConfig{Listen: listen, Relay: relay, StoreDir: e.NATSStore, Log: log}
		if e.NATSTLSCert != "" {
			id, err := ctlcert.Load(e.NATSTLSCert, e.NATSTLSKey)
			if err != nil {
				return nil, fmt.Errorf("nats-tls-cert: %w", err)
			}
			sc.TLS = &tls.Config{Certificates: []tls.Certificate{id.Cert}, MinVersion: tls.VersionTLS12}
		}
		if e.NATSAuth {
			if authFile, auth, err = natsAuthorizer(app, e.EventsApp); err != nil {
				return nil, err
			}
			sc.Auth = auth
		}
		srv, err = embedded.Start(sc)
		if err != nil {
			return nil, err
		}
		if nc, err = srv.Connect(nats.Name("dpxe serve")); err != nil {
			srv.Shutdown()
			return nil, err
		}
		where = srv.ClientURL()
		scheme, _, _ := strings.Cut(where, "://") // tls with --nats-tls-cert: the relay is byte for byte
		for _, a := range srv.RelayAddrs() {
			relayed = append(relayed, scheme+"://"+a.String())
		}
		if authFile != nil {
			// Nodes get their broker URLs and credentials with their
			// check-in answers (never logged).
			urls := e.NATSNodeURLs
			if len(urls) == 0 {
				urls = nodeNATSURLs(srv.Addr(), bootIP)
				if why := natsUnreachable(urls, srv.Addr().String()); why != "" && bootIP.IsValid() {
					log.Warn("nats-auth: " + why)
				}
			}
			if len(urls) == 0 {
				log.Warn("nats-auth: no address nodes could reach the embedded server at; check-in answers carry no NATS access", "nats", where)
			} else {
				app.controller.SetNATSAccess(withSkip(authFile.NodeAccess(e.EventsApp, urls), e.EventsSkip))
			}
		}
	}
	stop := func() {
		nc.Close()
		if srv != nil {
			srv.Shutdown()
		}
	}
	// sweep disconnects the clients whose permissions changed (nil: no
	// authorization by serve).
	var sweep func(context.Context) ([]string, error)
	if auth != nil {
		sweep = func(context.Context) ([]string, error) { return auth.Sweep(srv) }
	}
	if e.NATSCalloutKey != "" {
		co, err := attachCallout(ctx, app, e, coKeys, nc, log)
		if err != nil {
			stop()
			return nil, err
		}
		sweep = co.sweep
		prev := stop
		stop = func() { co.stop(); prev() }
	}
	js, err := jetstream.New(nc)
	if err != nil {
		stop()
		return nil, err
	}
	st, err := ensureStream(ctx, js, e, log)
	if err != nil {
		stop()
		return nil, err
	}
	app.api.Metrics().SetEvents(func(ctx context.Context) events.StreamState { return events.ReadStreamState(ctx, nc, st) })
	attrs := []any{"nats", where, "embedded", srv != nil, "stream", st.CachedInfo().Config.Name,
		"subjects", st.CachedInfo().Config.Subjects[0], "duplicate_window", time.Duration(e.EventsDupWindow), "auth", e.NATSAuth, "callout", e.NATSCalloutKey != ""}
	if len(relayed) > 0 {
		attrs = append(attrs, "relayed_from", strings.Join(relayed, ","))
	}
	if len(e.NATSNodeURLs) > 0 && (srv != nil && e.NATSAuth || e.NATSCalloutKey != "") {
		attrs = append(attrs, "node_urls", strings.Join(e.NATSNodeURLs, ","))
	}
	log.Info("events", attrs...)
	return func(ctx context.Context) error {
		defer stop()
		defer app.api.Metrics().SetEvents(nil)
		if sweep == nil {
			<-ctx.Done()
			return nil
		}
		// Revocation: a node whose lease lapsed or whose shards changed,
		// and a removed worker, are disconnected; a client that
		// reconnects gets its permissions of then.
		tick := time.NewTicker(natsSweepEvery)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-tick.C:
			case <-app.controller.PlanChanges():
			}
			sctx, cancel := context.WithTimeout(ctx, natsSweepTimeout)
			users, err := sweep(sctx)
			cancel()
			if err != nil {
				log.Warn("nats-auth: sweeping connections", "err", err, "disconnected", users)
			} else if len(users) > 0 {
				log.Info("nats-auth: disconnected clients whose permissions changed (lease lapsed, shards moved or worker removed)", "users", users)
			}
		}
	}, nil
}

// natsAuthorizer opens the credentials file beside the database: a node
// may connect while the controller has it live, with the shards of its
// range; workers with the tokens `dpxe workers add` made.
// natsSweepEvery is how often serve disconnects NATS clients whose
// permissions changed (and at once when the plan changes).
const natsSweepEvery = 2 * time.Second

// natsSweepTimeout bounds one sweep: on a cluster, listing the
// connections of every server and the kicks.
const natsSweepTimeout = 10 * time.Second

func natsAuthorizer(app *fleetApp, eventsApp string) (*natsauth.File, *natsauth.Authorizer, error) {
	f, err := natsauth.Open(filepath.Join(app.cfg.dataDir(), natsauth.FileName))
	if err != nil {
		return nil, nil, fmt.Errorf("nats-auth: %w", err)
	}
	ctl := app.controller
	// A node may publish for its range and for the shards it still holds
	// outside it until it releases them (controller.PublishShards).
	a, err := f.Authorizer(eventsApp, ctl.PublishShards)
	return f, a, err
}

// natsListen resolves the embedded server's listener: given, when
// --nats-listen (or nats_listen) names one; with netboot and --nats-auth,
// the boot interface's address on NATS's port, where nodes reach it, with
// loopback relayed to it for workers beside serve; else loopback only.
// Without --nats-auth the default stays on loopback: nodes get broker
// access only with it, and an open broker on the boot LAN would accept
// anyone there.
func natsListen(given string, auth bool, bootIP netip.Addr) (listen string, relay []string) {
	switch {
	case given != "":
		return given, nil
	case auth && bootIP.Is4():
		_, port, _ := net.SplitHostPort(embedded.DefaultListen)
		return net.JoinHostPort(bootIP.String(), port), []string{embedded.DefaultListen}
	default:
		return embedded.DefaultListen, nil
	}
}

// nodeNATSURLs are the broker URLs a node's check-in answer names: the
// embedded server's listener, or, when it listens on every interface
// (0.0.0.0 or ::), the IPv4 addresses of this machine's interfaces that are
// up (natsURLsOnHost).
func nodeNATSURLs(addr net.Addr, bootIP netip.Addr) []string {
	ta, ok := addr.(*net.TCPAddr)
	if !ok || ta == nil {
		return nil
	}
	port := uint16(ta.Port)
	if !ta.IP.IsUnspecified() {
		if ta.IP.To4() == nil {
			return nil // the kernel's client speaks IPv4 only
		}
		return []string{"nats://" + net.JoinHostPort(ta.IP.String(), strconv.Itoa(ta.Port))}
	}
	var up []netip.Addr
	ifs, _ := net.Interfaces()
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagUp == 0 {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(ipn.IP); ok {
					up = append(up, ip.Unmap())
				}
			}
		}
	}
	return natsURLsOnHost(port, bootIP, up)
}

// natsURLsOnHost orders the URLs of a broker listening on every interface
// for nodes, which try them in order: the boot interface's address first
// (bootIP, when netboot runs: the nodes are on that link), then the other
// IPv4 addresses as the interfaces list them, loopback last (a node skips
// it; a worker beside serve can use it). At most appliance.MaxNATSURLs.
func natsURLsOnHost(port uint16, bootIP netip.Addr, addrs []netip.Addr) []string {
	var urls, loop []string
	if bootIP.Is4() {
		urls = append(urls, "nats://"+netip.AddrPortFrom(bootIP, port).String())
	}
	for _, ip := range addrs {
		if !ip.Is4() || ip == bootIP {
			continue
		}
		u := "nats://" + netip.AddrPortFrom(ip, port).String()
		if ip.IsLoopback() {
			loop = append(loop, u)
		} else {
			urls = append(urls, u)
		}
	}
	urls = append(urls, loop...)
	if len(urls) > appliance.MaxNATSURLs {
		urls = urls[:appliance.MaxNATSURLs]
	}
	return urls
}

// natsUnreachable says why nodes on the boot network cannot reach a broker
// whose node URLs are urls ("" when one of them is not loopback): the
// embedded server listens on loopback only, the default, which suits
// workers beside serve but not kernel nodes.
func natsUnreachable(urls []string, listen string) string {
	if len(urls) == 0 {
		return "" // not an address a node could use at all; said apart
	}
	for _, u := range urls {
		host, _, err := net.SplitHostPort(strings.TrimPrefix(u, "nats://"))
		if ip, perr := netip.ParseAddr(host); err == nil && (perr != nil || !ip.IsLoopback()) {
			return ""
		}
	}
	return "the embedded NATS server listens on " + listen + ", which nodes cannot reach: they publish no events (give --nats-listen 0.0.0.0:4222, or the boot interface's address, to let them)"
}
