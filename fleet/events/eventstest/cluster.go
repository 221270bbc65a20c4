// Package eventstest starts three-server NATS JetStream clusters on
// loopback for tests: embedded servers of the nats-server module in the
// test process, or separate nats-server processes (Debian's package,
// /usr/sbin/nats-server). Everything it starts stops when the test ends.
package eventstest

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/discord-pxe/dpxe/internal/freeport"
)

// readyTimeout bounds the wait for each server to accept clients.
const readyTimeout = 30 * time.Second

// DebianServer is where Debian's nats-server package installs the server.
const DebianServer = "/usr/sbin/nats-server"

// Cluster is three routed NATS servers with JetStream.
type Cluster struct {
	// Names are the servers' names (as JetStream reports a stream's
	// leader), URLs their client URLs, in the same order.
	Names, URLs []string
	stops       []func()
}

// ClientURLs is the comma-separated client URLs, for nats.Connect or
// `dpxe serve --nats-url`.
func (c *Cluster) ClientURLs() string { return strings.Join(c.URLs, ",") }

// Stop stops the server named name (killed, for processes) and reports
// whether there was one.
func (c *Cluster) Stop(name string) bool {
	for i, n := range c.Names {
		if n == name {
			c.stops[i]()
			return true
		}
	}
	return false
}

func routes(ports []int) []string {
	var r []string
	for _, p := range ports {
		r = append(r, fmt.Sprintf("nats://127.0.0.1:%d", p))
	}
	return r
}

// StartEmbedded starts the three servers in the test process, named
// prefix1..prefix3, each on its own file store.
func StartEmbedded(t testing.TB, prefix string) *Cluster {
	t.Helper()
	ports := freeport.Ports(t, 3)
	rs := strings.Join(routes(ports), ",")
	c := &Cluster{}
	var servers []*server.Server
	for i := range 3 {
		name := fmt.Sprintf("%s%d", prefix, i+1)
		s, err := server.NewServer(&server.Options{ServerName: name, Host: "127.0.0.1", Port: server.RANDOM_PORT,
			JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true,
			Cluster: server.ClusterOpts{Name: prefix, Host: "127.0.0.1", Port: ports[i]},
			Routes:  server.RoutesFromStr(rs)})
		if err != nil {
			t.Fatal(err)
		}
		s.Start()
		t.Cleanup(s.Shutdown)
		servers = append(servers, s)
		c.Names = append(c.Names, name)
		c.stops = append(c.stops, s.Shutdown)
	}
	for i, s := range servers {
		if !s.ReadyForConnections(readyTimeout) {
			t.Fatalf("cluster server %s not ready within %s (route ports %v)", c.Names[i], readyTimeout, ports)
		}
		c.URLs = append(c.URLs, s.ClientURL())
	}
	return c
}

// StartProcesses starts the three servers as processes of bin (a
// nats-server binary) with a config file each, client ports picked by the
// servers (read back from their ports files). It skips the test when bin
// is not there.
func StartProcesses(t testing.TB, bin, prefix string) *Cluster {
	t.Helper()
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("no %s (apt-get install nats-server): %v", bin, err)
	}
	return startProcesses(t, bin, prefix, procConfig{})
}

// procConfig is how startProcesses runs the servers; the zero value is on
// loopback, in the test's own network.
type procConfig struct {
	// extra is appended to each server's config file.
	extra string
	// host is the address the servers listen on (clients and routes);
	// "" is 127.0.0.1.
	host string
	// command makes a server's command (exec.Command if nil; a test's
	// network namespace runs them inside it).
	command func(name string, arg ...string) *exec.Cmd
	// ready are the options of the connection that waits for each
	// server's client listener (credentials, a dialer into a namespace).
	ready []nats.Option
}

// startProcesses starts three servers of bin as pc says.
func startProcesses(t testing.TB, bin, prefix string, pc procConfig) *Cluster {
	t.Helper()
	host := pc.host
	if host == "" {
		host = "127.0.0.1"
	}
	ports := freeport.Ports(t, 3) // free here; in a fresh namespace every port is
	var quoted []string
	for _, p := range ports {
		quoted = append(quoted, fmt.Sprintf(`"nats://%s:%d"`, host, p))
	}
	c := &Cluster{}
	var portsDirs []string
	for i := range 3 {
		name := fmt.Sprintf("%s%d", prefix, i+1)
		dir := t.TempDir()
		conf := fmt.Sprintf(`server_name: %q
listen: "%s:-1"
ports_file_dir: %q
jetstream { store_dir: %q }
cluster {
  name: %q
  listen: "%s:%d"
  routes: [%s]
}
%s`, name, host, dir, filepath.Join(dir, "js"), prefix, host, ports[i], strings.Join(quoted, ", "), pc.extra)
		path := filepath.Join(dir, "nats.conf")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		logf, err := os.Create(filepath.Join(dir, "server.log"))
		if err != nil {
			t.Fatal(err)
		}
		var cmd *exec.Cmd
		if pc.command != nil {
			cmd = pc.command(bin, "-c", path)
		} else {
			cmd = exec.Command(bin, "-c", path)
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { cmd.Wait(); logf.Close(); close(done) }()
		stop := func() {
			select {
			case <-done:
				return
			default:
			}
			cmd.Process.Kill()
			<-done
		}
		t.Cleanup(stop)
		c.Names = append(c.Names, name)
		c.stops = append(c.stops, stop)
		portsDirs = append(portsDirs, dir)
	}
	for i, dir := range portsDirs {
		u, err := clientURL(dir, pc.ready...)
		if err != nil {
			log, _ := os.ReadFile(filepath.Join(dir, "server.log"))
			t.Fatalf("nats-server %s: %v\n%s", c.Names[i], err, log)
		}
		c.URLs = append(c.URLs, u)
	}
	return c
}

// clientURL waits for a server's ports file in dir and for its client
// listener to accept a connection.
func clientURL(dir string, opts ...nats.Option) (string, error) {
	deadline := time.Now().Add(readyTimeout)
	for {
		matches, _ := filepath.Glob(filepath.Join(dir, "*.ports"))
		if len(matches) == 1 {
			var pf struct {
				Nats []string `json:"nats"`
			}
			if b, err := os.ReadFile(matches[0]); err == nil && json.Unmarshal(b, &pf) == nil && len(pf.Nats) > 0 {
				if nc, err := nats.Connect(pf.Nats[0], append([]nats.Option{nats.MaxReconnects(0)}, opts...)...); err == nil {
					nc.Close()
					return pf.Nats[0], nil
				}
			}
		}
		if time.Now().After(deadline) {
			return "", errors.New("no client listener within " + readyTimeout.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
