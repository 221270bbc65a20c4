// Command dpxe-lab is `make run`: the whole Discord-PXE system live on one
// machine (see package tools/lab and docs/lab.md). It starts the lab,
// prints where everything is, prints a readiness table whenever something
// changes, and tears the lab down on Ctrl-C.
//
// Usage:
//
//	dpxe-lab [-nodes 3] [-shards 16] [-max-concurrency 1] [-firmware mixed]
//	         [-listen 127.0.0.1:8080] [-simulate] [-for DURATION]
//	         [-message-rate N] [-ping-every N] [-pingbot bin/pingbot] [-nats-auth]
//	dpxe-lab -clean     remove what a crashed lab left behind, then exit
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/discord-pxe/dpxe/tools/lab"
)

func main() {
	os.Exit(run())
}

func run() int {
	var cfg lab.Config
	fs := flag.NewFlagSet("dpxe-lab", flag.ContinueOnError)
	fs.StringVar(&cfg.Root, "root", ".", "repository root (out/, bin/, var/ are under it)")
	fs.IntVar(&cfg.Nodes, "nodes", 3, "nodes to boot")
	fs.IntVar(&cfg.Shards, "shards", 16, "total shards")
	fs.IntVar(&cfg.MaxConcurrency, "max-concurrency", 1, "Discord max_concurrency (Identify buckets)")
	fs.StringVar(&cfg.Firmware, "firmware", lab.FirmwareMixed, "bios (SeaBIOS+e1000), uefi (OVMF+virtio-net) or mixed")
	fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:8080", "host address of the dashboard and API")
	fs.StringVar(&cfg.GatewayListen, "gateway-listen", "127.0.0.1:7878", "host address of the Gateway emulator")
	fs.BoolVar(&cfg.Simulate, "simulate", false, "simulated nodes over HTTP even where QEMU nodes could boot")
	fs.Float64Var(&cfg.MessageRate, "message-rate", 0, "the emulator's synthetic MESSAGE_CREATEs per second per session (0: none)")
	fs.IntVar(&cfg.PingEvery, "ping-every", 0, "every N-th synthetic guild message is a \"!ping\" (0: none)")
	fs.BoolVar(&cfg.NATSAuth, "nats-auth", false, "dpxe serve --nats-auth: nodes, pingbot and the CLI connect to NATS with credentials (QEMU nodes publish events only with it)")
	fs.StringVar(&cfg.Pingbot, "pingbot", "", "the examples/pingbot binary to run against the fleet's events (\"\": none)")
	fs.BoolVar(&cfg.Plain, "plain", false, "no TLS (make run TLS=0): the emulator on http:// and ws://, nodes checking in over http://; by default wss://, https:// and pinned check-ins")
	runFor := fs.Duration("for", 0, "stop by itself after this long (0: until Ctrl-C)")
	clean := fs.Bool("clean", false, "only remove what a crashed lab left behind")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *clean {
		did, err := lab.CleanLeftovers(context.Background(), filepath.Join(cfg.Root, "var", "lab"))
		for _, d := range did {
			fmt.Println("dpxe-lab:", d)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "dpxe-lab:", err)
			return 1
		}
		if len(did) == 0 {
			fmt.Println("dpxe-lab: nothing left behind")
		}
		return 0
	}

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-sigs
		cancel()
		for range sigs {
			fmt.Fprintln(os.Stderr, "\ndpxe-lab: tearing down, one moment")
		}
	}()

	started := time.Now()
	l, err := lab.Start(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dpxe-lab:", err)
		return 1
	}
	code := 0
	if err := serve(ctx, l, started, *runFor); err != nil {
		fmt.Fprintln(os.Stderr, "dpxe-lab:", err)
		code = 1
	}
	if l.Mode == lab.ModeNetns {
		fmt.Println("\ndpxe-lab: stopping the nodes, dpxe serve and the emulator; removing the namespace")
	} else {
		fmt.Println("\ndpxe-lab: stopping the simulated nodes, dpxe serve and the emulator")
	}
	if err := l.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "dpxe-lab:", err)
		return 1
	}
	fmt.Println("dpxe-lab: stopped; nothing the lab created is left (the database and logs stay in", l.Config().Var+")")
	return code
}

// serve prints the banner and the readiness table until ctx ends.
func serve(ctx context.Context, l *lab.Lab, started time.Time, runFor time.Duration) error {
	cfg := l.Config()
	rel := func(p string) string {
		if r, err := filepath.Rel(mustWd(), p); err == nil && !strings.HasPrefix(r, "..") {
			return r
		}
		return p
	}
	dpxe := rel(cfg.DPXE)
	flags := " --token-file " + rel(l.TokenFile)
	if l.URL != "http://127.0.0.1:8080" {
		flags += " --server " + l.URL
	}
	link := loginLine(ctx, l)
	var b strings.Builder
	fmt.Fprintf(&b, "\n  Discord-PXE lab is up (%s after start).\n\n", time.Since(started).Round(100*time.Millisecond))
	if l.Mode == lab.ModeNetns {
		fmt.Fprintf(&b, "  %d QEMU nodes PXE-boot from dpxe serve in network namespace %s (bridge 10.213.0.1/24).\n", cfg.Nodes, l.Netns())
	} else {
		fmt.Fprintf(&b, "  SIMULATED: %d nodes named sim-N check in over HTTP from this process (no QEMU).\n", cfg.Nodes)
		if l.Why != "" {
			fmt.Fprintf(&b, "  Why: %s.\n", l.Why)
		}
	}
	example := "lab-2"
	if l.Mode != lab.ModeNetns {
		example = "sim-2"
	}
	if cfg.Nodes < 2 {
		example = example[:len(example)-1] + "1"
	}
	fmt.Fprintf(&b, "\n  Dashboard      %s/\n", l.URL)
	fmt.Fprintf(&b, "  Log in         %s\n", link)
	fmt.Fprintf(&b, "  Gateway emu    %s/debug/state (its record: sessions, Identifies, violations)\n", l.GatewayURL)
	if l.CAFile != "" {
		fmt.Fprintf(&b, "  Gateway CA     %s (wss:// and https://; curl --cacert it; TLS=0 for a plain lab)\n", l.CAFile)
	}
	fmt.Fprintf(&b, "\n  From another terminal in %s:\n", mustWd())
	line := func(what, cmd string) { fmt.Fprintf(&b, "    %-18s %s %s%s\n", what, dpxe, cmd, flags) }
	line("the fleet", "nodes")
	line("drain a node", "drain "+example)
	line("take it back", "undrain "+example)
	if l.Mode == lab.ModeNetns {
		line("its boot timeline", "nodes show "+example)
		line("machines seen", "nodes machines")
	}
	line("a new login link", "login-link")
	fmt.Fprintf(&b, "\n  Here: type a + Enter to boot one more node, s + Enter for the table, Ctrl-C to stop and clean up.\n")
	fmt.Fprintf(&b, "\n  Logs           %s (dpxe serve), %s (emulator)\n", rel(filepath.Join(cfg.Var, "serve.log")), rel(filepath.Join(cfg.Var, "gateway.log")))
	if l.Pingbot {
		fmt.Fprintf(&b, "  pingbot        %s (answers every \"!ping\"; the table counts its replies)\n", rel(filepath.Join(cfg.Var, "pingbot.log")))
	}
	if l.Mode == lab.ModeNetns {
		fmt.Fprintf(&b, "  Consoles       %s (tail -f one to watch a node boot)\n", rel(filepath.Join(cfg.Var, "nodes", "NODE", "console.log")))
	}
	fmt.Fprintf(&b, "  Admin token    %s\n\n", rel(l.TokenFile))
	fmt.Print(b.String())

	cmds := make(chan string)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			cmds <- strings.TrimSpace(sc.Text())
		}
	}()
	var deadline <-chan time.Time
	if runFor > 0 {
		deadline = time.After(runFor)
	}
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	last := ""
	warned := map[string]bool{}
	show := func(force bool) {
		rep, err := l.Status(ctx)
		if err != nil {
			if ctx.Err() == nil {
				fmt.Println("dpxe-lab: status:", err)
			}
			return
		}
		var sb strings.Builder
		rep.Print(&sb)
		if force || sb.String() != last {
			last = sb.String()
			fmt.Printf("%s\n%s\n", time.Now().Format("15:04:05"), sb.String())
		}
		for _, n := range rep.Nodes {
			if (n.KernelIP != "" || n.Banner) && !n.CheckedIn && time.Since(n.Since) > 90*time.Second && !warned[n.Name] {
				warned[n.Name] = true
				fmt.Printf("dpxe-lab: %s booted the kernel 90 s ago and has not checked in with the controller;\n"+
					"          its console says why: %s\n", n.Name, rel(filepath.Join(cfg.Var, "nodes", n.Name, "console.log")))
			}
		}
	}
	show(true)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-deadline:
			show(true)
			return nil
		case <-tick.C:
			show(false)
		case c := <-cmds:
			switch c {
			case "a":
				if n, err := l.AddNode(ctx); err != nil {
					fmt.Println("dpxe-lab: adding a node:", err)
				} else {
					fmt.Printf("dpxe-lab: added %s\n", n.Name)
				}
			case "s":
				show(true)
			case "l":
				fmt.Println("  Log in:", loginLine(ctx, l))
			case "":
			default:
				fmt.Println("dpxe-lab: a = add a node, s = status table, l = new login link, Ctrl-C = stop")
			}
		}
	}
}

// loginLine is the one-time login link, or how to log in without one.
func loginLine(ctx context.Context, l *lab.Lab) string {
	u, exp, err := l.LoginLink(ctx)
	if err != nil {
		return fmt.Sprintf("with the admin token in %s (no one-time link: %v)", l.TokenFile, err)
	}
	return fmt.Sprintf("%s  (one-time link, valid until %s)", u, exp.Local().Format("15:04:05"))
}

func mustWd() string {
	wd, err := os.Getwd()
	if err != nil {
		return "."
	}
	return wd
}
