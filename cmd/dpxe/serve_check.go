package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
)

// `dpxe serve` refuses at start, naming the flag, every setting it could
// not honour later: the --config file sets flags by name (every flag, the
// same rules), and each value is checked with the rule the part that uses
// it applies (the boot config's for the controller URL nodes get, the
// controller's for its policy).

// Errors of the --config file.
var (
	// errConfigKey means a --config key names no flag of `dpxe serve`.
	errConfigKey = errors.New("unknown key")
	// errConfigValue means a --config value is not a string, number,
	// boolean or (for a repeatable flag) a list of them.
	errConfigValue = errors.New("want a string, number, boolean or a list of them")
)

// configOnlyFlags may not be set from a --config file: --config itself, and
// one-time actions that a file would repeat at every start.
var configOnlyFlags = map[string]string{
	"config":               "a config file cannot name another",
	"rotate-admin-token":   "it is a one-time action; give it on the command line",
	"rotate-metrics-token": "it is a one-time action; give it on the command line",
}

// configEntry is one key of a --config file with its values as flag text
// (a list gives several, set in order, for a repeatable flag).
type configEntry struct {
	key    string
	values []string
	list   bool // the value was a JSON list
}

// parseConfigObject reads a --config file's JSON object into entries in
// file order. It refuses anything but one object, duplicate keys, null,
// nested objects and lists of non-scalars.
func parseConfigObject(b []byte) ([]configEntry, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, fmt.Errorf("want a JSON object of flag names and values")
	}
	var out []configEntry
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("want a key, found %v", tok)
		}
		if seen[key] {
			return nil, fmt.Errorf("key %q given twice", key)
		}
		seen[key] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("key %q: %w", key, err)
		}
		vals, err := configValues(raw)
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", key, err)
		}
		raw = bytes.TrimSpace(raw)
		out = append(out, configEntry{key: key, values: vals, list: len(raw) > 0 && raw[0] == '['})
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("text after the JSON object")
	}
	return out, nil
}

// configValues turns one JSON value into flag text.
func configValues(raw json.RawMessage) ([]string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '[' {
		var list []json.RawMessage
		if err := json.Unmarshal(raw, &list); err != nil {
			return nil, err
		}
		out := make([]string, 0, len(list))
		for _, e := range list {
			v, err := configScalar(e)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	}
	v, err := configScalar(raw)
	if err != nil {
		return nil, err
	}
	return []string{v}, nil
}

func configScalar(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "", errConfigValue
	}
	switch raw[0] {
	case '"':
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	case 't', 'f':
		var b bool
		if err := json.Unmarshal(raw, &b); err != nil {
			return "", err
		}
		return strconv.FormatBool(b), nil
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		var n json.Number
		if err := json.Unmarshal(raw, &n); err != nil {
			return "", err
		}
		return n.String(), nil
	}
	return "", errConfigValue
}

// applyConfigFile sets the flags of fs that a --config file names, except
// those given on the command line (the command line wins). Keys are flag
// names with _ or -.
func applyConfigFile(fs *flag.FlagSet, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxConfigFile+1))
	if err != nil {
		return fmt.Errorf("--config %s: %w", path, err)
	}
	if len(b) > maxConfigFile {
		return fmt.Errorf("--config %s: larger than %d bytes", path, maxConfigFile)
	}
	entries, err := parseConfigObject(b)
	if err != nil {
		return fmt.Errorf("--config %s: %w", path, err)
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, e := range entries {
		name := strings.ReplaceAll(e.key, "_", "-")
		if why, ok := configOnlyFlags[name]; ok {
			return fmt.Errorf("--config %s: key %q: %s", path, e.key, why)
		}
		if fs.Lookup(name) == nil {
			return fmt.Errorf("--config %s: key %q: %w (keys are the flags of `dpxe serve -h`, with _ or -)", path, e.key, errConfigKey)
		}
		if given[name] {
			continue
		}
		if e.list && name != "reserve" {
			return fmt.Errorf("--config %s: key %q: a list is only for a repeatable flag (reserve)", path, e.key)
		}
		for _, v := range e.values {
			if err := fs.Set(name, v); err != nil {
				return fmt.Errorf("--config %s: key %q: %v", path, e.key, err)
			}
		}
	}
	return nil
}

// dbSchemes are the URL schemes --db takes besides a SQLite path; any
// other "scheme://" is refused at start instead of becoming a folder named
// "scheme:". Every one opens the PostgreSQL store (store.IsPostgresURL).
var dbSchemes = map[string]bool{"postgres": true, "postgresql": true}

// checkServeCore checks the settings of serve.go itself: a database path
// this build can open, a listen address, and the controller's policy by the
// controller's own rules.
func checkServeCore(cfg serveConfig) error {
	if i := strings.Index(cfg.DB, "://"); i > 0 && !dbSchemes[cfg.DB[:i]] {
		return fmt.Errorf("%w: --db %q: %s databases are not supported; give a SQLite file path or a postgres:// URL",
			errUsage, redactURL(cfg.DB), cfg.DB[:i])
	}
	if cfg.DB == "" {
		return fmt.Errorf("%w: --db: empty path", errUsage)
	}
	if _, port, err := net.SplitHostPort(cfg.Listen); err != nil {
		return fmt.Errorf("%w: --listen %q: %v (want HOST:PORT, e.g. 127.0.0.1:8080)", errUsage, cfg.Listen, err)
	} else if p, err := strconv.ParseUint(port, 10, 16); err != nil || (p == 0 && port != "0") {
		return fmt.Errorf("%w: --listen %q: port %q is not 0..65535", errUsage, cfg.Listen, port)
	}
	if err := cfg.controllerConfig().Check(); err != nil {
		return fmt.Errorf("%w: %s", errUsage, flagNamed(err))
	}
	return nil
}

// flagNamed rewrites a controller config error ("controller config:
// lease 0s out of range") to name the flag (--lease).
func flagNamed(err error) string {
	msg := strings.TrimPrefix(err.Error(), controller.ErrConfig.Error()+": ")
	key, rest, ok := strings.Cut(msg, " ")
	if !ok {
		return msg
	}
	return "--" + strings.ReplaceAll(key, "_", "-") + " " + rest
}

// netbootOnlyFlags are the netboot flags that mean nothing without
// --interface.
var netbootOnlyFlags = []string{"dhcp", "pool", "router", "dns", "reserve", "boot-dir", "ipxe-dir",
	"controller-url", "ipv6-no-router", "tftp", "proxy-enroll"}

// checkNetbootFlags refuses netboot flags given without --interface and
// checks each value with the rule the netboot part applies at attach time.
func checkNetbootFlags(fs *flag.FlagSet, _ *serveConfig) error {
	f := &netbootFlags
	if f.iface == "" {
		var stray []string
		fs.Visit(func(fl *flag.Flag) {
			for _, n := range netbootOnlyFlags {
				if fl.Name == n {
					stray = append(stray, "--"+n)
				}
			}
		})
		if len(stray) > 0 {
			verb := "needs"
			if len(stray) > 1 {
				verb = "need"
			}
			return fmt.Errorf("%w: %s %s --interface IF (netboot is off without it)", errUsage, strings.Join(stray, ", "), verb)
		}
		return nil
	}
	switch f.dhcpMode {
	case "off", "proxy", "authoritative":
	default:
		return fmt.Errorf("%w: --dhcp %q: want proxy, authoritative or off", errUsage, f.dhcpMode)
	}
	if _, err := netbootDHCPConfig(); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if f.proxyEnroll && f.dhcpMode != "proxy" {
		return fmt.Errorf("%w: --proxy-enroll needs --dhcp proxy", errUsage)
	}
	if f.controller != "" {
		var bc appliance.BootConfig
		if err := bc.Set("controller=" + f.controller); err != nil {
			return fmt.Errorf("%w: --controller-url %q: %v (it goes on the kernel command line, which takes the boot config's rules)", errUsage, f.controller, err)
		}
	}
	if f.tftp != "" && f.tftp != "off" {
		if _, _, err := net.SplitHostPort(f.tftp); err != nil {
			return fmt.Errorf("%w: --tftp %q: %v (want HOST:PORT or off)", errUsage, f.tftp, err)
		}
	}
	return nil
}

// checkWebFlags checks the dashboard's flags.
func checkWebFlags(fs *flag.FlagSet, _ *serveConfig) error {
	if webFlags.liveEvery <= 0 {
		return fmt.Errorf("%w: --dashboard-live %v must be positive", errUsage, webFlags.liveEvery)
	}
	if webFlags.off {
		var stray bool
		fs.Visit(func(f *flag.Flag) { stray = stray || f.Name == "dashboard-live" })
		if stray {
			return fmt.Errorf("%w: --dashboard-live means nothing with --no-dashboard", errUsage)
		}
	}
	return nil
}
