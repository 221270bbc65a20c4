// Package httpboot is the HTTP stage of a network boot: it renders each
// node's iPXE script at /boot/<mac>.ipxe and serves the boot files
// (kernel.bin, iPXE binaries for UEFI HTTP boot) with Content-Length.
//
// What a MAC may boot is the inventory's decision, and which address may
// fetch an approved MAC's script (it carries a credential) is the
// Recorder's; this package asks both and refuses what they refuse
// (docs/security.md):
//
//   - a request whose Host is not the boot address (421): a page in an
//     operator's browser that rebinds its DNS name to the boot address
//     cannot read a script;
//   - an approved MAC's script to an address the Recorder does not let
//     claim it (403), or without a fresh DHCP exchange (a script that runs
//     DHCP again);
//   - a credential for a node that is live: the inventory's Enroll says
//     so, and the machine gets a script that waits for the lease to lapse.
package httpboot

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/netboot/bootfiles"
	"github.com/discord-pxe/dpxe/fleet/netboot/inventory"
	"github.com/discord-pxe/dpxe/fleet/netboot/stats"
	"github.com/discord-pxe/dpxe/fleet/security"
)

// DefaultKernel is the kernel file name in the boot roots.
const DefaultKernel = "kernel.bin"

// DefaultRetry is how long a script waits before asking again (unapproved
// node, failed download).
const DefaultRetry = 15 * time.Second

// maxLiveWait bounds how long the script of a live node's machine waits
// before it asks again.
const maxLiveWait = 5 * time.Minute

// Errors a Recorder's ClaimScript returns.
var (
	// ErrNotLeased: the address is not the one this server's DHCP leased
	// to the MAC (authoritative mode).
	ErrNotLeased = errors.New("httpboot: address not leased to this MAC")
	// ErrNoTicket: no DHCP exchange with the MAC recently enough, or its
	// script was fetched already since.
	ErrNoTicket = errors.New("httpboot: no fresh DHCP exchange for this script")
	// ErrEnrollOff: this server does not enroll machines over the network
	// (proxy DHCP without the operator's opt-in, or no DHCP).
	ErrEnrollOff = errors.New("httpboot: network enrollment is off")
)

// Config configures a Handler.
type Config struct {
	// BaseURL is this server as nodes reach it, e.g. http://10.0.0.1:8080;
	// script and kernel URLs are built from it.
	BaseURL string
	// Controller is the controller API URL put on the kernel command line.
	Controller string
	// ControllerPin is put on the kernel command line as controller_pin=
	// ("" for none): the controller's TLS key, which nodes pin.
	ControllerPin string
	Kernel        string        // default DefaultKernel
	Retry         time.Duration // default DefaultRetry
	Roots         *bootfiles.Roots
	// EnrollOff says, on the console of an approved machine, why this
	// server does not enroll it over the network (see ErrEnrollOff).
	EnrollOff string
	// Refusals counts and logs refused requests, rate-limited; nil logs
	// to the handler's logger.
	Refusals *security.Log
	// Stats, when set, counts requests, answers (status below 400) and
	// their body bytes, refusals by reason (from the status) and bodies
	// that ended before their Content-Length.
	Stats *stats.Counters
}

// Recorder receives the handler's observations and decides which address
// may fetch an approved MAC's script. Its methods must not block.
type Recorder interface {
	Sighting(inventory.Sighting)
	Event(inventory.Event)
	// MACForIP returns the MAC this server bound ip to (its own DHCP
	// lease, or a claimed script in proxy mode), if any; never what a
	// client claimed.
	MACForIP(ip netip.Addr) (net.HardwareAddr, bool)
	// VerifiesAddresses reports whether every boot client's address is
	// one this server leased (authoritative DHCP): then a script, even
	// one without a credential, goes only to the MAC's own address.
	VerifiesAddresses() bool
	// ClaimScript decides whether ip may fetch the enrollment script of
	// the approved MAC mac now, and uses the right up if so: nil, or
	// ErrNotLeased, ErrNoTicket or ErrEnrollOff (wrapped).
	ClaimScript(mac net.HardwareAddr, ip netip.Addr) error
}

// Handler serves /boot/. It is safe for concurrent use.
type Handler struct {
	cfg      Config
	inv      inventory.Inventory
	rec      Recorder
	log      *slog.Logger
	host     string // the Host of BaseURL, lower case
	hostBare string // the same without ":80" when BaseURL has no port
}

// New returns a Handler. rec may be nil: then no approved machine's script
// carries a credential (ErrEnrollOff).
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
	u, err := url.Parse(cfg.BaseURL)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("httpboot: base URL %q has no host", cfg.BaseURL)
	}
	if cfg.Refusals == nil {
		cfg.Refusals = security.New(log)
	}
	if cfg.EnrollOff == "" {
		cfg.EnrollOff = "this server does not enroll machines over the network"
	}
	h := &Handler{cfg: cfg, inv: inv, rec: rec, log: log, host: strings.ToLower(u.Host)}
	if u.Port() == "" {
		h.hostBare = h.host + ":80"
	}
	return h, nil
}

// Register mounts the handler on mux at GET /boot/.
func (h *Handler) Register(mux *http.ServeMux) {
	mux.Handle("GET /boot/{name}", h)
	mux.Handle("GET /boot/node/{mac}/{name}", h)
}

// ServeHTTP serves one /boot/ request, counted in Config.Stats.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	st := h.cfg.Stats
	if st == nil {
		h.serve(w, r)
		return
	}
	st.Request(stats.HTTP)
	sw := &statusWriter{ResponseWriter: w}
	h.serve(sw, r)
	switch code := sw.status(); {
	case code >= 400:
		st.Refuse(stats.HTTP, refusalReason(code))
	case r.Method != http.MethodHead && sw.short():
		st.Error(stats.HTTP, sw.n)
	default:
		st.Answer(stats.HTTP, sw.n)
	}
}

// refusalReason names an HTTP error status for stats.
func refusalReason(code int) string {
	switch {
	case code == http.StatusBadRequest:
		return stats.BadRequest
	case code == http.StatusForbidden:
		return stats.Forbidden
	case code == http.StatusNotFound:
		return stats.NotFound
	case code == http.StatusMisdirectedRequest:
		return stats.Misdirected
	case code == http.StatusServiceUnavailable:
		return stats.Unavailable
	case code >= 500:
		return stats.ServerError
	}
	return stats.Other
}

// statusWriter records the status and counts the body bytes of a response.
type statusWriter struct {
	http.ResponseWriter
	code int
	n    int64
}

func (s *statusWriter) WriteHeader(code int) {
	if s.code == 0 {
		s.code = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(p []byte) (int, error) {
	if s.code == 0 {
		s.code = http.StatusOK
	}
	n, err := s.ResponseWriter.Write(p)
	s.n += int64(n)
	return n, err
}

func (s *statusWriter) status() int {
	if s.code == 0 {
		return http.StatusOK
	}
	return s.code
}

// short reports a body that ended before the Content-Length it announced
// (the client went away, or a write failed).
func (s *statusWriter) short() bool {
	cl, err := strconv.ParseInt(s.Header().Get("Content-Length"), 10, 64)
	return err == nil && s.n < cl
}

// serve serves one /boot/ request.
func (h *Handler) serve(w http.ResponseWriter, r *http.Request) {
	if host := strings.ToLower(r.Host); host != h.host && (h.hostBare == "" || host != h.hostBare) {
		h.cfg.Refusals.Refused(security.BootHost, security.Source(r.RemoteAddr), "httpboot: request for another host refused",
			"host", truncate(r.Host, 64), "path", truncate(r.URL.Path, 128))
		http.Error(w, "this server serves boot files only as "+h.host, http.StatusMisdirectedRequest)
		return
	}
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

// truncate shortens a client-supplied string for a log line.
func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
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
	MAC, Base, Kernel, ScriptURL, UserClass, Cmdline, NodeID, Why string
	Retry                                                         int
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
	// The scripts that ask again run DHCP first: an approved machine's
	// script goes only to a machine that has just had a DHCP exchange
	// with this server (its "ticket").
	waitScript = template.Must(template.New("wait").Parse(`#!ipxe
# Discord-PXE: {{.MAC}} is not approved
set user-class {{.UserClass}}
echo dpxe: this machine ({{.MAC}}) is waiting for approval.
echo dpxe: on the controller run:  dpxe nodes approve {{.MAC}} --id NAME
:retry
echo dpxe: asking again in {{.Retry}} s
sleep {{.Retry}}
dhcp || goto retry
chain --replace {{.ScriptURL}} || goto retry
`))
	liveScript = template.Must(template.New("live").Parse(`#!ipxe
# Discord-PXE: node {{.NodeID}} ({{.MAC}}) is live
set user-class {{.UserClass}}
echo dpxe: node {{.NodeID}} is still checking in from its previous boot; a new boot enrolls once its lease lapses.
echo dpxe: if another machine runs as {{.NodeID}}, this one will not enroll: see the events page (enrollment_refused).
:retry
echo dpxe: asking again in {{.Retry}} s
sleep {{.Retry}}
dhcp || goto retry
chain --replace {{.ScriptURL}} || goto retry
`))
	againScript = template.Must(template.New("again").Parse(`#!ipxe
# Discord-PXE: {{.MAC}}: no fresh DHCP exchange
set user-class {{.UserClass}}
echo dpxe: this script must follow a DHCP exchange with this server; running DHCP again
:retry
sleep 2
dhcp || goto retry
chain --replace {{.ScriptURL}} || goto retry
`))
	enrollOffScript = template.Must(template.New("enroll-off").Parse(`#!ipxe
# Discord-PXE: node {{.NodeID}} ({{.MAC}}): network enrollment is off
echo dpxe: this machine is approved as {{.NodeID}}, but {{.Why}}.
echo dpxe: boot it from a USB stick made with dpxe flash (see docs/security.md).
exit 1
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
	src := security.Source(r.RemoteAddr)
	ctx := r.Context()
	node, err := h.inv.Lookup(ctx, mac)
	if errors.Is(err, inventory.ErrUnknownMAC) {
		node = inventory.Node{MAC: mac, State: inventory.Discovered}
	} else if err != nil {
		h.log.Error("httpboot: inventory lookup failed", "mac", mac.String(), "err", err)
		http.Error(w, "inventory unavailable", http.StatusServiceUnavailable)
		return
	}
	d := scriptData{
		MAC: inventory.MACKey(mac), Base: h.cfg.BaseURL, Kernel: h.cfg.Kernel,
		ScriptURL: h.cfg.BaseURL + "/boot/" + inventory.MACKey(mac) + ".ipxe",
		UserClass: UserClass, Retry: int(h.cfg.Retry / time.Second), NodeID: node.ID,
	}
	tmpl, detail := waitScript, string(node.State)+" from "+ip.String()
	switch node.State {
	case inventory.Approved:
		claim := ErrEnrollOff
		if h.rec != nil {
			claim = h.rec.ClaimScript(mac, ip)
		}
		switch {
		case claim == nil:
		case errors.Is(claim, ErrNotLeased):
			// Not the machine: nothing on its timeline.
			h.cfg.Refusals.Refused(security.BootAddress, src, "httpboot: script refused to an address not leased to its MAC",
				"mac", mac.String(), "node", node.ID)
			http.Error(w, "this address was not leased to "+mac.String(), http.StatusForbidden)
			return
		case errors.Is(claim, ErrNoTicket):
			h.cfg.Refusals.Refused(security.BootTicket, src, "httpboot: script without a fresh DHCP exchange; asking for one",
				"mac", mac.String(), "node", node.ID)
			h.writeScript(w, againScript, d, mac, "refused (no fresh DHCP exchange): asked to run DHCP again, from "+ip.String())
			return
		default: // ErrEnrollOff
			h.cfg.Refusals.Refused(security.BootEnrollOff, src, "httpboot: approved machine asked for its script; network enrollment is off",
				"mac", mac.String(), "node", node.ID)
			d.Why = h.cfg.EnrollOff
			h.writeScript(w, enrollOffScript, d, mac, "refused (network enrollment off) from "+ip.String())
			return
		}
		cred, err := h.inv.Enroll(ctx, node, ip)
		var live *inventory.LiveError
		if errors.As(err, &live) {
			h.cfg.Refusals.Refused(security.EnrollLive, src, "httpboot: enrollment of a live node refused",
				"mac", mac.String(), "node", node.ID, "lease_left", live.RetryAfter.Round(time.Second).String())
			d.Retry = int(min(max(live.RetryAfter+time.Second, h.cfg.Retry), maxLiveWait) / time.Second)
			h.writeScript(w, liveScript, d, mac, "refused (node is live) from "+ip.String())
			return
		}
		if err != nil {
			h.log.Error("httpboot: enrollment failed", "mac", mac.String(), "node", node.ID, "err", err)
			http.Error(w, "enrollment failed; retry", http.StatusServiceUnavailable)
			return
		}
		bc := appliance.BootConfig{NodeID: node.ID, Controller: h.cfg.Controller, Credential: cred, ControllerPin: h.cfg.ControllerPin}
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
	if node.State != inventory.Approved && h.rec != nil && h.rec.VerifiesAddresses() {
		// Authoritative mode: even a script without a credential goes
		// only to the MAC's own leased address, so nobody else can add
		// machines to the inventory or steps to a timeline.
		if owner, ok := h.rec.MACForIP(ip); !ok || owner.String() != mac.String() {
			h.cfg.Refusals.Refused(security.BootAddress, src, "httpboot: script refused to an address not leased to its MAC",
				"mac", mac.String())
			http.Error(w, "this address was not leased to "+mac.String(), http.StatusForbidden)
			return
		}
	}
	if h.rec != nil {
		h.rec.Sighting(inventory.Sighting{MAC: mac, Firmware: inventory.FirmwareIPXE, IP: ip, At: time.Now()})
	}
	h.writeScript(w, tmpl, d, mac, detail)
}

// writeScript renders one script and records it on mac's timeline.
func (h *Handler) writeScript(w http.ResponseWriter, tmpl *template.Template, d scriptData, mac net.HardwareAddr, detail string) {
	var b strings.Builder
	if err := tmpl.Execute(&b, d); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Length", fmt.Sprint(b.Len()))
	io.WriteString(w, b.String())
	h.event(mac, inventory.StageScriptFetched, detail)
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
	if name != h.cfg.Kernel || r.Method != http.MethodGet || h.rec == nil {
		return
	}
	// The timeline step goes to the MAC bound to the client's address,
	// and only there: a MAC in the URL is what the client claims.
	owner, bound := h.rec.MACForIP(remoteIP(r))
	switch {
	case !bound:
		return
	case mac == nil:
		mac = owner
	case owner.String() != mac.String():
		return
	}
	if cw.n == size {
		h.event(mac, inventory.StageKernelFetched, fmt.Sprintf("%d bytes", size))
	} else if r.Header.Get("Range") == "" {
		h.log.Warn("httpboot: kernel download ended early", "mac", mac.String(), "bytes", cw.n, "size", size)
		h.event(mac, inventory.StageKernelPartial, fmt.Sprintf("%d of %d bytes", cw.n, size))
	}
}
