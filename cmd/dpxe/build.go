package main

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/discord-pxe/dpxe/image"
	"github.com/discord-pxe/dpxe/kernel"
)

func init() {
	register(&command{
		name:    "build",
		summary: "assemble the kernel and write kernel.bin, netboot/, usb.img and manifest.json",
		run:     runBuild,
	})
}

// trustFlags collects repeated --trust PEMFILE flags.
type trustFlags []string

func (t *trustFlags) String() string     { return strings.Join(*t, ",") }
func (t *trustFlags) Set(v string) error { *t = append(*t, v); return nil }

// runBuild implements `dpxe build [--out DIR] [--src DIR] [--trust PEMFILE]...`.
func runBuild(ctx context.Context, args []string) error {
	flags := newFlagSet("build", "[--out DIR] [--src DIR] [--trust PEMFILE]... [--json]")
	var trust trustFlags
	flags.Var(&trust, "trust", "compile the TLS trust anchors of this PEM `file` into the kernel instead of the default set (repeatable; \"default\" names the default set)")
	out := flags.String("out", "out", "output `directory` for the artifacts")
	src := flags.String("src", "", "assemble the kernel tree in this `directory` instead of the sources built into dpxe")
	asJSON := flags.Bool("json", false, "print the manifest (manifest.json) instead of text")
	if err := parseFlags(flags, args); err != nil {
		return err
	}
	if flags.NArg() != 0 {
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, flags.Args())
	}
	var sourcesTrust []image.TrustSource
	for _, f := range trust {
		if f == "default" {
			sourcesTrust = append(sourcesTrust, image.TrustSource{Name: image.DefaultTrustName, PEM: image.DefaultTrustPEM})
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		sourcesTrust = append(sourcesTrust, image.TrustSource{Name: f, PEM: b})
	}
	m, err := image.Build(ctx, image.Options{
		Trust:     sourcesTrust,
		Sources:   sources(*src),
		Root:      kernel.Root,
		MBRLoader: kernel.MBRLoader,
		OutDir:    *out,
	})
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(m)
	}
	fmt.Printf("kernel %s (%s)\n", m.KernelVersion, m.NASMVersion)
	for _, a := range m.Artifacts {
		fmt.Printf("  %-24s %10d  sha256:%s\n", a.Path, a.Size, a.SHA256)
	}
	fmt.Printf("trust anchors: %d, sha256:%s\n", len(m.Trust.Anchors), m.Trust.SHA256)
	fmt.Printf("wrote %s/%s\n", *out, image.ManifestFile)
	return nil
}

// sources returns the kernel tree to assemble: a directory, or the embedded one.
func sources(dir string) fs.FS {
	if dir != "" {
		return os.DirFS(dir)
	}
	return kernel.Sources
}
