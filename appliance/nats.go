package appliance

import (
	"errors"
	"fmt"
	"strconv"
)

// The Go reference of the kernel's NATS protocol reader (issue 19; the
// kernel side, kernel/lib/nats.inc, is not written yet). A node's one NATS
// connection delivers the server's operations in TCP segments of any size;
// NATSReader takes them in pieces of any size with a fixed state (a
// control-line buffer, a header-block buffer and the first bytes of a body)
// and hands out one operation at a time:
//
//	INFO {json}                      max_payload, headers, tls_required, server_id
//	PING, PONG, +OK
//	-ERR 'reason'                    the reason, at most NATSErrMax bytes kept
//	MSG <subject> <sid> [reply] <#bytes>
//	HMSG <subject> <sid> [reply] <#header bytes> <#total bytes>
//
// An HMSG's header block ("NATS/1.0[ code[ description]]" CRLF, then
// "Name: value" lines, then an empty line) is checked and its status code
// kept (503 is "no responders" to a request). A body that looks like a
// JetStream PubAck ({"stream":..,"seq":N,"duplicate":true} or one with
// "error") is read into Ack.
//
// Rules (what the kernel must mirror, byte for byte):
//   - Verbs are case-insensitive; arguments are separated by runs of spaces
//     or tabs. Every control line ends with CR LF; a LF without CR before it,
//     or a CR not followed by LF, is ErrNATSLineEnd.
//   - A control line longer than NATSLineMax bytes (CR LF excluded) is
//     ErrNATSLineTooLong, refused at the byte that makes it too long.
//   - Numbers are decimal digits only, at most 10 digits and below 2^32
//     (sid, sizes) or 19 digits (max_payload), else ErrNATSNumber.
//   - A subject or reply is 1 to NATSSubjectMax bytes.
//   - Before INFO the payload limit is NATSDefaultMaxPayload (1 MiB); INFO's
//     max_payload replaces it. A MSG/HMSG total over it is ErrNATSPayload.
//   - HMSG's header length must be at least 10 ("NATS/1.0" CR LF CR LF is
//     12, the shortest legal block) and at most the total (ErrNATSHeaderLen),
//     and at most NATSHeaderMax (ErrNATSHeaderTooLong).
//   - The payload is followed by CR LF (ErrNATSPayloadEnd).
//
// A refusal is final: the connection is to be closed. Refusals carry the
// reason and the byte offset in the stream where it was found.

// Bounds of the reader (the kernel's will be the same).
const (
	NATSLineMax           = 4096 // bytes of one control line (the server's max_control_line)
	NATSHeaderMax         = 1024 // bytes of an HMSG header block kept and checked
	NATSBodyKeep          = 4096 // bytes of a body kept (a Gateway command is at most 4096)
	NATSSubjectMax        = 255  // bytes of a subject or reply subject
	NATSErrMax            = 128  // bytes of a -ERR reason kept
	NATSServerIDMax       = 64   // bytes of INFO's server_id kept
	NATSStreamMax         = 64   // bytes of a PubAck's stream name kept
	NATSDefaultMaxPayload = 1 << 20
)

// Refusals.
var (
	ErrNATSLineTooLong   = errors.New("line too long")
	ErrNATSLineEnd       = errors.New("bad line end")
	ErrNATSVerb          = errors.New("unknown verb")
	ErrNATSArgs          = errors.New("bad arguments")
	ErrNATSNumber        = errors.New("bad number")
	ErrNATSSubject       = errors.New("bad subject")
	ErrNATSHeaderLen     = errors.New("header length over total")
	ErrNATSHeaderTooLong = errors.New("header block too long")
	ErrNATSHeader        = errors.New("bad header block")
	ErrNATSPayload       = errors.New("payload over max_payload")
	ErrNATSPayloadEnd    = errors.New("bad payload end")
	ErrNATSInfo          = errors.New("bad INFO")
)

// NATSOpKind names a server operation.
type NATSOpKind byte

// Operations, the values hashed into the record.
const (
	NATSInfo NATSOpKind = 1 + iota
	NATSPing
	NATSPong
	NATSOK
	NATSErr
	NATSMsg
	NATSHMsg
)

// NATSAck is what a PubAck body holds (Found false when the body is not
// one object with a "stream" or an "error" at its top level).
type NATSAck struct {
	Found     bool
	Stream    string // at most NATSStreamMax bytes, no escapes
	Seq       uint64
	Duplicate bool
	Error     bool // the body has an "error" member: not stored
}

// NATSOp is one operation from the server.
type NATSOp struct {
	Kind NATSOpKind
	// INFO
	MaxPayload  uint64
	Headers     bool
	TLSRequired bool // "tls_required":true: the server wants TLS after INFO
	ServerID    string
	// -ERR
	Reason string
	// MSG, HMSG
	Subject, Reply string
	SID            uint32
	HeaderLen      uint32 // HMSG
	Total          uint32 // header + body
	Status         uint32 // HMSG: the status code on the NATS/1.0 line, 0 if none
	HeaderLines    uint32 // HMSG: "Name: value" lines
	Header         []byte // HMSG: the header block as sent
	Body           []byte // the first NATSBodyKeep bytes of the body
	BodyLen        uint32
	Ack            NATSAck
}

// NATSError is a refusal: the reason and the stream offset of the byte.
type NATSError struct {
	Err error
	At  uint64
}

func (e *NATSError) Error() string { return fmt.Sprintf("nats: %v at byte %d", e.Err, e.At) }
func (e *NATSError) Unwrap() error { return e.Err }

const (
	natsStLine    = iota // reading a control line
	natsStLF             // CR seen, LF expected
	natsStPayload        // reading header block and body
	natsStPayCR          // payload read, CR expected
	natsStPayLF          // LF expected
)

// NATSReader is the streaming reader; the zero value is not ready, use
// NewNATSReader.
type NATSReader struct {
	st         int
	pos        uint64 // bytes consumed from the stream
	line       []byte
	maxPayload uint64
	op         NATSOp // the MSG/HMSG being read
	left       uint32 // payload bytes still to read
	hdr        []byte
	body       []byte
	err        *NATSError
}

// NewNATSReader returns a reader at the start of a connection.
func NewNATSReader() *NATSReader {
	return &NATSReader{maxPayload: NATSDefaultMaxPayload, line: make([]byte, 0, NATSLineMax)}
}

// MaxPayload is the payload limit in force (INFO's, or the default).
func (r *NATSReader) MaxPayload() uint64 { return r.maxPayload }

// Feed reads from p until one operation is complete or p is used up. It
// returns the bytes consumed and the operation (nil if p ended first).
// After a refusal every call returns the same *NATSError.
func (r *NATSReader) Feed(p []byte) (int, *NATSOp, error) {
	if r.err != nil {
		return 0, nil, r.err
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch r.st {
		case natsStLine:
			if c == '\r' {
				r.st = natsStLF
				break
			}
			if c == '\n' {
				return i, nil, r.fail(ErrNATSLineEnd)
			}
			if len(r.line) >= NATSLineMax {
				return i, nil, r.fail(ErrNATSLineTooLong)
			}
			r.line = append(r.line, c)
		case natsStLF:
			if c != '\n' {
				return i, nil, r.fail(ErrNATSLineEnd)
			}
			op, err := r.control()
			if err != nil {
				// the offset of the LF that ended the line
				return i, nil, r.fail(err)
			}
			r.pos++
			r.line = r.line[:0]
			if op != nil {
				r.st = natsStLine
				return i + 1, op, nil
			}
			r.st = natsStPayload
			if r.left == 0 {
				r.st = natsStPayCR
			}
			continue
		case natsStPayload:
			if r.op.Kind == NATSHMsg && uint32(len(r.hdr)) < r.op.HeaderLen {
				r.hdr = append(r.hdr, c)
			} else if len(r.body) < NATSBodyKeep {
				r.body = append(r.body, c)
			}
			r.left--
			if r.left == 0 {
				r.st = natsStPayCR
			}
		case natsStPayCR:
			if c != '\r' {
				return i, nil, r.fail(ErrNATSPayloadEnd)
			}
			r.st = natsStPayLF
		case natsStPayLF:
			if c != '\n' {
				return i, nil, r.fail(ErrNATSPayloadEnd)
			}
			op, err := r.finishMsg()
			if err != nil {
				return i, nil, r.fail(err)
			}
			r.pos++
			r.st = natsStLine
			return i + 1, op, nil
		}
		r.pos++
	}
	return len(p), nil, nil
}

func (r *NATSReader) fail(err error) *NATSError {
	r.err = &NATSError{Err: err, At: r.pos}
	return r.err
}

// fields splits a control line on runs of spaces and tabs.
func natsFields(b []byte) [][]byte {
	var out [][]byte
	i := 0
	for i < len(b) {
		for i < len(b) && (b[i] == ' ' || b[i] == '\t') {
			i++
		}
		j := i
		for j < len(b) && b[j] != ' ' && b[j] != '\t' {
			j++
		}
		if j > i {
			out = append(out, b[i:j])
		}
		i = j
	}
	return out
}

func natsUpperEq(b []byte, verb string) bool {
	if len(b) != len(verb) {
		return false
	}
	for i := range b {
		c := b[i]
		if c >= 'a' && c <= 'z' {
			c -= 'a' - 'A'
		}
		if c != verb[i] {
			return false
		}
	}
	return true
}

// natsNumber reads decimal digits, at most maxDigits of them, at most max.
func natsNumber(b []byte, maxDigits int, max uint64) (uint64, bool) {
	if len(b) == 0 || len(b) > maxDigits {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + uint64(c-'0')
	}
	return v, v <= max
}

// control handles a complete control line: an operation without payload,
// or nil with r.op and r.left set for MSG/HMSG.
func (r *NATSReader) control() (*NATSOp, error) {
	line := r.line
	// the verb: up to the first space or tab
	v := 0
	for v < len(line) && line[v] != ' ' && line[v] != '\t' {
		v++
	}
	verb, rest := line[:v], line[v:]
	switch {
	case natsUpperEq(verb, "PING"), natsUpperEq(verb, "PONG"), natsUpperEq(verb, "+OK"):
		if len(natsFields(rest)) != 0 {
			return nil, ErrNATSArgs
		}
		k := NATSPing
		if natsUpperEq(verb, "PONG") {
			k = NATSPong
		} else if natsUpperEq(verb, "+OK") {
			k = NATSOK
		}
		return &NATSOp{Kind: k}, nil
	case natsUpperEq(verb, "-ERR"):
		return &NATSOp{Kind: NATSErr, Reason: natsErrReason(rest)}, nil
	case natsUpperEq(verb, "INFO"):
		return r.info(rest)
	case natsUpperEq(verb, "MSG"), natsUpperEq(verb, "HMSG"):
		return nil, r.msgLine(natsUpperEq(verb, "HMSG"), natsFields(rest))
	}
	return nil, ErrNATSVerb
}

// natsErrReason: the text after -ERR, blanks trimmed, one pair of single
// quotes around it taken off, at most NATSErrMax bytes kept.
func natsErrReason(b []byte) string {
	i, j := 0, len(b)
	for i < j && (b[i] == ' ' || b[i] == '\t') {
		i++
	}
	for j > i && (b[j-1] == ' ' || b[j-1] == '\t') {
		j--
	}
	if j-i >= 2 && b[i] == '\'' && b[j-1] == '\'' {
		i++
		j--
	}
	if j-i > NATSErrMax {
		j = i + NATSErrMax
	}
	return string(b[i:j])
}

func (r *NATSReader) msgLine(hmsg bool, f [][]byte) error {
	n := 3 // subject sid #bytes
	if hmsg {
		n = 4
	}
	if len(f) != n && len(f) != n+1 {
		return ErrNATSArgs
	}
	op := NATSOp{Kind: NATSMsg}
	if hmsg {
		op.Kind = NATSHMsg
	}
	if len(f[0]) > NATSSubjectMax {
		return ErrNATSSubject
	}
	op.Subject = string(f[0])
	sid, ok := natsNumber(f[1], 10, 1<<32-1)
	if !ok {
		return ErrNATSNumber
	}
	op.SID = uint32(sid)
	k := 2
	if len(f) == n+1 {
		if len(f[2]) > NATSSubjectMax {
			return ErrNATSSubject
		}
		op.Reply = string(f[2])
		k = 3
	}
	total, ok := natsNumber(f[len(f)-1], 10, 1<<32-1)
	if !ok {
		return ErrNATSNumber
	}
	if hmsg {
		h, ok := natsNumber(f[k], 10, 1<<32-1)
		if !ok {
			return ErrNATSNumber
		}
		if h < 10 || h > total {
			return ErrNATSHeaderLen
		}
		if h > NATSHeaderMax {
			return ErrNATSHeaderTooLong
		}
		op.HeaderLen = uint32(h)
	}
	if total > r.maxPayload {
		return ErrNATSPayload
	}
	op.Total = uint32(total)
	op.BodyLen = op.Total - op.HeaderLen
	r.op = op
	r.left = op.Total
	r.hdr = r.hdr[:0]
	r.body = r.body[:0]
	return nil
}

func (r *NATSReader) finishMsg() (*NATSOp, error) {
	op := r.op
	if op.Kind == NATSHMsg {
		st, lines, ok := natsHeaderBlock(r.hdr)
		if !ok {
			return nil, ErrNATSHeader
		}
		op.Status, op.HeaderLines = st, lines
		op.Header = append([]byte(nil), r.hdr...)
	}
	op.Body = append([]byte(nil), r.body...)
	op.Ack = natsPubAck(r.body)
	return &op, nil
}

// natsHeaderBlock checks a header block: "NATS/1.0", optionally a space,
// a 3-digit status and an optional " description", CR LF; then lines
// "Name:value" (Name 1+ bytes of 0x21-0x7e without ':', the value any
// bytes but CR and LF) each ending CR LF; then CR LF, the block's end.
func natsHeaderBlock(h []byte) (status, lines uint32, ok bool) {
	const ver = "NATS/1.0"
	if len(h) < len(ver)+4 || string(h[:len(ver)]) != ver {
		return 0, 0, false
	}
	if string(h[len(h)-4:]) != "\r\n\r\n" {
		return 0, 0, false
	}
	i := len(ver)
	// the status line's rest, up to CR LF
	e := i
	for h[e] != '\r' {
		if h[e] == '\n' {
			return 0, 0, false
		}
		e++
	}
	if h[e+1] != '\n' {
		return 0, 0, false
	}
	if e > i {
		s := h[i:e]
		if s[0] != ' ' || len(s) < 4 {
			return 0, 0, false
		}
		for _, c := range s[1:4] {
			if c < '0' || c > '9' {
				return 0, 0, false
			}
		}
		if len(s) > 4 && s[4] != ' ' {
			return 0, 0, false
		}
		status = uint32(s[1]-'0')*100 + uint32(s[2]-'0')*10 + uint32(s[3]-'0')
	}
	i = e + 2
	for {
		if h[i] == '\r' {
			// the empty line: must be the block's end
			return status, lines, h[i+1] == '\n' && i+2 == len(h)
		}
		n := i
		for h[n] != ':' {
			c := h[n]
			if c < 0x21 || c > 0x7e {
				return 0, 0, false
			}
			n++
		}
		if n == i {
			return 0, 0, false
		}
		e := n + 1
		for h[e] != '\r' {
			if h[e] == '\n' {
				return 0, 0, false
			}
			e++
		}
		if h[e+1] != '\n' {
			return 0, 0, false
		}
		lines++
		i = e + 2
	}
}

// natsTopMember walks a JSON object's top-level members with the reader's
// loose rule: the text must start with '{' (after blanks), strings end at
// an unescaped '"', braces and brackets outside strings must balance, and
// only blanks may follow the closing '}'. For every top-level member it
// calls fn with the key (raw, between its quotes) and the value's text
// (blanks trimmed) up to the next top-level ',' or the closing '}'. It
// returns false when the text is not such an object.
func natsTopMembers(b []byte, fn func(key, val []byte)) bool {
	i := 0
	blank := func(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }
	for i < len(b) && blank(b[i]) {
		i++
	}
	if i == len(b) || b[i] != '{' {
		return false
	}
	i++
	depth := 1
	inStr, esc := false, false
	keyStart, keyEnd, valStart := -1, -1, -1 // of the current top-level member
	strStart := -1
	emit := func(end int) {
		if keyEnd >= 0 && valStart >= 0 {
			s, e := valStart, end
			for s < e && blank(b[s]) {
				s++
			}
			for e > s && blank(b[e-1]) {
				e--
			}
			fn(b[keyStart:keyEnd], b[s:e])
		}
		keyStart, keyEnd, valStart = -1, -1, -1
	}
	for ; i < len(b); i++ {
		c := b[i]
		if inStr {
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inStr = false
				if depth == 1 && valStart < 0 && keyEnd < 0 {
					keyStart, keyEnd = strStart, i
				}
			}
			continue
		}
		switch c {
		case '"':
			inStr = true
			strStart = i + 1
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				if c != '}' {
					return false
				}
				emit(i)
				for i++; i < len(b); i++ {
					if !blank(b[i]) {
						return false
					}
				}
				return true
			}
			if depth < 0 {
				return false
			}
		case ':':
			if depth == 1 && keyEnd >= 0 && valStart < 0 {
				valStart = i + 1
			}
		case ',':
			if depth == 1 {
				emit(i)
			}
		}
	}
	return false
}

// natsString: a value "text" without backslashes, at most max bytes.
func natsString(v []byte, max int) (string, bool) {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' || len(v)-2 > max {
		return "", false
	}
	for _, c := range v[1 : len(v)-1] {
		if c == '\\' || c == '"' {
			return "", false
		}
	}
	return string(v[1 : len(v)-1]), true
}

func (r *NATSReader) info(rest []byte) (*NATSOp, error) {
	op := &NATSOp{Kind: NATSInfo, MaxPayload: NATSDefaultMaxPayload}
	ok := natsTopMembers(rest, func(k, v []byte) {
		switch string(k) {
		case "max_payload":
			if n, ok := natsNumber(v, 19, 1<<63-1); ok && n > 0 {
				op.MaxPayload = n
			}
		case "headers":
			op.Headers = string(v) == "true"
		case "tls_required":
			op.TLSRequired = string(v) == "true"
		case "server_id":
			if s, ok := natsString(v, NATSServerIDMax); ok {
				op.ServerID = s
			}
		}
	})
	if !ok {
		return nil, ErrNATSInfo
	}
	r.maxPayload = op.MaxPayload
	return op, nil
}

// natsPubAck reads a JetStream PubAck from a body kept whole (a body
// longer than NATSBodyKeep is not one).
func natsPubAck(body []byte) NATSAck {
	var a NATSAck
	if len(body) == 0 || len(body) >= NATSBodyKeep {
		return a
	}
	hasStream := false
	if !natsTopMembers(body, func(k, v []byte) {
		switch string(k) {
		case "stream":
			if s, ok := natsString(v, NATSStreamMax); ok {
				a.Stream, hasStream = s, true
			}
		case "seq":
			if n, ok := natsNumber(v, 19, 1<<63-1); ok {
				a.Seq = n
			}
		case "duplicate":
			a.Duplicate = string(v) == "true"
		case "error":
			a.Error = true
		}
	}) {
		return NATSAck{}
	}
	if !hasStream && !a.Error {
		return NATSAck{}
	}
	a.Found = true
	return a
}

// ReadNATS runs a whole stream through a reader in pieces of the given
// sizes (cycled; nil: one piece) and returns the operations in order and
// the refusal, if any.
func ReadNATS(stream []byte, pieces []int) ([]*NATSOp, error) {
	r := NewNATSReader()
	var ops []*NATSOp
	k := 0
	for len(stream) > 0 {
		p := stream
		if len(pieces) > 0 {
			n := pieces[k%len(pieces)]
			k++
			if n < len(p) {
				p = p[:n]
			}
		}
		for len(p) > 0 {
			n, op, err := r.Feed(p)
			if err != nil {
				return ops, err
			}
			if op != nil {
				ops = append(ops, op)
			}
			p = p[n:]
			stream = stream[n:]
		}
	}
	return ops, nil
}

// NATSRecordHash is FNV-1a 64 over the operations' fields, in the order
// the kernel's self-test hashes them.
func NATSRecordHash(ops []*NATSOp) uint64 {
	h := uint64(fnvOffset64)
	b := func(c byte) { h ^= uint64(c); h *= fnvPrime64 }
	u32 := func(v uint32) { b(byte(v)); b(byte(v >> 8)); b(byte(v >> 16)); b(byte(v >> 24)) }
	u64 := func(v uint64) { u32(uint32(v)); u32(uint32(v >> 32)) }
	str := func(s []byte) {
		u32(uint32(len(s)))
		for _, c := range s {
			b(c)
		}
	}
	for _, op := range ops {
		b(byte(op.Kind))
		switch op.Kind {
		case NATSInfo:
			u64(op.MaxPayload)
			if op.Headers {
				b(1)
			} else {
				b(0)
			}
			if op.TLSRequired {
				b(1)
			} else {
				b(0)
			}
			str([]byte(op.ServerID))
		case NATSErr:
			str([]byte(op.Reason))
		case NATSMsg, NATSHMsg:
			str([]byte(op.Subject))
			str([]byte(op.Reply))
			u32(op.SID)
			u32(op.HeaderLen)
			u32(op.Total)
			u32(op.Status)
			u32(op.HeaderLines)
			str(op.Body)
			var f byte
			if op.Ack.Found {
				f |= 1
			}
			if op.Ack.Duplicate {
				f |= 2
			}
			if op.Ack.Error {
				f |= 4
			}
			b(f)
			str([]byte(op.Ack.Stream))
			u64(op.Ack.Seq)
		}
	}
	return h
}

const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

// NATSLine is the self-test's verdict line for one stream (after "nats
// case N "): "ok ops=K rec=H" or "error at=B after=K REASON".
func NATSLine(stream []byte) string {
	ops, err := ReadNATS(stream, nil)
	return natsLineOf(ops, err)
}

func natsLineOf(ops []*NATSOp, err error) string {
	if err != nil {
		var ne *NATSError
		errors.As(err, &ne)
		return fmt.Sprintf("error at=%d after=%d %v", ne.At, len(ops), ne.Err)
	}
	return "ok ops=" + strconv.Itoa(len(ops)) + fmt.Sprintf(" rec=%016x", NATSRecordHash(ops))
}

// Client-side writers: what the kernel's client will send. Every text
// that goes into a control line or CONNECT's JSON must be printable ASCII
// (0x21-0x7e) without '"' or '\' (no escaping is ever needed); a subject
// or reply also at most NATSSubjectMax bytes. A refusal names the field.

// ErrNATSField is a writer's refusal; errors.Is matches it.
var ErrNATSField = errors.New("nats: bad field")

// NATSFieldError is a writer's refusal: the field and why.
type NATSFieldError struct {
	Field, Reason string
}

func (e *NATSFieldError) Error() string {
	return fmt.Sprintf("%v %s: %s", ErrNATSField, e.Field, e.Reason)
}
func (e *NATSFieldError) Unwrap() error { return ErrNATSField }

func natsPrintable(name, s string, max int) error {
	if len(s) == 0 || len(s) > max {
		return &NATSFieldError{name, fmt.Sprintf("length %d, want 1..%d", len(s), max)}
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x21 || c > 0x7e || c == '"' || c == '\\' {
			return &NATSFieldError{name, fmt.Sprintf("byte %d is 0x%02x", i, c)}
		}
	}
	return nil
}

// NATSConnect is the CONNECT line for user and pass (both may be empty:
// no credentials), naming the client name: verbose and pedantic off,
// headers and no_responders on, protocol 1.
func NATSConnect(user, pass, name string) ([]byte, error) {
	if err := natsPrintable("name", name, 64); err != nil {
		return nil, err
	}
	b := []byte(`CONNECT {"verbose":false,"pedantic":false,"lang":"dpxe-kernel","version":"1","protocol":1,"headers":true,"no_responders":true,"name":"`)
	b = append(b, name...)
	b = append(b, '"')
	if user != "" || pass != "" {
		if err := natsPrintable("user", user, 128); err != nil {
			return nil, err
		}
		if err := natsPrintable("pass", pass, 128); err != nil {
			return nil, err
		}
		b = append(b, `,"user":"`...)
		b = append(b, user...)
		b = append(b, `","pass":"`...)
		b = append(b, pass...)
		b = append(b, '"')
	}
	return append(b, "}\r\n"...), nil
}

// NATSSub is "SUB subject sid".
func NATSSub(subject string, sid uint32) ([]byte, error) {
	if err := natsPrintable("subject", subject, NATSSubjectMax); err != nil {
		return nil, err
	}
	return fmt.Appendf(nil, "SUB %s %d\r\n", subject, sid), nil
}

// NATSPongLine and NATSPingLine are the keep-alive lines.
const (
	NATSPongLine = "PONG\r\n"
	NATSPingLine = "PING\r\n"
)

// NATSHPub is "HPUB subject reply #hdr #total" with a header block holding
// only Nats-Msg-Id: msgID (empty: a plain PUB, no headers), then the body.
func NATSHPub(subject, reply, msgID string, body []byte) ([]byte, error) {
	if err := natsPrintable("subject", subject, NATSSubjectMax); err != nil {
		return nil, err
	}
	if reply != "" {
		if err := natsPrintable("reply", reply, NATSSubjectMax); err != nil {
			return nil, err
		}
	}
	var b []byte
	if msgID == "" {
		b = append(b, "PUB "...)
		b = append(b, subject...)
		if reply != "" {
			b = append(b, ' ')
			b = append(b, reply...)
		}
		b = fmt.Appendf(b, " %d\r\n", len(body))
	} else {
		if err := natsPrintable("msg_id", msgID, 200); err != nil {
			return nil, err
		}
		hdr := "NATS/1.0\r\nNats-Msg-Id: " + msgID + "\r\n\r\n"
		b = append(b, "HPUB "...)
		b = append(b, subject...)
		if reply != "" {
			b = append(b, ' ')
			b = append(b, reply...)
		}
		b = fmt.Appendf(b, " %d %d\r\n", len(hdr), len(hdr)+len(body))
		b = append(b, hdr...)
	}
	b = append(b, body...)
	return append(b, "\r\n"...), nil
}
