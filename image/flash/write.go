package flash

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
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
	Written int64 // bytes written to the target
	Skipped int64 // bytes of zeros not written (seeked over)
}

type chunk struct {
	off  int64
	buf  []byte // nil for a hole of the source
	n    int
	err  error
	hole bool
}

// zeroPolicy says which 4 KiB zero blocks of the image writeImage may
// leave out. The zero value writes every byte.
type zeroPolicy struct {
	// Known: the whole target reads as zeros (a regular file just
	// truncated and extended), so no zero block is written.
	Known bool
	// Probe, when set, reads the target (O_DIRECT, aligned buffers): a zero
	// block of the image is left out where the target read back zeros just
	// before the write. A chunk whose probe read fails is written in full.
	Probe io.ReaderAt
}

// writeImage copies size bytes of src to dst at the same offsets. Holes of
// src (found with SEEK_DATA/SEEK_HOLE) are not read but treated as zeros;
// zero blocks are left out as zp allows and otherwise written (holes from
// a zero buffer). Data is written in runs as long as possible. Reading runs
// up to two chunks ahead of writing. It does not sync.
//
// It does not hash: the read-back compares every byte with src and hashes
// both sides, so the write runs at the speed of the target.
func writeImage(ctx context.Context, dst io.WriterAt, src *os.File, size int64, zp zeroPolicy, prog *Progress) (writeStats, error) {
	var st writeStats
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
		send := func(c chunk) bool {
			select {
			case full <- c:
				return true
			case <-rctx.Done():
				return false
			}
		}
		for _, ext := range extents(src, size) {
			for off := ext.off; off < ext.end; {
				n := int(min(ChunkSize-off%ChunkSize, ext.end-off)) // keep chunks 4 MiB aligned
				if !ext.data {
					if !send(chunk{off: off, n: n, hole: true}) {
						return
					}
					off += int64(n)
					continue
				}
				var buf []byte
				select {
				case buf = <-free:
				case <-rctx.Done():
					return
				}
				got, err := src.ReadAt(buf[:n], off)
				if err == io.EOF && got == n {
					err = nil
				}
				if err != nil {
					send(chunk{off: off, err: fmt.Errorf("reading the image at %d: %w", off, err)})
					return
				}
				if !send(chunk{off: off, buf: buf, n: n}) {
					return
				}
				off += int64(n)
			}
		}
	}()
	zeroChunk := make([]byte, ChunkSize)
	var probeBuf []byte
	if zp.Probe != nil {
		b, err := unix.Mmap(-1, 0, ChunkSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
		if err != nil {
			return st, err
		}
		defer unix.Munmap(b)
		probeBuf = b
	}
	for c := range full {
		if c.err != nil {
			return st, c.err
		}
		if err := ctx.Err(); err != nil {
			return st, err
		}
		b := zeroChunk[:c.n]
		if !c.hole {
			b = c.buf[:c.n]
		}
		var cur []byte // what the target holds, when probed
		skip := zp.Known
		if !skip && zp.Probe != nil && (c.hole || hasZeroBlock(b)) {
			if _, err := readFullAt(zp.Probe, probeBuf[:c.n], c.off); err == nil {
				cur, skip = probeBuf[:c.n], true
			}
		}
		var w int64
		var err error
		switch {
		case !skip:
			_, err = dst.WriteAt(b, c.off)
			if err == nil {
				w = int64(len(b))
			} else {
				err = fmt.Errorf("writing at %d: %w", c.off, err)
			}
		case c.hole && cur == nil:
			// Known zeros on both sides: nothing to write.
		default:
			w, err = writeNeeded(dst, b, cur, c.off)
		}
		st.Written += w
		st.Skipped += int64(c.n) - w
		if err != nil {
			return st, err
		}
		prog.Add(int64(c.n))
		if c.buf != nil {
			free <- c.buf
		}
	}
	return st, ctx.Err()
}

// extent is a range of the source that holds data or is a hole.
type extent struct {
	off, end int64
	data     bool
}

// extents maps the first size bytes of f into data and holes with
// SEEK_DATA/SEEK_HOLE (lseek(2)). Where the file system does not support
// them, the whole file is one data extent. A hole reported wrongly would
// not go unnoticed: the read-back compares against ordinary reads of f.
func extents(f *os.File, size int64) []extent {
	all := []extent{{0, size, true}}
	fd := int(f.Fd())
	var out []extent
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) { // no data after off
			out = append(out, extent{off, size, false})
			break
		}
		if err != nil {
			return all
		}
		data = min(data, size)
		if data > off {
			out = append(out, extent{off, data, false})
		}
		if data >= size {
			break
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return all
		}
		hole = min(hole, size)
		out = append(out, extent{data, hole, true})
		off = hole
	}
	return out
}

// writeNeeded writes b at off except the 4 KiB blocks that are zeros in b
// and known to read as zeros on the target: everywhere when cur is nil,
// else where cur (the target's current bytes at off) is zeros too. It
// coalesces the rest into runs and returns how many bytes it wrote.
func writeNeeded(dst io.WriterAt, b, cur []byte, off int64) (int64, error) {
	var written int64
	start := -1 // start of the current run to write
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
		if isZero(b[i:end]) && (cur == nil || isZero(cur[i:end])) {
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

// hasZeroBlock reports whether b holds a 4 KiB block of zeros.
func hasZeroBlock(b []byte) bool {
	for i := 0; i < len(b); i += ZeroBlock {
		if isZero(b[i:min(i+ZeroBlock, len(b))]) {
			return true
		}
	}
	return false
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
