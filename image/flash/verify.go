package flash

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// ErrVerify means the target does not read back as the image was written.
var ErrVerify = errors.New("VERIFY FAILED: the target does not hold the image")

// VerifyBlock is the unit in which a mismatch is reported: a 512-byte
// sector, the smallest unit a disk writes.
const VerifyBlock = 512

// verifyResult is what verify read.
type verifyResult struct {
	Sum      [32]byte // SHA-256 of the target's first size bytes
	ImageSum [32]byte // SHA-256 of the personalised image
	Direct   bool     // read with O_DIRECT, past the page cache
}

// verify reads the first size bytes of the target at path and compares them
// with want (the personalised image), byte for byte and by SHA-256 (both
// sides hashed here, in parallel). It reads with O_DIRECT when the target allows it, so a block
// device is read from the medium and not from the page cache that the write
// went through; where O_DIRECT is refused (tmpfs) it drops the file's cached
// pages first (POSIX_FADV_DONTNEED), which is as close to the medium as such
// a file has. The first differing 512-byte block is named in the error.
func verify(ctx context.Context, path string, want io.ReaderAt, size int64, prog *Progress) (verifyResult, error) {
	var res verifyResult
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_DIRECT, 0)
	if err == nil {
		res.Direct = true
	} else {
		f, err = os.Open(path)
		if err != nil {
			return res, err
		}
		unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	}
	defer f.Close()
	// O_DIRECT needs a buffer aligned to the logical block size; an
	// anonymous mapping is page aligned.
	got, err := unix.Mmap(-1, 0, ChunkSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		return res, err
	}
	defer unix.Munmap(got)
	exp := make([]byte, ChunkSize)
	h, hImg := sha256.New(), sha256.New()
	for off := int64(0); off < size; off += ChunkSize {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		n := int(min(ChunkSize, size-off))
		if _, err := readFullAt(f, got[:n], off); err != nil {
			return res, fmt.Errorf("%w: reading %s at %d: %v", ErrVerify, path, off, err)
		}
		if _, err := readFullAt(want, exp[:n], off); err != nil {
			return res, fmt.Errorf("reading the image at %d: %w", off, err)
		}
		// Hash the image's chunk on the other core while this one hashes
		// what the target returned.
		done := make(chan struct{})
		go func() {
			hImg.Write(exp[:n])
			close(done)
		}()
		h.Write(got[:n])
		<-done
		if !bytes.Equal(got[:n], exp[:n]) {
			i := firstDiff(got[:n], exp[:n])
			at := off + int64(i)
			blk := at / VerifyBlock * VerifyBlock
			return res, fmt.Errorf("%w: %s differs from the image first in the %d-byte block at offset %d (sector %d; byte %d reads %#02x, want %#02x)",
				ErrVerify, path, VerifyBlock, blk, blk/VerifyBlock, at, got[i], exp[i])
		}
		prog.Add(int64(n))
	}
	copy(res.Sum[:], h.Sum(nil))
	copy(res.ImageSum[:], hImg.Sum(nil))
	if res.Sum != res.ImageSum {
		return res, fmt.Errorf("%w: %s: SHA-256 %s, the image's is %s", ErrVerify, path, hex.EncodeToString(res.Sum[:]), hex.EncodeToString(res.ImageSum[:]))
	}
	return res, nil
}

// readFullAt fills b from r at off. O_DIRECT reads may come back short at
// the end of a device; a short read before size is an error.
func readFullAt(r io.ReaderAt, b []byte, off int64) (int, error) {
	n := 0
	for n < len(b) {
		m, err := r.ReadAt(b[n:], off+int64(n))
		n += m
		if err != nil {
			if err == io.EOF && n == len(b) {
				return n, nil
			}
			return n, err
		}
	}
	return n, nil
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return len(a)
}
