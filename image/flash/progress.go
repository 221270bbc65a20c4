package flash

import (
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Progress reports a phase (write, verify) of a known number of bytes on a
// writer, usually stderr: bytes done, percentage, rate and ETA. On a
// terminal it redraws one line four times a second; on anything else it
// prints a line every five seconds, so logs stay readable. The rate is
// image bytes per second, so a sparse write that seeks over zeros moves as
// fast as the skipping does.
//
// u-root's pkg/progress was the first choice; it prints bytes and rate
// only, with no total, percentage or ETA, so it does not fit here.
type Progress struct {
	w     io.Writer
	label string
	total int64
	tty   bool
	every time.Duration
	start time.Time
	done  atomic.Int64
	stop  chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex // serialises lines
	once  sync.Once
}

// How often a Progress prints: on a terminal, and to anything else.
var (
	ttyEvery = 250 * time.Millisecond
	logEvery = 5 * time.Second
)

// NewProgress starts reporting on w (nil: a Progress that counts and prints
// nothing). Call Finish when the phase ends.
func NewProgress(w io.Writer, label string, total int64) *Progress {
	p := &Progress{w: w, label: label, total: total, start: time.Now(), stop: make(chan struct{}), every: logEvery}
	if w == nil {
		return p
	}
	if f, ok := w.(*os.File); ok {
		if _, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS); err == nil {
			p.tty, p.every = true, ttyEvery
		}
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		tk := time.NewTicker(p.every)
		defer tk.Stop()
		for {
			select {
			case <-tk.C:
				p.print(false)
			case <-p.stop:
				return
			}
		}
	}()
	return p
}

// Add counts n more bytes done. Safe for concurrent use and on a nil
// Progress.
func (p *Progress) Add(n int64) {
	if p != nil {
		p.done.Add(n)
	}
}

// Done returns the bytes counted so far.
func (p *Progress) Done() int64 { return p.done.Load() }

// Finish stops the ticker and prints the final line with the total time.
func (p *Progress) Finish() {
	p.once.Do(func() {
		if p.w == nil {
			return
		}
		close(p.stop)
		p.wg.Wait()
		p.print(true)
	})
}

func (p *Progress) print(final bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := p.done.Load()
	el := time.Since(p.start)
	rate := 0.0
	if s := el.Seconds(); s > 0 {
		rate = float64(n) / s
	}
	pct := 100.0
	if p.total > 0 {
		pct = 100 * float64(n) / float64(p.total)
	}
	line := fmt.Sprintf("%-7s %9s / %-9s %5.1f%%  %6.1f MB/s", p.label, humanBytes(n), humanBytes(p.total), pct, rate/1e6)
	switch {
	case final:
		line += fmt.Sprintf("  done in %s", el.Round(time.Millisecond))
	case rate > 0 && n < p.total:
		eta := time.Duration(float64(p.total-n) / rate * float64(time.Second))
		line += fmt.Sprintf("  ETA %s", eta.Round(time.Second))
	default:
		line += "  ETA --"
	}
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[2K%s", line)
		if final {
			fmt.Fprintln(p.w)
		}
		return
	}
	fmt.Fprintln(p.w, line)
}
