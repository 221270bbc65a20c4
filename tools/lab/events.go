package lab

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"

	"github.com/nats-io/nats.go"

	"github.com/discord-pxe/dpxe/fleet/events"
	"github.com/discord-pxe/dpxe/fleet/events/natsauth"
)

// Event delivery in the lab: `dpxe serve` runs its embedded NATS server,
// named in its "events" log line. With simulated nodes it listens on a
// loopback port of its own and each simulated node publishes every
// dispatch it receives from the emulator through an events.Publisher. In
// the namespace it listens on the bridge and loopback (serve's default), the
// QEMU nodes publish to it with the node credentials their check-in
// answers carry (so only with --nats-auth), and the lab relays it to a
// host port for pingbot and the operator.

// natsLineRE finds the NATS address in serve's log.
var natsLineRE = regexp.MustCompile(`msg=events part=events nats=(nats://\S+)`)

// labEventsApp is the app name of the lab's bot in subjects.
const labEventsApp = "bot"

// connectEvents connects the lab to the NATS server serve reported, at
// hostURL when it is relayed to the host (netns mode) or where serve
// said; a serve without event delivery leaves NATSURL empty and the
// nodes publish nothing.
func (l *Lab) connectEvents(hostURL string) error {
	m := natsLineRE.FindStringSubmatch(readFile(filepath.Join(l.cfg.Var, "serve.log")))
	if m == nil {
		l.logf("dpxe serve reports no NATS server: the nodes publish no events")
		return nil
	}
	url := m[1]
	if hostURL != "" {
		url = hostURL
	}
	if l.cfg.NATSAuth {
		// serve created the credentials file beside its database; the
		// simulated nodes derive their passwords from it as the
		// controller does for kernel nodes, and the operator gets a
		// worker of their own for the CLI.
		f, err := natsauth.Open(filepath.Join(l.cfg.Var, natsauth.FileName))
		if err != nil {
			return fmt.Errorf("lab: %w", err)
		}
		tokFile, err := l.addWorker(f, "operator")
		if err != nil {
			return err
		}
		l.mu.Lock()
		l.NATSURL, l.auth = url, f
		l.mu.Unlock()
		who := "simulated nodes publish"
		if l.Mode == ModeNetns {
			who = fmt.Sprintf("QEMU nodes publish to nats://%s:%d (named in their check-in answers), relayed to the host at %s", l.cfg.Subnet.Addr(), natsNetnsPort, url)
		}
		l.logf("events: %s with node credentials (dpxe events tail --nats-url %s --nats-user %soperator --nats-password-file %s)",
			who, url, natsauth.WorkerPrefix, tokFile)
		return nil
	}
	if l.Mode == ModeNetns {
		// Check-in answers carry broker access only from serve
		// --nats-auth: without it the kernel nodes publish nothing.
		l.mu.Lock()
		l.NATSURL = url
		l.mu.Unlock()
		l.logf("events: without NATS_AUTH=1 the QEMU nodes get no broker access and publish no events (dpxe events tail --nats-url %s)", url)
		return nil
	}
	nc, err := nats.Connect(url, nats.Name("dpxe lab"), nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("lab: NATS at %s: %w", url, err)
	}
	l.mu.Lock()
	l.NATSURL, l.nc = url, nc
	l.mu.Unlock()
	l.logf("events: simulated nodes publish to %s (dpxe events tail --nats-url %s)", url, url)
	return nil
}

// simPublisher is node's Publisher, nil without event delivery.
func (l *Lab) simPublisher(node string) (*events.Publisher, error) {
	l.mu.Lock()
	nc := l.nc
	l.mu.Unlock()
	if nc == nil {
		return nil, nil
	}
	return events.NewPublisher(nc, events.PublisherConfig{App: labEventsApp, Node: node})
}

// closeEvents closes the lab's NATS connection (after the nodes stopped).
func (l *Lab) closeEvents() {
	l.mu.Lock()
	nc := l.nc
	l.nc = nil
	l.mu.Unlock()
	if nc != nil {
		nc.Close()
	}
}

// startPingbot runs examples/pingbot (Config.Pingbot) against serve's
// NATS server and the emulator's REST API with the lab's bot token; its
// log is pingbot.log, its replies are in the emulator's record and the
// lab's table.
func (l *Lab) startPingbot() error {
	if l.cfg.Pingbot == "" {
		return nil
	}
	if l.NATSURL == "" {
		l.logf("pingbot not started: no event delivery")
		return nil
	}
	if _, err := os.Stat(l.cfg.Pingbot); err != nil {
		l.logf("pingbot not started: %v (tools/scripts/run.sh builds it)", err)
		return nil
	}
	args := []string{l.cfg.Pingbot, "-nats-url", l.NATSURL, "-app", labEventsApp,
		"-api", l.GatewayURL + "/api/v10", "-token-file", filepath.Join(l.cfg.Var, "bot.token")}
	if l.CAFile != "" {
		args = append(args, "-ca-file", l.CAFile) // the emulator's REST is https:// with the lab's CA
	}
	l.mu.Lock()
	auth := l.auth
	l.mu.Unlock()
	if auth != nil {
		tokFile, err := l.addWorker(auth, "pingbot")
		if err != nil {
			return err
		}
		args = append(args, "-nats-user", natsauth.WorkerPrefix+"pingbot", "-nats-password-file", tokFile)
	}
	_, err := l.start("pingbot", "pingbot.log", nil, args...)
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.Pingbot = true
	l.mu.Unlock()
	l.logf("pingbot answers \"!ping\" through %s/api/v10 (log: %s)", l.GatewayURL, filepath.Join(l.cfg.Var, "pingbot.log"))
	return nil
}

// addWorker creates worker name in the credentials file (as `dpxe
// workers add` does) and writes its password to worker-<name>.token in
// the lab's var directory.
func (l *Lab) addWorker(f *natsauth.File, name string) (string, error) {
	tok, err := f.AddWorker(name)
	if err != nil {
		return "", fmt.Errorf("lab: worker %s: %w", name, err)
	}
	path := filepath.Join(l.cfg.Var, "worker-"+name+".token")
	if err := os.WriteFile(path, []byte(tok+"\n"), 0o600); err != nil {
		return "", err
	}
	return path, nil
}
