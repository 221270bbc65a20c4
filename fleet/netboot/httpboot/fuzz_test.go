package httpboot

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/discord-pxe/dpxe/fleet/netboot/bootfiles"
	"github.com/discord-pxe/dpxe/fleet/netboot/inventory"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// FuzzServeHTTP sends arbitrary paths to the boot handler: it must not
// panic, must never serve the file outside its root (reachable by a
// symlink and by ..), and must answer scripts only for well-formed MACs.
func FuzzServeHTTP(f *testing.F) {
	for _, p := range []string{"/boot/kernel.bin", "/boot/52-54-00-12-34-56.ipxe", "/boot/node/52-54-00-12-34-56/kernel.bin",
		"/boot/../secret", "/boot/escape", "/boot/%2e%2e/secret", "/boot/node/../../secret", "/boot/.ipxe", "/boot/52:54:00:12:34:56.ipxe"} {
		f.Add(p)
	}
	dir := f.TempDir()
	root := filepath.Join(dir, "root")
	os.Mkdir(root, 0o755)
	os.WriteFile(filepath.Join(root, "kernel.bin"), []byte("KERNEL"), 0o644)
	os.WriteFile(filepath.Join(dir, "secret"), []byte("TOPSECRET"), 0o644)
	os.Symlink("../secret", filepath.Join(root, "escape"))
	roots, err := bootfiles.OpenRoots(root)
	if err != nil {
		f.Fatal(err)
	}
	st, err := store.Open(context.Background(), filepath.Join(dir, "inv.db"))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { st.Close() })
	h, err := New(Config{BaseURL: "http://10.0.0.1:8080", Controller: "http://10.0.0.1:8081", Roots: roots}, st.Netboot(), nil, nil)
	if err != nil {
		f.Fatal(err)
	}
	mux := http.NewServeMux()
	h.Register(mux)
	f.Fuzz(func(t *testing.T, path string) {
		req, err := http.NewRequest(http.MethodGet, "http://x"+path, nil)
		if err != nil || req.URL.Path == "" || req.URL.Path[0] != '/' {
			return
		}
		req.RemoteAddr = "10.0.0.5:1234"
		req.Host = "10.0.0.1:8080"
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		body := rec.Body.String()
		if strings.Contains(body, "TOPSECRET") {
			t.Fatalf("GET %q served the file outside the root", path)
		}
		if rec.Code == http.StatusOK && strings.HasPrefix(body, "#!ipxe") {
			name := strings.TrimSuffix(req.URL.Path[strings.LastIndex(req.URL.Path, "/")+1:], ".ipxe")
			if _, err := inventory.ParseMAC(name); err != nil {
				t.Fatalf("GET %q served a script for %q", path, name)
			}
		}
	})
}
