package main

import (
	"context"
	"fmt"
	"runtime/debug"
	"strings"
)

// buildVersion is set at link time (-ldflags "-X main.buildVersion=v1.2.3")
// by release builds; otherwise version() reads what the Go toolchain
// stamped into the binary.
var buildVersion string

func init() {
	register(&command{name: "version", summary: "print this build's version (also in dpxe serve's log)", run: runVersion})
}

// version names this build: the link-time version if any, else the VCS
// revision Go recorded (with "+dirty" for uncommitted changes), else
// "devel"; then the Go version.
func version() string {
	info, ok := debug.ReadBuildInfo()
	goVer := "unknown Go"
	v := buildVersion
	if ok {
		goVer = info.GoVersion
		var rev, dirty string
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				if s.Value == "true" {
					dirty = "+dirty"
				}
			}
		}
		if v == "" && rev != "" {
			v = rev[:min(12, len(rev))] + dirty
		}
		if v == "" && info.Main.Version != "" && info.Main.Version != "(devel)" {
			v = info.Main.Version
		}
	}
	if v == "" {
		v = "devel"
	}
	return v + " (" + strings.TrimPrefix(goVer, "go") + ")"
}

func runVersion(_ context.Context, args []string) error {
	fs := newFlagSet("version", "[--json]")
	asJSON := fs.Bool("json", false, "print {\"version\": ...}")
	rest, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 0 {
		return fmt.Errorf("%w: version takes no arguments", errUsage)
	}
	if *asJSON {
		return printJSON(map[string]string{"version": version()})
	}
	fmt.Println("dpxe " + version())
	return nil
}
