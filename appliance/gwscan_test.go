package appliance

import (
	"bytes"
	"encoding/json"
	"math/rand"
	"strings"
	"testing"
	"unicode/utf8"
)

func randomPieces(r *rand.Rand, n int) []int {
	var p []int
	for n > 0 {
		k := 1 + r.Intn(1+r.Intn(64))
		if r.Intn(8) == 0 {
			k = 1 + r.Intn(4096)
		}
		p = append(p, k)
		n -= k
	}
	return p
}

func TestGatewayScanFields(t *testing.T) {
	cases := []struct {
		msg  string
		want ScanFields
		err  string
	}{
		{`{"t":"READY","s":3,"d":{"session_id":"abc","resume_gateway_url":"ws://1.2.3.4/r","user":{"session_id":"no"}},"op":0}`,
			ScanFields{OpSt: FieldOK, SSt: FieldOK, S: 3, TSt: FieldOK, T: []byte("READY"), DSt: DObject,
				SIDSt: FieldOK, SID: []byte("abc"), URLSt: FieldOK, URL: []byte("ws://1.2.3.4/r")}, ""},
		{`{"d":{"heartbeat_interval":41250},"op":10,"s":null,"t":null}`,
			ScanFields{OpSt: FieldOK, Op: 10, SSt: FieldNull, TSt: FieldNull, DSt: DObject, HBSt: FieldOK, HB: 41250}, ""},
		{`{"d":false,"op":9}`, ScanFields{OpSt: FieldOK, Op: 9, DSt: DFalse}, ""},
		{`{"op":01,"s":-1,"t":"a\"b"}`, ScanFields{OpSt: FieldBad, SSt: FieldBad, TSt: FieldBad}, ""},
		{`{"op":4294967296}`, ScanFields{OpSt: FieldBad}, ""},
		{`{"d":{"x":{"heartbeat_interval":5}}}`, ScanFields{DSt: DObject}, ""},
		{`{"d":{"session_id":"a"},"d":7}`, ScanFields{DSt: DOther}, ""},
		{`{"op":1`, ScanFields{}, ScanErrCut},
		{``, ScanFields{}, ScanErrEmpty},
		{`{"op":1}{`, ScanFields{}, ScanErrAfter},
		{`{"a":"\q"}`, ScanFields{}, ScanErrEscape},
		{"{\"a\":\"\n\"}", ScanFields{}, ScanErrControl},
		{`{"a":nulL}`, ScanFields{}, ScanErrLiteral},
		{`{"a":[1,]}`, ScanFields{}, ScanErrByte},
		{`{"a":` + strings.Repeat("[", 63) + strings.Repeat("]", 63) + `}`, ScanFields{}, ""},
		{`{"a":` + strings.Repeat("[", 64) + strings.Repeat("]", 64) + `}`, ScanFields{}, ScanErrDepth},
	}
	for _, c := range cases {
		res, f := ScanMessage([]byte(c.msg), nil)
		if c.err != "" {
			if res.OK || res.Reason != c.err {
				t.Errorf("%q: %+v, want refusal %q", c.msg, res, c.err)
			}
			continue
		}
		if !res.OK {
			t.Errorf("%q: refused: %s at %d", c.msg, res.Reason, res.At)
			continue
		}
		if ScanRecordHash(f) != ScanRecordHash(c.want) {
			t.Errorf("%q: fields %+v, want %+v", c.msg, f, c.want)
		}
	}
}

// TestGatewayScanSplits: every corpus message gives the same verdict, the
// same place and the same fields whatever pieces it arrives in.
func TestGatewayScanSplits(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	corpus := GatewayScanCorpus(1)
	oks := 0
	for i, m := range corpus {
		whole, _ := ScanMessage(m, nil)
		if whole.OK {
			oks++
		}
		for k := 0; k < 4; k++ {
			got, _ := ScanMessage(m, randomPieces(r, len(m)))
			if got != whole {
				t.Fatalf("case %d %q: %+v in pieces, %+v whole", i, m, got, whole)
			}
		}
	}
	if oks < len(corpus)/5 || oks > len(corpus)*4/5 {
		t.Errorf("%d of %d cases accepted: the corpus should hold both kinds", oks, len(corpus))
	}
}

// checkAgainstEncodingJSON: an object encoding/json accepts (numbers strict,
// UTF-8 valid) and within our depth must be accepted, with op, s and t as
// encoding/json reads them where they are simple.
func checkAgainstEncodingJSON(t *testing.T, msg []byte, res ScanResult, f ScanFields) {
	var top map[string]json.RawMessage
	if json.Unmarshal(msg, &top) != nil || bytes.Count(msg, []byte("[")) >= ScanDepthMax-1 || bytes.Count(msg, []byte("{")) >= ScanDepthMax-1 {
		return
	}
	if !res.OK {
		t.Fatalf("%q: encoding/json accepts it, the scanner refuses: %s at %d", msg, res.Reason, res.At)
	}
	if bytes.Contains(msg, []byte(`\`)) {
		return // escaped keys: encoding/json matches them, the scanner does not
	}
	if raw, ok := top["op"]; ok && string(raw) != "null" {
		var v uint32
		if json.Unmarshal(raw, &v) == nil && !bytes.ContainsAny(raw, ".eE-") && (len(raw) == 1 || raw[0] != '0') {
			if f.OpSt != FieldOK || f.Op != v {
				t.Fatalf("%q: op %d (%d), encoding/json %d", msg, f.Op, f.OpSt, v)
			}
		}
	} else if !ok && f.OpSt != FieldAbsent {
		t.Fatalf("%q: op found where encoding/json has none", msg)
	}
	if raw, ok := top["t"]; ok && string(raw) != "null" {
		var s string
		if json.Unmarshal(raw, &s) == nil && len(s) <= ScanTMax && utf8.Valid(raw) { // encoding/json replaces bad UTF-8

			if f.TSt != FieldOK || string(f.T) != s {
				t.Fatalf("%q: t %q (%d), encoding/json %q", msg, f.T, f.TSt, s)
			}
		}
	}
}

func TestGatewayScanAgainstEncodingJSON(t *testing.T) {
	for _, m := range GatewayScanCorpus(2) {
		res, f := ScanMessage(m, nil)
		checkAgainstEncodingJSON(t, m, res, f)
	}
}

func FuzzGatewayScan(f *testing.F) {
	for _, m := range GatewayScanCorpus(3)[:200] {
		f.Add(m, int64(1))
	}
	f.Fuzz(func(t *testing.T, msg []byte, seed int64) {
		whole, fw := ScanMessage(msg, nil)
		got, _ := ScanMessage(msg, randomPieces(rand.New(rand.NewSource(seed)), len(msg)))
		if got != whole {
			t.Fatalf("%+v in pieces, %+v whole", got, whole)
		}
		checkAgainstEncodingJSON(t, msg, whole, fw)
	})
}

func TestGatewayScanLines(t *testing.T) {
	serial := "x\ngwscan case 0 ok len=3 rec=00\ngwscan FAIL y\ngwscan case 1 error at=0 json: empty message\n"
	c, f, err := ParseGatewayScanLines(serial)
	if err != nil || len(c) != 2 || len(f) != 1 || c[1] != "error at=0 json: empty message" {
		t.Fatalf("%q %q %v", c, f, err)
	}
	if _, _, err := ParseGatewayScanLines("gwscan case 1 ok\n"); err == nil {
		t.Fatal("out-of-order line accepted")
	}
}
