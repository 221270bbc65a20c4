package gatewayemu

import (
	"bufio"
	"bytes"
	"compress/zlib"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// rawClient is a WebSocket client written from RFC 6455 for these tests,
// independent of the library the emulator uses: it sees every frame (FIN,
// opcode, length), so a test can check how a message was fragmented, and it
// inflates compress=zlib-stream with one flate reader for the connection.
type rawClient struct {
	t    *testing.T
	conn net.Conn
	br   *bufio.Reader

	// zlib-stream: the compressed bytes of each message go to zin; one
	// goroutine inflates the connection's stream with one zlib reader and
	// decodes JSON values from it onto zout, so each message must yield
	// exactly one payload with no byte of the next message.
	zlib  bool
	zin   chan []byte
	zout  chan zvalue
	zdone chan struct{} // closed at cleanup: the inflater stops
}

// zvalue is one JSON value inflated from the zlib stream, or its error.
type zvalue struct {
	raw json.RawMessage
	err error
}

// feed is an io.Reader over the messages sent on ch; it blocks between them.
type feed struct {
	ch  chan []byte
	cur []byte
}

func (f *feed) Read(p []byte) (int, error) {
	for len(f.cur) == 0 {
		b, ok := <-f.ch
		if !ok {
			return 0, io.EOF
		}
		f.cur = b
	}
	n := copy(p, f.cur)
	f.cur = f.cur[n:]
	return n, nil
}

// inflate runs the connection's single zlib context: zlib.NewReader checks
// the RFC 1950 header once, at the start of the stream.
func (c *rawClient) inflate() {
	put := func(v zvalue) bool {
		select {
		case c.zout <- v:
			return true
		case <-c.zdone:
			return false
		}
	}
	zr, err := zlib.NewReader(&feed{ch: c.zin})
	if err != nil {
		put(zvalue{err: fmt.Errorf("zlib header: %w", err)})
		return
	}
	dec := json.NewDecoder(zr)
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			put(zvalue{err: err})
			return
		}
		if !put(zvalue{raw: raw}) {
			return
		}
	}
}

// rawFrame is one frame as received.
type rawFrame struct {
	fin     bool
	opcode  byte
	payload []byte
}

// rawMessage is one reassembled message and the frames it came in.
type rawMessage struct {
	opcode  byte // 1 text, 2 binary
	frames  []rawFrame
	payload []byte // reassembled (still compressed with zlib-stream)
	json    []byte // the Gateway payload (inflated with zlib-stream)
}

// rawDial opens a WebSocket to addr ("host:port") sending Host: host and
// path+query, through dial (net.Dial when nil).
func rawDial(t *testing.T, dial func(network, addr string) (net.Conn, error), addr, host, pathQuery string) (*rawClient, *http.Response) {
	t.Helper()
	if dial == nil {
		dial = net.Dial
	}
	conn, err := dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(4 * testTimeout))
	var key [16]byte
	rand.Read(key[:])
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n", pathQuery, host, base64.StdEncoding.EncodeToString(key[:]))
	br := bufio.NewReaderSize(conn, 1<<16)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("handshake: %v", err)
	}
	c := &rawClient{t: t, conn: conn, br: br, zlib: strings.Contains(pathQuery, "compress=zlib-stream")}
	if c.zlib {
		c.zin = make(chan []byte, 1)
		c.zout = make(chan zvalue, 1)
		c.zdone = make(chan struct{})
		go c.inflate()
		t.Cleanup(func() { close(c.zdone); close(c.zin) })
	}
	return c, resp
}

// readFrame reads one frame; server frames must not be masked.
func (c *rawClient) readFrame() (rawFrame, error) {
	var h [2]byte
	if _, err := io.ReadFull(c.br, h[:]); err != nil {
		return rawFrame{}, err
	}
	f := rawFrame{fin: h[0]&0x80 != 0, opcode: h[0] & 0x0f}
	if h[0]&0x70 != 0 {
		return f, errors.New("RSV bits set without an extension")
	}
	if h[1]&0x80 != 0 {
		return f, errors.New("server frame is masked (RFC 6455 §5.1)")
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var b [2]byte
		if _, err := io.ReadFull(c.br, b[:]); err != nil {
			return f, err
		}
		n = uint64(binary.BigEndian.Uint16(b[:]))
	case 127:
		var b [8]byte
		if _, err := io.ReadFull(c.br, b[:]); err != nil {
			return f, err
		}
		n = binary.BigEndian.Uint64(b[:])
	}
	if n > 64<<20 {
		return f, fmt.Errorf("frame of %d bytes", n)
	}
	f.payload = make([]byte, n)
	_, err := io.ReadFull(c.br, f.payload)
	return f, err
}

// writeText sends one masked text frame.
func (c *rawClient) writeText(s string) {
	c.t.Helper()
	var hdr []byte
	switch n := len(s); {
	case n < 126:
		hdr = []byte{0x81, 0x80 | byte(n)}
	case n < 1<<16:
		hdr = []byte{0x81, 0x80 | 126, byte(n >> 8), byte(n)}
	default:
		hdr = binary.BigEndian.AppendUint64([]byte{0x81, 0x80 | 127}, uint64(n))
	}
	var mask [4]byte
	rand.Read(mask[:])
	b := append(append(hdr, mask[:]...), s...)
	for i := range len(s) {
		b[len(hdr)+4+i] ^= mask[i%4]
	}
	if _, err := c.conn.Write(b); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// send sends one Gateway payload.
func (c *rawClient) send(op int, d any) {
	c.t.Helper()
	b, err := json.Marshal(map[string]any{"op": op, "d": d})
	if err != nil {
		c.t.Fatal(err)
	}
	c.writeText(string(b))
}

// next reads one whole message: data frames until FIN, checking that the
// first carries opcode 1 or 2 and the rest opcode 0. Control frames between
// fragments are skipped; a close frame is an error.
func (c *rawClient) next() (rawMessage, error) {
	var m rawMessage
	for i := 0; ; i++ {
		if i > 1<<20 {
			return m, errors.New("message of over a million frames")
		}
		f, err := c.readFrame()
		if err != nil {
			return m, err
		}
		switch {
		case f.opcode == 8:
			code := 0
			if len(f.payload) >= 2 {
				code = int(binary.BigEndian.Uint16(f.payload))
			}
			return m, fmt.Errorf("close frame %d %q", code, f.payload[min(2, len(f.payload)):])
		case f.opcode >= 8:
			continue // ping, pong
		case len(m.frames) == 0 && f.opcode != 1 && f.opcode != 2:
			return m, fmt.Errorf("first frame has opcode %d", f.opcode)
		case len(m.frames) > 0 && f.opcode != 0:
			return m, fmt.Errorf("continuation frame has opcode %d", f.opcode)
		}
		if len(m.frames) == 0 {
			m.opcode = f.opcode
		}
		m.frames = append(m.frames, f)
		m.payload = append(m.payload, f.payload...)
		if f.fin {
			break
		}
	}
	if !c.zlib {
		m.json = m.payload
		return m, nil
	}
	if m.opcode != 2 {
		return m, fmt.Errorf("zlib-stream message in a frame of opcode %d", m.opcode)
	}
	if !bytes.HasSuffix(m.payload, []byte{0, 0, 0xff, 0xff}) {
		return m, fmt.Errorf("zlib-stream message does not end with 00 00 ff ff: % x", m.payload[max(0, len(m.payload)-8):])
	}
	select {
	case v := <-c.zout:
		return m, fmt.Errorf("zlib-stream yielded a value before this message: %.80q %v", v.raw, v.err)
	default:
	}
	c.zin <- m.payload
	t := time.NewTimer(testTimeout)
	defer t.Stop()
	select {
	case v := <-c.zout:
		if v.err != nil {
			return m, fmt.Errorf("inflate: %v", v.err)
		}
		m.json = v.raw
	case <-t.C:
		return m, errors.New("zlib-stream message inflated to no whole JSON payload")
	}
	return m, nil
}

// expect reads the next message and decodes it as a Gateway payload.
func (c *rawClient) expect() (rawMessage, frame) {
	c.t.Helper()
	m, err := c.next()
	if err != nil {
		c.t.Fatalf("raw read: %v", err)
	}
	var f frame
	if err := json.Unmarshal(m.json, &f); err != nil {
		c.t.Fatalf("message of %d bytes is not one JSON payload: %v (%.120q)", len(m.json), err, m.json)
	}
	return m, f
}
