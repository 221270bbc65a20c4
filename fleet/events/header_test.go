package events

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

func TestHeaderRoundTrip(t *testing.T) {
	at := time.Date(2026, 12, 2, 3, 4, 5, 678901234, time.UTC)
	m := Meta{Shard: 5, Seq: 42, Session: "0123456789abcdef0123456789abcdef", Node: "rack1-07", Received: at}
	h, err := m.Header()
	if err != nil {
		t.Fatal(err)
	}
	if got := h.Get(HeaderMsgID); got != "0123456789abcdef0123456789abcdef:42" {
		t.Errorf("Nats-Msg-Id = %q", got)
	}
	back, err := ParseHeader(h)
	if err != nil {
		t.Fatal(err)
	}
	if back != m {
		t.Errorf("round trip = %+v, want %+v", back, m)
	}
}

func TestHeaderRefusals(t *testing.T) {
	at := time.Unix(1, 0)
	good := Meta{Shard: 1, Seq: 1, Session: "s", Node: "n", Received: at}
	bad := []struct {
		name string
		m    Meta
		err  error
	}{
		{"seq 0", Meta{Shard: 1, Seq: 0, Session: "s", Node: "n", Received: at}, ErrBadHeader},
		{"no session", Meta{Seq: 1, Node: "n", Received: at}, ErrMissingHeader},
		{"colon in session", Meta{Seq: 1, Session: "a:b", Node: "n", Received: at}, ErrBadHeader},
		{"newline in node", Meta{Seq: 1, Session: "s", Node: "n\r\nX: y", Received: at}, ErrBadHeader},
		{"no time", Meta{Seq: 1, Session: "s", Node: "n"}, ErrMissingHeader},
	}
	for _, c := range bad {
		if _, err := c.m.Header(); !errors.Is(err, c.err) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.err)
		}
	}
	edit := []struct {
		name, header, value string
		err                 error
	}{
		{"shard leading zero", HeaderShard, "01", ErrBadShard},
		{"seq sign", HeaderSeq, "+1", ErrBadHeader},
		{"seq huge", HeaderSeq, "18446744073709551616", ErrBadHeader},
		{"time", HeaderReceived, "yesterday", ErrBadHeader},
		{"msg id", HeaderMsgID, "s:2", ErrMsgIDMismatch},
		{"missing node", HeaderNode, "", ErrMissingHeader},
	}
	for _, c := range edit {
		h, err := good.Header()
		if err != nil {
			t.Fatal(err)
		}
		if c.value == "" {
			h.Del(c.header)
		} else {
			h.Set(c.header, c.value)
		}
		if _, err := ParseHeader(h); !errors.Is(err, c.err) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.err)
		}
	}
	h, _ := good.Header()
	h.Add(HeaderSeq, "2")
	if _, err := ParseHeader(h); !errors.Is(err, ErrBadHeader) {
		t.Errorf("two Dpxe-Seq values: err = %v", err)
	}
}

// FuzzParseHeader checks that whatever ParseHeader accepts, Header writes
// back identically.
func FuzzParseHeader(f *testing.F) {
	f.Add("1", "42", "sess", "node", "2026-12-02T03:04:05.5Z", "sess:42")
	f.Add("01", "0", "a:b", "", "x", "")
	f.Fuzz(func(t *testing.T, shard, seq, session, node, recv, id string) {
		h := nats.Header{}
		for k, v := range map[string]string{HeaderShard: shard, HeaderSeq: seq, HeaderSession: session,
			HeaderNode: node, HeaderReceived: recv, HeaderMsgID: id} {
			h.Set(k, v)
		}
		m, err := ParseHeader(h)
		if err != nil {
			return
		}
		h2, err := m.Header()
		if err != nil {
			t.Fatalf("accepted %+v but Header refuses it: %v", m, err)
		}
		m2, err := ParseHeader(h2)
		if err != nil || m2.Shard != m.Shard || m2.Seq != m.Seq || m2.Session != m.Session || m2.Node != m.Node || !m2.Received.Equal(m.Received) {
			t.Fatalf("round trip %+v -> %+v, %v", m, m2, err)
		}
	})
}
