package appliance

import (
	"bytes"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
)

// Go references for the kernel's lib/ primitives (kernel/lib/sha1.inc,
// base64.inc, ws.inc): what the WebSocket client of a shard computes, and
// the self-test digests of kernel/selftest/lib_selftest.inc. SHA-1 and
// base64 come from the standard library, so the kernel is compared with an
// independent implementation.

// LibSelfTestCases is how many pseudo-random cases the kernel's lib/
// self-test runs per digest.
const LibSelfTestCases = 2048

// LibDigestNames names the lib/ digests in the order the kernel prints them.
var LibDigestNames = []string{"sha1", "base64", "wskey", "wsframe", "wsparse", "wsmsg", "wsclose", "wsupgrade"}

// fillRandom fills b with splitmix64 words, little-endian, as the kernel's
// lib_st_fill: one next() per started 8 bytes.
func fillRandom(rng *splitmix64, b []byte) {
	var w [8]byte
	for i := 0; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(w[:], rng.next())
		copy(b[i:], w[:])
	}
}

// digestBytes folds a byte string as the kernel's lib_st_digest_bytes: its
// length, then every 8 bytes as a little-endian word, the last zero-padded.
func digestBytes(d *digest, b []byte) {
	d.add(uint64(len(b)))
	for i := 0; i < len(b); i += 8 {
		var w [8]byte
		copy(w[:], b[i:])
		d.add(binary.LittleEndian.Uint64(w[:]))
	}
}

// LibDigests computes, for a seed, every "selftest digest" line of the
// kernel's lib/ self-test. Each digest restarts the splitmix64 stream from
// the seed.
//
//   - sha1: r = next(); n = (r >> 32) % 2100 when r & 3 == 0, else % 200;
//     n random bytes; the 20-byte SHA-1 is folded.
//   - base64: n = (next() >> 32) % 100 random bytes; the encoding is folded.
//   - wskey: the WebSocket random stream seeded with seed; per case
//     MakeKey, then WSAcceptForKey of it; both folded.
//   - wsframe: BuildWSFrame of random lengths (around every length-form
//     boundary), header bytes (reserved opcodes, RSV and high bits
//     included), masks (given or from the stream seeded with seed) and
//     room (sometimes too small); see wsFrameCase.
//   - wsparse: ParseWSFrame of random and nearly valid byte strings with
//     random maxima; see wsParseCase.
//   - wsmsg: sequences of data and control frames appended to a WSMessage
//     of random capacity; see wsMsgCase.
//   - wsclose: WSCloseCode of 0-3 byte payloads and WSClosePayload of
//     random codes and reasons; see wsCloseCase.
//   - wsupgrade: WSHeadLength and WSCheckUpgrade of two good responses
//     with up to three random mutations; see wsUpgradeCase.
func LibDigests(seed uint32) map[string]uint64 {
	out := map[string]uint64{}
	run := func(name string, one func(rng *splitmix64, d *digest)) {
		rng := &splitmix64{state: uint64(seed)}
		d := newDigest()
		for i := 0; i < LibSelfTestCases; i++ {
			one(rng, &d)
		}
		out[name] = uint64(d)
	}
	run("sha1", func(rng *splitmix64, d *digest) {
		r := rng.next()
		lim := uint64(200)
		if r&3 == 0 {
			lim = 2100
		}
		b := make([]byte, (r>>32)%lim)
		fillRandom(rng, b)
		h := sha1.Sum(b)
		digestBytes(d, h[:])
	})
	run("base64", func(rng *splitmix64, d *digest) {
		b := make([]byte, (rng.next()>>32)%100)
		fillRandom(rng, b)
		digestBytes(d, []byte(base64.StdEncoding.EncodeToString(b)))
	})
	rnd := NewWSRandom(uint64(seed))
	run("wskey", func(_ *splitmix64, d *digest) {
		key := rnd.MakeKey()
		digestBytes(d, []byte(key))
		digestBytes(d, []byte(WSAcceptForKey(key)))
	})
	rnd = NewWSRandom(uint64(seed))
	frame := make([]byte, 65536+64)
	run("wsframe", func(rng *splitmix64, d *digest) { wsFrameCase(rng, rnd, d, frame, nil) })
	run("wsparse", func(rng *splitmix64, d *digest) { wsParseCase(rng, d, nil) })
	run("wsmsg", func(rng *splitmix64, d *digest) { wsMsgCase(rng, d, nil) })
	run("wsclose", func(rng *splitmix64, d *digest) { wsCloseCase(rng, d, nil) })
	run("wsupgrade", func(rng *splitmix64, d *digest) { wsUpgradeCase(rng, d, nil) })
	return out
}

// outcome names a case's result for the tests that check every generator
// reaches every outcome: "ok" or the error's text.
func outcome(note func(string), err error) {
	if note == nil {
		return
	}
	if err == nil {
		note("ok")
		return
	}
	note(err.Error())
}

// foldResult folds a kernel result: 0 then value on success (CF clear), 1
// then the code on failure (CF set).
func foldResult(d *digest, value uint64, err error) {
	var code uint64
	switch e := err.(type) {
	case nil:
		d.add(0)
		d.add(value)
		return
	case WSBuildError:
		code = uint64(e)
	case WSCloseError:
		code = uint64(e)
	case WSUpgradeError:
		code = uint64(e)
	default:
		panic(err)
	}
	d.add(1)
	d.add(code)
}

// wsFrameOps are the opcodes "wsframe" headers draw from: mostly defined.
var wsFrameOps = [16]byte{0, 1, 2, 8, 9, 10, 1, 2, 0, 1, 2, 9, 10, 3, 11, 15}

// wsFrameCase is one "wsframe" case. r1 = next(), r2 = next(); the payload
// length n by sel = r1 & 7: 0-3 (r1>>8) % 126, 4 120 + (r1>>8) % 12, 5
// 65530 + (r1>>8) % 12, 6 (r1>>8) % 1000, 7 (r1>>8) % 300; room =
// WSFrameHeaderLen(n) + n + 12 - ((r1>>40) & 15); header = (r2 & 0x80) |
// wsFrameOps[r2 & 15], with RSV1 when (r2>>8) & 7 == 0 and bit 8 when
// (r2>>8) & 63 == 1; mask from
// the stream when (r2>>11) & 1, else r2 >> 32; then n payload bytes.
// Folded: the result and, when built, the frame. note, when not nil, hears
// each case's outcome (so do the other case functions').
func wsFrameCase(rng *splitmix64, rnd *WSRandom, d *digest, frame []byte, note func(string)) {
	r1, r2 := rng.next(), rng.next()
	v := r1 >> 8
	var n uint64
	switch r1 & 7 {
	case 0, 1, 2, 3:
		n = v % 126
	case 4:
		n = 120 + v%12
	case 5:
		n = 65530 + v%12
	case 6:
		n = v % 1000
	case 7:
		n = v % 300
	}
	room := uint64(WSFrameHeaderLen(n)) + n + 12 - (r1>>40)&15
	header := r2&0x80 | uint64(wsFrameOps[r2&15])
	if (r2>>8)&7 == 0 {
		header |= 0x40
	}
	if (r2>>8)&63 == 1 {
		header |= 0x100
	}
	mask := r2 >> 32
	if (r2>>11)&1 == 1 {
		mask = WSMaskRandom
	}
	payload := make([]byte, n)
	fillRandom(rng, payload)
	k, err := BuildWSFrame(frame[:room], header, payload, mask, rnd)
	outcome(note, err)
	foldResult(d, uint64(k), err)
	if err == nil {
		digestBytes(d, frame[:k])
	}
}

// wsParseOps are the opcodes nearly valid "wsparse" headers draw from.
var wsParseOps = [8]byte{0, 1, 2, 8, 9, 10, 1, 3}

// wsParseCase is one "wsparse" case. r1 = next(), r2 = next(); n = (r1>>32)
// % 160 random bytes; mode = r1 & 3: 0 leaves them, 1-3 make byte 0
// (b0 & 0x80) | wsParseOps[(r1>>2) & 7] and byte 1 the length code
// (r1>>5) % 128 (mode 3: 126 + ((r1>>5) & 1)), unmasked; modes 2-3 write
// an extended length of (r1>>16) % 200 (a 64-bit one gets its top bit when
// (r1>>12) & 7 == 0) where it fits. max = ^0 when r2 & 3 == 0, else
// (r2>>8) % 200. Folded: the result (WS_FRAME_OK 0 / MORE 1, or the close
// code) and, unless it is a close code, the five WSFrame fields.
func wsParseCase(rng *splitmix64, d *digest, note func(string)) {
	r1, r2 := rng.next(), rng.next()
	b := make([]byte, (r1>>32)%160)
	fillRandom(rng, b)
	mode := r1 & 3
	if mode != 0 && len(b) >= 1 {
		b[0] = b[0]&0x80 | wsParseOps[(r1>>2)&7]
	}
	code := byte((r1 >> 5) % 128)
	if mode == 3 {
		code = 126 + byte((r1>>5)&1)
	}
	if mode != 0 && len(b) >= 2 {
		b[1] = code
	}
	ext := (r1 >> 16) % 200
	if mode >= 2 && code == 126 && len(b) >= 4 {
		binary.BigEndian.PutUint16(b[2:], uint16(ext))
	}
	if mode >= 2 && code == 127 && len(b) >= 10 {
		if (r1>>12)&7 == 0 {
			ext |= 1 << 63
		}
		binary.BigEndian.PutUint64(b[2:], ext)
	}
	max := (r2 >> 8) % 200
	if r2&3 == 0 {
		max = ^uint64(0)
	}
	f, err := ParseWSFrame(b, max)
	outcome(note, err)
	result := uint64(0)
	switch err {
	case nil:
	case ErrWSNeedMore:
		result = 1
	default:
		foldResult(d, 0, err)
		return
	}
	foldResult(d, result, nil)
	d.add(uint64(f.Opcode))
	d.add(uint64(f.Fin))
	d.add(uint64(f.HeaderLen))
	d.add(f.PayloadLen)
	d.add(f.Total)
}

// wsMsgOps are the opcodes of "wsmsg" frames (control ones included, which
// Append refuses with 1011).
var wsMsgOps = [8]byte{0, 0, 1, 2, 0, 8, 1, 0}

// wsMsgCase is one "wsmsg" case. r = next(); a WSMessage of capacity
// (r>>8) % 120; 1 + (r & 7) frames, each from f = next(): opcode
// wsMsgOps[f & 7], FIN when (f>>3) & 3 != 0, (f>>8) % 40 random payload
// bytes, header length 0. After each Append: the result, Len, Opcode,
// State, and the message when it is done.
func wsMsgCase(rng *splitmix64, d *digest, note func(string)) {
	r := rng.next()
	m := WSMessage{Buf: make([]byte, (r>>8)%120)}
	for i := uint64(0); i < 1+r&7; i++ {
		fr := rng.next()
		payload := make([]byte, (fr>>8)%40)
		fillRandom(rng, payload)
		f := WSFrame{Opcode: uint32(wsMsgOps[fr&7]), PayloadLen: uint64(len(payload)), Total: uint64(len(payload))}
		if (fr>>3)&3 != 0 {
			f.Fin = 1
		}
		st, err := m.Append(payload, f)
		if err == nil && st == WSMsgDone {
			outcome(note, errors.New("done"))
		} else {
			outcome(note, err)
		}
		foldResult(d, uint64(st), err)
		d.add(uint64(m.Len))
		d.add(uint64(m.Opcode))
		d.add(uint64(m.State))
		if err == nil && st == WSMsgDone {
			digestBytes(d, m.Buf[:m.Len])
		}
	}
}

// wsCloseCase is one "wsclose" case. r = next(); the code by
// (r>>2) & 3: 0 (r>>16) & 0xFFFF, 1 995 + (r>>16) % 25, 2 2995 +
// (r>>16) % 2010, 3 990 + (r>>16) % 30; WSCloseCode of the code
// big-endian plus one byte 0x41, cut to r & 3 bytes; then WSClosePayload
// of the code and (r>>40) % 130 random reason bytes. Folded: both results
// and the payload built.
func wsCloseCase(rng *splitmix64, d *digest, note func(string)) {
	r := rng.next()
	v := r >> 16
	var code uint32
	switch (r >> 2) & 3 {
	case 0:
		code = uint32(v & 0xFFFF)
	case 1:
		code = uint32(995 + v%25)
	case 2:
		code = uint32(2995 + v%2010)
	case 3:
		code = uint32(990 + v%30)
	}
	in := []byte{byte(code >> 8), byte(code), 0x41}
	got, err := WSCloseCode(in[:r&3])
	outcome(note, err)
	foldResult(d, uint64(got), err)
	reason := make([]byte, (r>>40)%130)
	fillRandom(rng, reason)
	p, err := WSClosePayload(code, reason)
	outcome(note, err)
	foldResult(d, uint64(len(p)), err)
	if err == nil {
		digestBytes(d, p)
	}
}

// WSUpgradeKey is the RFC 6455 §1.3 example key the "wsupgrade" digest
// and the known answers use.
const WSUpgradeKey = "dGhlIHNhbXBsZSBub25jZQ=="

// wsUpgradeTemplates are the responses "wsupgrade" mutates: two good ones
// and one with an extension and a subprotocol we did not offer.
var wsUpgradeTemplates = [3]string{
	"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: keep-alive, Upgrade\r\n" +
		"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\nSec-WebSocket-Extensions: \r\nX-Trace: a:b\r\n\r\n",
	"HTTP/1.1 101\r\nconnection: UPGRADE\r\nupgrade: WebSocket\r\nsec-websocket-accept:s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\t\r\n\r\n",
	"HTTP/1.1 101 OK\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n" +
		"Sec-WebSocket-Extensions: x\r\nSec-WebSocket-Protocol: chat\r\n\r\n",
}

// wsUpgradeTemplateOf picks a template by (r >> 2) & 3.
var wsUpgradeTemplateOf = [4]int{0, 1, 0, 2}

// wsUpgradeBytes are the bytes "wsupgrade" mutations write.
const wsUpgradeBytes = "\r\n:, \tXw1=\x00"

// wsUpgradeCase is one "wsupgrade" case. r = next(); template
// wsUpgradeTemplateOf[(r>>2) & 3];
// r & 3 mutations, each from m = next() at position (m>>8) % length: kinds
// m & 3 = 0, 1 flip the ASCII case of a letter, 2 write
// wsUpgradeBytes[(m>>32) % 11], 3 write a space. Folded: WSHeadLength,
// then the WSCheckUpgrade result over the whole template length.
func wsUpgradeCase(rng *splitmix64, d *digest, note func(string)) {
	r := rng.next()
	b := []byte(wsUpgradeTemplates[wsUpgradeTemplateOf[(r>>2)&3]])
	for i := uint64(0); i < r&3; i++ {
		m := rng.next()
		p := (m >> 8) % uint64(len(b))
		switch m & 3 {
		case 0, 1:
			if c := b[p] | 0x20; 'a' <= c && c <= 'z' {
				b[p] ^= 0x20
			}
		case 2:
			b[p] = wsUpgradeBytes[(m>>32)%uint64(len(wsUpgradeBytes))]
		case 3:
			b[p] = ' '
		}
	}
	d.add(uint64(WSHeadLength(b)))
	err := WSCheckUpgrade(b, WSUpgradeKey)
	outcome(note, err)
	foldResult(d, 0, err)
}

// --- WebSocket (RFC 6455), as kernel/lib/ws.inc ---------------------------

// WebSocket frame bits and opcodes (RFC 6455 §5.2).
const (
	WSFin        = 0x80 // byte 0: final fragment
	WSRSVBits    = 0x70 // byte 0: RSV1-3
	WSOpcodeBits = 0x0F
	WSMaskBit    = 0x80 // byte 1: payload masked

	WSOpCont   = 0x0
	WSOpText   = 0x1
	WSOpBinary = 0x2
	WSOpClose  = 0x8
	WSOpPing   = 0x9
	WSOpPong   = 0xA

	WSControlMax = 125 // largest control-frame payload (§5.5)
	WSMaxHeader  = 14  // 2 + 8-byte length + 4-byte mask
	WSKeyLen     = 24  // base64 of the 16-byte nonce (§4.1)
	WSAcceptLen  = 28  // base64 of a SHA-1

	// WSMaskRandom as the mask of BuildWSFrame takes one from the random stream.
	WSMaskRandom = ^uint64(0)
)

// WebSocket close codes (§7.4.1 and the IANA registry).
const (
	WSCloseNormal      = 1000
	WSCloseGoingAway   = 1001
	WSCloseProtocol    = 1002
	WSCloseUnsupported = 1003
	WSCloseNoStatus    = 1005 // never sent
	WSCloseAbnormal    = 1006 // never sent
	WSCloseInvalidData = 1007
	WSCloseTooBig      = 1009
	WSCloseInternal    = 1011
)

// WSGUID is the string RFC 6455 §1.3 appends to the key before hashing.
const WSGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

// WSAcceptForKey is the Sec-WebSocket-Accept a server must send for key
// (§4.2.2): base64(SHA-1(key + WSGUID)).
func WSAcceptForKey(key string) string {
	h := sha1.Sum([]byte(key + WSGUID))
	return base64.StdEncoding.EncodeToString(h[:])
}

// WSRandom is the kernel's ws_random stream: splitmix64 from a seed (the
// kernel seeds it from the TSC, the self-test from seed=).
type WSRandom struct{ rng splitmix64 }

// NewWSRandom starts the stream as ws_random_seed does.
func NewWSRandom(seed uint64) *WSRandom { return &WSRandom{splitmix64{seed}} }

// Next is ws_random.
func (r *WSRandom) Next() uint64 { return r.rng.next() }

// MakeKey is ws_make_key: two values, little-endian, base64.
func (r *WSRandom) MakeKey() string {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:], r.Next())
	binary.LittleEndian.PutUint64(b[8:], r.Next())
	return base64.StdEncoding.EncodeToString(b[:])
}

// WSBuildError is why BuildWSFrame or WSClosePayload refused (the kernel's
// RAX with CF set).
type WSBuildError int

// Refusals of BuildWSFrame and WSClosePayload.
const (
	WSBuildSpace   WSBuildError = 1 // the destination is too small
	WSBuildOpcode  WSBuildError = 2 // reserved opcode, RSV bits or bits above byte 0
	WSBuildControl WSBuildError = 3 // control frame over 125 bytes or not FIN
	WSBuildCode    WSBuildError = 4 // a close code that may not be sent
)

func (e WSBuildError) Error() string {
	switch e {
	case WSBuildSpace:
		return "websocket: frame does not fit"
	case WSBuildOpcode:
		return "websocket: reserved opcode or bits"
	case WSBuildControl:
		return "websocket: control frame over 125 bytes or fragmented"
	case WSBuildCode:
		return "websocket: close code may not be sent"
	}
	return fmt.Sprintf("websocket: build error %d", int(e))
}

// WSCloseError is a received frame or message that breaks RFC 6455; its
// value is the close code to send.
type WSCloseError uint32

func (e WSCloseError) Error() string { return fmt.Sprintf("websocket: close with %d", uint32(e)) }

// ErrWSNeedMore means the buffer does not hold the whole frame yet.
var ErrWSNeedMore = errors.New("websocket: need more bytes")

// wsOpcodeDefined reports whether an opcode is one of 0, 1, 2, 8, 9, 10.
func wsOpcodeDefined(op byte) bool {
	switch op {
	case WSOpCont, WSOpText, WSOpBinary, WSOpClose, WSOpPing, WSOpPong:
		return true
	}
	return false
}

// WSFrameHeaderLen is ws_frame_header_len: a masked client frame's header.
func WSFrameHeaderLen(n uint64) int {
	switch {
	case n <= 125:
		return 6
	case n <= 65535:
		return 8
	}
	return 14
}

// BuildWSFrame is ws_build_frame: it writes one masked client frame into
// dst (len(dst) is the room) and returns its length. header is byte 0
// (WSFin | opcode); mask holds the key in its low 32 bits, first byte sent
// lowest, or is WSMaskRandom to draw the low 32 bits of rnd.Next().
// Checks, in order: header bits and opcode, control frames, room.
func BuildWSFrame(dst []byte, header uint64, payload []byte, mask uint64, rnd *WSRandom) (int, error) {
	op := byte(header & WSOpcodeBits)
	if header&^uint64(WSFin|WSOpcodeBits) != 0 || !wsOpcodeDefined(op) {
		return 0, WSBuildOpcode
	}
	n := uint64(len(payload))
	if op&0x8 != 0 && (header&WSFin == 0 || n > WSControlMax) {
		return 0, WSBuildControl
	}
	hl := WSFrameHeaderLen(n)
	if n > uint64(len(dst)) || uint64(len(dst))-n < uint64(hl) {
		return 0, WSBuildSpace
	}
	if mask == WSMaskRandom {
		mask = rnd.Next()
	}
	dst[0] = byte(header)
	switch hl {
	case 6:
		dst[1] = WSMaskBit | byte(n)
	case 8:
		dst[1] = WSMaskBit | 126
		binary.BigEndian.PutUint16(dst[2:], uint16(n))
	default:
		dst[1] = WSMaskBit | 127
		binary.BigEndian.PutUint64(dst[2:], n)
	}
	var key [4]byte
	binary.LittleEndian.PutUint32(key[:], uint32(mask))
	copy(dst[hl-4:], key[:])
	for i, c := range payload {
		dst[hl+i] = c ^ key[i&3]
	}
	return hl + len(payload), nil
}

// WSFrame is the kernel's struc WSFRAME: what ParseWSFrame read. Fields it
// did not reach are 0.
type WSFrame struct {
	Opcode     uint32
	Fin        uint32
	HeaderLen  uint32
	PayloadLen uint64
	Total      uint64 // frame length; with ErrWSNeedMore, bytes needed in all
}

// ParseWSFrame is ws_parse_frame: one server frame at the front of b. It
// returns the frame (nil error), the frame so far with ErrWSNeedMore
// (Total = bytes b must hold), or a WSCloseError (1002 or 1009).
func ParseWSFrame(b []byte, maxPayload uint64) (WSFrame, error) {
	var f WSFrame
	if len(b) < 2 {
		f.Total = 2
		return f, ErrWSNeedMore
	}
	if b[0]&WSRSVBits != 0 {
		return f, WSCloseError(WSCloseProtocol)
	}
	op := b[0] & WSOpcodeBits
	if !wsOpcodeDefined(op) {
		return f, WSCloseError(WSCloseProtocol)
	}
	f.Opcode = uint32(op)
	f.Fin = uint32(b[0] >> 7)
	if b[1]&WSMaskBit != 0 {
		return f, WSCloseError(WSCloseProtocol)
	}
	n := uint64(b[1])
	if op&0x8 != 0 && (f.Fin == 0 || n > WSControlMax) {
		return f, WSCloseError(WSCloseProtocol)
	}
	hl := uint64(2)
	switch n {
	case 126:
		hl = 4
		f.HeaderLen = 4
		if uint64(len(b)) < hl {
			f.Total = hl
			return f, ErrWSNeedMore
		}
		n = uint64(binary.BigEndian.Uint16(b[2:]))
	case 127:
		hl = 10
		f.HeaderLen = 10
		if uint64(len(b)) < hl {
			f.Total = hl
			return f, ErrWSNeedMore
		}
		n = binary.BigEndian.Uint64(b[2:])
		if n>>63 != 0 {
			return f, WSCloseError(WSCloseProtocol)
		}
	}
	f.HeaderLen = uint32(hl)
	f.PayloadLen = n
	if n > maxPayload {
		return f, WSCloseError(WSCloseTooBig)
	}
	f.Total = hl + n
	if uint64(len(b)) < f.Total {
		return f, ErrWSNeedMore
	}
	return f, nil
}

// Message states of WSMessage (the kernel's WS_MSG_*).
const (
	WSMsgEmpty   = 0
	WSMsgPartial = 1
	WSMsgDone    = 2
)

// WSMessage is the kernel's struc WSMSG: a message reassembled from
// fragments into Buf (its length is the capacity).
type WSMessage struct {
	Buf    []byte
	Len    int
	Opcode uint32
	State  uint32
}

// Append is ws_msg_append: add the data frame f (parsed from frame) and
// return the new state, or a WSCloseError (1002 out of sequence, 1009 too
// big, 1011 a control frame) leaving m unchanged except that a finished
// message is forgotten first.
func (m *WSMessage) Append(frame []byte, f WSFrame) (uint32, error) {
	if m.State == WSMsgDone {
		m.Len, m.State = 0, WSMsgEmpty
	}
	if f.Opcode&0x8 != 0 {
		return 0, WSCloseError(WSCloseInternal)
	}
	start := 0
	if f.Opcode == WSOpCont {
		if m.State != WSMsgPartial {
			return 0, WSCloseError(WSCloseProtocol)
		}
		start = m.Len
	} else if m.State == WSMsgPartial {
		return 0, WSCloseError(WSCloseProtocol)
	}
	if f.PayloadLen > uint64(len(m.Buf)-start) {
		return 0, WSCloseError(WSCloseTooBig)
	}
	if f.Opcode != WSOpCont {
		m.Opcode = f.Opcode
	}
	n := int(f.PayloadLen)
	copy(m.Buf[start:], frame[f.HeaderLen:int(f.HeaderLen)+n])
	m.Len = start + n
	m.State = WSMsgPartial
	if f.Fin != 0 {
		m.State = WSMsgDone
	}
	return m.State, nil
}

// WSCloseCodeValid is ws_close_code_valid: 1000-1003, 1007-1014, 3000-4999.
func WSCloseCodeValid(code uint32) bool {
	return code >= 1000 && code <= 1003 || code >= 1007 && code <= 1014 || code >= 3000 && code <= 4999
}

// WSClosePayload is ws_close_payload: code big-endian then the reason.
func WSClosePayload(code uint32, reason []byte) ([]byte, error) {
	if !WSCloseCodeValid(code) {
		return nil, WSBuildCode
	}
	if len(reason) > WSControlMax-2 {
		return nil, WSBuildControl
	}
	return append([]byte{byte(code >> 8), byte(code)}, reason...), nil
}

// WSCloseCode is ws_close_code: the code of a received Close payload, 1005
// when empty, WSCloseError(1002) when 1 byte long or not a valid code.
func WSCloseCode(payload []byte) (uint32, error) {
	switch {
	case len(payload) == 0:
		return WSCloseNoStatus, nil
	case len(payload) == 1:
		return 0, WSCloseError(WSCloseProtocol)
	}
	code := uint32(binary.BigEndian.Uint16(payload))
	if !WSCloseCodeValid(code) {
		return 0, WSCloseError(WSCloseProtocol)
	}
	return code, nil
}

// WSHeadLength is ws_head_length: the length of the response head through
// its first CRLFCRLF, or 0 when it has not ended.
func WSHeadLength(b []byte) int {
	if i := bytes.Index(b, []byte("\r\n\r\n")); i >= 0 {
		return i + 4
	}
	return 0
}

// WSUpgradeError is why WSCheckUpgrade refused a response (the kernel's
// WS_UPG_*).
type WSUpgradeError int

// Refusals of WSCheckUpgrade, in the order it checks.
const (
	WSUpgMalformed  WSUpgradeError = 1 // a line without CRLF, a control byte, a header without ':'
	WSUpgStatus     WSUpgradeError = 2 // not "HTTP/1.1 101"
	WSUpgUpgrade    WSUpgradeError = 3 // no Upgrade listing websocket
	WSUpgConnection WSUpgradeError = 4 // no Connection listing upgrade
	WSUpgAccept     WSUpgradeError = 5 // Sec-WebSocket-Accept missing or wrong
	WSUpgExtension  WSUpgradeError = 6 // an extension we did not offer
	WSUpgProtocol   WSUpgradeError = 7 // a subprotocol we did not offer
)

func (e WSUpgradeError) Error() string {
	names := [...]string{"", "malformed head", "status is not 101", "no Upgrade: websocket",
		"no Connection: upgrade", "Sec-WebSocket-Accept missing or wrong",
		"unexpected Sec-WebSocket-Extensions", "unexpected Sec-WebSocket-Protocol"}
	if e > 0 && int(e) < len(names) {
		return "websocket upgrade: " + names[e]
	}
	return fmt.Sprintf("websocket upgrade: error %d", int(e))
}

// wsFindEOL is ws_check_upgrade's .find_eol: the index of the CR of the CRLF
// ending the line at start; false if b ends first or a bare CR or a control
// byte other than HTAB comes first.
func wsFindEOL(b []byte, start int) (int, bool) {
	for p := start; p+1 < len(b); p++ {
		c := b[p]
		if c == '\r' {
			return p, b[p+1] == '\n'
		}
		if c == 0x7F || c < ' ' && c != '\t' {
			return 0, false
		}
	}
	return 0, false
}

func wsTrimOWS(b []byte) []byte { return bytes.Trim(b, " \t") }

// wsTokenListHas is ws_token_list_has: a comma-separated element equal to
// token ignoring ASCII case.
func wsTokenListHas(v []byte, token string) bool {
	for _, e := range bytes.Split(v, []byte(",")) {
		if wsEqualFold(wsTrimOWS(e), token) {
			return true
		}
	}
	return false
}

// wsEqualFold compares ignoring ASCII case only (bytes.EqualFold also folds
// Unicode, the kernel does not).
func wsEqualFold(b []byte, lower string) bool {
	if len(b) != len(lower) {
		return false
	}
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			c |= 0x20
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

// WSCheckUpgrade is ws_check_upgrade: nil when head (through CRLFCRLF) is a
// good 101 answer to key, else the first WSUpgradeError in check order.
func WSCheckUpgrade(head []byte, key string) error {
	eol, ok := wsFindEOL(head, 0)
	if !ok {
		return WSUpgMalformed
	}
	const status = "HTTP/1.1 101"
	line := head[:eol]
	if !bytes.HasPrefix(line, []byte(status)) || len(line) > len(status) && line[len(status)] != ' ' {
		return WSUpgStatus
	}
	accept := WSAcceptForKey(key)
	var upgrade, connection, goodAccept, badAccept, extension, protocol bool
	for {
		start := eol + 2
		eol, ok = wsFindEOL(head, start)
		if !ok {
			return WSUpgMalformed
		}
		line := head[start:eol]
		if len(line) == 0 {
			break
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 || bytes.ContainsAny(line[:colon], " \t") {
			return WSUpgMalformed
		}
		name, value := line[:colon], wsTrimOWS(line[colon+1:])
		switch {
		case wsEqualFold(name, "upgrade"):
			upgrade = upgrade || wsTokenListHas(value, "websocket")
		case wsEqualFold(name, "connection"):
			connection = connection || wsTokenListHas(value, "upgrade")
		case wsEqualFold(name, "sec-websocket-accept"):
			if string(value) == accept {
				goodAccept = true
			} else {
				badAccept = true
			}
		case wsEqualFold(name, "sec-websocket-extensions"):
			extension = extension || len(value) > 0
		case wsEqualFold(name, "sec-websocket-protocol"):
			protocol = protocol || len(value) > 0
		}
	}
	switch {
	case !upgrade:
		return WSUpgUpgrade
	case !connection:
		return WSUpgConnection
	case badAccept || !goodAccept:
		return WSUpgAccept
	case extension:
		return WSUpgExtension
	case protocol:
		return WSUpgProtocol
	}
	return nil
}
