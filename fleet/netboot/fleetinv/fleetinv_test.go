package fleetinv

import (
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/netboot/inventory"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// TestEnrollAndApprove runs the adapter on a real store and controller:
// approval creates the node and stores no credential with the MAC, a
// taken name is refused, Enroll gives a credential for a node that is not
// live and refuses one that is with an inventory.LiveError (so a script
// fetch never replaces a running node's credential), and Ignore retires.
func TestEnrollAndApprove(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "dpxe.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	c, err := controller.New(ctx, st, controller.Config{TotalShards: 4, RebalanceEvery: -1}, time.Now, nil)
	if err != nil {
		t.Fatal(err)
	}
	inv := New(st.Netboot(), c)
	mac, _ := inventory.ParseMAC("52-54-00-12-34-56")
	other, _ := inventory.ParseMAC("52-54-00-99-99-99")
	for _, hw := range []inventory.Sighting{{MAC: mac, At: time.Now()}, {MAC: other, At: time.Now().Add(time.Second)}} {
		if err := inv.Seen(ctx, hw); err != nil {
			t.Fatal(err)
		}
	}
	if d, err := inv.Discovered(ctx); err != nil || len(d) != 2 || d[0].MAC != "52-54-00-99-99-99" {
		t.Fatalf("discovered (newest first): %+v %v", d, err)
	}
	if err := inv.Approve(ctx, "52-54-00-12-34-56", "rack-01"); err != nil {
		t.Fatal(err)
	}
	n, err := inv.Lookup(ctx, mac)
	if err != nil || n.State != inventory.Approved || n.ID != "rack-01" || n.Credential != "" {
		t.Fatalf("after approve: %+v %v", n, err)
	}
	if err := inv.Approve(ctx, "52-54-00-99-99-99", "rack-01"); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("approve under a taken name: %v", err)
	}
	cred, err := inv.Enroll(ctx, n, netip.MustParseAddr("10.9.0.20"))
	if err != nil || appliance.ValidateCredential(cred) != nil {
		t.Fatalf("enroll a node that is not live: %q %v", cred, err)
	}
	if _, err := c.Checkin(ctx, &appliance.CheckinRequest{NodeID: "rack-01", Capacity: 4}, "10.9.0.20"); err != nil {
		t.Fatal(err)
	}
	_, err = inv.Enroll(ctx, n, netip.MustParseAddr("10.9.0.20"))
	var live *inventory.LiveError
	if !errors.As(err, &live) || live.NodeID != "rack-01" || live.RetryAfter <= 0 {
		t.Fatalf("enroll a live node: %v", err)
	}
	if err := inv.Ignore(ctx, "52-54-00-99-99-99"); err != nil {
		t.Fatal(err)
	}
	if d, _ := inv.Discovered(ctx); len(d) != 0 {
		t.Fatalf("an ignored MAC is still discovered: %+v", d)
	}
	if err := inv.Ignore(ctx, "52-54-00-00-00-77"); err == nil || !strings.Contains(err.Error(), "never seen") {
		t.Fatalf("ignore an unknown MAC: %v", err)
	}
}
