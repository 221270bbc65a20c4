package bootfiles

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestRootsOrderAndConfinement(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	os.Mkdir(a, 0o755)
	os.Mkdir(b, 0o755)
	os.WriteFile(filepath.Join(dir, "secret"), []byte("s"), 0o600)
	os.WriteFile(filepath.Join(a, "kernel.bin"), []byte("from a"), 0o644)
	os.WriteFile(filepath.Join(b, "kernel.bin"), []byte("from b"), 0o644)
	os.WriteFile(filepath.Join(b, "ipxe.efi"), []byte("efi"), 0o644)
	os.Symlink("../secret", filepath.Join(a, "up"))
	os.Symlink(filepath.Join(dir, "secret"), filepath.Join(a, "abs"))
	os.Symlink("kernel.bin", filepath.Join(a, "alias"))
	r, err := OpenRoots(a, b)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cases := []struct {
		name, want string
		err        error
	}{
		{"kernel.bin", "from a", nil},
		{"ipxe.efi", "efi", nil},
		{"alias", "from a", nil},
		{"./kernel.bin", "from a", nil},
		{"up", "", ErrTraversal},
		{"abs", "", ErrTraversal},
		{"../secret", "", ErrTraversal},
		{"/etc/passwd", "", ErrAbsolutePath},
		{"nope", "", ErrNotFound},
		{".", "", ErrTraversal},
		{"a\\b", "", ErrBadPathChar},
	}
	for _, c := range cases {
		f, size, err := r.Open(c.name)
		if c.err != nil {
			if !errors.Is(err, c.err) {
				t.Errorf("Open(%q) err = %v, want %v", c.name, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("Open(%q): %v", c.name, err)
			continue
		}
		b := make([]byte, size)
		f.Read(b)
		f.Close()
		if string(b) != c.want {
			t.Errorf("Open(%q) = %q, want %q", c.name, b, c.want)
		}
	}
	// A published file is served by its name even through a link that
	// leaves every root; nothing else beside it is.
	ipxeDir := filepath.Join(dir, "ipxe")
	os.Mkdir(ipxeDir, 0o755)
	os.WriteFile(filepath.Join(dir, "real-ipxe.efi"), []byte("EFI"), 0o644)
	os.Symlink(filepath.Join(dir, "real-ipxe.efi"), filepath.Join(ipxeDir, "ipxe.efi"))
	if err := r.Publish("ipxe.efi", filepath.Join(ipxeDir, "ipxe.efi")); err != nil {
		t.Fatal(err)
	}
	if f, _, err := r.Open("ipxe.efi"); err != nil {
		t.Fatalf("published file: %v", err)
	} else {
		b := make([]byte, 3)
		f.Read(b)
		f.Close()
		if string(b) != "EFI" {
			t.Fatalf("published ipxe.efi = %q (the roots' own ipxe.efi shadows it?)", b)
		}
	}
	if _, _, err := r.Open("real-ipxe.efi"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unpublished neighbour: %v", err)
	}
	if err := r.Publish("../x", filepath.Join(ipxeDir, "ipxe.efi")); err == nil {
		t.Fatal("published under a traversing name")
	}
	if err := r.Publish("gone", filepath.Join(ipxeDir, "gone")); err == nil {
		t.Fatal("published a missing file")
	}
	if _, err := OpenRoots(filepath.Join(dir, "missing")); err == nil {
		t.Error("OpenRoots accepted a missing directory")
	}
}
