// Command dpxe is the one command-line tool of Discord-PXE: it builds boot
// images, serves the fleet (DHCP, TFTP, HTTP boot, controller API, dashboard),
// personalises and flashes USB media, and talks to a running controller.
//
// Each subcommand lives in its own file in this package and registers itself
// from an init function, so adding a command never touches this file.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

// command is one `dpxe NAME ...` subcommand.
type command struct {
	name    string // what the operator types
	summary string // one line for `dpxe help`
	// run executes the command with the arguments after its name. It
	// returns errUsage (possibly wrapped) when the arguments are wrong.
	run func(ctx context.Context, args []string) error
}

// errUsage marks an error caused by bad arguments; main prints it and exits 2.
var errUsage = errors.New("usage")

var commands = map[string]*command{}

// register adds c to the command table; it panics on a duplicate name, which
// is a programming error caught by any test that imports this package.
func register(c *command) {
	if _, dup := commands[c.name]; dup {
		panic("dpxe: duplicate command " + c.name)
	}
	commands[c.name] = c
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: dpxe COMMAND [flags] [args]")
	fmt.Fprintln(os.Stderr, "\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	width := 0
	for _, n := range names {
		width = max(width, len(n))
	}
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-*s  %s\n", width, n, commands[n].summary)
	}
	fmt.Fprintln(os.Stderr, "\nrun 'dpxe help COMMAND' for a command's flags (all of them: docs/commands.md)")
}

func main() {
	os.Exit(run(os.Args[1:]))
}

// run is main without os.Exit, so tests can call it.
func run(args []string) int {
	if len(args) == 2 && args[0] == "help" {
		return runHelp(args[1])
	}
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage()
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(os.Stderr, "dpxe: unknown command %q\n", args[0])
		usage()
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := c.run(ctx, args[1:])
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintf(os.Stderr, "dpxe %s: %v\n", c.name, err)
		return 2
	default:
		fmt.Fprintf(os.Stderr, "dpxe %s: %v\n", c.name, err)
		return 1
	}
}

// newFlagSet returns a flag set for a subcommand that reports errors instead
// of exiting, so run can map them to exit codes.
func newFlagSet(name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet("dpxe "+name, flag.ContinueOnError)
	if usageOut != nil {
		fs.SetOutput(usageOut)
	}
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: dpxe %s %s\n", name, synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args with fs and wraps a parse error as a usage error.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := parseFlagsOnce(fs, args); err != nil {
		return err
	}
	if flagsOnly {
		return errFlagsOnly
	}
	return nil
}

func parseFlagsOnce(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	return nil
}

// parseInterspersed parses flags that may come before, between or after
// positional arguments (`dpxe nodes show NAME --server URL`) and returns the
// positional arguments in order. "--" ends flag parsing.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parseFlagsOnce(fs, args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 || args[0] == "--" {
			if len(args) > 0 {
				pos = append(pos, args[1:]...)
			}
			if flagsOnly {
				return nil, errFlagsOnly
			}
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}
