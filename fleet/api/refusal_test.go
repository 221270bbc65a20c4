package api

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/security"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// TestRefusalsRateLimited performs the flood of the security probe (issue
// 24): thousands of unauthenticated check-ins and admin requests from one
// source. Each is refused and counted; the log gets one line per source
// and reason, not one per request.
func TestRefusalsRateLimited(t *testing.T) {
	var logs bytes.Buffer
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "d.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctrl, _ := controller.New(ctx, st, controller.Config{}, time.Now, nil)
	if _, err := ctrl.AddNode(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	refusals := security.New(slogTo(&logs))
	srv := New(ctrl, HashToken("admintoken"), nil)
	srv.SetRefusals(refusals)
	mux := http.NewServeMux()
	srv.Register(mux)
	const flood = 500
	send := func(remote, method, path, body, tok string) int {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.RemoteAddr = remote
		req.Header.Set("Authorization", "Bearer "+tok)
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		return rec.Code
	}
	for i := 0; i < flood; i++ {
		for _, id := range []string{"n1", "ghost"} {
			if code := send("10.77.0.66:40000", "POST", "/v1/checkin", `{"node_id":"`+id+`","capacity":1}`, "wrong"); code != 401 {
				t.Fatalf("refused check-in: %d", code)
			}
		}
		if code := send("10.77.0.66:40001", "GET", "/v1/nodes", "", "wrong"); code != 401 {
			t.Fatalf("refused admin request: %d", code)
		}
	}
	send("10.77.0.67:40000", "GET", "/v1/plan", "", "")
	lines := strings.Count(logs.String(), "\n")
	if lines != 3 {
		t.Fatalf("%d log lines for %d refused requests from 2 sources, want 3 (one per source and reason):\n%s",
			lines, 3*flood+1, logs.String())
	}
	if c := refusals.Counts(); c[security.NodeCredential] != 2*flood || c[security.AdminToken] != flood+1 {
		t.Fatalf("counts %v", c)
	}
}

// TestNodeRoutesOnly: RegisterNode mounts what nodes need and nothing an
// operator uses, so the boot network's listener carries no admin route.
func TestNodeRoutesOnly(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "d.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctrl, _ := controller.New(ctx, st, controller.Config{}, time.Now, nil)
	mux := http.NewServeMux()
	New(ctrl, HashToken("admintoken"), nil).RegisterNode(mux)
	for _, c := range []struct {
		method, path string
		want         int
	}{
		{"GET", "/healthz", 200},
		{"POST", "/v1/checkin", 400},
		{"POST", "/v1/identify", 400},
		{"GET", "/v1/nodes", 404},
		{"POST", "/v1/nodes", 404},
		{"GET", "/v1/events", 404},
		{"POST", "/v1/nodes/n1/credential", 404},
		{"GET", "/v1/plan", 404},
	} {
		req := httptest.NewRequest(c.method, c.path, strings.NewReader(""))
		req.Header.Set("Authorization", "Bearer admintoken")
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		if rec.Code != c.want {
			t.Errorf("%s %s on the node routes: %d, want %d", c.method, c.path, rec.Code, c.want)
		}
	}
}

// TestAdminTokenFileNoSymlink performs the symlink attack of issue 24: a
// link planted where admin.token goes, pointing at a file the attacker
// wants truncated. Creating the token replaces the link with a private
// file and leaves the target alone.
func TestAdminTokenFileNoSymlink(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(dir, "var", "dpxe.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	victim := filepath.Join(dir, "precious")
	if err := os.WriteFile(victim, []byte("do not truncate\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tokFile := filepath.Join(dir, "var", "admin.token")
	if err := os.Symlink(victim, tokFile); err != nil {
		t.Fatal(err)
	}
	for _, rotate := range []bool{false, true} {
		hash, created, err := LoadOrCreateAdminToken(ctx, st, tokFile, rotate)
		if err != nil || !created {
			t.Fatalf("rotate=%v: created %v, %v", rotate, created, err)
		}
		if b, _ := os.ReadFile(victim); string(b) != "do not truncate\n" {
			t.Fatalf("rotate=%v: the symlink's target was written: %q", rotate, b)
		}
		fi, err := os.Lstat(tokFile)
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
			t.Fatalf("rotate=%v: admin.token is %v (%v), want a regular 0600 file", rotate, fi.Mode(), err)
		}
		tok, _ := os.ReadFile(tokFile)
		if HashToken(strings.TrimSpace(string(tok))) != hash {
			t.Fatalf("rotate=%v: the file does not hold the stored token", rotate)
		}
		os.Remove(tokFile)
		os.Symlink(victim, tokFile)
		st.DB().Exec(`DELETE FROM settings WHERE key = ?`, adminTokenSetting)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "var", ".admin.token.*")); len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
}

// TestCheckinRedeemsEnrollment: over HTTP, a check-in with an enrollment
// credential from another address is refused (401, counted as
// enroll_address), and from the script's address it is the node's
// first check-in; Identify never redeems one.
func TestCheckinRedeemsEnrollment(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "d.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctrl, _ := controller.New(ctx, st, controller.Config{TotalShards: 4}, time.Now, nil)
	if _, err := ctrl.AddNode(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	cred, err := ctrl.Enroll(ctx, "n1", "10.0.0.5", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	refusals := security.New(nil)
	srv := New(ctrl, HashToken("admintoken"), nil)
	srv.SetRefusals(refusals)
	mux := http.NewServeMux()
	srv.Register(mux)
	send := func(remote, path, body string) int {
		req := httptest.NewRequest("POST", path, strings.NewReader(body))
		req.RemoteAddr = remote
		req.Header.Set("Authorization", "Bearer "+cred)
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		return rec.Code
	}
	body := `{"node_id":"n1","capacity":4}`
	if code := send("10.0.0.66:1234", "/v1/checkin", body); code != 401 {
		t.Fatalf("enrollment credential from another address: %d", code)
	}
	if code := send("10.0.0.5:1234", "/v1/identify", `{"node_id":"n1","shard_id":0}`); code != 401 {
		t.Fatalf("enrollment credential on Identify: %d", code)
	}
	if refusals.Count(security.EnrollAddress) != 1 {
		t.Fatalf("counts %v", refusals.Counts())
	}
	if code := send("10.0.0.5:1234", "/v1/checkin", body); code != 200 {
		t.Fatalf("first check-in from the script's address: %d", code)
	}
}
