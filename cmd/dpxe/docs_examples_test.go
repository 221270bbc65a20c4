package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The docs examples test (issue 23.9): every dpxe command line in a fenced
// block of README.md or docs/*.md marked as shell (```sh, ```shell,
// ```bash, ```console) is parsed against the real flag sets, and every
// block marked ```json dpxe-serve-config is loaded as a `dpxe serve
// --config` file. Synopses with [optional] parts belong in unmarked or
// ```text blocks, which are not checked.

// shellInfo are the fence info strings of runnable shell examples.
var shellInfo = map[string]bool{"sh": true, "shell": true, "bash": true, "console": true}

// docExample is one command line or config block of a doc.
type docExample struct {
	file string
	line int
	info string
	text string
}

// docExamples returns the fenced examples of README.md and docs/*.md.
func docExamples(t *testing.T) []docExample {
	t.Helper()
	root := filepath.Join("..", "..")
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append([]string{filepath.Join(root, "README.md")}, files...)
	var out []docExample
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		var cur *docExample
		for i, l := range strings.Split(string(b), "\n") {
			trimmed := strings.TrimSpace(l)
			if strings.HasPrefix(trimmed, "```") {
				if cur == nil {
					cur = &docExample{file: rel, line: i + 2, info: strings.TrimSpace(strings.TrimPrefix(trimmed, "```"))}
				} else {
					out = append(out, *cur)
					cur = nil
				}
				continue
			}
			if cur != nil {
				cur.text += l + "\n"
			}
		}
	}
	return out
}

// shellWords splits one shell line into words and the operators && || ; |
// (each its own word), honouring quotes and backslashes and dropping an
// unquoted # comment. It is just enough shell for documentation.
func shellWords(line string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	flush := func() {
		if inWord {
			words = append(words, cur.String())
			cur.Reset()
			inWord = false
		}
	}
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '\'' || c == '"':
			j := strings.IndexByte(line[i+1:], c)
			if j < 0 {
				return nil, fmt.Errorf("unclosed %c", c)
			}
			cur.WriteString(line[i+1 : i+1+j])
			inWord = true
			i += j + 1
		case c == '\\' && i+1 < len(line):
			cur.WriteByte(line[i+1])
			inWord = true
			i++
		case c == ' ' || c == '\t':
			flush()
		case c == '#' && !inWord:
			flush()
			return words, nil
		case c == '&' || c == '|' || c == ';':
			flush()
			op := string(c)
			if i+1 < len(line) && line[i+1] == c && c != ';' {
				op += string(c)
				i++
			}
			words = append(words, op)
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	flush()
	return words, nil
}

// dpxeCommands returns the dpxe invocations of a shell block: continuation
// lines joined, prompts and sudo and VAR=value prefixes dropped, pipelines
// and lists split. In a console block only "$ " lines are commands.
func dpxeCommands(ex docExample) ([][]string, error) {
	var lines []string
	pending := ""
	for _, l := range strings.Split(ex.text, "\n") {
		if ex.info == "console" {
			if !strings.HasPrefix(strings.TrimSpace(l), "$ ") && pending == "" {
				continue
			}
		}
		l = strings.TrimPrefix(strings.TrimSpace(l), "$ ")
		if strings.HasSuffix(l, "\\") {
			pending += strings.TrimSuffix(l, "\\") + " "
			continue
		}
		lines = append(lines, pending+l)
		pending = ""
	}
	var out [][]string
	for _, l := range lines {
		words, err := shellWords(l)
		if err != nil {
			return nil, err
		}
		var cmd []string
		emit := func() {
			for len(cmd) > 0 && (cmd[0] == "sudo" || (strings.Contains(cmd[0], "=") && !strings.HasPrefix(cmd[0], "-"))) {
				cmd = cmd[1:]
			}
			if len(cmd) > 0 && (cmd[0] == "dpxe" || strings.HasSuffix(cmd[0], "/dpxe")) {
				out = append(out, cmd[1:])
			}
			cmd = nil
		}
		for _, w := range words {
			switch w {
			case "&&", "||", ";", "|", "&":
				emit()
			default:
				cmd = append(cmd, w)
			}
		}
		emit()
	}
	return out, nil
}

// clientCommands talk to a running controller through clientFlags.
var clientCommands = map[string]bool{"drain": true, "undrain": true, "route": true, "restart-fatal": true, "login-link": true, "nodes": true}

// checkDocCommand parses one documented dpxe command line against the real
// flag sets: `dpxe serve` through all of its start-up checks, the others
// up to the end of their flags.
func checkDocCommand(args []string) error {
	if len(args) == 0 {
		return errors.New("dpxe without a command")
	}
	name := args[0]
	if name == "help" {
		return nil
	}
	c, ok := commands[name]
	if !ok {
		return fmt.Errorf("unknown command %q", name)
	}
	if name == "serve" {
		usageOut = io.Discard
		defer func() { usageOut = nil }()
		_, err := parseServeFlags(args[1:])
		if errors.Is(err, iofs.ErrNotExist) {
			return nil // a --config file of the reader's own
		}
		return err
	}
	// Client commands check their arguments too and stop where they would
	// reach the controller; the others stop after their flags.
	usageOut = io.Discard
	if clientCommands[name] {
		stopAtClient = true
	} else {
		flagsOnly = true
	}
	defer func() { flagsOnly, stopAtClient, usageOut = false, false, nil }()
	err := c.run(context.Background(), args[1:])
	if errors.Is(err, errFlagsOnly) {
		return nil
	}
	if err == nil {
		return errors.New("the command ran instead of stopping after its flags")
	}
	return err
}

func TestDocsExamples(t *testing.T) {
	checked, configs := 0, 0
	for _, ex := range docExamples(t) {
		fields := strings.Fields(ex.info)
		switch {
		case len(fields) > 0 && shellInfo[fields[0]]:
			cmds, err := dpxeCommands(ex)
			if err != nil {
				t.Errorf("%s:%d: %v", ex.file, ex.line, err)
				continue
			}
			for _, args := range cmds {
				checked++
				if err := checkDocCommand(args); err != nil {
					t.Errorf("%s (block at line %d): dpxe %s: %v", ex.file, ex.line, strings.Join(args, " "), err)
				}
			}
		case len(fields) == 2 && fields[0] == "json" && fields[1] == "dpxe-serve-config":
			configs++
			f := filepath.Join(t.TempDir(), "serve.json")
			if err := os.WriteFile(f, []byte(ex.text), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := parseServeFlags([]string{"--config", f}); err != nil {
				t.Errorf("%s (block at line %d): dpxe serve --config: %v", ex.file, ex.line, err)
			}
		}
	}
	// The test must see the docs' examples, not pass on none.
	if checked < 20 || configs < 1 {
		t.Fatalf("checked %d dpxe command lines and %d serve configs: fewer than the docs hold", checked, configs)
	}
	t.Logf("checked %d dpxe command lines and %d serve configs", checked, configs)
}

// TestDocsExamplesCatchDrift: the checker refuses what drifted docs held.
func TestDocsExamplesCatchDrift(t *testing.T) {
	for _, bad := range []string{
		"dpxe flash --api http://x --node n t.img",
		"dpxe nodes --nonesuch",
		"dpxe serve --dhcp proxy",
		"dpxe servee",
		"dpxe route not-a-guild",
		"dpxe nodes approve 52:54:00:12:34:56",
		"dpxe nodes show",
	} {
		cmds, err := dpxeCommands(docExample{info: "sh", text: bad})
		if err != nil || len(cmds) != 1 {
			t.Fatalf("%q: %v %v", bad, cmds, err)
		}
		if checkDocCommand(cmds[0]) == nil {
			t.Errorf("%q passed the docs check", bad)
		}
	}
	cmds, err := dpxeCommands(docExample{info: "console", text: "$ sudo DPXE=1 bin/dpxe drain a --dry-run | tee x && dpxe route 1 # note\noutput dpxe nodes\n$ dpxe nodes \\\n  --json\n"})
	if err != nil || fmt.Sprint(cmds) != "[[drain a --dry-run] [route 1] [nodes --json]]" {
		t.Errorf("console block: %q %v", cmds, err)
	}
}
