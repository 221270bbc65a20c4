package image

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"text/template"

	"github.com/discord-pxe/dpxe/appliance"
)

// IPXETemplate is netboot/boot.ipxe.tmpl: a Go text/template that renders a
// node's iPXE script. Its variables are the fields of IPXEVars.
const IPXETemplate = `#!ipxe
# Discord-PXE boot script, rendered per node from boot.ipxe.tmpl.
# Variables (Go text/template): {{"{{"}}.KernelURL{{"}}"}} = URL of kernel.bin,
# {{"{{"}}.Cmdline{{"}}"}} = the node's boot config as one line of key=value tokens.
# On BIOS iPXE boots kernel.bin as a Multiboot kernel, on UEFI as an EFI
# application; both give it the command line.
echo Discord-PXE: loading ${platform} kernel {{.KernelURL}}
:retry
kernel {{.KernelURL}} {{.Cmdline}} || goto failed
boot || goto failed
:failed
echo Discord-PXE: boot failed, retrying in 10 seconds
sleep 10
goto retry
`

// IPXEVars are the variables of IPXETemplate.
type IPXEVars struct {
	KernelURL string // http://... or tftp://... URL of kernel.bin
	Cmdline   string // boot config tokens, e.g. "node=n1 controller=http://10.0.0.1:8080 cred=..."
}

// ErrIPXEVars means a value would change the script's meaning.
var ErrIPXEVars = errors.New("ipxe: unsafe template value")

// RenderIPXE renders tmpl (normally IPXETemplate or the boot.ipxe.tmpl of a
// build) with v. It refuses values that iPXE would split or expand: line
// breaks, '$' (settings expansion), and a command line that is not a valid
// boot config.
func RenderIPXE(tmpl string, v IPXEVars) ([]byte, error) {
	for name, s := range map[string]string{"KernelURL": v.KernelURL, "Cmdline": v.Cmdline} {
		if strings.ContainsAny(s, "\r\n$") {
			return nil, fmt.Errorf("%w: %s contains a line break or '$'", ErrIPXEVars, name)
		}
	}
	if v.KernelURL == "" || strings.ContainsAny(v.KernelURL, " \t") {
		return nil, fmt.Errorf("%w: KernelURL %q", ErrIPXEVars, v.KernelURL)
	}
	if _, err := appliance.ParseBootConfig([]byte(v.Cmdline)); err != nil {
		return nil, fmt.Errorf("%w: Cmdline: %v", ErrIPXEVars, err)
	}
	t, err := template.New("boot.ipxe").Option("missingkey=error").Parse(tmpl)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := t.Execute(&b, v); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
