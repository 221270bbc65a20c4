// Package bootfiles serves files to booting nodes from an ordered list of
// directories (the image output, Debian's iPXE binaries), confined to those
// directories: it is shared by the TFTP and HTTP boot services.
package bootfiles

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// Path errors. All of them are answered with a TFTP access violation except
// ErrNotFound.
var (
	ErrAbsolutePath = errors.New("bootfiles: absolute paths are refused")
	ErrTraversal    = errors.New("bootfiles: path leaves the boot root")
	ErrBadPathChar  = errors.New("bootfiles: path has a backslash or control character")
	ErrPathTooLong  = errors.New("bootfiles: path too long")
	ErrNotFound     = errors.New("bootfiles: file not found")
	ErrNotRegular   = errors.New("bootfiles: not a regular file")
	ErrEmptyName    = errors.New("bootfiles: empty file name")
)

// MaxNameLen bounds a requested file name.
const MaxNameLen = 255

// CleanPath checks a requested file name and returns it in clean,
// slash-separated, root-relative form. It refuses absolute paths, any ".."
// component, backslashes and control characters, rather than rewriting
// them: a client asking for them is confused or hostile.
func CleanPath(name string) (string, error) {
	if name == "" {
		return "", ErrEmptyName
	}
	if len(name) > MaxNameLen {
		return "", ErrPathTooLong
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x20 || c == 0x7f || c == '\\' {
			return "", ErrBadPathChar
		}
	}
	if name[0] == '/' {
		return "", ErrAbsolutePath
	}
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return "", ErrTraversal
		}
	}
	clean := path.Clean(name)
	if clean == "." || !fs.ValidPath(clean) {
		return "", ErrTraversal
	}
	return clean, nil
}

// Roots serves files from an ordered list of directories: the first one
// holding a name wins. Symbolic links are followed only while they stay
// inside their directory (os.Root enforces this in the kernel's openat2 or
// by walking, so a link to /etc/shadow is refused).
//
// Single files can also be published by name (Publish), for binaries that
// live among other files, such as Debian's /usr/lib/ipxe, whose ipxe.efi is
// a symbolic link to /boot/ipxe.efi: only the published names are served.
type Roots struct {
	roots     []*os.Root
	dirs      []string
	published map[string]string // clean name → resolved path
}

// Publish serves the file at path under name. The operator's path is
// resolved once, now (symbolic links included); clients can reach nothing
// else through it.
func (r *Roots) Publish(name, path string) error {
	clean, err := CleanPath(name)
	if err != nil {
		return err
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return fmt.Errorf("bootfiles: publish %s: %w", name, err)
	}
	st, err := os.Stat(real)
	if err != nil {
		return fmt.Errorf("bootfiles: publish %s: %w", name, err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%w: %s", ErrNotRegular, path)
	}
	if r.published == nil {
		r.published = map[string]string{}
	}
	r.published[clean] = real
	return nil
}

// OpenRoots opens dirs for serving.
func OpenRoots(dirs ...string) (*Roots, error) {
	r := &Roots{}
	for _, d := range dirs {
		root, err := os.OpenRoot(d)
		if err != nil {
			r.Close()
			return nil, fmt.Errorf("bootfiles: boot root %s: %w", d, err)
		}
		r.roots = append(r.roots, root)
		r.dirs = append(r.dirs, d)
	}
	return r, nil
}

// Close releases the directories.
func (r *Roots) Close() error {
	for _, root := range r.roots {
		root.Close()
	}
	return nil
}

// Open opens the regular file name (as given by the client) and returns it
// with its size.
func (r *Roots) Open(name string) (*os.File, int64, error) {
	clean, err := CleanPath(name)
	if err != nil {
		return nil, 0, err
	}
	if real, ok := r.published[clean]; ok {
		f, err := os.Open(real)
		if err != nil {
			return nil, 0, fmt.Errorf("%w: %s: %v", ErrNotFound, clean, err)
		}
		st, err := f.Stat()
		if err != nil || !st.Mode().IsRegular() {
			f.Close()
			return nil, 0, fmt.Errorf("%w: %s", ErrNotRegular, clean)
		}
		return f, st.Size(), nil
	}
	for _, root := range r.roots {
		f, err := root.Open(clean)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			// os.Root reports escapes ("path escapes from parent") as a
			// *PathError that is not ErrNotExist.
			return nil, 0, fmt.Errorf("%w: %s: %v", ErrTraversal, clean, err)
		}
		st, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, 0, err
		}
		if !st.Mode().IsRegular() {
			f.Close()
			return nil, 0, fmt.Errorf("%w: %s", ErrNotRegular, clean)
		}
		return f, st.Size(), nil
	}
	return nil, 0, fmt.Errorf("%w: %s", ErrNotFound, clean)
}
