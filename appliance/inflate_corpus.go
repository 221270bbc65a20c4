package appliance

import (
	"bytes"
	"compress/flate"
	"compress/zlib"
	"encoding/binary"
	"fmt"
	"hash/adler32"
	"io"
	"strconv"
)

// The corpus of the kernel's inflate self-test (see inflate.go): compressed
// streams made from a seed by compress/zlib and, bit by bit, by the writer
// below, which reaches what a compressor never writes (long codes, single
// and empty distance codes, the window edge, every refusal of RFC 1951).

// --- the corpus ------------------------------------------------------------

// Corpus composition: how many cases of each family. Sizes are kept small
// on average (the kernel runs them under TCG in the selftest=1 boot); one
// large Discord-like message carries the throughput figure.
const (
	inflateZlibCases     = 360
	inflateStreamCases   = 160
	inflateBuiltCases    = 480
	inflateCorruptCases  = 320
	inflateHeaderCases   = 40
	inflateMutantCases   = 1600
	inflateLargeOutBytes = 4 << 20
)

// InflateCorpus returns the cases for a seed: the same seed gives the
// same bytes (for one Go version: compress/flate's output may change
// between versions, the verdicts may not). The first case is the largest.
func InflateCorpus(seed uint32) []InflateCase {
	g := &inflateGen{rng: splitmix64{uint64(seed) ^ 0x1F1A7E}}
	var cases []InflateCase
	add := func(kind string, stream []byte, syncs int) {
		cases = append(cases, InflateCase{Kind: kind, Stream: stream, Syncs: syncs})
	}

	large := g.discordJSON(inflateLargeOutBytes)
	add("large-zlib-6", zlibCompress(large, 6), -1)

	for i := 0; i < inflateZlibCases; i++ {
		level := int(g.intn(12)) - 2 // -2 (Huffman only) .. 9
		data := g.data()
		add("zlib-"+strconv.Itoa(level), zlibCompress(data, level), -1) // Close's own blocks are Go's business
	}
	for i := 0; i < inflateStreamCases; i++ {
		s, n := g.zstream()
		add("zstream", s, n)
	}
	for i := 0; i < inflateBuiltCases; i++ {
		kind, s, n := g.built()
		add(kind, s, n)
	}
	for i := 0; i < inflateCorruptCases; i++ {
		kind, s := g.corrupt()
		add(kind, s, -1)
	}
	for _, h := range g.headers() {
		add(h.Kind, h.Stream, h.Syncs)
	}
	var small [][]byte // mutants of streams up to 8 KiB: plenty of kinds, little time
	for _, c := range cases {
		if len(c.Stream) <= 8192 {
			small = append(small, c.Stream)
		}
	}
	for i := 0; i < inflateMutantCases; i++ {
		kind, s := g.mutate(small[g.intn(uint64(len(small)))])
		add(kind, s, -1)
	}
	return cases
}

// zlibCompress is compress/zlib at level, closed (final block, Adler-32).
func zlibCompress(data []byte, level int) []byte {
	var b bytes.Buffer
	w, err := zlib.NewWriterLevel(&b, level)
	if err != nil {
		panic(err) // levels come from InflateCorpus: -2..9
	}
	w.Write(data)
	w.Close()
	return b.Bytes()
}

type inflateGen struct{ rng splitmix64 }

func (g *inflateGen) next() uint64 { return g.rng.next() }

// intn returns a value in [0, n); n > 0.
func (g *inflateGen) intn(n uint64) uint64 { return g.next() % n }

func (g *inflateGen) chance(pct uint64) bool { return g.intn(100) < pct }

// size picks a length skewed to small: mostly under 2 KiB, now and then up
// to max.
func (g *inflateGen) size(max int) int {
	switch r := g.intn(16); {
	case r < 2:
		return int(g.intn(8))
	case r < 11:
		return int(g.intn(2048))
	case r < 15:
		return int(g.intn(16384))
	default:
		return int(g.intn(uint64(max) + 1))
	}
}

func (g *inflateGen) bytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(g.next())
	}
	return b
}

// count picks how many random symbols a block gets: mostly a few hundred.
func (g *inflateGen) count() int {
	if g.chance(10) {
		return int(g.intn(3000))
	}
	return int(g.intn(400))
}

// data is the plain text of one case: random bytes, Discord-like JSON,
// runs, short periods (matches overlapping themselves), a two-letter
// alphabet, or a block repeated 32 KiB later (matches at the window edge).
func (g *inflateGen) data() []byte {
	n := g.size(40000)
	switch g.intn(13) {
	case 0:
		return g.bytes(n)
	case 1, 2, 3, 4, 5, 6:
		return g.discordJSON(n)
	case 7, 8:
		return bytes.Repeat([]byte{byte(g.next())}, n)
	case 9, 10:
		p := g.bytes(1 + int(g.intn(9)))
		return bytes.Repeat(p, n/len(p)+1)[:n]
	case 11:
		b := make([]byte, n)
		for i := range b {
			b[i] = "ab"[g.next()&1]
		}
		return b
	default:
		x := g.bytes(InflateWindow - int(g.intn(64)))
		return append(x, x[:g.intn(uint64(len(x)))]...)
	}
}

// discordJSON returns n bytes of text shaped like Gateway dispatches
// (GUILD_CREATE members with snowflakes, names and roles).
func (g *inflateGen) discordJSON(n int) []byte {
	var b bytes.Buffer
	names := []string{"ada", "linus", "grace", "ken", "dennis", "barbara", "margaret", "edsger", "donald", "frances"}
	seq := 1 + g.intn(1000)
	for b.Len() < n {
		fmt.Fprintf(&b, `{"t":"GUILD_CREATE","s":%d,"op":0,"d":{"id":"%d","name":"guild %d","members":[`, seq, 1<<60|g.intn(1<<58), g.intn(1e6))
		seq++
		for m, members := 0, 1+g.intn(40); m < int(members); m++ {
			if m > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"user":{"id":"%d","username":"%s%d","avatar":null,"bot":%v},"roles":["%d"],"joined_at":"2021-0%d-1%dT12:00:00.000000+00:00","deaf":false,"mute":false}`,
				1<<59|g.intn(1<<57), names[g.intn(uint64(len(names)))], g.intn(10000), g.chance(10), 1<<58|g.intn(1<<56), 1+g.intn(9), g.intn(10))
		}
		b.WriteString(`]}}`)
	}
	return b.Bytes()[:n]
}

// zstream is Discord's compress=zlib-stream: one zlib stream, each
// message followed by a sync flush (00 00 FF FF), never closed. It returns
// the stream and the number of flushes.
func (g *inflateGen) zstream() ([]byte, int) {
	var b bytes.Buffer
	w, _ := zlib.NewWriterLevel(&b, int(g.intn(10)))
	msgs := 1 + int(g.intn(12))
	for i := 0; i < msgs; i++ {
		var m []byte
		if g.chance(70) {
			m = g.discordJSON(g.size(20000))
		} else {
			m = g.data()
		}
		w.Write(m)
		w.Flush()
	}
	return b.Bytes(), msgs
}

// --- streams built bit by bit (RFC 1951 §3.2) --------------------------------

// bitWriter appends bits first-bit-lowest, as DEFLATE packs them (§3.1.1).
type bitWriter struct {
	out []byte
	acc uint64
	n   uint
}

func (w *bitWriter) put(v uint64, n uint) {
	w.acc |= (v & (1<<n - 1)) << w.n
	w.n += n
	for w.n >= 8 {
		w.out = append(w.out, byte(w.acc))
		w.acc >>= 8
		w.n -= 8
	}
}

// putCode writes a Huffman code, most significant bit first (§3.1.1).
func (w *bitWriter) putCode(code uint16, length uint8) {
	for i := int(length) - 1; i >= 0; i-- {
		w.put(uint64(code>>uint(i)&1), 1)
	}
}

func (w *bitWriter) align() {
	if w.n > 0 {
		w.put(0, 8-w.n)
	}
}

func (w *bitWriter) bytes() []byte {
	w.align()
	return w.out
}

// canonicalCodes assigns codes to lengths as §3.2.2 does.
func canonicalCodes(lengths []uint8) []uint16 {
	var count, next [16]int
	for _, l := range lengths {
		count[l]++
	}
	count[0] = 0
	code := 0
	for l := 1; l < 16; l++ {
		code = (code + count[l-1]) << 1
		next[l] = code
	}
	codes := make([]uint16, len(lengths))
	for s, l := range lengths {
		if l > 0 {
			codes[s] = uint16(next[l])
			next[l]++
		}
	}
	return codes
}

// Length and distance symbols (§3.2.5).
var (
	deflateLenBase   = [29]int{3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258}
	deflateLenExtra  = [29]uint{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0}
	deflateDistBase  = [30]int{1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577}
	deflateDistExtra = [30]uint{0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13}
)

const deflateEOB = 256

// dtok is one symbol of a compressed block: a literal (lsym < 256), the
// end of the block (256), a length with its distance (lsym 257-285), or a
// symbol that does not exist (286, 287; dsym 30, 31) for refusal cases.
type dtok struct {
	lsym, dsym   int
	lext, dext   uint64
	lbits, dbits uint
}

func litTok(b byte) dtok { return dtok{lsym: int(b)} }

func matchTok(length, dist int) dtok {
	t := dtok{}
	for i := len(deflateLenBase) - 1; i >= 0; i-- {
		if deflateLenBase[i] <= length {
			t.lsym, t.lext, t.lbits = 257+i, uint64(length-deflateLenBase[i]), deflateLenExtra[i]
			break
		}
	}
	for i := len(deflateDistBase) - 1; i >= 0; i-- {
		if deflateDistBase[i] <= dist {
			t.dsym, t.dext, t.dbits = i, uint64(dist-deflateDistBase[i]), deflateDistExtra[i]
			break
		}
	}
	return t
}

// fixedLitLens and fixedDistLens are the fixed code (§3.2.6).
func fixedLitLens() []uint8 {
	l := make([]uint8, 288)
	for i := range l {
		switch {
		case i < 144:
			l[i] = 8
		case i < 256:
			l[i] = 9
		case i < 280:
			l[i] = 7
		default:
			l[i] = 8
		}
	}
	return l
}

func fixedDistLens() []uint8 { return bytes.Repeat([]uint8{5}, 32) }

// putToks writes symbols with the codes of litLens and distLens, then the
// end-of-block code when eob. A symbol without a code writes nothing (the
// refusal cases never get that far).
func putToks(w *bitWriter, toks []dtok, litLens, distLens []uint8, eob bool) {
	lc, dc := canonicalCodes(litLens), canonicalCodes(distLens)
	for _, t := range toks {
		if t.lsym < len(litLens) {
			w.putCode(lc[t.lsym], litLens[t.lsym])
		}
		if t.lsym > deflateEOB {
			w.put(t.lext, t.lbits)
			if t.dsym < len(distLens) {
				w.putCode(dc[t.dsym], distLens[t.dsym])
			}
			w.put(t.dext, t.dbits)
		}
	}
	if eob {
		w.putCode(lc[deflateEOB], litLens[deflateEOB])
	}
}

func putBlockHeader(w *bitWriter, final bool, btype uint64) {
	f := uint64(0)
	if final {
		f = 1
	}
	w.put(f, 1)
	w.put(btype, 2)
}

// putStored writes a stored block (§3.2.4); len(data) <= 65535.
func putStored(w *bitWriter, final bool, data []byte) {
	putBlockHeader(w, final, 0)
	w.align()
	w.put(uint64(len(data)), 16)
	w.put(uint64(^uint16(len(data))), 16)
	for _, c := range data {
		w.put(uint64(c), 8)
	}
}

func putFixed(w *bitWriter, final bool, toks []dtok) {
	putBlockHeader(w, final, 1)
	putToks(w, toks, fixedLitLens(), fixedDistLens(), true)
}

// dynSpoil names one way putDynamic breaks a block's header on purpose.
type dynSpoil int

const (
	spoilNone dynSpoil = iota
	spoilHLIT
	spoilHDIST
	spoilCLOver
	spoilCLIncomplete
	spoilCLSingle
	spoilRepeatFirst
	spoilRepeatOver
	spoilLitOver
	spoilLitIncomplete
	spoilDistOver
	spoilDistIncomplete
)

// putDynamic writes a dynamic block (§3.2.7) for toks with the given code
// lengths (litLens holds HLIT + 257 entries, distLens HDIST + 1), run-length
// coding the lengths with 16/17/18 when repeats, spoiled as asked.
func (g *inflateGen) putDynamic(w *bitWriter, final bool, toks []dtok, litLens, distLens []uint8, repeats, eob bool, spoil dynSpoil) {
	hdrLit, hdrDist := append([]uint8(nil), litLens...), append([]uint8(nil), distLens...)
	switch spoil {
	case spoilLitOver:
		g.overSubscribe(hdrLit)
	case spoilLitIncomplete:
		g.makeIncomplete(hdrLit)
	case spoilDistOver:
		g.overSubscribe(hdrDist)
	case spoilDistIncomplete:
		g.makeIncomplete(hdrDist)
	}
	all := append(append([]uint8(nil), hdrLit...), hdrDist...)
	type clTok struct {
		sym   int
		ext   uint64
		nbits uint
	}
	var seq []clTok
	n := len(all)
	if spoil == spoilRepeatOver {
		n-- // the last length becomes a run of three zeros: one too many
	}
	if spoil == spoilRepeatFirst {
		seq = append(seq, clTok{16, g.intn(4), 2})
	}
	for i := 0; i < n; {
		l := all[i]
		run := 1
		for i+run < n && all[i+run] == l {
			run++
		}
		switch {
		case repeats && l == 0 && run >= 11:
			r := min(run, 138)
			seq = append(seq, clTok{18, uint64(r - 11), 7})
			i += r
		case repeats && l == 0 && run >= 3:
			r := min(run, 10)
			seq = append(seq, clTok{17, uint64(r - 3), 3})
			i += r
		case repeats && l != 0 && run >= 4:
			r := min(run-1, 6)
			seq = append(seq, clTok{int(l), 0, 0}, clTok{16, uint64(r - 3), 2})
			i += 1 + r
		default:
			seq = append(seq, clTok{int(l), 0, 0})
			i++
		}
	}
	if spoil == spoilRepeatOver {
		seq = append(seq, clTok{17, 0, 3})
	}
	// The code length code: a random complete code over the symbols used
	// (two at least: one 1-bit code is refused by the kernel and is what
	// spoilCLSingle writes).
	used := map[int]bool{}
	for _, t := range seq {
		used[t.sym] = true
	}
	var syms []int
	for s := 0; s < 19; s++ {
		if used[s] {
			syms = append(syms, s)
		}
	}
	for len(syms) < 2 {
		s := int(g.intn(19))
		if !used[s] {
			used[s] = true
			syms = append(syms, s)
		}
	}
	clLens := make([]uint8, 19)
	for i, l := range g.completeLengths(len(syms), 7) {
		clLens[syms[i]] = l
	}
	switch spoil {
	case spoilCLOver:
		g.overSubscribe(clLens)
	case spoilCLIncomplete:
		g.makeIncomplete(clLens)
	case spoilCLSingle:
		for i := range clLens {
			clLens[i] = 0
		}
		clLens[18] = 1 // one 1-bit code: the lengths become zeros
		seq = seq[:0]
		for left := len(all); left > 0; left -= min(left, 138) {
			r := max(min(left, 138), 11)
			seq = append(seq, clTok{18, uint64(r - 11), 7})
		}
	}
	order := [19]int{16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15}
	hclen := 4
	for i := 18; i >= 4; i-- {
		if clLens[order[i]] != 0 {
			hclen = i + 1
			break
		}
	}
	putBlockHeader(w, final, 2)
	hlit, hdist := uint64(len(litLens)-257), uint64(len(distLens)-1)
	switch spoil {
	case spoilHLIT:
		hlit = 30 + g.intn(2) // 287 or 288 codes
	case spoilHDIST:
		hdist = 30 + g.intn(2) // 31 or 32 codes
	}
	w.put(hlit, 5)
	w.put(hdist, 5)
	w.put(uint64(hclen-4), 4)
	for i := 0; i < hclen; i++ {
		w.put(uint64(clLens[order[i]]), 3)
	}
	clCodes := canonicalCodes(clLens)
	for _, t := range seq {
		if clLens[t.sym] > 0 {
			w.putCode(clCodes[t.sym], clLens[t.sym])
		}
		w.put(t.ext, t.nbits)
	}
	putToks(w, toks, litLens, distLens, eob)
}

// completeLengths returns k code lengths (in random order) of a complete
// prefix code no longer than maxBits: leaves of a binary tree grown by
// splitting a random leaf, the deepest one a third of the time so that
// long codes (and second-level tables) come up. One symbol gets one 1-bit
// code, the §3.2.7 special case. k <= 2^maxBits.
func (g *inflateGen) completeLengths(k, maxBits int) []uint8 {
	if k <= 1 {
		return []uint8{1}[:k]
	}
	leaves := []uint8{0}
	deep := g.chance(33)
	for len(leaves) < k {
		i := int(g.intn(uint64(len(leaves))))
		if deep {
			for j, d := range leaves {
				if d > leaves[i] && d < uint8(maxBits) {
					i = j
				}
			}
		}
		for leaves[i] >= uint8(maxBits) {
			i = (i + 1) % len(leaves)
		}
		leaves[i]++
		leaves = append(leaves, leaves[i])
	}
	for i := len(leaves) - 1; i > 0; i-- {
		j := int(g.intn(uint64(i + 1)))
		leaves[i], leaves[j] = leaves[j], leaves[i]
	}
	return leaves
}

// overSubscribe shortens one code of two bits or more: one pattern too many.
func (g *inflateGen) overSubscribe(lens []uint8) {
	for tries := 0; tries < 4*len(lens); tries++ {
		if i := int(g.intn(uint64(len(lens)))); lens[i] >= 2 {
			lens[i]--
			return
		}
	}
	lens[0] = 1 // no code long enough: two more 1-bit codes over-subscribe
	lens[len(lens)-1] = 1
	if len(lens) > 2 {
		lens[1] = 1
	}
}

// makeIncomplete lengthens one code (or drops it): a pattern left unused.
func (g *inflateGen) makeIncomplete(lens []uint8) {
	start := int(g.intn(uint64(len(lens))))
	for k := 0; k < len(lens); k++ {
		i := (start + k) % len(lens)
		if lens[i] > 0 && lens[i] < 15 {
			lens[i]++
			return
		}
	}
	for i := range lens { // every code at 15 bits: drop one
		if lens[i] > 0 {
			lens[i] = 0
			return
		}
	}
}

// codeFor gives the symbols in used a random complete code, in a length
// table of n entries (symbols beyond n are not allowed). Now and then a
// few unused symbols get codes too, as real compressors sometimes do.
func (g *inflateGen) codeFor(used map[int]bool, n, maxBits int) []uint8 {
	var syms []int
	for s := 0; s < n; s++ {
		if used[s] || g.chance(2) {
			syms = append(syms, s)
		}
	}
	lens := make([]uint8, n)
	for i, l := range g.completeLengths(len(syms), maxBits) {
		lens[syms[i]] = l
	}
	return lens
}

// randomToks returns count symbols following out bytes already decoded:
// literals and matches of random lengths at random distances, often at the
// edges: distance 1-8 (the copy overlaps itself), exactly the output so
// far or 32,768, length 258 or 3.
func (g *inflateGen) randomToks(count int, out int) ([]dtok, int) {
	var toks []dtok
	for i := 0; i < count; i++ {
		if out == 0 || g.chance(45) {
			toks = append(toks, litTok(byte(g.next())))
			out++
			continue
		}
		hist := min(out, InflateWindow)
		var dist int
		switch r := g.intn(10); {
		case r < 2:
			dist = 1 + int(g.intn(uint64(min(hist, 8))))
		case r < 3:
			dist = hist
		default:
			dist = 1 + int(g.intn(uint64(hist)))
		}
		length := 3 + int(g.intn(16))
		switch g.intn(10) {
		case 0:
			length = 258
		case 1, 2:
			length = 3 + int(g.intn(256))
		}
		toks = append(toks, matchTok(length, dist))
		out += length
	}
	return toks, out
}

// lz77 turns data into symbols with a small greedy matcher of its own
// (hash of 3 bytes, a short chain, the whole 32 KiB window), starting at
// data[from:] with data[:from] as history.
func lz77(data []byte, from int) []dtok {
	const hashBits = 12
	head := make([]int32, 1<<hashBits)
	for i := range head {
		head[i] = -1
	}
	prev := make([]int32, len(data))
	hash := func(i int) int {
		return int((uint32(data[i])<<16 | uint32(data[i+1])<<8 | uint32(data[i+2])) * 2654435761 >> (32 - hashBits))
	}
	insert := func(i int) {
		if i+2 < len(data) {
			h := hash(i)
			prev[i] = head[h]
			head[h] = int32(i)
		}
	}
	for i := max(0, from-InflateWindow); i < from; i++ {
		insert(i)
	}
	var toks []dtok
	for i := from; i < len(data); {
		bestLen, bestDist := 0, 0
		if i+2 < len(data) {
			for j, chain := int(head[hash(i)]), 0; j >= 0 && i-j <= InflateWindow && chain < 16; j, chain = int(prev[j]), chain+1 {
				l := 0
				for l < 258 && i+l < len(data) && data[j+l] == data[i+l] {
					l++
				}
				if l > bestLen {
					bestLen, bestDist = l, i-j
				}
			}
		}
		if bestLen >= 3 {
			toks = append(toks, matchTok(bestLen, bestDist))
			for k := 0; k < bestLen; k++ {
				insert(i + k)
			}
			i += bestLen
		} else {
			toks = append(toks, litTok(data[i]))
			insert(i)
			i++
		}
	}
	return toks
}

// dynamicLens gives the symbols of toks (and the end-of-block symbol) a
// random complete code: HLIT and HDIST as small as the symbols allow, or
// now and then the largest.
func (g *inflateGen) dynamicLens(toks []dtok, eob bool) ([]uint8, []uint8) {
	lit, dist := map[int]bool{}, map[int]bool{}
	if eob {
		lit[deflateEOB] = true
	}
	nlit, ndist := 257, 1
	for _, t := range toks {
		lit[t.lsym] = true
		nlit = max(nlit, t.lsym+1)
		if t.lsym > deflateEOB {
			dist[t.dsym] = true
			ndist = max(ndist, t.dsym+1)
		}
	}
	if g.chance(10) {
		nlit, ndist = 286, 30
	}
	litLens := g.codeFor(lit, nlit, 15)
	var distLens []uint8
	if len(dist) == 0 && g.chance(50) {
		distLens = make([]uint8, ndist) // no distance codes at all: allowed
	} else {
		distLens = g.codeFor(dist, ndist, 15)
	}
	return litLens, distLens
}

// zlibHeader is CMF 0x78 (deflate, 32 KiB window) with a random FLEVEL
// and the FCHECK that makes it a multiple of 31 (RFC 1950 §2.2).
func (g *inflateGen) zlibHeader() []byte {
	cmf := byte(0x78)
	flg := byte(g.intn(4)) << 6
	flg |= byte(31 - (uint(cmf)<<8|uint(flg))%31)
	return []byte{cmf, flg}
}

// wrap makes a raw DEFLATE stream a zlib stream: a header and, when
// trailer, the Adler-32 of what Go inflates from it.
func (g *inflateGen) wrap(raw []byte, trailer bool) []byte {
	s := append(g.zlibHeader(), raw...)
	if trailer {
		out, _ := io.ReadAll(flate.NewReader(bytes.NewReader(raw)))
		s = binary.BigEndian.AppendUint32(s, adler32.Checksum(out))
	}
	return s
}

// built returns one valid stream written bit by bit: a sequence of stored,
// fixed and dynamic blocks over real or random symbols, closed (final
// block and Adler-32) or left open with sync flushes like zlib-stream.
// out counts the bytes decoded so far (matches never reach further back);
// hist is an exact tail of them when known, so that the matcher can refer
// to it, nil after random symbols.
func (g *inflateGen) built() (string, []byte, int) {
	w := &bitWriter{}
	var hist []byte
	out, syncs := 0, 0
	blocks := 1 + int(g.intn(6))
	closed := g.chance(60)
	kinds := ""
	for b := 0; b < blocks; b++ {
		final := closed && b == blocks-1
		if g.intn(5) == 0 {
			kinds += "s"
			stored := g.bytes(min(g.size(20000), 65535))
			if g.chance(1) {
				stored = g.bytes(65535)
			}
			putStored(w, final, stored)
			if len(stored) == 0 {
				syncs++ // an empty stored block is one, whatever the intent
			}
			if hist != nil {
				hist = append(hist, stored...)
			}
			out += len(stored)
		} else {
			var toks []dtok
			if g.chance(50) {
				more := g.data()
				if len(more) > 8000 {
					more = more[:8000]
				}
				from := len(hist)
				hist = append(hist, more...)
				toks = lz77(hist, from)
				out += len(more)
			} else {
				toks, out = g.randomToks(g.count(), out)
				hist = nil
			}
			if g.chance(30) {
				kinds += "f"
				putFixed(w, final, toks)
			} else {
				kinds += "d"
				litLens, distLens := g.dynamicLens(toks, true)
				g.putDynamic(w, final, toks, litLens, distLens, g.chance(70), true, spoilNone)
			}
		}
		if len(hist) > 2*InflateWindow {
			hist = hist[len(hist)-InflateWindow:]
		}
		if !final && g.chance(30) {
			putStored(w, false, nil) // a sync flush between blocks
			syncs++
		}
	}
	if !closed && g.chance(70) {
		putStored(w, false, nil) // zlib-stream ends every message so
		syncs++
	}
	return "built-" + kinds, g.wrap(w.bytes(), closed), syncs
}

// corrupt returns a stream that breaks one rule of RFC 1951 on purpose,
// after some valid output (a stored or fixed block) most of the time.
func (g *inflateGen) corrupt() (string, []byte) {
	w := &bitWriter{}
	out := 0
	if g.chance(70) {
		n := 1 + g.size(20000)
		if g.chance(10) {
			n = InflateWindow + int(g.intn(100))
		}
		for left := n; left > 0; left -= min(left, 65535) {
			putStored(w, false, g.bytes(min(left, 65535)))
		}
		out = n
	}
	toks, out2 := g.randomToks(g.count()/4, out)
	kind := ""
	switch r := g.intn(19); r {
	case 0:
		kind = "btype3"
		putBlockHeader(w, true, 3)
		w.put(g.next(), 32)
	case 1:
		kind = "stored-nlen"
		putBlockHeader(w, true, 0)
		w.align()
		n := g.intn(65536)
		w.put(n, 16)
		w.put(^n^(1<<g.intn(16)), 16) // one bit of NLEN wrong
		w.put(g.next(), 64)
	case 2:
		kind = "fixed-lit286"
		putBlockHeader(w, true, 1)
		putToks(w, toks, fixedLitLens(), fixedDistLens(), false)
		bad := dtok{lsym: 286 + int(g.intn(2))}
		putToks(w, []dtok{bad}, fixedLitLens(), fixedDistLens(), false)
	case 3:
		kind = "fixed-dist30"
		putBlockHeader(w, true, 1)
		bad := matchTok(3+int(g.intn(256)), 1)
		bad.dsym, bad.dext, bad.dbits = 30+int(g.intn(2)), 0, 0
		if out == 0 {
			toks = nil
		}
		putToks(w, append(toks, bad), fixedLitLens(), fixedDistLens(), false)
	case 4:
		kind = "far"
		putBlockHeader(w, true, 1)
		hist := min(out2, InflateWindow)
		if hist >= InflateWindow {
			toks = nil // nothing further than 32 KiB can be coded: start fresh
			w = &bitWriter{}
			out2 = 0
			putBlockHeader(w, true, 1)
			hist = 0
		}
		far := matchTok(3+int(g.intn(256)), hist+1+int(g.intn(uint64(InflateWindow-hist))))
		putToks(w, append(toks, far), fixedLitLens(), fixedDistLens(), true)
	case 5:
		kind = "no-eob"
		litLens, distLens := g.dynamicLens(toks, false)
		for litLens[deflateEOB] != 0 { // a complete code without it
			litLens, distLens = g.dynamicLens(toks, false)
		}
		g.putDynamic(w, true, toks, litLens, distLens, true, false, spoilNone)
		w.put(g.next(), 64)
	case 6:
		kind = "single-dist-unused"
		// One distance code of one bit (distance 1): its other pattern is
		// invalid, and comes right after a length.
		toks, _ = g.randomToks(g.size(20), max(out, 1))
		if out == 0 {
			toks = append([]dtok{litTok('x')}, toks...)
		}
		lit := map[int]bool{deflateEOB: true, 257: true}
		for i, t := range toks {
			lit[t.lsym] = true
			if t.lsym > deflateEOB {
				toks[i].dsym, toks[i].dext, toks[i].dbits = 0, 0, 0
			}
		}
		litLens := g.codeFor(lit, 286, 15)
		distLens := make([]uint8, 1+int(g.intn(30)))
		distLens[0] = 1
		g.putDynamic(w, true, toks, litLens, distLens, true, false, spoilNone)
		w.putCode(canonicalCodes(litLens)[257], litLens[257])
		w.put(1, 1) // the unused distance pattern
		w.put(g.next(), 32)
	case 7:
		kind = "dist-empty-used"
		// No distance codes, then a length symbol.
		lit := map[int]bool{deflateEOB: true, 'a': true, 258: true}
		litLens := g.codeFor(lit, 259, 15)
		g.putDynamic(w, true, []dtok{litTok('a')}, litLens, make([]uint8, 1), true, false, spoilNone)
		lc := canonicalCodes(litLens)
		w.putCode(lc[258], litLens[258])
		w.put(g.next(), 32)
	default:
		spoils := []dynSpoil{spoilHLIT, spoilHDIST, spoilCLOver, spoilCLIncomplete, spoilCLSingle, spoilRepeatFirst,
			spoilRepeatOver, spoilLitOver, spoilLitIncomplete, spoilDistOver, spoilDistIncomplete}
		names := []string{"hlit", "hdist", "cl-over", "cl-incomplete", "cl-single", "repeat-first",
			"repeat-over", "lit-over", "lit-incomplete", "dist-over", "dist-incomplete"}
		i := int(r) - 8
		kind = names[i]
		litLens, distLens := g.dynamicLens(toks, true)
		if spoils[i] == spoilDistOver || spoils[i] == spoilDistIncomplete {
			if countCodes(distLens) < 2 {
				distLens = g.codeFor(map[int]bool{0: true, 1: true, 2: true}, 30, 15)
			}
		}
		g.putDynamic(w, true, toks, litLens, distLens, true, true, spoils[i])
		w.put(g.next(), 64)
	}
	return "corrupt-" + kind, g.wrap(w.bytes(), g.chance(50))
}

func countCodes(lens []uint8) int {
	n := 0
	for _, l := range lens {
		if l > 0 {
			n++
		}
	}
	return n
}

// headers returns streams around RFC 1950's header and trailer: every
// FLEVEL, smaller windows (accepted: ours is the largest), CM 7 and 15,
// CINFO 8, a wrong FCHECK, FDICT (with a dictionary id other than the
// Adler-32 of nothing, and equal to it: see CheckInflateCase), an empty
// stream, an empty final block, a bad, a short and no Adler-32, and bytes
// after the end.
func (g *inflateGen) headers() []InflateCase {
	hello := []byte("hello, zlib")
	raw := func() []byte {
		w := &bitWriter{}
		putFixed(w, true, lz77(hello, 0))
		return w.bytes()
	}()
	trailer := binary.BigEndian.AppendUint32(nil, adler32.Checksum(hello))
	withFCHECK := func(cmf, flg byte) []byte {
		flg &^= 31
		flg |= byte(31 - (uint(cmf)<<8|uint(flg))%31)
		return []byte{cmf, flg}
	}
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	var cs []InflateCase
	add := func(kind string, s []byte) {
		cs = append(cs, InflateCase{Kind: "header-" + kind, Stream: s, Syncs: -1})
	}
	for lvl := 0; lvl < 4; lvl++ {
		add("flevel", cat(withFCHECK(0x78, byte(lvl<<6)), raw, trailer))
	}
	for cinfo := 0; cinfo < 7; cinfo++ {
		add("cinfo-small", cat(withFCHECK(byte(cinfo<<4|8), 0), raw, trailer))
	}
	add("cm7", cat(withFCHECK(0x77, 0x80), raw, trailer))
	add("cm15", cat(withFCHECK(0x7F, 0x80), raw, trailer))
	add("cinfo8", cat(withFCHECK(0x88, 0x80), raw, trailer))
	add("cinfo15", cat(withFCHECK(0xF8, 0x80), raw, trailer))
	bad := withFCHECK(0x78, 0x80)
	bad[1] ^= 1 + byte(g.intn(30))
	add("fcheck", cat(bad, raw, trailer))
	add("fdict", cat(withFCHECK(0x78, 0xA0), []byte{0xDE, 0xAD, 0xBE, 0xEF}, raw, trailer))
	add("fdict-id1", cat(withFCHECK(0x78, 0xA0), []byte{0, 0, 0, 1}, raw, trailer))
	add("fdict-short", cat(withFCHECK(0x78, 0xA0), []byte{0, 0}))
	add("empty", nil)
	add("one-byte", []byte{0x78})
	add("empty-final-stored", cat([]byte{0x78, 0x01, 0x01, 0x00, 0x00, 0xFF, 0xFF}, []byte{0, 0, 0, 1}))
	add("sync-only", []byte{0x78, 0x9C, 0x00, 0x00, 0x00, 0xFF, 0xFF})
	badTrailer := append([]byte(nil), trailer...)
	badTrailer[g.intn(4)] ^= 1 << g.intn(8)
	add("adler-bad", cat([]byte{0x78, 0x9C}, raw, badTrailer))
	add("adler-short", cat([]byte{0x78, 0x9C}, raw, trailer[:g.intn(4)]))
	add("adler-none", cat([]byte{0x78, 0x9C}, raw))
	add("trailing", cat([]byte{0x78, 0x9C}, raw, trailer, g.bytes(1+int(g.intn(20)))))
	for len(cs) < inflateHeaderCases {
		add("random", cat(g.zlibHeader(), g.bytes(g.size(300))))
	}
	return cs
}

// mutate spoils a valid stream: truncates it anywhere, flips one to three
// bits, overwrites a byte, or appends garbage.
func (g *inflateGen) mutate(src []byte) (string, []byte) {
	s := append([]byte(nil), src...)
	if len(s) == 0 {
		return "mutant-garbage", g.bytes(1 + int(g.intn(64)))
	}
	switch g.intn(4) {
	case 0:
		return "mutant-trunc", s[:g.intn(uint64(len(s)))]
	case 1:
		for i, n := 0, 1+int(g.intn(3)); i < n; i++ {
			s[g.intn(uint64(len(s)))] ^= 1 << g.intn(8)
		}
		return "mutant-flip", s
	case 2:
		s[g.intn(uint64(len(s)))] = byte(g.next())
		return "mutant-byte", s
	default:
		return "mutant-append", append(s, g.bytes(1+int(g.intn(64)))...)
	}
}
