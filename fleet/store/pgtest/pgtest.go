// Package pgtest runs a throw-away PostgreSQL server for tests: Debian's
// postgresql binaries (/usr/lib/postgresql/N/bin), a cluster made by
// initdb in a temporary directory, a postgres process on a free loopback
// port and a Unix socket in that directory, stopped and removed by Stop.
// As root the server runs as the postgres user (initdb refuses root).
//
// Tests get a fresh database each from one shared server per test binary:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }
//	...
//	dsn := pgtest.DB(t) // postgres://postgres@127.0.0.1:PORT/dpxe_3?sslmode=disable
//
// Where PostgreSQL is not installed, DB skips the test and says how to
// install it; any other failure to start fails the test.
package pgtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/discord-pxe/dpxe/internal/freeport"
)

// ErrNotInstalled is returned by Start when no PostgreSQL server binaries
// are found.
var ErrNotInstalled = errors.New("pgtest: PostgreSQL is not installed (apt-get install postgresql, or tools/scripts/deps.sh test)")

// startTimeout bounds initdb plus the server's start on a busy machine.
const startTimeout = 60 * time.Second

// stopTimeout is how long Stop waits for a fast shutdown before killing.
const stopTimeout = 15 * time.Second

// Server is one running PostgreSQL server.
type Server struct {
	dir  string // holds data/, the socket and server.log
	port int
	cmd  *exec.Cmd
	done chan struct{} // closed when the server process has exited
	seq  atomic.Int64  // databases created
}

// binDir returns the directory of the newest installed server's binaries.
func binDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi > vj
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", ErrNotInstalled
}

// asServerUser makes cmd run as the postgres user when we are root.
func asServerUser(cmd *exec.Cmd, cred *syscall.Credential) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// Start makes a cluster in a new temporary directory and starts its server
// on a free loopback port; it returns when the server accepts connections.
func Start(ctx context.Context) (*Server, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "dpxe-pgtest-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	s := &Server{dir: dir, done: make(chan struct{})}
	ok := false
	defer func() {
		if !ok {
			s.Stop()
		}
	}()
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("pgtest: running as root needs the postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, fmt.Errorf("pgtest: %w", err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	data := filepath.Join(dir, "data")
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres",
		"--auth=trust", "--encoding=UTF8", "--no-locale", "--no-sync")
	asServerUser(initdb, cred)
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pgtest: initdb: %w\n%s", err, out)
	}
	if s.port, err = freeport.Get(); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "server.log"))
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	defer logf.Close()
	// Durability is not under test here: fsync off keeps the suite fast on
	// a shared machine.
	s.cmd = exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-p", strconv.Itoa(s.port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="+dir,
		"-c", "fsync=off", "-c", "full_page_writes=off", "-c", "max_connections=200")
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	asServerUser(s.cmd, cred)
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("pgtest: starting postgres: %w", err)
	}
	go func() { s.cmd.Wait(); close(s.done) }()
	if err := s.waitReady(ctx); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "server.log"))
		return nil, fmt.Errorf("pgtest: %w\nserver log:\n%s", err, log)
	}
	ok = true
	return s, nil
}

// URL returns the address of database name on s.
func (s *Server) URL(name string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, name)
}

// SocketURL returns the address of database name on s through the
// server's Unix socket: for a client in another network namespace, which
// shares the file system but not the loopback address.
func (s *Server) SocketURL(name string) string {
	return fmt.Sprintf("postgres://postgres@/%s?host=%s&port=%d&sslmode=disable", name, s.dir, s.port)
}

// waitReady polls until the server answers a query, it exits, or ctx ends.
func (s *Server) waitReady(ctx context.Context) error {
	db, err := sql.Open("pgx", s.URL("postgres"))
	if err != nil {
		return err
	}
	defer db.Close()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := db.PingContext(pctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-s.done:
			return fmt.Errorf("postgres exited while starting: %v", s.cmd.ProcessState)
		case <-ctx.Done():
			return fmt.Errorf("postgres not ready: %w (last: %v)", ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// NewDatabase creates an empty database and returns its URL.
func (s *Server) NewDatabase(ctx context.Context) (string, error) {
	name := fmt.Sprintf("dpxe_%d", s.seq.Add(1))
	db, err := sql.Open("pgx", s.URL("postgres"))
	if err != nil {
		return "", err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		return "", fmt.Errorf("pgtest: create database %s: %w", name, err)
	}
	return s.URL(name), nil
}

// Stop shuts the server down (fast shutdown, then SIGKILL) and removes its
// directory.
func (s *Server) Stop() error {
	var err error
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Signal(syscall.SIGINT) // fast shutdown
		select {
		case <-s.done:
		case <-time.After(stopTimeout):
			s.cmd.Process.Kill()
			<-s.done
			err = errors.New("pgtest: postgres ignored a fast shutdown; killed")
		}
	}
	if rerr := os.RemoveAll(s.dir); rerr != nil && err == nil {
		err = fmt.Errorf("pgtest: %w", rerr)
	}
	return err
}

// The server shared by one test binary.
var shared struct {
	sync.Mutex
	srv *Server
	err error
}

// DB returns the URL of a new, empty database on the test binary's shared
// server, starting it on first use. Without PostgreSQL installed it skips
// t; a server that is installed but does not start fails t. Call Run from
// TestMain so the server is stopped at the end.
func DB(t testing.TB) string {
	t.Helper()
	shared.Lock()
	if shared.srv == nil && shared.err == nil {
		shared.srv, shared.err = Start(context.Background())
	}
	srv, err := shared.srv, shared.err
	shared.Unlock()
	if errors.Is(err, ErrNotInstalled) {
		t.Skipf("skipping the PostgreSQL run: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	dsn, err := srv.NewDatabase(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return dsn
}

// Run runs the tests and then stops the shared server, if one started. A
// failure to stop it cleanly fails the run.
func Run(m *testing.M) int {
	code := m.Run()
	shared.Lock()
	defer shared.Unlock()
	if shared.srv != nil {
		if err := shared.srv.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			if code == 0 {
				code = 1
			}
		}
		shared.srv = nil
	}
	return code
}

// Backend is one database a test suite runs on: a name for t.Run and a
// function that returns a new, empty database's name for store.Open (a
// SQLite file path or a PostgreSQL URL).
type Backend struct {
	Name  string
	NewDB func(t testing.TB) string
}

// Backends lists SQLite (a file in t.TempDir) and PostgreSQL (DB).
var Backends = []Backend{
	{"sqlite", func(t testing.TB) string { return filepath.Join(t.TempDir(), "sub", "dpxe.db") }},
	{"postgres", DB},
}

// Each runs f as a subtest on every backend.
func Each(t *testing.T, f func(t *testing.T, dsn string)) {
	for _, b := range Backends {
		t.Run(b.Name, func(t *testing.T) { f(t, b.NewDB(t)) })
	}
}
