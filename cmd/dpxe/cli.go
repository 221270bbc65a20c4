package main

import (
	"flag"
	"fmt"
	"net/url"
)

// The flag vocabulary every client command shares (docs/commands.md lists
// them all): --server is the controller's base URL as this machine reaches
// it, --token-file the admin token `dpxe serve` wrote, --json the API's
// answer instead of text. Flags may come before, between or after
// positional arguments.

// renamedFlag defines old as a flag that only says it is now called
// current, so a command line written for an older dpxe fails with the new
// spelling instead of an "unknown flag".
func renamedFlag(fs *flag.FlagSet, old, current string) {
	fs.Func(old, "renamed: use --"+current, func(string) error {
		return fmt.Errorf("--%s is now called --%s", old, current)
	})
}

// checkServerURL refuses a controller base URL the client cannot use,
// naming the flag it came from.
func checkServerURL(flagName, s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%w: %s %q is not an http(s) URL such as http://127.0.0.1:8080", errUsage, flagName, s)
	}
	return nil
}
