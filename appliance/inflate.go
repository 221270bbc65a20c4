package appliance

import (
	"bytes"
	"compress/flate"
	"compress/zlib"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"strconv"
	"strings"
)

// The Go side of the kernel's streaming inflate (kernel/lib/inflate.inc)
// and of its self-test (kernel/selftest/inflate_selftest.inc).
//
// The kernel cannot generate compressed streams the way Go's compressor
// does, so the cases travel to it: InflateCorpus makes them from a seed
// (Go's compress/zlib at every level, Discord-style zlib-stream with a sync
// flush after every message, streams built bit by bit here to reach what a
// compressor never writes, and corruptions of all of them), InflateSection
// packs them into the self-test module, the kernel inflates each one in
// randomly sized input pieces and output rooms and prints one line per
// case, and CheckInflateCase compares that line with what compress/zlib
// (compress/flate underneath) makes of the same stream.

// InflateModuleTag is the self-test module section holding the cases.
const InflateModuleTag = "INFLATE1"

// InflateWindow is DEFLATE's window (RFC 1951 §2): a match reaches at most
// this far back.
const InflateWindow = 32768

// InflateReasons names the kernel's refusals, indexed by INFLATE_E_*, as
// kernel/lib/inflate.inc's inflate_reason_names prints them.
var InflateReasons = []string{
	"unknown", "header-method", "header-window", "header-fcheck", "fdict", "block-type", "stored-length",
	"hlit", "hdist", "clen-oversubscribed", "clen-incomplete", "repeat-first", "repeat-overflow",
	"litlen-oversubscribed", "litlen-incomplete", "no-end-of-block", "dist-oversubscribed", "dist-incomplete",
	"litlen-symbol", "dist-symbol", "distance-too-far", "adler32", "table-overflow",
}

// inflateEarlyReasons are refusals the kernel makes as soon as it has read a
// block's code lengths, where Go reads on and fails only later (or reaches
// the end of the input first): a code length code that is not complete
// (Go, unlike zlib, accepts one 1-bit code there, which can never describe
// a usable literal/length code) and a literal/length code without the
// end-of-block symbol (the block could never end).
var inflateEarlyReasons = map[string]bool{"clen-incomplete": true, "no-end-of-block": true}

// InflateCase is one compressed stream of the self-test.
type InflateCase struct {
	Kind   string // how it was made, e.g. "zlib-6", "zstream", "dynamic", "trunc"
	Stream []byte
	Syncs  int // empty stored blocks (sync flushes) in it, -1 when not known
}

// InflateSection packs cases as the kernel's self-test reads them: u32
// little-endian count, then per case u32 little-endian length and bytes.
func InflateSection(cases []InflateCase) []byte {
	var b bytes.Buffer
	var n [4]byte
	binary.LittleEndian.PutUint32(n[:], uint32(len(cases)))
	b.Write(n[:])
	for _, c := range cases {
		binary.LittleEndian.PutUint32(n[:], uint32(len(c.Stream)))
		b.Write(n[:])
		b.Write(c.Stream)
	}
	return b.Bytes()
}

// ParseInflateSection is InflateSection's inverse; it refuses a count or a
// length that runs past the payload, and trailing bytes.
func ParseInflateSection(p []byte) ([][]byte, error) {
	if len(p) < 4 {
		return nil, fmt.Errorf("inflate section: %d bytes, no count", len(p))
	}
	count := binary.LittleEndian.Uint32(p)
	off := 4
	var out [][]byte
	for i := uint32(0); i < count; i++ {
		if len(p)-off < 4 {
			return nil, fmt.Errorf("inflate section: case %d: offset %d: truncated length", i, off)
		}
		n := binary.LittleEndian.Uint32(p[off:])
		off += 4
		if uint64(len(p)-off) < uint64(n) {
			return nil, fmt.Errorf("inflate section: case %d: offset %d: %d bytes, %d left", i, off-4, n, len(p)-off)
		}
		out = append(out, p[off:off+int(n)])
		off += int(n)
	}
	if off != len(p) {
		return nil, fmt.Errorf("inflate section: %d bytes after case %d", len(p)-off, count)
	}
	return out, nil
}

// --- what Go makes of a stream ---------------------------------------------------

// InflateOutcome is Go's compress/zlib verdict on a stream.
type InflateOutcome struct {
	Verdict string // "end", "more" (io.ErrUnexpectedEOF: the input ran out) or "error"
	Class   string // for "error": "header", "dict", "checksum" or "corrupt"
	Err     error
	Out     []byte // every byte Go delivered before the verdict
}

// GoInflate inflates stream with compress/zlib, reading to the end.
func GoInflate(stream []byte) InflateOutcome {
	var o InflateOutcome
	r, err := zlib.NewReader(bytes.NewReader(stream))
	if err == nil {
		o.Out, err = io.ReadAll(r)
	}
	o.Err = err
	var corrupt flate.CorruptInputError
	switch {
	case err == nil:
		o.Verdict = "end"
	case errors.Is(err, io.ErrUnexpectedEOF):
		o.Verdict = "more"
	case errors.Is(err, zlib.ErrHeader):
		o.Verdict, o.Class = "error", "header"
	case errors.Is(err, zlib.ErrDictionary):
		o.Verdict, o.Class = "error", "dict"
	case errors.Is(err, zlib.ErrChecksum):
		o.Verdict, o.Class = "error", "checksum"
	case errors.As(err, &corrupt):
		o.Verdict, o.Class = "error", "corrupt"
	default:
		o.Verdict, o.Class = "error", "other"
	}
	return o
}

// inflatePad is what GoInflatePadded appends: more bits than a whole
// length/distance pair (48) and the kernel's bit buffer (63) hold.
var inflatePad = make([]byte, 16)

// GoInflatePadded inflates stream followed by zero bytes. compress/flate
// reads at least as many bits as its shortest literal/length code (raised
// to the end-of-block code's length) before it decodes a symbol, so near the
// end of the input it stops before symbols whose bits have all arrived;
// the kernel decodes those. With padding Go decodes them too (and perhaps
// more, from the zeros): the kernel's output is a prefix of this one.
func GoInflatePadded(stream []byte) InflateOutcome {
	return GoInflate(append(append([]byte(nil), stream...), inflatePad...))
}

// InflateHash is the kernel's output hash: FNV-1a 64 over the bytes.
func InflateHash(b []byte) uint64 {
	h := fnv.New64a()
	h.Write(b)
	return h.Sum64()
}

// KernelInflateResult is one "inflate case" line of the kernel.
type KernelInflateResult struct {
	Case    int
	Verdict string // "end", "more" or "error"
	Reason  string // for "error": one of InflateReasons
	Out     uint64 // bytes of output
	Hash    uint64 // InflateHash of them
	Syncs   int    // empty stored blocks seen
}

// InflateReport is what the kernel's inflate self-test printed.
type InflateReport struct {
	Size       int // INFLATE_size
	Window     int
	Cases      []KernelInflateResult
	CaseCount  int      // the "inflate cases N" line, -1 when absent
	Failures   []string // "inflate FAIL ..." lines
	Throughput string   // the "inflate throughput" line, after the prefix
	MBps       float64  // its MB/s (10^6 bytes per second), 0 when absent
}

// ParseInflateReport reads the inflate self-test's lines from a serial log:
//
//	inflate size N window W
//	inflate case N end|more out=L hash=H syncs=S
//	inflate case N error REASON out=L hash=H syncs=S
//	inflate cases N
//	inflate throughput case=N out=B cycles=C us=U MBps=X.YY
//	inflate FAIL what
//
// Case lines must come in order from 0. Other lines are ignored.
func ParseInflateReport(serial string) (*InflateReport, error) {
	r := &InflateReport{CaseCount: -1}
	for _, line := range strings.Split(serial, "\n") {
		line = strings.TrimRight(line, "\r")
		rest, ok := strings.CutPrefix(line, "inflate ")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "FAIL":
			r.Failures = append(r.Failures, strings.TrimPrefix(rest, "FAIL "))
		case "size":
			if len(f) != 4 || f[2] != "window" {
				return nil, fmt.Errorf("inflate size line %q: want \"inflate size N window W\"", line)
			}
			var err1, err2 error
			r.Size, err1 = strconv.Atoi(f[1])
			r.Window, err2 = strconv.Atoi(f[3])
			if err := errors.Join(err1, err2); err != nil {
				return nil, fmt.Errorf("inflate size line %q: %v", line, err)
			}
		case "cases":
			if len(f) != 2 {
				return nil, fmt.Errorf("inflate cases line %q", line)
			}
			n, err := strconv.Atoi(f[1])
			if err != nil || n < 0 {
				return nil, fmt.Errorf("inflate cases line %q: bad count", line)
			}
			r.CaseCount = n
		case "throughput":
			r.Throughput = strings.TrimPrefix(rest, "throughput ")
			for _, kv := range f[1:] {
				if v, ok := strings.CutPrefix(kv, "MBps="); ok {
					mb, err := strconv.ParseFloat(v, 64)
					if err != nil {
						return nil, fmt.Errorf("inflate throughput line %q: MBps: %v", line, err)
					}
					r.MBps = mb
				}
			}
		case "case":
			c, err := parseInflateCaseLine(f[1:])
			if err != nil {
				return nil, fmt.Errorf("inflate case line %q: %v", line, err)
			}
			if c.Case != len(r.Cases) {
				return nil, fmt.Errorf("inflate case line %q: case %d out of order, want %d", line, c.Case, len(r.Cases))
			}
			r.Cases = append(r.Cases, c)
		}
	}
	return r, nil
}

func parseInflateCaseLine(f []string) (KernelInflateResult, error) {
	var c KernelInflateResult
	if len(f) < 5 {
		return c, fmt.Errorf("%d fields, want N VERDICT [REASON] out= hash= syncs=", len(f))
	}
	n, err := strconv.Atoi(f[0])
	if err != nil || n < 0 {
		return c, fmt.Errorf("case number %q", f[0])
	}
	c.Case, c.Verdict = n, f[1]
	kv := f[2:]
	switch c.Verdict {
	case "end", "more":
	case "error":
		c.Reason, kv = kv[0], kv[1:]
		known := false
		for _, r := range InflateReasons {
			known = known || r == c.Reason
		}
		if !known {
			return c, fmt.Errorf("unknown reason %q", c.Reason)
		}
	default:
		return c, fmt.Errorf("verdict %q, want end, more or error", c.Verdict)
	}
	if len(kv) != 3 {
		return c, fmt.Errorf("want out=, hash= and syncs=, got %q", kv)
	}
	for i, key := range []string{"out=", "hash=", "syncs="} {
		v, ok := strings.CutPrefix(kv[i], key)
		if !ok {
			return c, fmt.Errorf("field %q, want %sVALUE", kv[i], key)
		}
		switch i {
		case 0:
			c.Out, err = strconv.ParseUint(v, 10, 64)
		case 1:
			c.Hash, err = strconv.ParseUint(v, 16, 64)
		case 2:
			var s uint64
			s, err = strconv.ParseUint(v, 10, 31)
			c.Syncs = int(s)
		}
		if err != nil {
			return c, fmt.Errorf("%s %v", key, err)
		}
	}
	return c, nil
}

// CheckInflateCase compares the kernel's result on a stream with Go's. The
// kernel must agree with compress/zlib on every byte of output and on the
// verdict, except where the two legitimately differ:
//
//   - Error kinds: Go says only ErrHeader, ErrDictionary, ErrChecksum or
//     CorruptInputError (with an offset); the kernel names the rule. Each
//     kernel reason must fall in Go's class: header-* in ErrHeader, adler32
//     in ErrChecksum, the rest in CorruptInputError.
//   - Near the end of the input Go waits for bits it may not need (see
//     GoInflatePadded), so where Go says the input ran out the kernel may
//     have decoded a few more symbols, or (corrupt streams) reached the
//     refusal Go would reach with more input; the padded run must then
//     agree.
//   - Early refusals (inflateEarlyReasons): Go reads on into a block the
//     kernel has already refused; Go must fail too, or run out of input,
//     after at least the kernel's output.
//   - FDICT: the kernel holds no dictionary and refuses every stream that
//     asks for one (RFC 1950 §2.2: a decoder without the dictionary must
//     not go on). Go compares the dictionary id with the Adler-32 of an
//     empty dictionary, 1, and inflates the stream when they match.
func CheckInflateCase(stream []byte, k KernelInflateResult) error {
	g := GoInflate(stream)
	switch k.Verdict {
	case "end":
		if g.Verdict != "end" {
			return fmt.Errorf("kernel: end of stream, Go: %v", g.Err)
		}
		return sameOutput(k, g.Out)
	case "more":
		if g.Verdict != "more" {
			return fmt.Errorf("kernel: needs more input, Go: %s (%v)", g.Verdict, g.Err)
		}
		return prefixOutput(k, g.Out, GoInflatePadded(stream).Out)
	case "error":
	default:
		return fmt.Errorf("kernel verdict %q", k.Verdict)
	}
	switch {
	case k.Reason == "fdict":
		if k.Out != 0 {
			return fmt.Errorf("kernel refused fdict after %d bytes of output", k.Out)
		}
		return nil
	case strings.HasPrefix(k.Reason, "header-"):
		if g.Class != "header" {
			return fmt.Errorf("kernel: %s, Go: %s (%v)", k.Reason, g.Verdict, g.Err)
		}
		return sameOutput(k, nil)
	case k.Reason == "adler32":
		if g.Class != "checksum" {
			return fmt.Errorf("kernel: adler32, Go: %s (%v)", g.Verdict, g.Err)
		}
		return sameOutput(k, g.Out)
	case inflateEarlyReasons[k.Reason]:
		if g.Verdict != "more" && g.Class != "corrupt" {
			return fmt.Errorf("kernel: %s, Go: %s (%v)", k.Reason, g.Verdict, g.Err)
		}
		p := GoInflatePadded(stream)
		if k.Out > uint64(len(g.Out)) && k.Out > uint64(len(p.Out)) {
			return fmt.Errorf("kernel: %s after %d bytes, more than Go's %d", k.Reason, k.Out, len(g.Out))
		}
		full := g.Out
		if len(p.Out) > len(full) {
			full = p.Out
		}
		return sameOutput(k, full[:k.Out])
	}
	if g.Class == "corrupt" {
		return sameOutput(k, g.Out)
	}
	if g.Verdict == "more" {
		p := GoInflatePadded(stream)
		if p.Class != "corrupt" {
			return fmt.Errorf("kernel: %s, Go: input ran out (%v), padded: %s (%v)", k.Reason, g.Err, p.Verdict, p.Err)
		}
		return sameOutput(k, p.Out)
	}
	return fmt.Errorf("kernel: %s, Go: %s (%v)", k.Reason, g.Verdict, g.Err)
}

func sameOutput(k KernelInflateResult, want []byte) error {
	if k.Out != uint64(len(want)) || k.Hash != InflateHash(want) {
		return fmt.Errorf("kernel %s output %d bytes hash %016x, Go %d bytes hash %016x", k.Verdict, k.Out, k.Hash, len(want), InflateHash(want))
	}
	return nil
}

// prefixOutput: the kernel's output lies between Go's (unpadded) and
// Go's padded output, and is a prefix of the padded one.
func prefixOutput(k KernelInflateResult, short, long []byte) error {
	if k.Out < uint64(len(short)) || k.Out > uint64(len(long)) {
		return fmt.Errorf("kernel output %d bytes, Go %d (padded %d)", k.Out, len(short), len(long))
	}
	if h := InflateHash(long[:k.Out]); h != k.Hash {
		return fmt.Errorf("kernel output %d bytes hash %016x, Go's first %d bytes hash %016x", k.Out, k.Hash, k.Out, h)
	}
	return nil
}
