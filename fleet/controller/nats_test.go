package controller

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/discord-pxe/dpxe/fleet/events"
	"github.com/discord-pxe/dpxe/fleet/events/embedded"
	"github.com/discord-pxe/dpxe/fleet/events/natsauth"
)

// TestCheckinCarriesNATSAccess: with SetNATSAccess wired as dpxe serve
// --nats-auth wires it, a node's check-in answer holds broker URLs and
// credentials that the embedded server (its authorizer fed by this
// controller's nodes, as in serve) accepts for the node's own shards'
// subjects and refuses for another node's; without it the answer has no
// "nats".
func TestCheckinCarriesNATSAccess(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 4})
	h.add("n1", "n2")
	if r := h.checkin("n1", 4, 0); r.NATS != nil {
		t.Fatalf("no broker access set, answer has %+v", r.NATS)
	}
	dir := t.TempDir()
	f, err := natsauth.Open(filepath.Join(dir, natsauth.FileName))
	if err != nil {
		t.Fatal(err)
	}
	auth, err := f.Authorizer("bot", func(id string) ([]uint32, bool) {
		for _, n := range h.c.Nodes() {
			if n.ID == id && n.Live {
				var s []uint32
				for i := uint32(0); i < n.RangeCount; i++ {
					s = append(s, n.RangeStart+i)
				}
				return s, true
			}
		}
		return nil, false
	})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := embedded.Start(embedded.ServerConfig{StoreDir: filepath.Join(dir, "nats"), Listen: "127.0.0.1:0", Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	admin, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ajs, _ := jetstream.New(admin)
	if _, err := events.EnsureStream(ctx, ajs, "bot", events.DefaultStreamLimits()); err != nil {
		t.Fatal(err)
	}
	h.c.SetNATSAccess(f.NodeAccess("bot", []string{srv.ClientURL()}))

	r1 := h.checkin("n1", 2, 1)
	r2 := h.checkin("n2", 2, 0)
	r1 = h.checkin("n1", 2, r2.Generation)
	if r1.NATS == nil || r2.NATS == nil {
		t.Fatalf("answers without nats: %+v / %+v", r1.NATS, r2.NATS)
	}
	a1, a2 := r1.NATS, r2.NATS
	if a1.User != "node-n1" || a1.App != "bot" || len(a1.URLs) != 1 || a1.URLs[0] != srv.ClientURL() || a1.Password == a2.Password {
		t.Fatalf("n1's access: user %q app %q urls %v (password equal to n2's: %v)", a1.User, a1.App, a1.URLs, a1.Password == a2.Password)
	}
	if r1.RangeCount == 0 || r2.RangeCount == 0 {
		t.Fatalf("ranges n1 %d+%d, n2 %d+%d", r1.RangeStart, r1.RangeCount, r2.RangeStart, r2.RangeCount)
	}
	// n1 with n2's password: refused
	if nc, err := nats.Connect(a1.URLs[0], nats.UserInfo(a1.User, a2.Password), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("n1 connected with n2's password")
	}
	perm := make(chan string, 4)
	nc, err := nats.Connect(a1.URLs[0], nats.UserInfo(a1.User, a1.Password), nats.MaxReconnects(0),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { perm <- err.Error() }))
	if err != nil {
		t.Fatalf("n1 with its answer's credentials: %v", err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	own := fmt.Sprintf("dpxe.bot.events.%d.MESSAGE_CREATE", r1.RangeStart)
	ack, err := js.Publish(ctx, own, []byte(`{"op":0}`), jetstream.WithMsgID("s:1"))
	if err != nil || ack.Sequence != 1 {
		t.Fatalf("n1 publishing to its own shard %s: %+v %v", own, ack, err)
	}
	other := fmt.Sprintf("dpxe.bot.events.%d.MESSAGE_CREATE", r2.RangeStart)
	if err := nc.Publish(other, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	select {
	case e := <-perm:
		if !strings.Contains(e, "Permissions Violation") || !strings.Contains(e, other) {
			t.Fatalf("publish to n2's shard: %s", e)
		}
	case <-ctx.Done():
		t.Fatalf("publish to n2's shard %s: no permissions violation", other)
	}
	// the JSON the node reads names the fields documented in docs/api.md
	if r1.NATS.Validate() != nil {
		t.Fatal(r1.NATS.Validate())
	}
	h.c.SetNATSAccess(nil)
	if r := h.checkin("n1", 2, r1.Generation); r.NATS != nil {
		t.Fatal("access still in the answer after SetNATSAccess(nil)")
	}
}
