package image

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRenderIPXE(t *testing.T) {
	dir, _ := builtFixture(t)
	tmpl, err := os.ReadFile(filepath.Join(dir, IPXETemplateFile))
	if err != nil {
		t.Fatal(err)
	}
	if string(tmpl) != IPXETemplate {
		t.Fatal("netboot/boot.ipxe.tmpl differs from IPXETemplate")
	}
	out, err := RenderIPXE(string(tmpl), IPXEVars{
		KernelURL: "http://10.0.0.1:8080/boot/kernel.bin",
		Cmdline:   "node=n1 controller=http://10.0.0.1:8080 cred=abcdefghijklmnop1234",
	})
	if err != nil {
		t.Fatal(err)
	}
	s := string(out)
	if !strings.HasPrefix(s, "#!ipxe\n") {
		t.Errorf("script does not start with #!ipxe:\n%s", s)
	}
	for _, want := range []string{
		"\nkernel http://10.0.0.1:8080/boot/kernel.bin node=n1 controller=http://10.0.0.1:8080 cred=abcdefghijklmnop1234 || goto failed\n",
		"\nboot || goto failed\n",
		"# Variables (Go text/template): {{.KernelURL}}",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("script lacks %q:\n%s", want, s)
		}
	}
}

func TestRenderIPXERejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    IPXEVars
	}{
		{"no URL", IPXEVars{Cmdline: "node=n1"}},
		{"URL with space", IPXEVars{KernelURL: "http://x/k.bin initrd=evil", Cmdline: "node=n1"}},
		{"line break in cmdline", IPXEVars{KernelURL: "http://x/k.bin", Cmdline: "node=n1\nshell"}},
		{"settings expansion", IPXEVars{KernelURL: "http://x/${net0/ip}/k.bin", Cmdline: "node=n1"}},
		{"invalid boot config", IPXEVars{KernelURL: "http://x/k.bin", Cmdline: "node=n1 colour=blue"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := RenderIPXE(IPXETemplate, tc.v); !errors.Is(err, ErrIPXEVars) {
				t.Fatalf("RenderIPXE: %v, want ErrIPXEVars", err)
			}
		})
	}
}
