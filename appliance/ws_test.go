package appliance

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// The RFC 6455 §5.7 examples.
var (
	wsHello       = []byte{0x81, 0x05, 'H', 'e', 'l', 'l', 'o'}
	wsMaskedHello = []byte{0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58}
	wsMaskedPong  = []byte{0x8a, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58}
	wsRFCMask     = uint64(0x3d21fa37) // 37 fa 21 3d, first byte lowest
)

func TestWSAcceptForKey(t *testing.T) {
	if got, want := WSAcceptForKey(WSUpgradeKey), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="; got != want { // §1.3
		t.Errorf("WSAcceptForKey(%q) = %q, want %q", WSUpgradeKey, got, want)
	}
	key := NewWSRandom(7).MakeKey()
	raw, err := base64.StdEncoding.DecodeString(key)
	if len(key) != WSKeyLen || err != nil || len(raw) != 16 {
		t.Errorf("MakeKey = %q (%d bytes decoded, %v), want 24 characters of 16 bytes", key, len(raw), err)
	}
}

func TestBuildWSFrame(t *testing.T) {
	hello := []byte("Hello")
	big := make([]byte, 126)
	cases := []struct {
		name    string
		header  uint64
		payload []byte
		room    int
		want    []byte // nil when refused
		err     error
	}{
		{"§5.7 masked Hello", WSFin | WSOpText, hello, 64, wsMaskedHello, nil},
		{"§5.7 masked pong, exact room", WSFin | WSOpPong, hello, 11, wsMaskedPong, nil},
		{"one byte short", WSFin | WSOpText, hello, 10, nil, WSBuildSpace},
		{"payload over room", WSFin | WSOpBinary, big, 125, nil, WSBuildSpace},
		{"16-bit one byte short", WSFin | WSOpBinary, big, 133, nil, WSBuildSpace},
		{"opcode 3", WSFin | 3, hello, 64, nil, WSBuildOpcode},
		{"opcode 11", WSFin | 11, hello, 64, nil, WSBuildOpcode},
		{"RSV1", WSFin | 0x40 | WSOpText, hello, 64, nil, WSBuildOpcode},
		{"bit 8", 0x100 | WSFin | WSOpText, hello, 64, nil, WSBuildOpcode},
		{"fragmented ping", WSOpPing, hello, 64, nil, WSBuildControl},
		{"126-byte close", WSFin | WSOpClose, big, 200, nil, WSBuildControl},
	}
	for _, c := range cases {
		dst := make([]byte, c.room)
		n, err := BuildWSFrame(dst, c.header, c.payload, wsRFCMask, nil)
		if err != c.err || c.want != nil && !bytes.Equal(dst[:n], c.want) {
			t.Errorf("%s: % x, %v; want % x, %v", c.name, dst[:n], err, c.want, c.err)
		}
	}
	for _, c := range []struct {
		n    uint64
		want int
	}{{0, 6}, {125, 6}, {126, 8}, {65535, 8}, {65536, 14}} {
		if got := WSFrameHeaderLen(c.n); got != c.want {
			t.Errorf("WSFrameHeaderLen(%d) = %d, want %d", c.n, got, c.want)
		}
	}
}

// serverFrame turns a masked client frame into the unmasked frame a server
// would send with the same header.
func serverFrame(client []byte) []byte {
	hl := 2
	switch client[1] & 0x7F {
	case 126:
		hl = 4
	case 127:
		hl = 10
	}
	key := client[hl : hl+4]
	out := append([]byte(nil), client[:hl]...)
	out[1] &^= WSMaskBit
	for i, c := range client[hl+4:] {
		out = append(out, c^key[i&3])
	}
	return out
}

func TestWSFrameRoundTrip(t *testing.T) {
	rnd := NewWSRandom(3)
	for _, n := range []int{0, 1, 5, 124, 125, 126, 127, 1000, 65535, 65536, 70000} {
		payload := make([]byte, n)
		fillRandom(&splitmix64{uint64(n)}, payload)
		dst := make([]byte, n+WSMaxHeader)
		k, err := BuildWSFrame(dst, WSFin|WSOpBinary, payload, WSMaskRandom, rnd)
		if err != nil || k != WSFrameHeaderLen(uint64(n))+n {
			t.Fatalf("build %d bytes: %d, %v", n, k, err)
		}
		if _, err := ParseWSFrame(dst[:k], ^uint64(0)); err != WSCloseError(WSCloseProtocol) {
			t.Errorf("a masked frame of %d bytes parsed with %v, want 1002", n, err)
		}
		srv := serverFrame(dst[:k])
		f, err := ParseWSFrame(srv, ^uint64(0))
		if err != nil || f.Opcode != WSOpBinary || f.Fin != 1 || f.PayloadLen != uint64(n) ||
			f.Total != uint64(len(srv)) || !bytes.Equal(srv[f.HeaderLen:], payload) {
			t.Errorf("round trip of %d bytes: %+v, %v", n, f, err)
		}
		if f, err := ParseWSFrame(srv[:len(srv)-1], ^uint64(0)); err != ErrWSNeedMore || f.Total != uint64(len(srv)) {
			t.Errorf("%d bytes one short: %+v, %v; want need %d", n, f, err, len(srv))
		}
	}
}

func TestParseWSFrame(t *testing.T) {
	b := func(v ...byte) []byte { return v }
	cases := []struct {
		name string
		in   []byte
		max  uint64
		want WSFrame
		err  error
	}{
		{"§5.7 Hello", wsHello, 1000, WSFrame{1, 1, 2, 5, 7}, nil},
		{"payload at max", wsHello, 5, WSFrame{1, 1, 2, 5, 7}, nil},
		{"payload over max", wsHello, 4, WSFrame{}, WSCloseError(WSCloseTooBig)},
		{"half Hello", wsHello[:4], 1000, WSFrame{1, 1, 2, 5, 7}, ErrWSNeedMore},
		{"1 byte", wsHello[:1], 1000, WSFrame{Total: 2}, ErrWSNeedMore},
		{"empty", nil, 1000, WSFrame{Total: 2}, ErrWSNeedMore},
		{"§5.7 256 bytes", b(0x82, 0x7E, 0x01, 0x00), 1000, WSFrame{2, 1, 4, 256, 260}, ErrWSNeedMore},
		{"cut 16-bit length", b(0x82, 0x7E, 0x01), 1000, WSFrame{2, 1, 4, 0, 4}, ErrWSNeedMore},
		{"§5.7 64 KiB", b(0x82, 0x7F, 0, 0, 0, 0, 0, 1, 0, 0), 65536, WSFrame{2, 1, 10, 65536, 65546}, ErrWSNeedMore},
		{"64 KiB over max", b(0x82, 0x7F, 0, 0, 0, 0, 0, 1, 0, 0), 65535, WSFrame{}, WSCloseError(WSCloseTooBig)},
		{"cut 64-bit length", b(0x82, 0x7F, 0, 0, 0, 0, 0, 1, 0), 65536, WSFrame{2, 1, 10, 0, 10}, ErrWSNeedMore},
		{"non-minimal length", b(0x81, 0x7E, 0, 5, 'H', 'e', 'l', 'l', 'o'), 1000, WSFrame{1, 1, 4, 5, 9}, nil},
		{"masked", wsMaskedHello, 1000, WSFrame{}, WSCloseError(WSCloseProtocol)},
		{"RSV1", b(0xC1, 0), 1000, WSFrame{}, WSCloseError(WSCloseProtocol)},
		{"opcode 3", b(0x83, 0), 1000, WSFrame{}, WSCloseError(WSCloseProtocol)},
		{"opcode 15", b(0x8F, 0), 1000, WSFrame{}, WSCloseError(WSCloseProtocol)},
		{"fragmented ping", b(0x09, 0), 1000, WSFrame{}, WSCloseError(WSCloseProtocol)},
		{"126-byte close", b(0x88, 0x7E, 0, 0x7E), 1000, WSFrame{}, WSCloseError(WSCloseProtocol)},
		{"125-byte pong", b(0x8A, 0x7D), 1000, WSFrame{10, 1, 2, 125, 127}, ErrWSNeedMore},
		{"64-bit top bit", b(0x82, 0x7F, 0x80, 0, 0, 0, 0, 0, 0, 0), ^uint64(0), WSFrame{}, WSCloseError(WSCloseProtocol)},
	}
	for _, c := range cases {
		f, err := ParseWSFrame(c.in, c.max)
		if err != c.err || err == nil || err == ErrWSNeedMore {
			if err != c.err || f != c.want {
				t.Errorf("%s: %+v, %v; want %+v, %v", c.name, f, err, c.want, c.err)
			}
		}
	}
}

func TestWSMessage(t *testing.T) {
	hel := []byte{0x01, 0x03, 'H', 'e', 'l'} // §5.7 fragmented Hello
	lo := []byte{0x80, 0x02, 'l', 'o'}
	ping := []byte{0x89, 0x00}
	m := WSMessage{Buf: make([]byte, 64)}
	step := func(frame []byte, wantState uint32, wantErr error) {
		t.Helper()
		f, err := ParseWSFrame(frame, 1000)
		if err != nil {
			t.Fatal(err)
		}
		st, err := m.Append(frame, f)
		if st != wantState || err != wantErr {
			t.Errorf("Append(% x) = %d, %v; want %d, %v", frame, st, err, wantState, wantErr)
		}
	}
	step(hel, WSMsgPartial, nil)
	step(ping, 0, WSCloseError(WSCloseInternal))
	step(lo, WSMsgDone, nil)
	if got := string(m.Buf[:m.Len]); got != "Hello" || m.Opcode != WSOpText {
		t.Errorf("message %q opcode %d, want Hello, text", got, m.Opcode)
	}
	step(lo, 0, WSCloseError(WSCloseProtocol)) // nothing to continue
	step(hel, WSMsgPartial, nil)
	step(hel, 0, WSCloseError(WSCloseProtocol)) // a new message inside one
	m = WSMessage{Buf: make([]byte, 4)}
	step(hel, WSMsgPartial, nil)
	step(lo, 0, WSCloseError(WSCloseTooBig))
	if m.Len != 3 || m.State != WSMsgPartial {
		t.Errorf("a refused frame changed the message: %+v", m)
	}
}

func TestWSClose(t *testing.T) {
	p, err := WSClosePayload(WSCloseNormal, []byte("bye"))
	if err != nil || !bytes.Equal(p, []byte{0x03, 0xE8, 'b', 'y', 'e'}) {
		t.Errorf("WSClosePayload(1000, bye) = % x, %v", p, err)
	}
	for _, c := range []struct {
		code   uint32
		reason int
		err    error
	}{
		{1005, 0, WSBuildCode}, {1006, 0, WSBuildCode}, {1004, 0, WSBuildCode}, {999, 0, WSBuildCode},
		{1015, 0, WSBuildCode}, {5000, 0, WSBuildCode}, {4000, 0, nil}, {1012, 123, nil}, {1000, 124, WSBuildControl},
	} {
		if _, err := WSClosePayload(c.code, make([]byte, c.reason)); err != c.err {
			t.Errorf("WSClosePayload(%d, %d bytes) = %v, want %v", c.code, c.reason, err, c.err)
		}
	}
	for _, c := range []struct {
		in   []byte
		code uint32
		err  error
	}{
		{p, 1000, nil}, {nil, WSCloseNoStatus, nil}, {p[:1], 0, WSCloseError(WSCloseProtocol)},
		{[]byte{0x03, 0xED}, 0, WSCloseError(WSCloseProtocol)}, {[]byte{0x0F, 0xA0}, 4000, nil},
	} {
		if code, err := WSCloseCode(c.in); code != c.code || err != c.err {
			t.Errorf("WSCloseCode(% x) = %d, %v; want %d, %v", c.in, code, err, c.code, c.err)
		}
	}
}

func TestWSCheckUpgrade(t *testing.T) {
	const acc = "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"
	const up = "Upgrade: websocket\r\nConnection: Upgrade\r\n"
	cases := []struct {
		name, head string
		err        error
	}{
		{"RFC 6455 §1.3", "HTTP/1.1 101 Switching Protocols\r\n" + up + acc + "\r\n", nil},
		{"case and lists", "HTTP/1.1 101\r\nUPGRADE:WebSocket\r\nconnection: keep-alive ,  UPGRADE\t\r\n" +
			"sec-websocket-accept: \ts3pPLMBiTxaQ9kYGzzhZRbK+xOo=  \r\nSec-WebSocket-Protocol:\r\n\r\n", nil},
		{"status 200", "HTTP/1.1 200 OK\r\n" + up + acc + "\r\n", WSUpgStatus},
		{"status 1010", "HTTP/1.1 1010 Switching\r\n" + up + acc + "\r\n", WSUpgStatus},
		{"HTTP/1.0", "HTTP/1.0 101 Switching Protocols\r\n" + up + acc + "\r\n", WSUpgStatus},
		{"no websocket", "HTTP/1.1 101 x\r\nUpgrade: websockets\r\nConnection: Upgrade\r\n" + acc + "\r\n", WSUpgUpgrade},
		{"no upgrade token", "HTTP/1.1 101 x\r\nUpgrade: websocket\r\nConnection: keep-alive\r\n" + acc + "\r\n", WSUpgConnection},
		{"second accept wrong", "HTTP/1.1 101 x\r\n" + up + acc + "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOO=\r\n\r\n", WSUpgAccept},
		{"no accept", "HTTP/1.1 101 x\r\n" + up + "\r\n", WSUpgAccept},
		{"extension", "HTTP/1.1 101 x\r\n" + up + acc + "Sec-WebSocket-Extensions: permessage-deflate\r\n\r\n", WSUpgExtension},
		{"protocol", "HTTP/1.1 101 x\r\n" + up + acc + "Sec-WebSocket-Protocol: chat\r\n\r\n", WSUpgProtocol},
		{"no colon", "HTTP/1.1 101 x\r\n" + up + acc + "Server\r\n\r\n", WSUpgMalformed},
		{"space before colon", "HTTP/1.1 101 x\r\nUpgrade : websocket\r\n" + acc + "\r\n", WSUpgMalformed},
		{"bare LF", "HTTP/1.1 101 x\r\nUpgrade: websocket\nConnection: Upgrade\r\n" + acc + "\r\n", WSUpgMalformed},
		{"cut", "HTTP/1.1 101 x\r\n" + up + acc + "\r", WSUpgMalformed},
	}
	for _, c := range cases {
		if err := WSCheckUpgrade([]byte(c.head), WSUpgradeKey); err != c.err {
			t.Errorf("%s: %v, want %v", c.name, err, c.err)
		}
	}
	if n := WSHeadLength([]byte(cases[0].head + "extra")); n != len(cases[0].head) {
		t.Errorf("WSHeadLength = %d, want %d", n, len(cases[0].head))
	}
}

// TestLibDigestGenerators checks that the random cases behind every ws
// digest reach every outcome, so a digest match means something: a
// generator stuck on one refusal would compare almost nothing.
func TestLibDigestGenerators(t *testing.T) {
	seen := map[string]map[string]int{}
	note := func(digest string) func(string) {
		seen[digest] = map[string]int{}
		return func(o string) { seen[digest][o]++ }
	}
	rng := &splitmix64{state: 99}
	rnd := NewWSRandom(99)
	var d digest
	frame := make([]byte, 65536+64)
	fn, pn, mn, cn, un := note("wsframe"), note("wsparse"), note("wsmsg"), note("wsclose"), note("wsupgrade")
	for i := 0; i < LibSelfTestCases; i++ {
		wsFrameCase(rng, rnd, &d, frame, fn)
		wsParseCase(rng, &d, pn)
		wsMsgCase(rng, &d, mn)
		wsCloseCase(rng, &d, cn)
		wsUpgradeCase(rng, &d, un)
	}
	want := map[string][]error{
		"wsframe": {nil, WSBuildSpace, WSBuildOpcode, WSBuildControl},
		"wsparse": {nil, ErrWSNeedMore, WSCloseError(WSCloseProtocol), WSCloseError(WSCloseTooBig)},
		"wsmsg": {nil, errors.New("done"), WSCloseError(WSCloseProtocol), WSCloseError(WSCloseTooBig),
			WSCloseError(WSCloseInternal)},
		"wsclose":   {nil, WSCloseError(WSCloseProtocol), WSBuildCode, WSBuildControl},
		"wsupgrade": {nil, WSUpgMalformed, WSUpgStatus, WSUpgUpgrade, WSUpgConnection, WSUpgAccept, WSUpgExtension},
	}
	for name, outs := range want {
		for _, e := range outs {
			o := "ok"
			if e != nil {
				o = e.Error()
			}
			if seen[name][o] == 0 {
				t.Errorf("%s: no case ends in %q (seen %v)", name, o, seen[name])
			}
		}
		t.Logf("%s: %v", name, seen[name])
	}
}

func TestLibDigestsStable(t *testing.T) {
	a, b := LibDigests(1), LibDigests(1)
	for _, name := range LibDigestNames {
		if a[name] != b[name] {
			t.Errorf("%s differs between two runs", name)
		}
	}
	if c := LibDigests(2); c["wsparse"] == a["wsparse"] {
		t.Error("wsparse digest does not depend on the seed")
	}
}

// TestWSInteropCoder runs the Go reference against a real WebSocket server,
// coder/websocket (the library tools/gatewayemu serves the Gateway with):
// the handshake WSCheckUpgrade accepts, masked client frames it reads,
// fragmented messages, ping/pong, and the closing handshake.
func TestWSInteropCoder(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
		if err != nil {
			return
		}
		c.SetReadLimit(1 << 20)
		ctx := r.Context()
		for {
			typ, msg, err := c.Read(ctx)
			if err != nil {
				return // the library answers our Close
			}
			if err := c.Write(ctx, typ, msg); err != nil {
				return
			}
		}
	}))
	defer srv.Close()
	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	rnd := NewWSRandom(uint64(time.Now().UnixNano()))
	key := rnd.MakeKey()
	fmt.Fprintf(conn, "GET /?v=10&encoding=json HTTP/1.1\r\nHost: gateway.test\r\nUpgrade: websocket\r\n"+
		"Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n", key)
	r := bufio.NewReader(conn)
	var head []byte
	for WSHeadLength(head) == 0 {
		c, err := r.ReadByte()
		if err != nil {
			t.Fatalf("reading the response head: %v (so far %q)", err, head)
		}
		head = append(head, c)
	}
	if err := WSCheckUpgrade(head, key); err != nil {
		t.Fatalf("WSCheckUpgrade of coder/websocket's answer: %v\n%s", err, head)
	}
	if err := WSCheckUpgrade(head, rnd.MakeKey()); err != WSUpgAccept {
		t.Errorf("the answer checked against another key: %v, want %v", err, WSUpgAccept)
	}

	send := func(header uint64, payload []byte) {
		t.Helper()
		dst := make([]byte, len(payload)+WSMaxHeader)
		n, err := BuildWSFrame(dst, header, payload, WSMaskRandom, rnd)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Write(dst[:n]); err != nil {
			t.Fatal(err)
		}
	}
	var rx []byte
	next := func() (WSFrame, []byte) { // one whole server frame
		t.Helper()
		for {
			f, err := ParseWSFrame(rx, 1<<20)
			if err == nil {
				frame := rx[:f.Total]
				rx = rx[f.Total:]
				return f, frame
			}
			if err != ErrWSNeedMore {
				t.Fatalf("server frame: %v", err)
			}
			buf := make([]byte, 4096)
			k, err := r.Read(buf)
			if err != nil {
				t.Fatalf("reading frames: %v", err)
			}
			rx = append(rx, buf[:k]...)
		}
	}
	m := WSMessage{Buf: make([]byte, 1<<20)}
	message := func() (uint32, string) { // the next data message; answers nothing
		t.Helper()
		for {
			f, frame := next()
			if f.Opcode&0x8 != 0 {
				t.Fatalf("unexpected control frame %d", f.Opcode)
			}
			st, err := m.Append(frame, f)
			if err != nil {
				t.Fatal(err)
			}
			if st == WSMsgDone {
				return m.Opcode, string(m.Buf[:m.Len])
			}
		}
	}

	send(WSFin|WSOpText, []byte(`{"op":1,"d":null}`))
	if op, msg := message(); op != WSOpText || msg != `{"op":1,"d":null}` {
		t.Errorf("echo: %d %q", op, msg)
	}
	send(WSOpText, []byte(`{"op":2,`)) // fragmented, with a ping in between
	send(WSFin|WSOpPing, []byte("are you there"))
	send(WSOpCont, []byte(`"d":{}`))
	send(WSFin|WSOpCont, []byte(`}`))
	f, frame := next()
	if f.Opcode != WSOpPong || string(frame[f.HeaderLen:]) != "are you there" {
		t.Errorf("pong: %+v %q", f, frame[f.HeaderLen:])
	}
	if op, msg := message(); op != WSOpText || msg != `{"op":2,"d":{}}` {
		t.Errorf("fragmented echo: %d %q", op, msg)
	}
	big := make([]byte, 70000) // 64-bit length both ways
	fillRandom(&splitmix64{5}, big)
	send(WSFin|WSOpBinary, big)
	if op, msg := message(); op != WSOpBinary || msg != string(big) {
		t.Errorf("70000-byte binary echo: opcode %d, %d bytes", op, len(msg))
	}
	p, _ := WSClosePayload(4000, []byte("resume later"))
	send(WSFin|WSOpClose, p)
	f, frame = next()
	code, err := WSCloseCode(frame[f.HeaderLen:])
	if f.Opcode != WSOpClose || err != nil || code != 4000 {
		t.Errorf("close answer: %+v code %d %v, want 4000", f, code, err)
	}
	if _, err := r.ReadByte(); err != io.EOF {
		t.Errorf("after the closing handshake: %v, want EOF", err)
	}
}

// FuzzWSParseFrame checks ParseWSFrame's promises on any input: it never
// reads past the buffer (a panic would), a frame it accepts lies inside the
// buffer and obeys §5.5, "need more" always asks for more than it has (a
// lower bound that only grows), and more bytes never change a frame or an
// error already reached.
func FuzzWSParseFrame(f *testing.F) {
	for _, s := range [][]byte{wsHello, wsMaskedHello, {0x82, 0x7E, 0x01, 0x00}, {0x82, 0x7F, 0, 0, 0, 0, 0, 1, 0, 0},
		{0x89, 0x00}, {0x09, 0x00}, {0xC1, 0x00}, {0x82, 0x7F, 0x80, 0, 0, 0, 0, 0, 0, 0}, {0x81}} {
		f.Add(s, uint64(1000))
	}
	f.Fuzz(func(t *testing.T, b []byte, max uint64) {
		fr, err := ParseWSFrame(b, max)
		more := append(append([]byte(nil), b...), 0x81, 0x7F, 0xFF, 0x00)
		fr2, err2 := ParseWSFrame(more, max)
		switch e := err.(type) {
		case nil:
			if fr.HeaderLen != 2 && fr.HeaderLen != 4 && fr.HeaderLen != 10 ||
				fr.Total != uint64(fr.HeaderLen)+fr.PayloadLen || fr.Total > uint64(len(b)) || fr.PayloadLen > max {
				t.Fatalf("accepted frame outside the rules: %+v of %d bytes, max %d", fr, len(b), max)
			}
			if !wsOpcodeDefined(byte(fr.Opcode)) || fr.Opcode&8 != 0 && (fr.Fin != 1 || fr.PayloadLen > WSControlMax) {
				t.Fatalf("accepted a bad opcode or control frame: %+v", fr)
			}
			if err2 != nil || fr2 != fr {
				t.Fatalf("more bytes changed an accepted frame: %+v %v -> %+v %v", fr, err, fr2, err2)
			}
			if _, err := ParseWSFrame(b[:fr.Total-1], max); err != ErrWSNeedMore {
				t.Fatalf("one byte short of %+v: %v, want need more", fr, err)
			}
		case WSCloseError:
			if e != WSCloseProtocol && e != WSCloseTooBig {
				t.Fatalf("close code %d", e)
			}
			if err2 != err {
				t.Fatalf("more bytes changed error %v to %v", err, err2)
			}
		default:
			if err != ErrWSNeedMore {
				t.Fatalf("unexpected error %v", err)
			}
			if fr.Total <= uint64(len(b)) {
				t.Fatalf("need more with %d bytes, but Total %d", len(b), fr.Total)
			}
			if err2 == ErrWSNeedMore && (fr2.Total < fr.Total || fr2.Total <= uint64(len(more))) {
				t.Fatalf("need more: %d bytes want %d, %d bytes want %d", len(b), fr.Total, len(more), fr2.Total)
			}
		}
		if len(b) >= 2 && b[1]&WSMaskBit != 0 && err == nil {
			t.Fatal("accepted a masked server frame")
		}
	})
}

// FuzzWSCheckUpgrade: any head, never a panic, and an accepted head has
// the 101 status line and our accept value.
func FuzzWSCheckUpgrade(f *testing.F) {
	for _, s := range wsUpgradeTemplates {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, head []byte) {
		if WSCheckUpgrade(head, WSUpgradeKey) == nil {
			if !bytes.HasPrefix(head, []byte("HTTP/1.1 101")) || !bytes.Contains(head, []byte(WSAcceptForKey(WSUpgradeKey))) {
				t.Fatalf("accepted %q", head)
			}
		}
		_ = WSHeadLength(head)
	})
}
