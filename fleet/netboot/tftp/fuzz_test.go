package tftp

import (
	"errors"
	"path"
	"strings"
	"testing"
)

func FuzzParseRequest(f *testing.F) {
	f.Add(rrq("kernel.bin", "octet", "blksize", "1468", "tsize", "0", "windowsize", "16"))
	f.Add(rrq("undionly.kpxe", "octet"))
	f.Add([]byte("\x00\x02x\x00netascii\x00"))
	f.Add([]byte("\x00\x01\x00\x00"))
	f.Fuzz(func(t *testing.T, p []byte) {
		r, err := ParseRequest(p)
		if err != nil {
			return
		}
		// A parsed request survives a round trip.
		r2, err := ParseRequest(r.Marshal())
		if err != nil || r2.Filename != r.Filename || r2.Mode != r.Mode || len(r2.Options) != len(r.Options) {
			t.Fatalf("round trip of %q: %+v vs %+v (%v)", p, r, r2, err)
		}
		for _, o := range (Limits{}).Negotiate(r) {
			if o.Name == OptBlksize && (len(o.Value) > 4 || o.Value > "1468" && len(o.Value) == 4) {
				t.Fatalf("blksize %s above the clamp", o.Value)
			}
		}
	})
}

func FuzzCleanPath(f *testing.F) {
	for _, s := range []string{"kernel.bin", "../etc/passwd", "/etc/passwd", "a/../../b", "a//b/./c", "..", ".", "a\\..\\b", "sub/inner", "\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		clean, err := CleanPath(name)
		if err != nil {
			if !errors.Is(err, ErrTraversal) && !errors.Is(err, ErrAbsolutePath) && !errors.Is(err, ErrBadPathChar) &&
				!errors.Is(err, ErrPathTooLong) && !errors.Is(err, ErrEmptyFilename) {
				t.Fatalf("CleanPath(%q): unexpected error kind %v", name, err)
			}
			return
		}
		if path.IsAbs(clean) || clean == ".." || strings.HasPrefix(clean, "../") || strings.Contains(clean, "/../") ||
			strings.ContainsAny(clean, "\\\x00") {
			t.Fatalf("CleanPath(%q) = %q escapes the root", name, clean)
		}
		for _, part := range strings.Split(name, "/") {
			if part == ".." {
				t.Fatalf("CleanPath(%q) accepted a .. component", name)
			}
		}
	})
}
