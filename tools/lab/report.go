package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/discord-pxe/dpxe/fleet/controller"
)

// NodeReport is what the lab knows about one node, from the API (netboot
// inventory, boot timeline, controller) and the node's serial console.
type NodeReport struct {
	Name     string
	MAC      string
	Firmware string
	// Lease is the address dpxe serve's DHCP gave the machine ("" before).
	Lease string
	// Timeline is the boot timeline as the netboot services recorded it.
	Timeline []Step
	// Since is when the lab started the node (Timeline times are absolute).
	Since time.Time
	// Banner: the kernel printed its config line with this node's ID.
	Banner bool
	// KernelIP: the kernel's own DHCP bound this address ("dhcp: bound").
	KernelIP string
	// CheckedIn: the controller has seen the node (live, or a checkin step).
	CheckedIn bool
	Live      bool
	Ready     int
	Starting  int
	Backoff   int
	Fatal     int
	Range     string
	// RangeCount is the number of shards in the node's range.
	RangeCount int
	// Exited is set when the node's QEMU is no longer running.
	Exited string
}

// Has reports whether the timeline has a step of that stage.
func (r NodeReport) Has(stage string) bool {
	for _, s := range r.Timeline {
		if s.Stage == stage {
			return true
		}
	}
	return false
}

// Report is the lab's readiness: one entry per node, and the emulator's
// record in short.
type Report struct {
	At    time.Time
	Mode  string
	Nodes []NodeReport
	// Sessions is the number of connected sessions at the emulator.
	Sessions int
	// Violations counts the emulator's violations by kind.
	Violations map[string]int
	// Pings is the "!ping"s the emulator sent, Replies the messages bots
	// created through its REST API, RateLimited the creates answered 429.
	Pings, Replies, RateLimited int
	// Pingbot: the lab runs pingbot, so the table shows the replies.
	Pingbot bool
}

var (
	bannerRE = regexp.MustCompile(`node=(\S+) controller=\S+ cred=set`)
	boundRE  = regexp.MustCompile(`dhcp: bound (\d+\.\d+\.\d+\.\d+)`)
)

// Status gathers the readiness report through the API.
func (l *Lab) Status(ctx context.Context) (Report, error) {
	rep := Report{At: time.Now(), Mode: l.Mode}
	views, err := l.admin.nodes(ctx)
	if err != nil {
		return rep, err
	}
	byID := map[string]controller.NodeView{}
	for _, v := range views {
		byID[v.ID] = v
	}
	var machines []Machine
	if l.Mode == ModeNetns {
		if machines, err = l.admin.machines(ctx); err != nil {
			return rep, err
		}
	}
	var emu struct {
		Shards []struct {
			Sessions []struct {
				State string `json:"state"`
			} `json:"sessions"`
		} `json:"shards"`
		Violations []struct {
			Kind string `json:"kind"`
		} `json:"violations"`
		REST struct {
			Messages    []json.RawMessage `json:"messages"`
			Pings       []json.RawMessage `json:"pings"`
			RateLimited int               `json:"rate_limited"`
		} `json:"rest"`
	}
	gc, err := l.gateway()
	if err != nil {
		return rep, err
	}
	if err := gc.do(ctx, "GET", "/debug/state", nil, &emu); err != nil {
		return rep, fmt.Errorf("the emulator's record: %w", err)
	}
	for _, s := range emu.Shards {
		for _, sess := range s.Sessions {
			if sess.State == "connected" {
				rep.Sessions++
			}
		}
	}
	rep.Pings, rep.Replies, rep.RateLimited = len(emu.REST.Pings), len(emu.REST.Messages), emu.REST.RateLimited
	l.mu.Lock()
	rep.Pingbot = l.Pingbot
	l.mu.Unlock()
	rep.Violations = map[string]int{}
	for _, v := range emu.Violations {
		rep.Violations[v.Kind]++
	}
	for _, n := range l.Nodes() {
		r := NodeReport{Name: n.Name, MAC: n.MAC, Firmware: n.Firmware, Since: n.Started}
		for _, m := range machines {
			if strings.EqualFold(strings.ReplaceAll(m.MAC, "-", ":"), n.MAC) {
				r.Lease = m.IP
				if r.Timeline, err = l.admin.timeline(ctx, m.MAC); err != nil {
					return rep, err
				}
			}
		}
		if n.Console != "" {
			for _, line := range consoleLines(n.Console) {
				if m := bannerRE.FindStringSubmatch(line); m != nil && m[1] == n.Name {
					r.Banner = true
				}
				if m := boundRE.FindStringSubmatch(line); m != nil {
					r.KernelIP = m[1]
				}
			}
		}
		if v, ok := byID[n.Name]; ok {
			r.Live = v.Live
			r.CheckedIn = !v.FirstSeen.IsZero() || r.Has("checkin")
			r.Ready, r.Starting, r.Backoff, r.Fatal = v.ReadyShards, v.StartingShards, v.BackoffShards, v.FatalShards
			r.RangeCount = int(v.RangeCount)
			if v.RangeCount > 0 {
				r.Range = fmt.Sprintf("%d-%d", v.RangeStart, v.RangeStart+v.RangeCount-1)
			}
		}
		if n.proc != nil {
			if err := n.proc.exited(); err != nil {
				r.Exited = err.Error()
			}
		}
		rep.Nodes = append(rep.Nodes, r)
	}
	return rep, nil
}

// netbootStages are the steps shown in the report, in boot order.
var netbootStages = []struct{ stage, label string }{
	{"dhcp_ack", "dhcp"},
	{"tftp_file", "tftp"},
	{"script_fetched", "script"},
	{"kernel_fetched", "kernel"},
	{"checkin", "check-in"},
}

// timelineText is "dhcp 2.1s · script 4.0s · kernel 4.8s": the first time
// each stage was reached, in seconds since the node was started.
func (r NodeReport) timelineText() string {
	var parts []string
	for _, st := range netbootStages {
		for _, s := range r.Timeline {
			if s.Stage == st.stage {
				parts = append(parts, fmt.Sprintf("%s %.1fs", st.label, s.At.Sub(r.Since).Seconds()))
				break
			}
		}
	}
	if r.Has("kernel_partial") {
		parts = append(parts, "KERNEL DOWNLOAD CUT")
	}
	if len(parts) == 0 {
		return "waiting for DHCP"
	}
	return strings.Join(parts, " · ")
}

// Print writes the report as a table.
func (rep Report) Print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if rep.Mode == ModeNetns {
		fmt.Fprintln(tw, "NODE\tFIRMWARE\tDHCP LEASE\tNETBOOT (since QEMU start)\tKERNEL\tCHECKED IN\tRANGE\tSHARDS R/S/B/F")
	} else {
		fmt.Fprintln(tw, "NODE\tKIND\tCHECKED IN\tRANGE\tSHARDS R/S/B/F")
	}
	for _, r := range rep.Nodes {
		checked := "not yet"
		if r.CheckedIn {
			checked = "yes"
			if !r.Live {
				checked = "yes, lease expired"
			}
		}
		shards := fmt.Sprintf("%d/%d/%d/%d", r.Ready, r.Starting, r.Backoff, r.Fatal)
		if !r.CheckedIn {
			shards = "-"
		}
		if rep.Mode != ModeNetns {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Name, r.Firmware, checked, dash(r.Range), shards)
			continue
		}
		kernel := "-"
		switch {
		case r.Exited != "":
			kernel = "QEMU " + r.Exited
		case r.KernelIP != "":
			kernel = "up, dhcp " + r.KernelIP
		case r.Banner:
			kernel = "booted"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Name, r.Firmware, dash(r.Lease), r.timelineText(), kernel, checked, dash(r.Range), shards)
	}
	tw.Flush()
	fmt.Fprintf(w, "Gateway emulator: %d sessions connected, %s\n", rep.Sessions, violationText(rep.Violations))
	if rep.Pingbot || rep.Replies > 0 {
		fmt.Fprintf(w, "pingbot: %d \"!ping\" sent by the emulator, %d replies posted to its REST API (%d answered 429 first)\n",
			rep.Pings, rep.Replies, rep.RateLimited)
	}
}

// violationText is "no violations" or "3 violations: bucket_out_of_order 3".
func violationText(v map[string]int) string {
	if len(v) == 0 {
		return "no violations"
	}
	kinds := make([]string, 0, len(v))
	total := 0
	for k, n := range v {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
		total += n
	}
	sort.Strings(kinds)
	return fmt.Sprintf("%d violations: %s (see /debug/state)", total, strings.Join(kinds, ", "))
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
