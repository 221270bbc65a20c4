package appliance

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
)

// The Go reference of the kernel's streaming Gateway scanner
// (kernel/lib/gwscan.inc). A Gateway message (one JSON object) arrives in
// pieces of any size: WebSocket frames of any length, continuation frames,
// the output of the zlib-stream inflater. The scanner keeps a fixed-size
// state (the container stack as 64 bits, a 20-byte key, three bounded
// captures) and takes the bytes one at a time, never holding the message.
// It checks the JSON's structure and finds, wherever they are in the
// object, the top-level op, s, t and d, and inside an object d the three
// fields the kernel acts on: session_id, resume_gateway_url and
// heartbeat_interval (op 9's flag is d itself, true or false).
//
// What it checks: objects, arrays, the colons and commas between their
// members, strings (no byte below 0x20, escapes one of \" \\ \/ \b \f \n \r
// \t or \u and four hex digits), the literals true, false and null, nesting
// up to ScanDepthMax, and that the message is exactly one object with only
// whitespace around it. What it does not: numbers outside the captured
// fields are checked loosely (a run of 0-9 + - . e E that starts with - or
// a digit), and UTF-8 is not validated. A captured number must be digits
// only, without a leading zero, at most 2^32 - 1; otherwise the field is
// FieldBad. A captured string holding an escape, or longer than its bound,
// is FieldBad (the kernel never needs one: session IDs are visible ASCII
// without '"' or '\', and the Gateway does not escape URLs). A repeated key
// replaces the earlier value; a repeated d clears the fields found in the
// earlier one.

// Bounds of the scanner (kernel/lib/gwscan.inc has the same).
const (
	ScanDepthMax = 64      // containers open at once
	ScanKeyMax   = 20      // bytes of a key compared; longer keys match nothing
	ScanTMax     = 31      // bytes of t kept (GW_TNAME_MAX - 1)
	ScanSIDMax   = 63      // bytes of d.session_id kept (SESSION.id - 1)
	ScanURLMax   = 211     // bytes of d.resume_gateway_url kept (GW_URL_MAX - 21)
	ScanMsgMax   = 1 << 30 // bytes of one message, whitespace before it included
)

// Field statuses.
const (
	FieldAbsent = 0 // not in the message
	FieldOK     = 1 // present with the expected type and within bounds
	FieldNull   = 2 // null
	FieldBad    = 3 // another type, out of bounds, or holding an escape
)

// Kinds of the top-level d.
const (
	DAbsent = 0
	DObject = 1
	DTrue   = 2
	DFalse  = 3
	DNull   = 4
	DOther  = 5
)

// The scanner's refusals, as the kernel prints them.
const (
	ScanErrByte    = "json: unexpected byte"
	ScanErrDepth   = "json: nested too deep"
	ScanErrControl = "json: control byte in a string"
	ScanErrEscape  = "json: bad escape"
	ScanErrLiteral = "json: bad literal"
	ScanErrAfter   = "json: bytes after the object"
	ScanErrLong    = "json: message over 1 GiB"
	ScanErrEmpty   = "json: empty message"
	ScanErrCut     = "json: message ends inside the object"
)

// ScanFields is what the scanner found in one message.
type ScanFields struct {
	OpSt  uint8
	Op    uint32
	SSt   uint8
	S     uint32
	TSt   uint8
	T     []byte
	DSt   uint8
	SIDSt uint8
	SID   []byte
	URLSt uint8
	URL   []byte
	HBSt  uint8
	HB    uint32
}

// scanner states
const (
	scIdle  = iota // before the object: whitespace or '{'
	scKey          // in an object: a key (or '}' when empty)
	scColon        // after a key
	scValue        // a value (or ']' when an empty array)
	scAfter        // after a value: ',' or the container's end
	scStr          // in a string
	scEsc          // after a backslash
	scHex          // in \uXXXX
	scNum          // in a number
	scLit          // in true, false or null
	scDone         // after the object: whitespace only
)

// what a value is captured into
const (
	capNone = iota
	capOp
	capS
	capT
	capD
	capSID
	capURL
	capHB
)

// GatewayScanner is the state of one shard's scanner.
type GatewayScanner struct {
	state   int
	depth   int
	stack   uint64 // bit depth-1: 1 when that container is an array
	emptyOK bool   // '}' or ']' may close the container just opened
	inD     bool   // the object at depth 2 is the top-level d
	isKey   bool
	cap     int // the value after the current key goes here
	vcap    int // the string, number or literal being read goes here
	lit     string
	litPos  int
	hex     int
	num     uint64
	numOK   bool
	numLen  int
	key     []byte
	keyBad  bool
	buf     []byte
	bufBad  bool
	F       ScanFields
	Len     uint64 // bytes of the message so far
	Err     string // sticky refusal
	ErrAt   uint64 // the byte it was refused at
}

// Feed scans bytes. After a refusal every call answers the same.
func (g *GatewayScanner) Feed(p []byte) error {
	if g.Err != "" {
		return fmt.Errorf("%s", g.Err)
	}
	for _, c := range p {
		if g.Len >= ScanMsgMax {
			return g.fail(ScanErrLong)
		}
		if e := g.step(c); e != "" {
			return g.fail(e)
		}
		g.Len++
	}
	return nil
}

// End marks the end of a message (a WebSocket message's FIN, or zlib-stream's
// sync flush): the object must be complete. The fields stay until the next
// message's '{'; the scanner is then ready for the next message.
func (g *GatewayScanner) End() error {
	if g.Err != "" {
		return fmt.Errorf("%s", g.Err)
	}
	switch g.state {
	case scDone:
		g.state = scIdle
		g.Len = 0
		return nil
	case scIdle:
		return g.fail(ScanErrEmpty)
	}
	return g.fail(ScanErrCut)
}

func (g *GatewayScanner) fail(e string) error {
	g.Err = e
	g.ErrAt = g.Len
	return fmt.Errorf("%s", e)
}

func isWS(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func isNumByte(c byte) bool {
	return c >= '0' && c <= '9' || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E'
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

func (g *GatewayScanner) top() bool { return g.stack>>(g.depth-1)&1 == 1 } // true: array

func (g *GatewayScanner) push(arr bool) string {
	if g.depth == ScanDepthMax {
		return ScanErrDepth
	}
	g.depth++
	bit := uint64(1) << (g.depth - 1)
	g.stack &^= bit
	if arr {
		g.stack |= bit
	}
	g.emptyOK = true
	if arr {
		g.state = scValue
	} else {
		g.state = scKey
	}
	return ""
}

func (g *GatewayScanner) pop() {
	g.depth--
	if g.depth == 1 {
		g.inD = false
	}
	if g.depth == 0 {
		g.state = scDone
	} else {
		g.state = scAfter
	}
}

// setStatus sets a captured field's status, clearing its value.
func (g *GatewayScanner) setStatus(cap int, st uint8) {
	f := &g.F
	switch cap {
	case capOp:
		f.OpSt, f.Op = st, 0
	case capS:
		f.SSt, f.S = st, 0
	case capT:
		f.TSt, f.T = st, nil
	case capSID:
		f.SIDSt, f.SID = st, nil
	case capURL:
		f.URLSt, f.URL = st, nil
	case capHB:
		f.HBSt, f.HB = st, 0
	}
}

func strMax(cap int) int {
	switch cap {
	case capT:
		return ScanTMax
	case capSID:
		return ScanSIDMax
	case capURL:
		return ScanURLMax
	}
	return -1
}

func (g *GatewayScanner) startValue(c byte) string {
	if isWS(c) {
		return ""
	}
	cap := g.cap
	g.cap = capNone
	if cap == capD { // a new d: forget what an earlier one held
		g.F.SIDSt, g.F.SID, g.F.URLSt, g.F.URL, g.F.HBSt, g.F.HB = 0, nil, 0, nil, 0, 0
	}
	switch {
	case c == '{':
		if cap == capD {
			g.F.DSt = DObject
		} else {
			g.setStatus(cap, FieldBad)
		}
		if e := g.push(false); e != "" {
			return e
		}
		if cap == capD {
			g.inD = true
		}
	case c == '[':
		if cap == capD {
			g.F.DSt = DOther
		} else {
			g.setStatus(cap, FieldBad)
		}
		return g.push(true)
	case c == '"':
		g.state, g.isKey, g.vcap = scStr, false, cap
		g.buf, g.bufBad = g.buf[:0], false
		if cap == capD {
			g.F.DSt = DOther
		} else if strMax(cap) < 0 {
			g.setStatus(cap, FieldBad)
		}
	case c == '-' || c >= '0' && c <= '9':
		g.state, g.vcap = scNum, cap
		g.num, g.numOK, g.numLen = uint64(c-'0'), c != '-', 1
		if cap == capD {
			g.F.DSt = DOther
		} else if strMax(cap) >= 0 {
			g.setStatus(cap, FieldBad)
		}
	case c == 't' || c == 'f' || c == 'n':
		g.state, g.vcap, g.litPos = scLit, cap, 1
		g.lit = map[byte]string{'t': "true", 'f': "false", 'n': "null"}[c]
	case c == ']' && g.emptyOK && g.top():
		g.pop()
	default:
		return ScanErrByte
	}
	return ""
}

func (g *GatewayScanner) endNumber() {
	switch g.vcap {
	case capOp, capS, capHB:
		if !g.numOK {
			g.setStatus(g.vcap, FieldBad)
			break
		}
		v := uint32(g.num)
		g.setStatus(g.vcap, FieldOK)
		switch g.vcap {
		case capOp:
			g.F.Op = v
		case capS:
			g.F.S = v
		case capHB:
			g.F.HB = v
		}
	}
	g.state = scAfter
}

func (g *GatewayScanner) endLiteral() {
	switch g.vcap {
	case capD:
		g.F.DSt = map[string]uint8{"true": DTrue, "false": DFalse, "null": DNull}[g.lit]
	case capS, capT:
		if g.lit == "null" {
			g.setStatus(g.vcap, FieldNull)
		} else {
			g.setStatus(g.vcap, FieldBad)
		}
	case capNone:
	default:
		g.setStatus(g.vcap, FieldBad)
	}
	g.state = scAfter
}

func (g *GatewayScanner) endKey() {
	g.cap = capNone
	if !g.keyBad {
		k := string(g.key)
		if g.depth == 1 {
			g.cap = map[string]int{"op": capOp, "s": capS, "t": capT, "d": capD}[k]
		} else if g.depth == 2 && g.inD {
			g.cap = map[string]int{"session_id": capSID, "resume_gateway_url": capURL, "heartbeat_interval": capHB}[k]
		}
	}
	g.state = scColon
}

func (g *GatewayScanner) endString() {
	if g.isKey {
		g.endKey()
		return
	}
	if max := strMax(g.vcap); max >= 0 {
		if g.bufBad {
			g.setStatus(g.vcap, FieldBad)
		} else {
			g.setStatus(g.vcap, FieldOK)
			v := append([]byte(nil), g.buf...)
			switch g.vcap {
			case capT:
				g.F.T = v
			case capSID:
				g.F.SID = v
			case capURL:
				g.F.URL = v
			}
		}
	}
	g.state = scAfter
}

// markEscape: an escape makes a key match nothing and a capture bad.
func (g *GatewayScanner) markEscape() {
	if g.isKey {
		g.keyBad = true
	} else {
		g.bufBad = true
	}
}

func (g *GatewayScanner) step(c byte) string {
	for {
		switch g.state {
		case scIdle:
			if isWS(c) {
				return ""
			}
			if c != '{' {
				return ScanErrByte
			}
			g.F = ScanFields{}
			g.depth, g.stack, g.inD, g.cap = 0, 0, false, capNone
			return g.push(false)
		case scDone:
			if isWS(c) {
				return ""
			}
			return ScanErrAfter
		case scKey:
			switch {
			case c == '"':
				g.state, g.isKey = scStr, true
				g.key, g.keyBad = g.key[:0], false
			case c == '}' && g.emptyOK:
				g.pop()
			case isWS(c):
			default:
				return ScanErrByte
			}
			return ""
		case scColon:
			switch {
			case c == ':':
				g.state, g.emptyOK = scValue, false
			case isWS(c):
			default:
				return ScanErrByte
			}
			return ""
		case scValue:
			return g.startValue(c)
		case scAfter:
			switch {
			case c == ',':
				g.emptyOK = false
				if g.top() {
					g.state = scValue
				} else {
					g.state = scKey
				}
			case c == '}' && !g.top(), c == ']' && g.top():
				g.pop()
			case isWS(c):
			default:
				return ScanErrByte
			}
			return ""
		case scStr:
			switch {
			case c == '"':
				g.endString()
			case c == '\\':
				g.state = scEsc
				g.markEscape()
			case c < 0x20:
				return ScanErrControl
			case g.isKey:
				if len(g.key) < ScanKeyMax {
					g.key = append(g.key, c)
				} else {
					g.keyBad = true
				}
			default:
				if max := strMax(g.vcap); max >= 0 {
					if len(g.buf) < max {
						g.buf = append(g.buf, c)
					} else {
						g.bufBad = true
					}
				}
			}
			return ""
		case scEsc:
			switch c {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				g.state = scStr
			case 'u':
				g.state, g.hex = scHex, 4
			default:
				return ScanErrEscape
			}
			return ""
		case scHex:
			if !isHex(c) {
				return ScanErrEscape
			}
			g.hex--
			if g.hex == 0 {
				g.state = scStr
			}
			return ""
		case scNum:
			if !isNumByte(c) {
				g.endNumber()
				continue // the byte after the number, in scAfter
			}
			if c < '0' || c > '9' || g.num == 0 && g.numLen == 1 && g.numOK {
				g.numOK = false // a sign, fraction, exponent or leading zero
			}
			g.numLen++
			if g.numOK {
				g.num = g.num*10 + uint64(c-'0')
				if g.num > 0xFFFFFFFF {
					g.numOK = false
				}
			}
			return ""
		case scLit:
			if c != g.lit[g.litPos] {
				return ScanErrLiteral
			}
			g.litPos++
			if g.litPos == len(g.lit) {
				g.endLiteral()
			}
			return ""
		}
		return ScanErrByte
	}
}

// ScanRecordHash is the kernel's digest of a message's fields: FNV-1a 64
// over op status, op (u32 LE), s status, s, t status, t's length (one byte)
// and bytes, d's kind, session_id's status, length and bytes, the same for
// resume_gateway_url, heartbeat_interval's status and value. A value counts
// only when its status is FieldOK (0 or empty otherwise).
func ScanRecordHash(f ScanFields) uint64 {
	h := fnv.New64a()
	u32 := func(st uint8, v uint32) {
		if st != FieldOK {
			v = 0
		}
		var b [5]byte
		b[0] = st
		binary.LittleEndian.PutUint32(b[1:], v)
		h.Write(b[:])
	}
	str := func(st uint8, v []byte) {
		if st != FieldOK {
			v = nil
		}
		h.Write([]byte{st, byte(len(v))})
		h.Write(v)
	}
	u32(f.OpSt, f.Op)
	u32(f.SSt, f.S)
	str(f.TSt, f.T)
	h.Write([]byte{f.DSt})
	str(f.SIDSt, f.SID)
	str(f.URLSt, f.URL)
	u32(f.HBSt, f.HB)
	return h.Sum64()
}

// ScanResult is one message's verdict as the kernel's self-test prints it.
type ScanResult struct {
	OK     bool
	Reason string // the refusal, when not OK
	At     uint64 // OK: the message's length; else the byte refused (the length for End's refusals)
	Rec    uint64 // OK: ScanRecordHash
}

// Line is the kernel's self-test line after "gwscan case N ".
func (r ScanResult) Line() string {
	if r.OK {
		return fmt.Sprintf("ok len=%d rec=%016x", r.At, r.Rec)
	}
	return fmt.Sprintf("error at=%d %s", r.At, r.Reason)
}

// ScanMessage scans msg as one message fed in the given pieces (their
// lengths; what is left over goes in one last piece) and ends it.
func ScanMessage(msg []byte, pieces []int) (ScanResult, ScanFields) {
	var g GatewayScanner
	off := 0
	for _, n := range pieces {
		if n > len(msg)-off {
			n = len(msg) - off
		}
		if g.Feed(msg[off:off+n]) != nil {
			return ScanResult{Reason: g.Err, At: g.ErrAt}, g.F
		}
		off += n
	}
	if g.Feed(msg[off:]) != nil {
		return ScanResult{Reason: g.Err, At: g.ErrAt}, g.F
	}
	n := g.Len
	if g.End() != nil {
		return ScanResult{Reason: g.Err, At: g.ErrAt}, g.F
	}
	return ScanResult{OK: true, At: n, Rec: ScanRecordHash(g.F)}, g.F
}

// GatewayScanModuleTag is the self-test module section of the scanner's
// cases: u32 count, then per case a u32 length and the message (the same
// packing as InflateSection).
const GatewayScanModuleTag = "GWSCAN01"

// GatewayScanSection packs messages for the kernel.
func GatewayScanSection(msgs [][]byte) []byte {
	cs := make([]InflateCase, len(msgs))
	for i, m := range msgs {
		cs[i] = InflateCase{Stream: m}
	}
	return InflateSection(cs)
}

// ParseGatewayScanLines reads the kernel's "gwscan case N LINE" lines, in
// order from 0, and the "gwscan FAIL what" lines.
func ParseGatewayScanLines(serial string) (cases []string, fails []string, err error) {
	for _, line := range strings.Split(serial, "\n") {
		line = strings.TrimRight(line, "\r")
		rest, ok := strings.CutPrefix(line, "gwscan ")
		if !ok {
			continue
		}
		if f, ok := strings.CutPrefix(rest, "FAIL "); ok {
			fails = append(fails, f)
			continue
		}
		rest, ok = strings.CutPrefix(rest, "case ")
		if !ok {
			continue
		}
		num, tail, _ := strings.Cut(rest, " ")
		n, e := strconv.Atoi(num)
		if e != nil || n != len(cases) {
			return nil, nil, fmt.Errorf("gwscan: case line %q out of order", line)
		}
		cases = append(cases, tail)
	}
	return cases, fails, nil
}
