package controller

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// TestDeleteNode (issue 23.6): a live node is refused and keeps working; a
// node whose lease lapsed is deleted with its credential, shard status
// and pending enrollment, stays deleted after a restart, and its ID can
// be added again with a new credential.
func TestDeleteNode(t *testing.T) {
	h := newHarness(t, Config{TotalShards: 4, Lease: 10 * time.Second})
	ctx := context.Background()
	h.add("a", "b")
	r := h.checkin("a", 4, 0)
	if _, err := h.c.Checkin(ctx, &appliance.CheckinRequest{NodeID: "a", Capacity: 4, Generation: r.Generation, FatalShards: 1,
		Shards: []appliance.ShardStatus{{ID: 0, State: appliance.ShardFatal, CloseCode: 4004}}}, "127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	if err := h.c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.c.DeleteNode(ctx, "a"); !errors.Is(err, ErrLive) {
		t.Fatalf("delete of a live node: %v, want ErrLive", err)
	}
	if err := h.c.Authenticate(ctx, "a", h.creds["a"]); err != nil {
		t.Fatalf("a refused delete revoked the credential: %v", err)
	}
	if err := h.c.DeleteNode(ctx, "nobody"); !errors.Is(err, ErrUnknownNode) {
		t.Fatalf("delete of an unknown node: %v", err)
	}
	if _, err := h.c.Enroll(ctx, "b", "10.0.0.9", time.Minute); err != nil {
		t.Fatal(err)
	}

	h.clock.Advance(11 * time.Second) // a's lease lapses
	for _, id := range []string{"a", "b"} {
		if err := h.c.DeleteNode(ctx, id); err != nil {
			t.Fatalf("delete %s: %v", id, err)
		}
		if err := h.c.Authenticate(ctx, id, h.creds[id]); !errors.Is(err, ErrUnknownNode) {
			t.Errorf("%s's credential after the delete: %v", id, err)
		}
		if _, err := h.st.Node(ctx, id); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s still in the store: %v", id, err)
		}
		if _, err := h.c.Node(ctx, id); !errors.Is(err, ErrUnknownNode) {
			t.Errorf("%s still in the controller: %v", id, err)
		}
	}
	if got, err := h.st.ShardStatuses(ctx, "a"); err != nil || len(got) != 0 {
		t.Errorf("a's shard status after the delete: %v %v", got, err)
	}
	var enrollments int
	if err := h.st.DB().QueryRowContext(ctx, `SELECT COUNT(*) FROM enrollments WHERE node_id = 'b'`).Scan(&enrollments); err != nil || enrollments != 0 {
		t.Errorf("b's enrollment after the delete: %d rows, %v", enrollments, err)
	}
	if err := h.c.Flush(ctx); err != nil {
		t.Fatalf("flush after the delete: %v", err)
	}
	ev, err := h.st.Events(ctx, 0, EventNodeDeleted, 10)
	if err != nil || len(ev) != 2 {
		t.Errorf("node_deleted events: %+v %v", ev, err)
	}

	h.restart()
	if _, err := h.c.Node(ctx, "a"); !errors.Is(err, ErrUnknownNode) {
		t.Errorf("a back after a restart: %v", err)
	}
	old := h.creds["a"]
	h.add("a")
	if h.c.Authenticate(ctx, "a", old) == nil || h.c.Authenticate(ctx, "a", h.creds["a"]) != nil {
		t.Error("a added again: only the new credential may work")
	}
	if err := h.c.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
}
