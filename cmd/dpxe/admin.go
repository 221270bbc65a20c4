package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/discord-pxe/dpxe/fleet/store"
	"github.com/discord-pxe/dpxe/web"
)

func init() {
	register(&command{
		name:    "admin",
		summary: "operator settings: `admin passwd` sets the dashboard password",
		run:     runAdmin,
	})
}

// maxPasswordLen bounds a dashboard password read from standard input.
const maxPasswordLen = 1024

func runAdmin(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "passwd" {
		return fmt.Errorf("%w: want `dpxe admin passwd [--db FILE] [--clear]`", errUsage)
	}
	fs := newFlagSet("admin passwd", "[--db FILE] [--clear]")
	dbPath := fs.String("db", defaultDBPath, "SQLite inventory file of dpxe serve (it may be running)")
	clearIt := fs.Bool("clear", false, "remove the password; only the admin token logs in afterwards")
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q (the password is read from standard input)", errUsage, fs.Arg(0))
	}
	// Refuse to create a database at a mistyped path.
	if _, err := os.Stat(*dbPath); err != nil {
		return fmt.Errorf("inventory %s: %w (run `dpxe serve` once, or pass --db)", *dbPath, err)
	}
	st, err := store.Open(ctx, *dbPath)
	if err != nil {
		return err
	}
	defer st.Close()
	if *clearIt {
		if err := web.ClearPassword(ctx, st); err != nil {
			return err
		}
		fmt.Fprintln(os.Stderr, "dashboard password removed; log in with the admin token")
		return nil
	}
	pw, err := readPassword(os.Stdin, os.Stderr)
	if err != nil {
		return err
	}
	if err := web.SetPassword(ctx, st, pw); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	fmt.Fprintln(os.Stderr, "dashboard password set; it works at the next login, no restart needed")
	return nil
}

// readPassword reads the new password: from a terminal twice with echo
// off, otherwise as the first line of in.
func readPassword(in *os.File, prompt io.Writer) (string, error) {
	fd := int(in.Fd())
	term, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil { // not a terminal: a pipe or a file
		line, err := bufio.NewReader(io.LimitReader(in, maxPasswordLen+1)).ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return "", err
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			return "", fmt.Errorf("%w: no password on standard input", errUsage)
		}
		return line, nil
	}
	quiet := *term
	quiet.Lflag &^= unix.ECHO
	quiet.Lflag |= unix.ICANON
	if err := unix.IoctlSetTermios(fd, unix.TCSETS, &quiet); err != nil {
		return "", err
	}
	defer unix.IoctlSetTermios(fd, unix.TCSETS, term)
	r := bufio.NewReader(in)
	ask := func(p string) (string, error) {
		fmt.Fprint(prompt, p)
		s, err := r.ReadString('\n')
		fmt.Fprintln(prompt)
		return strings.TrimRight(s, "\r\n"), err
	}
	a, err := ask("new dashboard password: ")
	if err != nil {
		return "", err
	}
	b, err := ask("again: ")
	if err != nil {
		return "", err
	}
	if a != b {
		return "", fmt.Errorf("%w: the two passwords differ", errUsage)
	}
	return a, nil
}
