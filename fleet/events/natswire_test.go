package events

import (
	"net"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/nats-io/nats.go"
)

// wireConn is a raw TCP client speaking through appliance's writers and
// reading through appliance.NATSReader, as the kernel will.
type wireConn struct {
	t   *testing.T
	c   net.Conn
	r   *appliance.NATSReader
	buf []byte
	// skipInfo: INFO again after CONNECT (protocol 1 asks for updates)
	skipInfo bool
}

func (w *wireConn) send(b []byte, err error) {
	w.t.Helper()
	if err != nil {
		w.t.Fatal(err)
	}
	if _, err := w.c.Write(b); err != nil {
		w.t.Fatal(err)
	}
}

// next returns the next operation, reading in pieces of at most 7 bytes
// so the reader sees real server bytes split everywhere.
func (w *wireConn) next() *appliance.NATSOp {
	w.t.Helper()
	deadline := time.Now().Add(testDeadline)
	for {
		for len(w.buf) > 0 {
			p := w.buf
			if len(p) > 7 {
				p = p[:7]
			}
			n, op, err := w.r.Feed(p)
			w.buf = w.buf[n:]
			if err != nil {
				w.t.Fatalf("reader refused the server's bytes: %v", err)
			}
			if op != nil && (op.Kind != appliance.NATSInfo || !w.skipInfo) {
				return op
			}
		}
		if time.Now().After(deadline) {
			w.t.Fatal("no operation from the server")
		}
		_ = w.c.SetReadDeadline(deadline)
		b := make([]byte, 4096)
		n, err := w.c.Read(b)
		w.buf = append(w.buf, b[:n]...)
		if err != nil && n == 0 {
			w.t.Fatalf("read: %v", err)
		}
	}
}

// TestNATSWireRealServer speaks to the embedded nats-server through the
// Go reference of the kernel's NATS reader and writers: INFO's
// max_payload and headers, CONNECT without verbose (no +OK), PING/PONG,
// HPUB with Nats-Msg-Id and a PubAck, the same Msg-Id acknowledged as a
// duplicate, a 503 no-responders reply, a worker's request with headers
// read as HMSG and answered, and the -ERR for an unknown operation.
func TestNATSWireRealServer(t *testing.T) {
	s := startServer(t, t.TempDir(), "127.0.0.1:0")
	nc := connect(t, s)
	testStream(t, nc)
	c, err := net.DialTimeout("tcp", s.Addr().String(), testDeadline)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	w := &wireConn{t: t, c: c, r: appliance.NewNATSReader()}
	info := w.next()
	if info.Kind != appliance.NATSInfo || info.MaxPayload != 8<<20 || !info.Headers || info.ServerID == "" {
		t.Fatalf("INFO %+v", info)
	}
	w.skipInfo = true
	w.send(appliance.NATSConnect("", "", "dpxe-test"))
	w.send(appliance.NATSSub("dpxe.bot.commands.3", 1))
	w.send(appliance.NATSSub("_INBOX.k.>", 2))
	w.send([]byte(appliance.NATSPingLine), nil)
	if op := w.next(); op.Kind != appliance.NATSPong {
		t.Fatalf("after CONNECT, SUB, PING: %+v (verbose must be off)", op)
	}
	for i, dup := range []bool{false, true} {
		w.send(appliance.NATSHPub("dpxe.bot.events.3.MESSAGE_CREATE", "_INBOX.k.1", "sess:1", []byte(`{"op":0,"s":1}`)))
		op := w.next()
		if op.Kind != appliance.NATSMsg || op.Subject != "_INBOX.k.1" || op.SID != 2 || !op.Ack.Found ||
			op.Ack.Stream != "DPXE_EVENTS_bot" || op.Ack.Seq != 1 || op.Ack.Duplicate != dup || op.Ack.Error {
			t.Fatalf("PubAck %d: %+v %q", i, op, op.Body)
		}
	}
	w.send(appliance.NATSHPub("nobody.listens", "_INBOX.k.2", "", []byte("x")))
	if op := w.next(); op.Kind != appliance.NATSHMsg || op.Status != 503 || op.Subject != "_INBOX.k.2" {
		t.Fatalf("no responders: %+v", op)
	}
	// a worker's request with a header
	type reply struct {
		m   *nats.Msg
		err error
	}
	got := make(chan reply, 1)
	go func() {
		m := nats.NewMsg("dpxe.bot.commands.3")
		m.Header.Set("X-Worker", "w1")
		m.Data = []byte(`{"op":3,"d":{}}`)
		r, err := nc.RequestMsg(m, testDeadline)
		got <- reply{r, err}
	}()
	op := w.next()
	if op.Kind != appliance.NATSHMsg || op.Subject != "dpxe.bot.commands.3" || op.SID != 1 || op.Reply == "" ||
		op.HeaderLines != 1 || string(op.Body) != `{"op":3,"d":{}}` {
		t.Fatalf("command %+v", op)
	}
	w.send(appliance.NATSHPub(op.Reply, "", "", []byte(`{"status":"ok"}`)))
	r := <-got
	if r.err != nil || string(r.m.Data) != `{"status":"ok"}` {
		t.Fatalf("worker's reply: %v %v", r.m, r.err)
	}
	w.send([]byte("FOO\r\n"), nil)
	for {
		op := w.next()
		if op.Kind == appliance.NATSPing {
			continue
		}
		if op.Kind != appliance.NATSErr || op.Reason != "Unknown Protocol Operation" {
			t.Fatalf("after FOO: %+v", op)
		}
		break
	}
}
