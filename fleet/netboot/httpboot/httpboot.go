// Package httpboot is the HTTP stage of a network boot: it renders each
// node's iPXE script at /boot/<mac>.ipxe and serves the boot files
// (kernel.bin, iPXE binaries for UEFI HTTP boot) with Content-Length.
//
// What a MAC may boot is the inventory's decision; this package only asks.
package httpboot

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"text/template"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/netboot/bootfiles"
	"github.com/discord-pxe/dpxe/fleet/netboot/inventory"
)

// DefaultKernel is the kernel file name in the boot roots.
const DefaultKernel = "kernel.bin"

// DefaultRetry is how long a script waits before asking again (unapproved
// node, failed download).
const DefaultRetry = 15 * time.Second

// Config configures a Handler.
type Config struct {
	// BaseURL is this server as nodes reach it, e.g. http://10.0.0.1:8080;
	// script and kernel URLs are built from it.
	BaseURL string
	// Controller is the controller API URL put on the kernel command line.
	Controller string
	Kernel     string        // default DefaultKernel
	Retry      time.Duration // default DefaultRetry
	Roots      *bootfiles.Roots
}

// Recorder receives the handler's observations; it must not block.
type Recorder interface {
	Sighting(inventory.Sighting)
	Event(inventory.Event)
	// MACForIP returns the MAC that DHCP last saw at ip, if any.
	MACForIP(ip netip.Addr) (net.HardwareAddr, bool)
}

// Handler serves /boot/. It is safe for concurrent use.
type Handler struct {
	cfg Config
	inv inventory.Inventory
	rec Recorder
	log *slog.Logger
}

// New returns a Handler. rec may be nil.
func New(cfg Config, inv inventory.Inventory, rec Recorder, log *slog.Logger) (*Handler, error) {
	if cfg.Kernel == "" {
		cfg.Kernel = DefaultKernel
	}
	if cfg.Retry <= 0 {
		cfg.Retry = DefaultRetry
	}
	if log == nil {
		log = slog.Default()
	}
	if !strings.HasPrefix(cfg.BaseURL, "http://") {
		return nil, fmt.Errorf("httpboot: base URL %q must start with http:// (stock iPXE has no TLS trust anchors)", cfg.BaseURL)
	}
	cfg.BaseURL = strings.TrimRight(cfg.BaseURL, "/")
	if cfg.Roots == nil {
		return nil, errors.New("httpboot: no boot roots")
	}
	return &Handler{cfg: cfg, inv: inv, rec: rec, log: log}, nil
}

// Register mounts the handler on mux at GET /boot/.
func (h *Handler) Register(mux *http.ServeMux) {
	mux.Handle("GET /boot/{name}", h)
	mux.Handle("GET /boot/node/{mac}/{name}", h)
}

// ServeHTTP serves one /boot/ request.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if name == "" {
		name = strings.TrimPrefix(r.URL.Path, "/boot/")
	}
	var mac net.HardwareAddr
	if m := r.PathValue("mac"); m != "" {
		var err error
		if mac, err = inventory.ParseMAC(m); err != nil {
			http.Error(w, "bad MAC address in path", http.StatusBadRequest)
			return
		}
	} else if strings.HasSuffix(name, ".ipxe") {
		h.serveScript(w, r, strings.TrimSuffix(name, ".ipxe"))
		return
	}
	h.serveFile(w, r, name, mac)
}

func remoteIP(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

func (h *Handler) event(mac net.HardwareAddr, st inventory.Stage, detail string) {
	if h.rec != nil && mac != nil {
		h.rec.Event(inventory.Event{MAC: mac, Stage: st, Detail: detail, At: time.Now()})
	}
}

// scriptData feeds the script templates.
type scriptData struct {
	MAC, Base, Kernel, ScriptURL, UserClass, Cmdline, NodeID string
	Retry                                                    int
}

// The kernel URL names the MAC in its path, not in a query: iPXE passes
// the whole URL as the first command-line token, and a '=' there would
// read as a key=value pair to the kernel.
//
// The boot script keeps the kernel line free of "|| goto" so that
// every token after the URL is the command line for any parser; when a
// download fails iPXE ends the script and the firmware moves to its next
// boot option (usually the network again).
//
// The scripts set our own user class first: if anything makes iPXE run
// DHCP again, the server sees "dpxe" and sends this script, never an iPXE
// binary, so the chainload loop cannot start.
var (
	bootScript = template.Must(template.New("boot").Parse(`#!ipxe
# Discord-PXE: node {{.NodeID}} ({{.MAC}})
set user-class {{.UserClass}}
echo dpxe: booting node {{.NodeID}}
kernel {{.Base}}/boot/node/{{.MAC}}/{{.Kernel}} {{.Cmdline}}
boot
`))
	waitScript = template.Must(template.New("wait").Parse(`#!ipxe
# Discord-PXE: {{.MAC}} is not approved
set user-class {{.UserClass}}
echo dpxe: this machine ({{.MAC}}) is waiting for approval.
echo dpxe: on the controller run:  dpxe nodes approve {{.MAC}} --id NAME
echo dpxe: asking again in {{.Retry}} s
sleep {{.Retry}}
chain --replace {{.ScriptURL}}
`))
	retiredScript = template.Must(template.New("retired").Parse(`#!ipxe
# Discord-PXE: {{.MAC}} is retired
echo dpxe: this machine ({{.MAC}}) is retired; not booting.
exit 1
`))
)

// UserClass is what our scripts set (the DHCP server recognises it).
const UserClass = "dpxe"

func (h *Handler) serveScript(w http.ResponseWriter, r *http.Request, macText string) {
	mac, err := inventory.ParseMAC(macText)
	if err != nil {
		http.Error(w, "bad MAC address in script name", http.StatusBadRequest)
		return
	}
	ip := remoteIP(r)
	// A script carries the node's credential: refuse it to an address that
	// DHCP saw belong to a different MAC.
	if h.rec != nil && ip.IsValid() {
		if owner, ok := h.rec.MACForIP(ip); ok && owner.String() != mac.String() {
			h.log.Warn("httpboot: script request from another node's address", "mac", mac.String(), "ip", ip, "owner", owner.String())
			http.Error(w, "this address belongs to another MAC", http.StatusForbidden)
			return
		}
	}
	ctx := r.Context()
	node, err := h.inv.Lookup(ctx, mac)
	if errors.Is(err, inventory.ErrUnknownMAC) {
		node = inventory.Node{MAC: mac, State: inventory.Discovered}
	} else if err != nil {
		h.log.Error("httpboot: inventory lookup failed", "mac", mac.String(), "err", err)
		http.Error(w, "inventory unavailable", http.StatusServiceUnavailable)
		return
	}
	if h.rec != nil {
		h.rec.Sighting(inventory.Sighting{MAC: mac, Firmware: inventory.FirmwareIPXE, IP: ip, At: time.Now()})
	}
	d := scriptData{
		MAC: inventory.MACKey(mac), Base: h.cfg.BaseURL, Kernel: h.cfg.Kernel,
		ScriptURL: h.cfg.BaseURL + "/boot/" + inventory.MACKey(mac) + ".ipxe",
		UserClass: UserClass, Retry: int(h.cfg.Retry / time.Second), NodeID: node.ID,
	}
	tmpl := waitScript
	switch node.State {
	case inventory.Approved:
		bc := appliance.BootConfig{NodeID: node.ID, Controller: h.cfg.Controller, Credential: node.Credential}
		d.Cmdline = bc.String()
		// The kernel applies exactly ParseBootConfig: never send a line it
		// would reject (it would halt with a config error).
		if _, err := appliance.ParseBootConfig([]byte(d.Kernel + " " + d.Cmdline)); err != nil {
			h.log.Error("httpboot: node's boot config is invalid", "mac", mac.String(), "node", node.ID, "err", err)
			http.Error(w, "node boot config invalid: "+err.Error(), http.StatusInternalServerError)
			return
		}
		tmpl = bootScript
	case inventory.Retired:
		tmpl = retiredScript
	}
	var b strings.Builder
	if err := tmpl.Execute(&b, d); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Length", fmt.Sprint(b.Len()))
	io.WriteString(w, b.String())
	h.event(mac, inventory.StageScriptFetched, string(node.State)+" from "+ip.String())
}

// countingWriter counts the body bytes written.
type countingWriter struct {
	http.ResponseWriter
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.n += int64(n)
	return n, err
}

// serveFile serves a boot file; mac, when known from the URL, names the
// node for the timeline.
func (h *Handler) serveFile(w http.ResponseWriter, r *http.Request, name string, mac net.HardwareAddr) {
	f, size, err := h.cfg.Roots.Open(name)
	if err != nil {
		if errors.Is(err, bootfiles.ErrNotFound) {
			http.NotFound(w, r)
		} else {
			h.log.Info("httpboot: refused", "name", name, "from", r.RemoteAddr, "err", err)
			http.Error(w, "forbidden", http.StatusForbidden)
		}
		return
	}
	defer f.Close()
	st, _ := f.Stat()
	cw := &countingWriter{ResponseWriter: w}
	// ServeContent sets Content-Length (and serves Range requests).
	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(cw, r, "", st.ModTime(), f)
	if name != h.cfg.Kernel || r.Method != http.MethodGet {
		return
	}
	if mac == nil && h.rec != nil {
		mac, _ = h.rec.MACForIP(remoteIP(r))
	}
	if cw.n == size {
		h.event(mac, inventory.StageKernelFetched, fmt.Sprintf("%d bytes", size))
	} else if r.Header.Get("Range") == "" {
		h.log.Warn("httpboot: kernel download ended early", "mac", mac.String(), "bytes", cw.n, "size", size)
		h.event(mac, inventory.StageKernelPartial, fmt.Sprintf("%d of %d bytes", cw.n, size))
	}
}
