package appliance

import (
	"bytes"
	"compress/flate"
	"compress/zlib"
	"encoding/binary"
	"fmt"
	"hash/adler32"
	"io"
	"reflect"
	"strings"
	"testing"
)

func TestInflateCorpusDeterministic(t *testing.T) {
	a, b := InflateCorpus(7), InflateCorpus(7)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("InflateCorpus(7) differs between two calls")
	}
	if c := InflateCorpus(8); bytes.Equal(InflateSection(a), InflateSection(c)) {
		t.Fatal("InflateCorpus(7) and (8) are the same")
	}
	if len(a[0].Stream) < len(a[1].Stream) || !strings.HasPrefix(a[0].Kind, "large") {
		t.Errorf("case 0 is %s (%d bytes), want the large one first", a[0].Kind, len(a[0].Stream))
	}
}

// TestInflateCorpusVerdicts checks that each family is what its name says,
// by Go's compress/zlib: the valid ones end or are open (zlib-stream), the
// spoiled ones never end cleanly, the header cases get the verdict RFC 1950
// gives them.
func TestInflateCorpusVerdicts(t *testing.T) {
	header := map[string]string{
		"flevel": "end", "cinfo-small": "end", "cm7": "error/header", "cm15": "error/header",
		"cinfo8": "error/header", "cinfo15": "error/header", "fcheck": "error/header", "fdict": "error/dict",
		"fdict-id1": "end", "fdict-short": "more", "empty": "more", "one-byte": "more",
		"empty-final-stored": "end", "sync-only": "more", "adler-bad": "error/checksum",
		"adler-short": "more", "adler-none": "more", "trailing": "end",
	}
	seen := map[string]int{}
	for i, c := range InflateCorpus(11) {
		o := GoInflate(c.Stream)
		v := o.Verdict
		if o.Class != "" {
			v += "/" + o.Class
		}
		family, rest, _ := strings.Cut(c.Kind, "-")
		seen[family]++
		bad := false
		switch family {
		case "large", "zlib":
			bad = v != "end"
		case "zstream":
			bad = v != "more" || c.Syncs < 1
		case "built":
			bad = v != "end" && v != "more"
		case "corrupt": // no-eob: Go reads on to the end of the input
			bad = v == "end" || (rest != "no-eob" && v != "error/corrupt")
		case "header":
			if want, ok := header[rest]; ok {
				bad = v != want
			} else if rest != "random" {
				t.Errorf("case %d: unknown header case %q", i, rest)
			}
		case "mutant":
		default:
			t.Errorf("case %d: unknown family %q", i, c.Kind)
		}
		if bad {
			t.Errorf("case %d %s: Go says %s (%v)", i, c.Kind, v, o.Err)
		}
	}
	for _, f := range []string{"large", "zlib", "zstream", "built", "corrupt", "header", "mutant"} {
		if seen[f] == 0 {
			t.Errorf("no %s cases", f)
		}
	}
}

// decodeToks is a direct reading of a block's symbols (§3.2.3): what the
// bytes written by putToks must inflate to.
func decodeToks(out []byte, toks []dtok) []byte {
	for _, tk := range toks {
		switch {
		case tk.lsym < deflateEOB:
			out = append(out, byte(tk.lsym))
		case tk.lsym > deflateEOB:
			n := deflateLenBase[tk.lsym-257] + int(tk.lext)
			d := deflateDistBase[tk.dsym] + int(tk.dext)
			for i := 0; i < n; i++ {
				out = append(out, out[len(out)-d])
			}
		}
	}
	return out
}

// TestBitWriterBlocks checks the bit-level writer against compress/flate:
// stored, fixed and dynamic blocks of random symbols (with repeats, long
// codes, a single or no distance code, the window edge) inflate to what
// the symbols say.
func TestBitWriterBlocks(t *testing.T) {
	g := &inflateGen{rng: splitmix64{99}}
	for i := 0; i < 300; i++ {
		w := &bitWriter{}
		var want []byte
		for b, blocks := 0, 1+int(g.intn(4)); b < blocks; b++ {
			final := b == blocks-1
			toks, _ := g.randomToks(g.count(), len(want))
			switch g.intn(3) {
			case 0:
				s := g.bytes(int(g.intn(3000)))
				putStored(w, final, s)
				want = append(want, s...)
				continue
			case 1:
				putFixed(w, final, toks)
			default:
				lit, dist := g.dynamicLens(toks, true)
				g.putDynamic(w, final, toks, lit, dist, g.chance(50), true, spoilNone)
			}
			want = decodeToks(want, toks)
		}
		got, err := io.ReadAll(flate.NewReader(bytes.NewReader(w.bytes())))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("stream %d: flate: %v, %d bytes, want %d", i, err, len(got), len(want))
		}
	}
}

func TestCompleteLengths(t *testing.T) {
	g := &inflateGen{rng: splitmix64{5}}
	for _, max := range []int{7, 15} {
		for k := 2; k <= 288 && k <= 1<<max; k += 1 + int(g.intn(9)) {
			lens := g.completeLengths(k, max)
			kraft := 0
			for _, l := range lens {
				if l == 0 || int(l) > max {
					t.Fatalf("k=%d max=%d: length %d", k, max, l)
				}
				kraft += 1 << (max - int(l))
			}
			if len(lens) != k || kraft != 1<<max {
				t.Fatalf("k=%d max=%d: %d lengths, Kraft sum %d/%d", k, max, len(lens), kraft, 1<<max)
			}
		}
	}
	if l := g.completeLengths(1, 15); len(l) != 1 || l[0] != 1 {
		t.Errorf("one symbol: %v, want one 1-bit code", l)
	}
}

func TestInflateSection(t *testing.T) {
	cases := []InflateCase{{Stream: nil}, {Stream: []byte{1, 2, 3}}, {Stream: bytes.Repeat([]byte{9}, 300)}}
	p := InflateSection(cases)
	got, err := ParseInflateSection(p)
	if err != nil || len(got) != 3 || len(got[0]) != 0 || !bytes.Equal(got[1], []byte{1, 2, 3}) || len(got[2]) != 300 {
		t.Fatalf("round trip: %v, %q", err, got)
	}
	for _, bad := range [][]byte{nil, {1, 0, 0}, {1, 0, 0, 0}, {1, 0, 0, 0, 5, 0, 0, 0, 1}, append(p, 0)} {
		if _, err := ParseInflateSection(bad); err == nil {
			t.Errorf("ParseInflateSection(% x) accepted", bad)
		}
	}
}

func TestSelfTestModule(t *testing.T) {
	cases := [][]byte{[]byte("node=a"), nil, []byte("seed=5")}
	plain, err := SelfTestModule{ConfigCases: cases}.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var old bytes.Buffer // the format before sections: unchanged
	old.WriteString("DPXECFG1")
	for _, c := range cases {
		binary.Write(&old, binary.LittleEndian, uint32(len(c)))
		old.Write(c)
	}
	if !bytes.Equal(plain, old.Bytes()) {
		t.Errorf("module without sections is not the old format:\n% x\n% x", plain, old.Bytes())
	}
	secs := []ModuleSection{{Tag: "INFLATE1", Payload: []byte{1, 2}}, {Tag: "OTHERTAG", Payload: nil}}
	b, err := SelfTestModule{ConfigCases: cases, Sections: secs}.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	m, err := ParseSelfTestModule(b)
	if err != nil || len(m.ConfigCases) != 3 || string(m.ConfigCases[2]) != "seed=5" || len(m.Sections) != 2 {
		t.Fatalf("round trip: %v %+v", err, m)
	}
	if p, ok := m.Section("INFLATE1"); !ok || !bytes.Equal(p, []byte{1, 2}) {
		t.Errorf("Section(INFLATE1) = %v, %v", p, ok)
	}
	if _, ok := m.Section("NOTTHERE"); ok {
		t.Error("Section(NOTTHERE) found")
	}
	for _, s := range [][]ModuleSection{{{Tag: "SHORT"}}, {{Tag: "INFLATE1"}, {Tag: "INFLATE1"}}} {
		if _, err := (SelfTestModule{Sections: s}).MarshalBinary(); err == nil {
			t.Errorf("MarshalBinary accepted sections %v", s)
		}
	}
	for _, bad := range [][]byte{nil, []byte("DPXECFG2"), []byte("DPXECFG1\x01"), []byte("DPXECFG1\x05\x00\x00\x00ab"),
		[]byte("DPXECFG1\xff\xff\xff\xffINFLATE1\x09\x00\x00\x00x"), b[:len(b)-1]} {
		if _, err := ParseSelfTestModule(bad); err == nil {
			t.Errorf("ParseSelfTestModule(%q) accepted", bad)
		}
	}
}

func TestParseInflateReport(t *testing.T) {
	serial := "boot: x\ninflate size 38976 window 32768\r\n" +
		"inflate case 0 end out=5 hash=a430d84680aabd0b syncs=0\n" +
		"inflate case 1 error distance-too-far out=0 hash=cbf29ce484222325 syncs=2\n" +
		"inflate case 2 more out=12 hash=00000000000000ff syncs=1\n" +
		"inflate cases 3\ninflate FAIL something\n" +
		"inflate throughput case=0 out=4194304 in=645056 cycles=37552746 us=17909 MBps=234.19\n"
	r, err := ParseInflateReport(serial)
	if err != nil {
		t.Fatal(err)
	}
	want := []KernelInflateResult{
		{0, "end", "", 5, 0xa430d84680aabd0b, 0},
		{1, "error", "distance-too-far", 0, 0xcbf29ce484222325, 2},
		{2, "more", "", 12, 0xff, 1},
	}
	if !reflect.DeepEqual(r.Cases, want) || r.Size != 38976 || r.Window != 32768 || r.CaseCount != 3 ||
		len(r.Failures) != 1 || r.MBps != 234.19 {
		t.Errorf("got %+v", r)
	}
	for _, bad := range []string{
		"inflate case 1 end out=1 hash=0 syncs=0",          // out of order
		"inflate case 0 fine out=1 hash=0 syncs=0",         // verdict
		"inflate case 0 error nosuch out=1 hash=0 syncs=0", // reason
		"inflate case 0 end out=x hash=0 syncs=0",
		"inflate case 0 end hash=0 out=1 syncs=0",
		"inflate case 0 end out=1 hash=0",
		"inflate size 1",
		"inflate cases -1",
		"inflate throughput MBps=fast",
	} {
		if _, err := ParseInflateReport(bad); err == nil {
			t.Errorf("ParseInflateReport(%q) accepted", bad)
		}
	}
}

// TestCheckInflateCase runs the comparison rules on results made from
// Go's own answers, right and wrong.
func TestCheckInflateCase(t *testing.T) {
	hello := []byte("hello, hello, hello")
	var b bytes.Buffer
	w := zlib.NewWriter(&b)
	w.Write(hello)
	w.Close()
	full := b.Bytes()
	res := func(v, reason string, out []byte) KernelInflateResult {
		return KernelInflateResult{Verdict: v, Reason: reason, Out: uint64(len(out)), Hash: InflateHash(out)}
	}
	badAdler := append(append([]byte(nil), full[:len(full)-1]...), full[len(full)-1]^1)
	fdict1 := append([]byte{0x78, 0xBB, 0, 0, 0, 1}, full[2:]...) // FDICT with the id of no dictionary
	for _, c := range []struct {
		name   string
		stream []byte
		k      KernelInflateResult
		ok     bool
	}{
		{"end", full, res("end", "", hello), true},
		{"end, other bytes", full, res("end", "", []byte("hello, hello, hellO")), false},
		{"end, said more", full, res("more", "", hello), false},
		{"truncated", full[:len(full)-4], res("more", "", hello), true},
		{"truncated, said end", full[:len(full)-4], res("end", "", hello), false},
		{"adler", badAdler, res("error", "adler32", hello), true},
		{"adler as corrupt", badAdler, res("error", "distance-too-far", hello), false},
		{"header", []byte{0x78, 0x9D, 0, 0}, res("error", "header-fcheck", nil), true},
		{"header as corrupt", []byte{0x78, 0x9D, 0, 0}, res("error", "block-type", nil), false},
		{"fdict id 1", fdict1, res("error", "fdict", nil), true},
		{"fdict after output", fdict1, res("error", "fdict", hello), false},
		{"block type 3", []byte{0x78, 0x9C, 0x07, 0}, res("error", "block-type", nil), true},
		{"block type 3, said end", []byte{0x78, 0x9C, 0x07, 0}, res("end", "", nil), false},
	} {
		err := CheckInflateCase(c.stream, c.k)
		if (err == nil) != c.ok {
			t.Errorf("%s: CheckInflateCase = %v, want ok %v", c.name, err, c.ok)
		}
	}
	if got := adler32.Checksum(nil); got != 1 {
		t.Fatalf("Adler-32 of nothing = %d", got) // what fdict-id1 relies on
	}
}

func FuzzParseInflateReport(f *testing.F) {
	f.Add("inflate size 38976 window 32768\ninflate case 0 end out=5 hash=ff syncs=0\ninflate cases 1\n")
	f.Add("inflate case 0 error fdict out=0 hash=cbf29ce484222325 syncs=0\ninflate throughput case=0 MBps=1.5")
	f.Add("inflate FAIL x\ninflate case 0 more out=18446744073709551615 hash=ffffffffffffffff syncs=2147483647")
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseInflateReport(s)
		if err != nil {
			return
		}
		for i, c := range r.Cases {
			if c.Case != i {
				t.Fatalf("case %d numbered %d", i, c.Case)
			}
			c.Case = 0 // each line, printed again as the first, parses back
			line := fmt.Sprintf("inflate case 0 %s out=%d hash=%x syncs=%d", strings.TrimSpace(c.Verdict+" "+c.Reason), c.Out, c.Hash, c.Syncs)
			again, err := ParseInflateReport(line)
			if err != nil || len(again.Cases) != 1 || again.Cases[0] != c {
				t.Fatalf("%q does not parse back: %v", line, err)
			}
		}
	})
}

func FuzzParseSelfTestModule(f *testing.F) {
	m, _ := SelfTestModule{ConfigCases: [][]byte{[]byte("node=a")}, Sections: []ModuleSection{{Tag: "INFLATE1", Payload: []byte{0, 0, 0, 0}}}}.MarshalBinary()
	f.Add(m)
	f.Add([]byte("DPXECFG1"))
	f.Add([]byte("DPXECFG1\xff\xff\xff\xff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseSelfTestModule(b)
		if err != nil {
			return
		}
		again, err := m.MarshalBinary()
		if err != nil {
			t.Fatalf("parsed module does not marshal: %v", err)
		}
		if len(m.Sections) > 0 || !bytes.HasSuffix(b, []byte{0xff, 0xff, 0xff, 0xff}) {
			if !bytes.Equal(again, b) {
				t.Fatalf("round trip differs:\n% x\n% x", b, again)
			}
		}
	})
}

func FuzzParseInflateSection(f *testing.F) {
	f.Add(InflateSection([]InflateCase{{Stream: []byte{0x78, 0x9c}}}))
	f.Add([]byte{0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		cs, err := ParseInflateSection(b)
		if err != nil {
			return
		}
		var cases []InflateCase
		for _, c := range cs {
			cases = append(cases, InflateCase{Stream: c})
		}
		if !bytes.Equal(InflateSection(cases), b) {
			t.Fatal("round trip differs")
		}
	})
}

// FuzzCheckInflateCase: any stream and any claimed result are judged
// without a panic, and Go's own answer on a stream that ends is accepted.
func FuzzCheckInflateCase(f *testing.F) {
	f.Add([]byte{0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01}, "end", "", uint64(0))
	f.Add([]byte{0x78, 0x9c, 0x07}, "error", "block-type", uint64(3))
	f.Fuzz(func(t *testing.T, stream []byte, verdict, reason string, out uint64) {
		CheckInflateCase(stream, KernelInflateResult{Verdict: verdict, Reason: reason, Out: out, Hash: out})
		if g := GoInflate(stream); g.Verdict == "end" {
			k := KernelInflateResult{Verdict: "end", Out: uint64(len(g.Out)), Hash: InflateHash(g.Out)}
			if err := CheckInflateCase(stream, k); err != nil {
				t.Fatalf("Go's own answer refused: %v", err)
			}
		}
	})
}
