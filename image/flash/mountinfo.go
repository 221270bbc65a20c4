package flash

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// ErrMountInfo means a line of /proc/self/mountinfo could not be parsed.
var ErrMountInfo = errors.New("malformed mountinfo line")

// DevNum is a block device number as the kernel prints it: major:minor.
type DevNum struct{ Major, Minor uint32 }

func (d DevNum) String() string { return fmt.Sprintf("%d:%d", d.Major, d.Minor) }

// ParseDevNum parses "major:minor" (the format of mountinfo field 3 and of
// the sysfs dev files).
func ParseDevNum(s string) (DevNum, error) {
	maj, min, ok := strings.Cut(strings.TrimSpace(s), ":")
	if !ok {
		return DevNum{}, fmt.Errorf("device number %q: want major:minor", s)
	}
	a, err := strconv.ParseUint(maj, 10, 32)
	if err != nil {
		return DevNum{}, fmt.Errorf("device number %q: %v", s, err)
	}
	b, err := strconv.ParseUint(min, 10, 32)
	if err != nil {
		return DevNum{}, fmt.Errorf("device number %q: %v", s, err)
	}
	return DevNum{uint32(a), uint32(b)}, nil
}

// Mount is one line of /proc/self/mountinfo (proc(5)), the fields the
// safety checks use.
type Mount struct {
	ID         int
	Dev        DevNum // field 3: the st_dev of files in this mount
	Root       string // field 4: the directory of the file system mounted here ("/" unless a bind mount of a subtree)
	MountPoint string // field 5
	FSType     string // after the " - " separator
	Source     string // mount source, e.g. /dev/sdb1
}

// ParseMountInfo reads mountinfo text. Every mount of a block device,
// including bind mounts and mounts in other places of the tree, appears with
// the device's number, which is what the checks compare (a source path such
// as /dev/sdb1 can be spelled many ways; the number cannot).
func ParseMountInfo(r io.Reader) ([]Mount, error) {
	var out []Mount
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		text := sc.Text()
		if strings.TrimSpace(text) == "" {
			continue
		}
		m, err := parseMountLine(text)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		out = append(out, m)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

func parseMountLine(text string) (Mount, error) {
	fields := strings.Fields(text)
	sep := -1
	for i := 6; i < len(fields); i++ {
		if fields[i] == "-" {
			sep = i
			break
		}
	}
	if sep < 0 || sep+1 >= len(fields) {
		return Mount{}, fmt.Errorf("%w: %q", ErrMountInfo, clip(text))
	}
	id, err := strconv.Atoi(fields[0])
	if err != nil {
		return Mount{}, fmt.Errorf("%w: mount ID %q", ErrMountInfo, fields[0])
	}
	dev, err := ParseDevNum(fields[2])
	if err != nil {
		return Mount{}, fmt.Errorf("%w: %v", ErrMountInfo, err)
	}
	m := Mount{ID: id, Dev: dev, Root: unescapeMount(fields[3]), MountPoint: unescapeMount(fields[4]), FSType: fields[sep+1]}
	if sep+2 < len(fields) {
		m.Source = unescapeMount(fields[sep+2])
	}
	return m, nil
}

// unescapeMount undoes the kernel's octal escapes (\040 for a space, \011,
// \012, \134) in mountinfo paths.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func clip(s string) string {
	if len(s) > 120 {
		return s[:120] + "..."
	}
	return s
}
