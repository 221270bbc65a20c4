package main

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/discord-pxe/dpxe/fleet/store"
)

func TestNodesOffline(t *testing.T) {
	db := filepath.Join(t.TempDir(), "dpxe.db")
	st, err := store.Open(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	if code := run([]string{"nodes", "--db", db, "add", "off-1"}); code != 0 {
		t.Fatalf("add: exit %d", code)
	}
	if code := run([]string{"nodes", "--db", db, "add", "off-1"}); code != 1 {
		t.Fatalf("duplicate add: exit %d", code)
	}
	if code := run([]string{"nodes", "--db", db, "add", "bad id"}); code != 2 {
		t.Fatalf("bad ID: exit %d", code)
	}
	if code := run([]string{"nodes", "--db", db, "drain", "off-1"}); code != 2 {
		t.Fatalf("offline drain: exit %d", code)
	}
	if code := run([]string{"nodes", "--db", db}); code != 0 {
		t.Fatalf("list: exit %d", code)
	}
	st, _ = store.Open(context.Background(), db)
	defer st.Close()
	n, err := st.Node(context.Background(), "off-1")
	if err != nil || len(n.CredHash) != 32 {
		t.Fatalf("stored node %+v %v", n, err)
	}
}
