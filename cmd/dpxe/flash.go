package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/image/flash"
)

func init() {
	register(&command{
		name:    "flash",
		summary: "personalise usb.img for a node and write it to a USB stick or file, verified",
		run:     runFlash,
	})
}

const flashSynopsis = "--node NAME [--image out/usb.img] [--controller URL] [--server URL] [--cred CRED | --token-file F [--rotate]] [--yes] [--force] [--skip-zeroed=false] [--json] DEVICE|FILE\n       dpxe flash --list [--all] [--json]"

// Seams for tests: the system the safety checks look at, and where the
// confirmation is read from.
var (
	flashEnv             = flash.System
	flashStdin io.Reader = os.Stdin
)

// runFlash implements `dpxe flash`.
func runFlash(ctx context.Context, args []string) error {
	fs := newFlagSet("flash", flashSynopsis)
	img := fs.String("image", "out/"+image.USBImageFile, "source image (never modified)")
	node := fs.String("node", "", "node ID to write into DPXE.CFG (required)")
	ctrl := fs.String("controller", "http://"+defaultListen, "controller URL the node uses, written into DPXE.CFG")
	apiURL := fs.String("server", "http://"+defaultListen, "controller base URL this machine reaches the API at, to create or rotate the node's credential")
	pin := fs.String("controller-pin", "", "controller_pin= to write: the SHA-256 of the controller's TLS key, as dpxe serve --print-pin prints it (a node checks in over https:// only with it); default for an https:// --controller: read from --server with the admin token")
	cred := fs.String("cred", "", "node credential to write; without it the credential is created (or with --rotate, replaced) at the controller")
	tokenFile := fs.String("token-file", "./var/"+adminTokenName, "admin token file that dpxe serve wrote")
	renamedFlag(fs, "api", "server")
	renamedFlag(fs, "admin-token-file", "token-file")
	rotate := fs.Bool("rotate", false, "the node exists: issue it a new credential (its old one stops working)")
	yes := fs.Bool("yes", false, "do not ask for confirmation")
	force := fs.Bool("force", false, "write to a device that is not reported as removable (no other check is overridden)")
	skipZeroed := fs.Bool("skip-zeroed", true, "devices: read each range first and leave out the image's zero blocks the device already holds as zeros (false: write every byte)")
	list := fs.Bool("list", false, "list removable block devices and whether they hold Discord-PXE media")
	all := fs.Bool("all", false, "with --list: include devices that are not removable")
	asJSON := fs.Bool("json", false, "print the result (or with --list the devices) as JSON; progress and the question stay on stderr")
	rest, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if *list {
		if len(rest) != 0 || *node != "" {
			return fmt.Errorf("%w: --list takes no other arguments", errUsage)
		}
		return flashList(*all, *asJSON)
	}
	if len(rest) != 1 {
		return fmt.Errorf("%w: dpxe flash %s", errUsage, flashSynopsis)
	}
	target := rest[0]
	if *node == "" {
		return fmt.Errorf("%w: --node is required", errUsage)
	}

	// Everything that can be refused is checked before the controller is
	// asked for anything and before the prompt.
	if err := checkServerURL("--server", *apiURL); err != nil {
		return err
	}
	cfg, err := baseConfig(*img)
	if err != nil {
		return err
	}
	if err := cfg.Set("node="+*node, "controller="+*ctrl); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if *pin != "" {
		if err := cfg.Set("controller_pin=" + *pin); err != nil {
			return fmt.Errorf("%w: --controller-pin: %v", errUsage, err)
		}
	}
	// An https:// controller without --controller-pin: the pin is read
	// from the controller below, when it is asked for the credential.
	askPin := *pin == "" && *cred == "" && slices.ContainsFunc(cfg.ControllerURLs(), func(u string) bool { return strings.HasPrefix(u, "https://") })
	if !askPin {
		if err := checkPinScheme(cfg); err != nil {
			return err
		}
	}
	if *cred != "" {
		if err := cfg.Set("cred=" + *cred); err != nil {
			return fmt.Errorf("%w: --cred: %v", errUsage, err)
		}
	}
	if u, _ := url.Parse(*ctrl); u != nil && isLoopback(u.Hostname()) {
		fmt.Fprintf(os.Stderr, "warning: controller=%s is a loopback address: a node cannot reach it (use --controller http://ADDRESS:PORT)\n", *ctrl)
	}
	// Every target check (the source itself, a loop device backed by it,
	// mounted, the system disk, removable, size) runs here, before the
	// controller is asked for anything.
	env := flashEnv()
	t, err := env.Inspect(target)
	if err != nil {
		return err
	}
	if err := env.Preflight(t, *img, *force); err != nil {
		return err
	}

	var client *nodesClient
	credAction := "given with --cred"
	if *cred == "" {
		base := *apiURL
		tok, err := os.ReadFile(*tokenFile)
		if err != nil {
			return fmt.Errorf("admin token (needed to get node %s's credential; see --token-file, or pass --cred): %w", *node, err)
		}
		client = &nodesClient{base: strings.TrimRight(base, "/"), token: strings.TrimSpace(string(tok)), http: &http.Client{Timeout: clientTimeout}}
		status, err := client.call(ctx, "GET", "/v1/nodes/"+url.PathEscape(*node), nil, nil)
		switch {
		case err != nil && status != http.StatusNotFound:
			return fmt.Errorf("controller %s: %w", base, err)
		case status == http.StatusNotFound:
			credAction = "created at " + base + " (new node)"
		case !*rotate:
			return fmt.Errorf("node %s already exists at %s: its credential cannot be read back; pass --rotate to issue a new one (the old one stops working) or --cred", *node, base)
		default:
			credAction = "rotated at " + base + " (the node's old credential stops working)"
		}
		if askPin {
			var out struct {
				Pin string `json:"pin"`
			}
			if _, err := client.call(ctx, "GET", "/v1/controller/pin", nil, &out); err != nil {
				return fmt.Errorf("controller %s: reading its pin for the https:// --controller: %w (or pass --controller-pin)", base, err)
			}
			if err := cfg.Set("controller_pin=" + out.Pin); err != nil {
				return fmt.Errorf("controller %s: its pin: %v", base, err)
			}
			if err := checkPinScheme(cfg); err != nil {
				return err
			}
		}
	}

	if !*yes {
		if err := confirmFlash(t, *img, cfg, credAction); err != nil {
			return err
		}
	}

	if client != nil {
		c, err := fetchCredential(ctx, client, *node, *rotate)
		if err != nil {
			return err
		}
		cfg.Credential = c
	}
	raw, err := image.RenderConfig(cfg)
	if err != nil {
		return err
	}
	res, err := flash.Flash(ctx, flash.Options{Image: *img, Config: raw, Target: target, Force: *force, SkipZeroed: *skipZeroed, Env: env, Progress: os.Stderr, Expect: t})
	if err != nil {
		if errors.Is(err, flash.ErrVerify) {
			fmt.Fprintf(os.Stderr, "\n*** %s does NOT hold a good image: do not boot from it; flash it again or replace the medium ***\n\n", target)
		}
		if client != nil {
			fmt.Fprintf(os.Stderr, "note: node %s's credential was %s but the flash failed; rerun with --rotate\n", *node, credAction)
		}
		return err
	}
	shown := cfg
	if shown.Credential != "" {
		shown.Credential = credentialMask
	}
	if *asJSON {
		return printJSON(flashOut{Target: target, Image: *img, Size: res.Size, SHA256: hex.EncodeToString(res.SHA256[:]),
			Config: shown.String(), Credential: credAction, Written: res.Written, Skipped: res.Skipped,
			WriteMS: res.WriteTime.Milliseconds(), VerifyMS: res.VerifyTime.Milliseconds(), VerifyDirect: res.VerifyDirect})
	}
	fmt.Printf("%s: flashed and verified %s (%d bytes, SHA-256 %s)\n", target, *img, res.Size, hex.EncodeToString(res.SHA256[:]))
	fmt.Printf("  DPXE.CFG: %s\n", shown.String())
	how := "holes of a new file"
	if res.Target.Block {
		how = "the device already held them"
		if !res.Probed {
			how = "none: every byte written"
		}
	}
	fmt.Printf("  wrote %d bytes, skipped %d zero bytes (%s), write+sync %s, verify %s (%s)\n", res.Written, res.Skipped, how,
		res.WriteTime.Round(time.Millisecond), res.VerifyTime.Round(time.Millisecond), verifyHow(res.VerifyDirect))
	return nil
}

// flashOut is what a flash prints with --json.
type flashOut struct {
	Target       string `json:"target"`
	Image        string `json:"image"`
	Size         int64  `json:"size"`
	SHA256       string `json:"sha256"`     // of the personalised image, read back from the target
	Config       string `json:"config"`     // DPXE.CFG's boot config, credential masked
	Credential   string `json:"credential"` // what happened to it: given, created, rotated
	Written      int64  `json:"written"`
	Skipped      int64  `json:"skipped"`
	WriteMS      int64  `json:"write_ms"`
	VerifyMS     int64  `json:"verify_ms"`
	VerifyDirect bool   `json:"verify_direct"` // read back with O_DIRECT
}

func verifyHow(direct bool) string {
	if direct {
		return "read back with O_DIRECT"
	}
	return "read back after dropping cached pages"
}

// baseConfig is the source image's DPXE.CFG, the starting point of the
// personalised one (so keys set on a template image are kept).
func baseConfig(img string) (appliance.BootConfig, error) {
	u, err := image.ReadUSBConfig(img)
	if err != nil {
		return appliance.BootConfig{}, err
	}
	c, err := appliance.ParseBootConfig(u.Raw)
	if err != nil {
		return c, fmt.Errorf("%s: DPXE.CFG is invalid (%w); fix it with 'dpxe config set --reset'", img, err)
	}
	return c, nil
}

// confirmFlash shows what is about to be overwritten and reads the answer.
func confirmFlash(t *flash.Target, img string, cfg appliance.BootConfig, credAction string) error {
	w := os.Stderr
	fmt.Fprintf(w, "About to write %s to:\n  %s\n", img, t.Describe())
	for _, p := range t.Partitions {
		fmt.Fprintf(w, "    partition %s (%s): %s\n", p.Name, p.Dev, humanSize(p.Size))
	}
	if t.Block && len(t.Partitions) == 0 {
		fmt.Fprintln(w, "    no partitions")
	}
	fmt.Fprintf(w, "  node=%s controller=%s, credential %s\n", cfg.NodeID, cfg.Controller, credAction)
	if t.Exist {
		fmt.Fprintf(w, "Everything on %s will be lost. Continue? [y/N] ", t.Path)
	} else {
		fmt.Fprintf(w, "Continue? [y/N] ")
	}
	line, err := bufio.NewReader(flashStdin).ReadString('\n')
	if err != nil && line == "" {
		return fmt.Errorf("%w (no answer on stdin; use --yes to skip the question)", flash.ErrAborted)
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return nil
	}
	return flash.ErrAborted
}

// fetchCredential creates the node (or, with rotate, replaces its
// credential) and returns the new credential.
func fetchCredential(ctx context.Context, c *nodesClient, node string, rotate bool) (string, error) {
	var out struct {
		NodeID     string `json:"node_id"`
		Credential string `json:"credential"`
	}
	method, path, body := "POST", "/v1/nodes", any(map[string]string{"node_id": node})
	if rotate {
		path, body = "/v1/nodes/"+url.PathEscape(node)+"/credential", nil
	}
	status, err := c.call(ctx, method, path, body, &out)
	if status == http.StatusNotFound && rotate {
		// The node was not there after all: create it.
		status, err = c.call(ctx, "POST", "/v1/nodes", map[string]string{"node_id": node}, &out)
	}
	if err != nil {
		return "", fmt.Errorf("controller: %w", err)
	}
	if out.NodeID != node {
		return "", fmt.Errorf("controller answered for node %q, asked for %q", out.NodeID, node)
	}
	if err := appliance.ValidateCredential(out.Credential); err != nil {
		return "", fmt.Errorf("controller returned an unusable credential: %w", err)
	}
	return out.Credential, nil
}

// call is nodesClient.do that also returns the HTTP status (0 when no
// answer came), so callers can tell "no such node" from a failure.
func (c *nodesClient) call(ctx context.Context, method, path string, body, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode/100 != 2 {
		var e struct{ Error string }
		if json.Unmarshal(data, &e) == nil && e.Error != "" {
			return resp.StatusCode, fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, e.Error)
		}
		return resp.StatusCode, fmt.Errorf("%s %s: %s", method, path, resp.Status)
	}
	if out == nil {
		return resp.StatusCode, nil
	}
	return resp.StatusCode, json.Unmarshal(data, out)
}

// flashList prints the block devices and what they hold.
func flashList(all, asJSON bool) error {
	ms, err := flashEnv().List(all)
	if err != nil {
		return err
	}
	if asJSON {
		type device struct {
			Path       string `json:"path"`
			Size       int64  `json:"size"`
			Removable  bool   `json:"removable"`
			Vendor     string `json:"vendor,omitempty"`
			Model      string `json:"model,omitempty"`
			Backing    string `json:"backing,omitempty"` // a loop device's file
			DPXE       bool   `json:"dpxe"`              // holds Discord-PXE media
			Loader     bool   `json:"loader"`            // our MBR loader at least
			Node       string `json:"node,omitempty"`
			Controller string `json:"controller,omitempty"`
			Note       string `json:"note,omitempty"`
		}
		out := make([]device, 0, len(ms))
		for _, m := range ms {
			out = append(out, device{m.Path, m.Size, m.Removable, strings.TrimSpace(m.Vendor), strings.TrimSpace(m.Model), m.Backing,
				m.DPXE, m.Loader, m.Node, m.Ctrl, m.Note})
		}
		return printJSON(map[string]any{"devices": out})
	}
	if len(ms) == 0 {
		if all {
			fmt.Println("no block devices")
		} else {
			fmt.Println("no removable block devices (--all lists every device)")
		}
		return nil
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tSIZE\tREMOVABLE\tMODEL\tDISCORD-PXE\tNODE\tCONTROLLER\tNOTE")
	for _, m := range ms {
		model := strings.TrimSpace(m.Vendor + " " + m.Model)
		if m.Backing != "" {
			model = "loop: " + m.Backing
		}
		dpxe := "no"
		switch {
		case m.DPXE:
			dpxe = "yes"
		case m.Loader:
			dpxe = "loader only"
		}
		fmt.Fprintf(tw, "%s\t%s\t%v\t%s\t%s\t%s\t%s\t%s\n", m.Path, humanSize(m.Size), yesNo(m.Removable), orDash(model), dpxe, orDash(m.Node), orDash(m.Ctrl), m.Note)
	}
	return tw.Flush()
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func humanSize(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	default:
		return fmt.Sprintf("%d KiB", n>>10)
	}
}

func isLoopback(host string) bool {
	return host == "localhost" || strings.HasPrefix(host, "127.") || host == "::1"
}

// checkPinScheme refuses a boot config the node would refuse at every
// check-in: an https:// controller without controller_pin=, or
// controller_pin= with an http:// controller (docs/security.md).
func checkPinScheme(c appliance.BootConfig) error {
	for _, u := range c.ControllerURLs() {
		switch https := strings.HasPrefix(u, "https://"); {
		case https && c.ControllerPin == "":
			return fmt.Errorf("%w: controller %s is https:// but there is no controller pin: the node would refuse it (give --controller-pin, from `dpxe serve --print-pin`)", errUsage, u)
		case !https && c.ControllerPin != "":
			return fmt.Errorf("%w: controller %s is http:// but a controller pin is set: the node would refuse it (give the controller's https:// URL)", errUsage, u)
		}
	}
	return nil
}
