package web

import (
	"context"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/netboot/fleetinv"
	"github.com/discord-pxe/dpxe/fleet/netboot/inventory"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// TestInventoryNetboot runs the dashboard's netboot sections on the real
// netboot inventory tables (fleetinv.Inventory, as `dpxe serve` passes it): sightings, a boot timeline and a DHCP lease
// written through store.NetbootInventory, approval through the dashboard's form.
func TestInventoryNetboot(t *testing.T) {
	ctx := context.Background()
	var inv *store.NetbootInventory
	f := newTestFleet(t, fleetOpts{total: 16, maxConc: 1, netbootFor: func(st *store.Store, c *controller.Controller) Netboot {
		inv = st.Netboot()
		return fleetinv.New(inv, c)
	}})
	mac, _ := inventory.ParseMAC("52-54-00-12-34-56")
	other, _ := inventory.ParseMAC("52-54-00-99-99-99")
	t0 := time.Now().Add(-time.Minute)
	for _, s := range []inventory.Sighting{
		{MAC: mac, Firmware: inventory.FirmwareBIOS, IP: netip.MustParseAddr("10.9.0.20"), At: t0},
		{MAC: other, Firmware: inventory.FirmwareUEFI, At: t0.Add(time.Second)},
	} {
		if err := inv.Seen(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	c := f.client()
	csrf := f.login(c, testToken)
	_, body := get(t, c, f.srv.URL+"/discovered")
	if strings.Index(body, "52-54-00-99-99-99") > strings.Index(body, "52-54-00-12-34-56") || strings.Contains(body, "disabled") {
		t.Fatalf("discovered page (newest first, enabled):\n%s", body)
	}
	code, _, _ := post(t, c, f.srv.URL+"/discovered/52-54-00-12-34-56/approve", url.Values{"csrf": {csrf}, "name": {"rack-01"}})
	if code != http.StatusSeeOther {
		t.Fatalf("approve: %d", code)
	}
	n, err := inv.Lookup(ctx, mac)
	if err != nil || n.State != inventory.Approved || n.ID != "rack-01" {
		t.Fatalf("inventory after approve: %+v %v", n, err)
	}
	if n.Credential != "" {
		t.Fatal("approval stored a credential in clear; netboot enrolls it")
	}
	if _, err := f.ctrl.Node(ctx, "rack-01"); err != nil {
		t.Fatalf("approval did not create the node at the controller: %v", err)
	}
	// Approving another MAC under a taken name is refused with a reason.
	code, _, body = post(t, c, f.srv.URL+"/discovered/52-54-00-99-99-99/approve", url.Values{"csrf": {csrf}, "name": {"rack-01"}})
	if code != http.StatusConflict || !strings.Contains(body, "already exists") {
		t.Fatalf("approve with a taken name: %d", code)
	}
	// A boot: DHCP, a failed kernel download, a retry that succeeds.
	for i, e := range []inventory.Event{
		{Stage: inventory.StageDHCPOffer, Detail: "10.9.0.20"},
		{Stage: inventory.StageKernelPartial, Detail: "connection reset after 1 MiB"},
		{Stage: inventory.StageDHCPOffer, Detail: "10.9.0.20"},
		{Stage: inventory.StageScriptFetched},
		{Stage: inventory.StageKernelFetched, Detail: "kernel.bin"},
	} {
		e.MAC, e.At = mac, t0.Add(time.Duration(i)*time.Second)
		if err := inv.Record(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	if err := inv.PutLease(ctx, inventory.Lease{IP: netip.MustParseAddr("10.9.0.20"), MAC: mac, Expiry: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.caps["rack-01"] = 4
	f.mu.Unlock()
	f.settle("rack-01")
	_, body = get(t, c, f.srv.URL+"/nodes/rack-01")
	for _, h := range []string{"52-54-00-12-34-56", "bios", "10.9.0.20, ends in", "script_fetched", "kernel_fetched"} {
		if !strings.Contains(body, h) {
			t.Errorf("node page lacks %q", h)
		}
	}
	if strings.Contains(body, "kernel_partial") {
		t.Error("node page shows the earlier boot attempt; want only the latest")
	}
	_, body = get(t, c, f.srv.URL+"/nodes")
	if !strings.Contains(body, "<td>kernel_fetched</td>") || !strings.Contains(body, "<td>52-54-00-12-34-56</td>") {
		t.Error("nodes table lacks the boot stage or MAC")
	}
	code, _, _ = post(t, c, f.srv.URL+"/discovered/52-54-00-99-99-99/ignore", url.Values{"csrf": {csrf}})
	if n, _ := inv.Lookup(ctx, other); code != http.StatusSeeOther || n.State != inventory.Retired {
		t.Fatalf("ignore: %d, state %s", code, n.State)
	}
	_, body = get(t, c, f.srv.URL+"/discovered")
	if strings.Contains(body, "52-54-00-99-99-99") {
		t.Error("an ignored MAC is still listed as discovered")
	}
}
