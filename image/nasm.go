package image

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// ErrNoNASM means the nasm assembler is not installed.
var ErrNoNASM = errors.New("nasm not found in PATH: install it (Debian/Ubuntu: apt-get install nasm; or run tools/scripts/deps.sh build)")

// Assembler runs nasm.
type Assembler struct {
	Path string // the nasm binary; "" means look up "nasm" in PATH
	dir  string // working directory for Assemble; "" = the current one
}

func (a Assembler) path() (string, error) {
	if a.Path != "" {
		return a.Path, nil
	}
	p, err := exec.LookPath("nasm")
	if err != nil {
		return "", ErrNoNASM
	}
	return p, nil
}

// Version returns the first line of `nasm -v`.
func (a Assembler) Version(ctx context.Context) (string, error) {
	p, err := a.path()
	if err != nil {
		return "", err
	}
	out, err := exec.CommandContext(ctx, p, "-v").Output()
	if err != nil {
		return "", fmt.Errorf("nasm -v: %w", err)
	}
	return strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0]), nil
}

// Assemble runs nasm with args (output and input included) and returns the
// bytes of the output file out. A failure includes nasm's messages.
func (a Assembler) Assemble(ctx context.Context, out string, args ...string) ([]byte, error) {
	p, err := a.path()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, p, args...)
	cmd.Dir = a.dir
	var msg bytes.Buffer
	cmd.Stdout, cmd.Stderr = &msg, &msg
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("nasm %s failed (%v):\n%s", strings.Join(args, " "), err, strings.TrimSpace(msg.String()))
	}
	return os.ReadFile(out)
}
