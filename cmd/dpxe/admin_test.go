package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/discord-pxe/dpxe/fleet/store"
	"github.com/discord-pxe/dpxe/web"
)

// withStdin runs f with standard input reading text.
func withStdin(t *testing.T, text string, f func()) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	go func() { w.WriteString(text); w.Close() }()
	old := os.Stdin
	os.Stdin = r
	defer func() { os.Stdin = old; r.Close() }()
	f()
}

func TestAdminPasswd(t *testing.T) {
	ctx := context.Background()
	db := filepath.Join(t.TempDir(), "dpxe.db")
	if code := run([]string{"admin", "passwd", "--db", db}); code != 1 {
		t.Fatalf("missing database: exit %d, want 1", code)
	}
	st, err := store.Open(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	for _, tc := range []struct {
		name  string
		stdin string
		args  []string
		code  int
	}{
		{"too short", "short\n", nil, 2},
		{"empty", "", nil, 2},
		{"extra argument", "x\n", []string{"pw"}, 2},
		{"set", "a fine long password\n", nil, 0},
	} {
		var code int
		withStdin(t, tc.stdin, func() { code = run(append([]string{"admin", "passwd", "--db", db}, tc.args...)) })
		if code != tc.code {
			t.Errorf("%s: exit %d, want %d", tc.name, code, tc.code)
		}
	}
	st, err = store.Open(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	h, err := st.Setting(ctx, web.PasswordSetting)
	st.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := web.CheckPassword(h, "a fine long password"); err != nil {
		t.Fatalf("stored hash does not match: %v", err)
	}
	if code := run([]string{"admin", "passwd", "--db", db, "--clear"}); code != 0 {
		t.Fatalf("--clear: exit %d", code)
	}
	st, _ = store.Open(ctx, db)
	defer st.Close()
	if _, err := st.Setting(ctx, web.PasswordSetting); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("password still stored after --clear: %v", err)
	}
}
