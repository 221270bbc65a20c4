package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/image"
)

func init() {
	register(&command{
		name:    "config",
		summary: "show or edit the node config (DPXE.CFG) inside a USB image or device",
		run:     runConfig,
	})
}

const configSynopsis = "show [--reveal] IMAGE | set [--reset] IMAGE key=value...  (an empty value removes the key)"

// runConfig implements `dpxe config show IMAGE` and `dpxe config set IMAGE key=value...`.
func runConfig(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		newFlagSet("config", configSynopsis).Usage()
		if len(args) == 0 {
			return fmt.Errorf("%w: dpxe config %s", errUsage, configSynopsis)
		}
		return nil
	}
	verb := args[0]
	synopsis := "IMAGE ..."
	switch verb {
	case "show":
		synopsis = "[--reveal] [--json] IMAGE"
	case "set":
		synopsis = "[--reset] [--json] IMAGE key=value...  (an empty value removes the key)"
	}
	flags := newFlagSet("config "+verb, synopsis)
	reveal := flags.Bool("reveal", false, "show: print the credential instead of masking it")
	reset := flags.Bool("reset", false, "set: start from an empty config instead of the current one")
	asJSON := flags.Bool("json", false, "print {image, lba, text, effective, error} instead of text")
	rest, err := parseInterspersed(flags, args[1:])
	if err != nil {
		return err
	}
	switch {
	case verb == "show" && len(rest) == 1 && !*reset:
		return configShow(rest[0], *reveal, *asJSON)
	case verb == "set" && len(rest) >= 2 && !*reveal:
		return configSet(rest[0], rest[1:], *reset, *asJSON)
	case verb == "show" || verb == "set":
		return fmt.Errorf("%w: dpxe config %s", errUsage, configSynopsis)
	default:
		return fmt.Errorf("%w: unknown config verb %q (show or set)", errUsage, verb)
	}
}

// configShow prints DPXE.CFG's text and what it configures; an invalid file
// is printed too, and the command fails with the reason.
func configShow(path string, reveal, asJSON bool) error {
	cfg, err := image.ReadUSBConfig(path)
	if err != nil {
		return err
	}
	text := image.ConfigText(cfg.Raw)
	if asJSON {
		out := configOut{Image: path, LBA: cfg.LBA, Text: string(text)}
		if !reveal {
			out.Text = string(maskCredential(text))
		}
		c, perr := appliance.ParseBootConfig(cfg.Raw)
		if perr == nil {
			if c.Credential != "" && !reveal {
				c.Credential = credentialMask
			}
			out.Effective = c.String()
		} else {
			out.Error = perr.Error()
		}
		if err := printJSON(out); err != nil {
			return err
		}
		if perr != nil {
			return fmt.Errorf("%s: DPXE.CFG is invalid, the kernel will refuse it: %w", path, perr)
		}
		return nil
	}
	fmt.Printf("# %s: DPXE.CFG at LBA %d (%d bytes of text)\n", path, cfg.LBA, len(text))
	if !reveal {
		text = maskCredential(text)
	}
	os.Stdout.Write(text)
	if len(text) > 0 && text[len(text)-1] != '\n' {
		fmt.Println()
	}
	c, err := appliance.ParseBootConfig(cfg.Raw)
	if err != nil {
		return fmt.Errorf("%s: DPXE.CFG is invalid, the kernel will refuse it: %w", path, err)
	}
	if c.Credential != "" && !reveal {
		c.Credential = credentialMask
	}
	if s := c.String(); s != "" {
		fmt.Printf("# effective: %s\n", s)
	} else {
		fmt.Println("# effective: nothing set")
	}
	return nil
}

// configSet applies assignments to the image's config and rewrites DPXE.CFG
// in place.
func configSet(path string, assignments []string, reset, asJSON bool) error {
	cfg, err := image.ReadUSBConfig(path)
	if err != nil {
		return err
	}
	var c appliance.BootConfig
	if !reset {
		if c, err = appliance.ParseBootConfig(cfg.Raw); err != nil {
			return fmt.Errorf("%s: the current DPXE.CFG is invalid (%w); use 'dpxe config set --reset' to start from an empty config", path, err)
		}
	}
	if err := c.Set(assignments...); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	raw, err := image.RenderConfig(c)
	if err != nil {
		return err
	}
	if err := image.WriteUSBConfig(path, raw); err != nil {
		if errors.Is(err, image.ErrNotDPXEImage) {
			return err
		}
		return fmt.Errorf("%s: %w", path, err)
	}
	if c.Credential != "" {
		c.Credential = credentialMask
	}
	if asJSON {
		return printJSON(configOut{Image: path, LBA: cfg.LBA, Effective: c.String()})
	}
	fmt.Printf("%s: DPXE.CFG now: %s\n", path, c.String())
	return nil
}

// configOut is what config show and set print with --json; the credential
// is masked unless --reveal.
type configOut struct {
	Image     string `json:"image"`
	LBA       uint32 `json:"lba"`
	Text      string `json:"text,omitempty"`  // DPXE.CFG's text (show)
	Effective string `json:"effective"`       // the boot config it makes, one line
	Error     string `json:"error,omitempty"` // why the kernel would refuse it
}

// credentialMask replaces a node credential in what config prints.
const credentialMask = "********"

// maskCredential returns text with the value of every cred= token masked.
func maskCredential(text []byte) []byte {
	out := append([]byte(nil), text...)
	for i := 0; i+5 <= len(out); i++ {
		if string(out[i:i+5]) != "cred=" || (i > 0 && !isConfigSpace(out[i-1])) {
			continue
		}
		j := i + 5
		for j < len(out) && !isConfigSpace(out[j]) {
			out[j] = '*'
			j++
		}
		i = j
	}
	return out
}

func isConfigSpace(b byte) bool { return b == ' ' || b == '\t' || b == '\r' || b == '\n' }
