// Package embedded runs the NATS server with JetStream that `dpxe serve`
// embeds by default: a file store under the data directory, one client
// listener (loopback by default) with relays from more addresses to it,
// and in-process connections for the controller. It is apart
// from package events so that bots using the SDK do not link a server.
package embedded

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/discord-pxe/dpxe/internal/tcprelay"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Defaults of the embedded NATS server.
const (
	// DefaultListen is where `dpxe serve` lets workers connect: loopback,
	// NATS's registered port (with netboot and --nats-auth, serve listens
	// on the boot interface and relays this address to it).
	DefaultListen = "127.0.0.1:4222"
	// embeddedName names the server in INFO and in JetStream's metadata.
	embeddedName = "dpxe"
	// startTimeout bounds how long Start waits for the listener and
	// JetStream (the file store recovers its streams first).
	startTimeout = 30 * time.Second
	// embeddedMaxMemory bounds JetStream memory storage; the event stream
	// uses files, so this only serves what workers might add.
	embeddedMaxMemory = 64 << 20
	// tlsHandshakeTimeout bounds a client's TLS handshake (the server's
	// default is 2 s): a kernel node under QEMU's TCG checks the chain and
	// signs its key share in software, far slower than a Go client.
	tlsHandshakeTimeout = 15 * time.Second
)

// ErrServerConfig means the embedded server's settings are wrong; wrapped
// with the field at fault.
var ErrServerConfig = errors.New("embedded NATS server setting")

// ServerConfig configures the NATS server `dpxe serve` embeds.
type ServerConfig struct {
	// Listen is host:port of the client listener (port 0 picks one);
	// empty means no TCP listener, only in-process connections.
	Listen string
	// StoreDir is the JetStream file store's directory (created).
	StoreDir string
	// MaxPayload is the largest message a client may publish; it must
	// admit the stream's MaxMsgSize plus headers. 0 means
	// 8 MiB (the event stream's largest message plus room for headers).
	MaxPayload int32
	// Log receives the server's notices and errors; nil discards them.
	Log *slog.Logger
	// Relay lists more addresses (host:port, port 0 picks one) whose
	// connections are relayed byte for byte to the Listen address: the
	// server has one client listener, and `dpxe serve` puts it on the
	// boot interface and relays loopback to it. Needs Listen.
	Relay []string
	// Auth, if set, authenticates every client (user and password) and
	// sets its permissions; nil accepts every client with every
	// permission. In-process connections (Connect) always have every
	// permission.
	Auth Authorizer
	// TLS, if set, is the listener's TLS identity (Certificates), and
	// every client over TCP must speak TLS: INFO says tls_required and a
	// client that sends anything else is cut. Relayed connections are
	// joined byte for byte, so their clients speak TLS too. In-process
	// connections (Connect) need none.
	TLS *tls.Config
}

// Server is a running embedded NATS server with JetStream. Its methods are
// safe for concurrent use.
type Server struct {
	srv       *server.Server
	adminPass string // with Auth: Connect's password
	// relays join connections on ServerConfig.Relay's addresses byte for
	// byte to the listener (the NATS server has one client listener); the
	// server sees such a client as coming from the listener's address.
	relays []*tcprelay.Relay
}

// Start starts an embedded NATS server with JetStream on a file
// store and waits until it accepts connections.
func Start(cfg ServerConfig) (*Server, error) {
	if cfg.StoreDir == "" {
		return nil, fmt.Errorf("store_dir: empty: %w", ErrServerConfig)
	}
	if cfg.MaxPayload == 0 {
		cfg.MaxPayload = 8 << 20
	}
	if cfg.MaxPayload < 1024 || cfg.MaxPayload > 64<<20 {
		return nil, fmt.Errorf("max_payload %d: 1 KiB..64 MiB: %w", cfg.MaxPayload, ErrServerConfig)
	}
	opts := &server.Options{
		ServerName:         embeddedName,
		JetStream:          true,
		StoreDir:           cfg.StoreDir,
		JetStreamMaxMemory: embeddedMaxMemory,
		MaxPayload:         cfg.MaxPayload,
		NoSigs:             true, // dpxe serve owns the signals
	}
	if cfg.Listen == "" {
		if len(cfg.Relay) > 0 {
			return nil, fmt.Errorf("relay %q: needs a listen address: %w", cfg.Relay, ErrServerConfig)
		}
		opts.DontListen = true
	} else {
		host, port, err := net.SplitHostPort(cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("listen %q: %v: %w", cfg.Listen, err, ErrServerConfig)
		}
		p, err := strconv.ParseUint(port, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("listen %q: port: %w", cfg.Listen, ErrServerConfig)
		}
		if host == "" {
			return nil, fmt.Errorf("listen %q: name a host (0.0.0.0 for every interface): %w", cfg.Listen, ErrServerConfig)
		}
		opts.Host = host
		opts.Port = int(p)
		if p == 0 {
			opts.Port = server.RANDOM_PORT // 0 would mean 4222 to the server
		}
	}
	if cfg.TLS != nil {
		if cfg.Listen == "" {
			return nil, fmt.Errorf("tls: needs a listen address: %w", ErrServerConfig)
		}
		if len(cfg.TLS.Certificates) == 0 && cfg.TLS.GetCertificate == nil {
			return nil, fmt.Errorf("tls: no certificate: %w", ErrServerConfig)
		}
		opts.TLS = true
		opts.TLSConfig = cfg.TLS
		opts.TLSTimeout = tlsHandshakeTimeout.Seconds()
	}
	var adminPass string
	if cfg.Auth != nil {
		adminPass = newAdminPassword()
		opts.CustomClientAuthentication = &authAdapter{adminPass: adminPass, a: cfg.Auth}
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// A fatal error (such as a port in use) does not stop an embedded
	// server; the adapter reports it so Start fails at once.
	fatal := make(chan string, 1)
	srv.SetLoggerV2(slogAdapter{l: log, fatal: fatal}, false, false, false)
	srv.Start()
	deadline := time.Now().Add(startTimeout)
	for !srv.ReadyForConnections(100 * time.Millisecond) {
		select {
		case why := <-fatal:
			srv.Shutdown()
			return nil, fmt.Errorf("embedded NATS (listen %q, store %s): %s", cfg.Listen, cfg.StoreDir, why)
		default:
		}
		if time.Now().After(deadline) {
			srv.Shutdown()
			return nil, fmt.Errorf("embedded NATS: not ready after %v (listen %q, store %s)", startTimeout, cfg.Listen, cfg.StoreDir)
		}
	}
	if !srv.JetStreamEnabled() {
		srv.Shutdown()
		return nil, fmt.Errorf("embedded NATS: JetStream did not start (store %s)", cfg.StoreDir)
	}
	s := &Server{srv: srv, adminPass: adminPass}
	for _, addr := range cfg.Relay {
		r, err := tcprelay.Listen(addr)
		if err != nil {
			s.Shutdown()
			return nil, fmt.Errorf("embedded NATS: relay %s: %w", addr, err)
		}
		r.Serve(srv.Addr().String(), nil)
		s.relays = append(s.relays, r)
	}
	return s, nil
}

// RelayAddrs are the addresses relayed to the listener
// (ServerConfig.Relay, ports resolved), in the order given.
func (s *Server) RelayAddrs() []net.Addr {
	var out []net.Addr
	for _, r := range s.relays {
		out = append(out, r.Addr())
	}
	return out
}

// ClientURL is the URL of the TCP listener, or "" without one: nats://,
// or tls:// when ServerConfig.TLS is set.
func (s *Server) ClientURL() string {
	if s.srv.Addr() == nil {
		return ""
	}
	return s.srv.ClientURL()
}

// Addr is the TCP listener's address, or nil without one.
func (s *Server) Addr() net.Addr { return s.srv.Addr() }

// Connect opens an in-process client connection (no TCP) with opts.
func (s *Server) Connect(opts ...nats.Option) (*nats.Conn, error) {
	base := []nats.Option{nats.InProcessServer(s.srv)}
	if s.adminPass != "" {
		base = append(base, nats.UserInfo(adminUser, s.adminPass))
	}
	return nats.Connect("", append(base, opts...)...)
}

// Shutdown stops the server and waits until it has stopped; the file store
// is closed, so a new server on the same directory recovers the stream.
func (s *Server) Shutdown() {
	for _, r := range s.relays {
		r.Close()
	}
	s.srv.Shutdown()
	s.srv.WaitForShutdown()
}

// slogAdapter feeds the server's printf-style log into slog; its
// start-up banner (notices) goes to Debug, so `dpxe serve` logs one line.
type slogAdapter struct {
	l     *slog.Logger
	fatal chan<- string // the first fatal message, for Start
}

func (a slogAdapter) Noticef(f string, v ...any) { a.l.Debug(fmt.Sprintf(f, v...)) }
func (a slogAdapter) Warnf(f string, v ...any)   { a.l.Warn(fmt.Sprintf(f, v...)) }
func (a slogAdapter) Fatalf(f string, v ...any) {
	msg := fmt.Sprintf(f, v...)
	a.l.Error(msg)
	select {
	case a.fatal <- msg:
	default:
	}
}
func (a slogAdapter) Errorf(f string, v ...any) { a.l.Error(fmt.Sprintf(f, v...)) }
func (a slogAdapter) Debugf(f string, v ...any) { a.l.Debug(fmt.Sprintf(f, v...)) }
func (a slogAdapter) Tracef(f string, v ...any) {}
