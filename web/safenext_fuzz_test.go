package web

import (
	"net/url"
	"strings"
	"testing"
)

// FuzzSafeNext: whatever next= a login carries, the redirect stays on
// this site: the answer is "/" or the input itself, a path with one
// leading '/', visible ASCII without a backslash, and no host or scheme
// however a browser reads it.
func FuzzSafeNext(f *testing.F) {
	for _, s := range []string{"/", "/nodes?sort=lease", "//evil.example", "/\t/evil.example", "/\\evil", "https://x/",
		"/%2F/x", "/nodes#x", "", "/\x00", "/é", "/a/../b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		out := safeNext(in)
		if out != "/" && out != in {
			t.Fatalf("safeNext(%q) = %q: neither the input nor /", in, out)
		}
		if !strings.HasPrefix(out, "/") || strings.HasPrefix(out, "//") || strings.ContainsAny(out, "\\#") {
			t.Fatalf("safeNext(%q) = %q", in, out)
		}
		for i := 0; i < len(out); i++ {
			if out[i] <= ' ' || out[i] >= 0x7f {
				t.Fatalf("safeNext(%q) = %q keeps byte %#x", in, out, out[i])
			}
		}
		u, err := url.Parse(out)
		if err != nil || u.Host != "" || u.Scheme != "" || strings.HasPrefix(u.Path, "//") {
			t.Fatalf("safeNext(%q) = %q parses as %+v, %v", in, out, u, err)
		}
	})
}
