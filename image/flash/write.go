package flash

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
)

const (
	// ChunkSize is the unit of reads and writes: 4 MiB, the block size of
	// the `dd bs=4M` the benchmarks compare against.
	ChunkSize = 4 << 20
	// ZeroBlock is the granularity of zero skipping: 4 KiB, the page and
	// file-system block size, so a skipped block leaves a whole hole.
	ZeroBlock = 4096
)

// writeStats is what writeImage did.
type writeStats struct {
	Written int64    // bytes written to the target
	Skipped int64    // bytes of zeros not written (seeked over)
	Sum     [32]byte // SHA-256 of the whole source
}

type chunk struct {
	off int64
	buf []byte
	n   int
	err error
}

// writeImage copies size bytes of src to dst at the same offsets. With
// skipZero, every 4 KiB block of zeros is left out (the caller guarantees
// the target already reads as zeros there); other bytes are written in runs
// as long as possible. Reading and hashing run one chunk ahead of writing,
// so the two cores overlap them. It does not sync.
func writeImage(ctx context.Context, dst io.WriterAt, src io.ReaderAt, size int64, skipZero bool, prog *Progress) (writeStats, error) {
	var st writeStats
	h := sha256.New()
	const depth = 2
	free := make(chan []byte, depth+1)
	for i := 0; i < depth+1; i++ {
		free <- make([]byte, ChunkSize)
	}
	full := make(chan chunk, depth)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		defer close(full)
		for off := int64(0); off < size; off += ChunkSize {
			var buf []byte
			select {
			case buf = <-free:
			case <-rctx.Done():
				return
			}
			n := int(min(ChunkSize, size-off))
			got, err := src.ReadAt(buf[:n], off)
			if err == io.EOF && got == n {
				err = nil
			}
			if err != nil {
				full <- chunk{off: off, err: fmt.Errorf("reading the image at %d: %w", off, err)}
				return
			}
			h.Write(buf[:n])
			full <- chunk{off: off, buf: buf, n: n}
		}
	}()
	for c := range full {
		if c.err != nil {
			return st, c.err
		}
		if err := ctx.Err(); err != nil {
			return st, err
		}
		b := c.buf[:c.n]
		if !skipZero {
			if _, err := dst.WriteAt(b, c.off); err != nil {
				return st, fmt.Errorf("writing at %d: %w", c.off, err)
			}
			st.Written += int64(len(b))
		} else {
			w, err := writeNonZero(dst, b, c.off)
			st.Written += w
			st.Skipped += int64(len(b)) - w
			if err != nil {
				return st, err
			}
		}
		prog.Add(int64(c.n))
		free <- c.buf
	}
	if err := ctx.Err(); err != nil {
		return st, err
	}
	copy(st.Sum[:], h.Sum(nil))
	return st, nil
}

// writeNonZero writes the runs of b that are not whole 4 KiB blocks of
// zeros, at off, and returns how many bytes it wrote.
func writeNonZero(dst io.WriterAt, b []byte, off int64) (int64, error) {
	var written int64
	start := -1 // start of the current non-zero run
	flush := func(end int) error {
		if start < 0 {
			return nil
		}
		if _, err := dst.WriteAt(b[start:end], off+int64(start)); err != nil {
			return fmt.Errorf("writing at %d: %w", off+int64(start), err)
		}
		written += int64(end - start)
		start = -1
		return nil
	}
	for i := 0; i < len(b); i += ZeroBlock {
		end := min(i+ZeroBlock, len(b))
		if isZero(b[i:end]) {
			if err := flush(i); err != nil {
				return written, err
			}
			continue
		}
		if start < 0 {
			start = i
		}
	}
	return written, flush(len(b))
}

var zeros [ZeroBlock]byte

func isZero(b []byte) bool {
	for len(b) > 0 {
		n := min(len(b), len(zeros))
		if string(b[:n]) != string(zeros[:n]) {
			return false
		}
		b = b[n:]
	}
	return true
}

// prepareFile makes the regular file f read as size bytes of zeros with no
// blocks allocated: truncated to 0, then extended. Zero blocks of the image
// can then be skipped: the holes read as zeros (POSIX ftruncate).
func prepareFile(f *os.File, size int64) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	return f.Truncate(size)
}
