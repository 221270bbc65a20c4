package api

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/netboot/inventory"
)

// TestNetbootMachinesAPI runs the netboot operator endpoints on a real
// store: a sighting is listed as discovered, approval creates the node at
// the controller (and stores no credential with the MAC), the timeline is
// served, retire works and an unknown MAC is 404; each needs the admin
// token and a malformed MAC is refused naming the field.
func TestNetbootMachinesAPI(t *testing.T) {
	s := newTestServer(t, controller.Config{TotalShards: 4, MaxConcurrency: 1})
	ctx := context.Background()
	inv := s.st.Netboot()
	mac, _ := inventory.ParseMAC("52-54-00-12-34-56")
	at := time.Now().Add(-time.Minute).Truncate(time.Second)
	if err := inv.Seen(ctx, inventory.Sighting{MAC: mac, Firmware: inventory.FirmwareBIOS, IP: netip.MustParseAddr("10.9.0.20"), At: at}); err != nil {
		t.Fatal(err)
	}
	var list struct{ Machines []NetbootMachine }
	if code := s.call("GET", "/v1/netboot/machines", s.admin, "", &list); code != 200 || len(list.Machines) != 1 ||
		list.Machines[0].MAC != "52-54-00-12-34-56" || list.Machines[0].State != "discovered" || list.Machines[0].Firmware != "bios" {
		t.Fatalf("machines: %d %+v", code, list)
	}
	for _, p := range []string{"GET /v1/netboot/machines", "POST /v1/netboot/machines/52-54-00-12-34-56/approve",
		"POST /v1/netboot/machines/52-54-00-12-34-56/retire", "GET /v1/netboot/machines/52-54-00-12-34-56/timeline"} {
		method, path, _ := strings.Cut(p, " ")
		if code, _ := s.raw(method, path, "wrong", `{"node_id":"rack-01"}`); code != 401 {
			t.Errorf("%s with a wrong token: %d, want 401", p, code)
		}
	}
	var e errorBody
	if code := s.call("POST", "/v1/netboot/machines/not-a-mac/approve", s.admin, `{"node_id":"rack-01"}`, &e); code != 400 || e.Field != "mac" {
		t.Fatalf("approve a malformed MAC: %d %+v", code, e)
	}
	if code := s.call("POST", "/v1/netboot/machines/52-54-00-12-34-56/approve", s.admin, `{"node_id":"rack-01"}`, nil); code != 200 {
		t.Fatalf("approve: %d", code)
	}
	n, err := inv.Lookup(ctx, mac)
	if err != nil || n.State != inventory.Approved || n.ID != "rack-01" || n.Credential != "" {
		t.Fatalf("after approve: %+v %v", n, err)
	}
	if _, err := s.ctrl.Node(ctx, "rack-01"); err != nil {
		t.Fatalf("approval did not create the node: %v", err)
	}
	if code := s.call("POST", "/v1/netboot/machines/52-54-00-12-34-56/approve", s.admin, `{"node_id":"rack-01"}`, &e); code != 400 ||
		e.Field != "node_id" || !strings.Contains(e.Error, "already exists") {
		t.Fatalf("approve under a taken name: %d %+v", code, e)
	}
	if err := inv.Record(ctx, inventory.Event{MAC: mac, Stage: inventory.StageDHCPOffer, Detail: "ip=10.9.0.20", At: at}); err != nil {
		t.Fatal(err)
	}
	var tl struct {
		MAC      string
		Timeline []NetbootStep
	}
	if code := s.call("GET", "/v1/netboot/machines/52-54-00-12-34-56/timeline", s.admin, "", &tl); code != 200 ||
		len(tl.Timeline) != 1 || tl.Timeline[0].Stage != "dhcp_offer" || tl.Timeline[0].Detail != "ip=10.9.0.20" {
		t.Fatalf("timeline: %d %+v", code, tl)
	}
	if code := s.call("POST", "/v1/netboot/machines/52-54-00-12-34-56/retire", s.admin, "", nil); code != 200 {
		t.Fatalf("retire: %d", code)
	}
	if n, _ := inv.Lookup(ctx, mac); n.State != inventory.Retired {
		t.Fatalf("after retire: %s", n.State)
	}
	if code := s.call("POST", "/v1/netboot/machines/52-54-00-99-99-99/retire", s.admin, "", &e); code != 404 || e.Field != "mac" {
		t.Fatalf("retire an unknown MAC: %d %+v", code, e)
	}
}

// TestStrictBodies: every endpoint that takes a JSON body refuses an
// unknown field with 400 and names it (appliance.DecodeStrict), and
// refuses data after the object.
func TestStrictBodies(t *testing.T) {
	s := newTestServer(t, controller.Config{TotalShards: 4, MaxConcurrency: 1})
	s.addNode("n1")
	if err := s.st.Netboot().Seen(context.Background(), inventory.Sighting{MAC: mustMAC(t, "52-54-00-12-34-56"), At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ method, path, token, body string }{
		{"POST", "/v1/checkin", "", `{"node_id":"n1","capacity":1,"bogus_field":1}`},
		{"POST", "/v1/identify", "", `{"node_id":"n1","shard_id":0,"bogus_field":1}`},
		{"POST", "/v1/nodes", s.admin, `{"node_id":"n2","bogus_field":1}`},
		{"PUT", "/v1/budget", s.admin, `{"total":1000,"remaining":900,"reset_after":1000,"bogus_field":1}`},
		{"POST", "/v1/nodes/n1/restart-fatal", s.admin, `{"shards":[0],"bogus_field":1}`},
		{"POST", "/v1/netboot/machines/52-54-00-12-34-56/approve", s.admin, `{"node_id":"rack-01","bogus_field":1}`},
	} {
		var e errorBody
		if code := s.call(c.method, c.path, c.token, c.body, &e); code != 400 || e.Field != "bogus_field" || !strings.Contains(e.Error, "bogus_field") {
			t.Errorf("%s %s with an unknown field: %d %+v, want 400 naming bogus_field", c.method, c.path, code, e)
		}
		trailing := strings.Replace(c.body, `,"bogus_field":1}`, `} {}`, 1)
		if code := s.call(c.method, c.path, c.token, trailing, &e); code != 400 || !strings.Contains(e.Error, "after the JSON object") {
			t.Errorf("%s %s with data after the object: %d %+v", c.method, c.path, code, e)
		}
	}
	if _, err := s.ctrl.Node(context.Background(), "n2"); err == nil {
		t.Error("POST /v1/nodes with an unknown field created the node")
	}
}

func mustMAC(t *testing.T, s string) []byte {
	t.Helper()
	hw, err := inventory.ParseMAC(s)
	if err != nil {
		t.Fatal(err)
	}
	return hw
}
