package bootfiles

import (
	"errors"
	"path"
	"strings"
	"testing"
)

func FuzzCleanPath(f *testing.F) {
	for _, s := range []string{"kernel.bin", "../etc/passwd", "/etc/passwd", "a/../../b", "a//b/./c", "..", ".", "a\\..\\b", "sub/inner", "\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		clean, err := CleanPath(name)
		if err != nil {
			if !errors.Is(err, ErrTraversal) && !errors.Is(err, ErrAbsolutePath) && !errors.Is(err, ErrBadPathChar) &&
				!errors.Is(err, ErrPathTooLong) && !errors.Is(err, ErrEmptyName) {
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
