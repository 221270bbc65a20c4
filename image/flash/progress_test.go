package flash

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is a bytes.Buffer safe to read while a Progress writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestProgressLines(t *testing.T) {
	old := logEvery
	logEvery = 10 * time.Millisecond
	defer func() { logEvery = old }()
	var out lockedBuffer
	p := NewProgress(&out, "write", 64<<20)
	p.Add(16 << 20)
	p.Add(16 << 20)
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(out.String(), "ETA") && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	p.Finish()
	p.Finish() // idempotent
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	mid, last := lines[0], lines[len(lines)-1]
	for _, want := range []string{"write", "32.0 MiB", "/ 64.0 MiB", "50.0%", "MB/s", "ETA "} {
		if !strings.Contains(mid, want) {
			t.Errorf("progress line %q lacks %q", mid, want)
		}
	}
	if !strings.Contains(last, "done in") || strings.Contains(last, "ETA") || strings.Count(out.String(), "done in") != 1 {
		t.Errorf("final line %q", last)
	}
	if strings.Contains(out.String(), "\r") {
		t.Error("carriage returns in output that is not a terminal")
	}
	var nilP *Progress
	nilP.Add(1) // a nil Progress counts nothing and does not panic
	q := NewProgress(nil, "x", 1)
	q.Add(1)
	q.Finish()
	if q.Done() != 1 {
		t.Error("a quiet Progress still counts")
	}
}
