package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// stateFile, under the lab's var directory, records what a running lab
// created: its own PID, its namespace and the processes it started outside
// the namespace. A lab that dies without tearing down (SIGKILL, a crash, a
// power cut of the terminal) leaves it behind; the next lab reads it and
// removes exactly those things before it starts.
const stateFile = "lab.json"

// labState is the content of stateFile.
type labState struct {
	PID     int       `json:"pid"`
	Cmdline string    `json:"cmdline"` // the lab's own command line (a reused PID is not a lab)
	Started time.Time `json:"started"`
	Mode    string    `json:"mode"`             // "netns" or "simulated"
	Netns   string    `json:"netns,omitempty"`  // the namespace (netns mode)
	Procs   []proc    `json:"procs,omitempty"`  // processes started (both modes)
	Listen  string    `json:"listen,omitempty"` // the dashboard's host address
}

// proc is a started process, with its command line so a reused PID is
// never mistaken for it.
type proc struct {
	PID     int    `json:"pid"`
	Cmdline string `json:"cmdline"`
	Name    string `json:"name"`
}

// cmdline returns a process's command line with spaces between arguments,
// or "" when it does not exist.
func cmdline(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
}

// alive reports whether pid is a running process (not a zombie).
func alive(pid int) bool {
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state is the field after the parenthesised command name.
	if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) {
		return b[i+2] != 'Z'
	}
	return true
}

func writeState(dir string, st *labState) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, stateFile+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, stateFile))
}

func readState(dir string) (*labState, error) {
	b, err := os.ReadFile(filepath.Join(dir, stateFile))
	if err != nil {
		return nil, err
	}
	var st labState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, stateFile), err)
	}
	return &st, nil
}

// ErrRunning is returned when another lab is running on the same var
// directory.
var ErrRunning = errors.New("lab: another lab is running")

// CleanLeftovers removes what a lab that died on dir left behind: the
// processes it recorded (only if the PID still runs the recorded command
// line), every process in its namespace, and the namespace with its bridge
// and taps. It returns what it removed, one line each. If the recorded lab
// is still running it returns ErrRunning and touches nothing.
func CleanLeftovers(ctx context.Context, dir string) ([]string, error) {
	st, err := readState(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		// Unreadable: nothing can be identified safely; set it aside.
		os.Rename(filepath.Join(dir, stateFile), filepath.Join(dir, stateFile+".bad"))
		return []string{"unreadable " + stateFile + " set aside: " + err.Error()}, nil
	}
	if st.PID != os.Getpid() && alive(st.PID) && cmdline(st.PID) == st.Cmdline {
		return nil, fmt.Errorf("%w (pid %d, started %s, dashboard %s); stop it with Ctrl-C in its terminal or kill -TERM %d",
			ErrRunning, st.PID, st.Started.Format(time.RFC3339), st.Listen, st.PID)
	}
	var did []string
	for _, p := range st.Procs {
		if alive(p.PID) && cmdline(p.PID) == p.Cmdline {
			syscall.Kill(p.PID, syscall.SIGKILL)
			did = append(did, fmt.Sprintf("killed %s (pid %d)", p.Name, p.PID))
		}
	}
	if st.Netns != "" && netnsExists(ctx, st.Netns) {
		for _, pid := range netnsPIDs(ctx, st.Netns) {
			syscall.Kill(pid, syscall.SIGKILL)
			did = append(did, fmt.Sprintf("killed pid %d (%s) in namespace %s", pid, firstWord(cmdline(pid)), st.Netns))
		}
		// Gone in between (another sweep of stale namespaces took it) is as good as removed.
		if out, err := exec.CommandContext(ctx, "ip", "netns", "del", st.Netns).CombinedOutput(); err != nil && netnsExists(ctx, st.Netns) {
			return did, fmt.Errorf("removing namespace %s: %v: %s", st.Netns, err, strings.TrimSpace(string(out)))
		}
		did = append(did, "removed namespace "+st.Netns+" (with its bridge and taps)")
	}
	if err := os.Remove(filepath.Join(dir, stateFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return did, err
	}
	return did, nil
}

func firstWord(s string) string {
	f := strings.Fields(s)
	if len(f) == 0 {
		return "exited"
	}
	return filepath.Base(f[0])
}

// netnsExists reports whether a namespace of that name is listed by ip.
func netnsExists(ctx context.Context, name string) bool {
	out, err := exec.CommandContext(ctx, "ip", "netns", "list").Output()
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == name {
			return true
		}
	}
	return false
}

// netnsPIDs lists the processes in a namespace.
func netnsPIDs(ctx context.Context, name string) []int {
	out, err := exec.CommandContext(ctx, "ip", "netns", "pids", name).Output()
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
			pids = append(pids, pid)
		}
	}
	return pids
}
