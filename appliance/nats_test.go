package appliance

import (
	"bytes"
	"errors"
	"math/rand"
	"strings"
	"testing"
)

func TestNATSReaderOps(t *testing.T) {
	info := "INFO {\"server_id\":\"ABC\",\"headers\":true,\"max_payload\":8388608,\"connect_urls\":[\"x:1\"]}\r\n"
	stream := info + "PING\r\n-ERR 'Stale Connection'\r\n" +
		"MSG _INBOX.a.1 2 40\r\n{\"stream\":\"S\",\"seq\":41,\"duplicate\":true}\r\n" +
		"HMSG _INBOX.a.2 2 16 16\r\nNATS/1.0 503\r\n\r\n\r\n" +
		"HMSG dpxe.bot.commands.3 7 _INBOX.w.1 23 25\r\nNATS/1.0\r\nA: b\r\nC:d\r\n\r\n{}\r\n"
	ops, err := ReadNATS([]byte(stream), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(ops) != 6 {
		t.Fatalf("%d ops", len(ops))
	}
	if o := ops[0]; o.Kind != NATSInfo || o.MaxPayload != 8388608 || !o.Headers || o.ServerID != "ABC" {
		t.Errorf("INFO %+v", o)
	}
	if ops[1].Kind != NATSPing || ops[2].Kind != NATSErr || ops[2].Reason != "Stale Connection" {
		t.Errorf("PING/-ERR %+v %+v", ops[1], ops[2])
	}
	if a := ops[3].Ack; ops[3].Kind != NATSMsg || !a.Found || a.Stream != "S" || a.Seq != 41 || !a.Duplicate || a.Error {
		t.Errorf("PubAck %+v", ops[3])
	}
	if o := ops[4]; o.Kind != NATSHMsg || o.Status != 503 || o.BodyLen != 0 || o.Ack.Found {
		t.Errorf("503 %+v", o)
	}
	ops, err = ReadNATS([]byte(stream), []int{1})
	if err != nil || len(ops) != 6 {
		t.Fatalf("byte at a time: %d ops, %v", len(ops), err)
	}
	// Feed hands out one operation at a time
	r := NewNATSReader()
	rest := []byte(stream)
	var all []*NATSOp
	for len(rest) > 0 {
		n, op, err := r.Feed(rest)
		if err != nil {
			t.Fatal(err)
		}
		if op != nil {
			all = append(all, op)
		}
		rest = rest[n:]
	}
	if len(all) != 6 {
		t.Fatalf("Feed loop: %d ops", len(all))
	}
	if o := all[5]; o.Kind != NATSHMsg || o.Subject != "dpxe.bot.commands.3" || o.SID != 7 || o.Reply != "_INBOX.w.1" ||
		o.HeaderLines != 2 || string(o.Body) != "{}" || o.Status != 0 {
		t.Errorf("command %+v", o)
	}
	if r.MaxPayload() != 8388608 {
		t.Errorf("max payload %d", r.MaxPayload())
	}
}

func TestNATSReaderRefusals(t *testing.T) {
	for _, c := range []struct {
		in   string
		want error
		at   uint64
	}{
		{"PING\n", ErrNATSLineEnd, 4},
		{"PING\rx", ErrNATSLineEnd, 5},
		{"FOO\r\n", ErrNATSVerb, 4},
		{"PING x\r\n", ErrNATSArgs, 7},
		{"MSG s 1\r\n", ErrNATSArgs, 8},
		{"MSG s 1 x\r\n", ErrNATSNumber, 10},
		{"MSG s 1 12345678901\r\n", ErrNATSNumber, 20},
		{"HMSG s 1 13 12\r\n", ErrNATSHeaderLen, 15},
		{"HMSG s 1 9 12\r\n", ErrNATSHeaderLen, 14},
		{"HMSG s 1 1025 2000\r\n", ErrNATSHeaderTooLong, 19},
		{"MSG s 1 1048577\r\n", ErrNATSPayload, 16},
		{"MSG s 1 2\r\nabc", ErrNATSPayloadEnd, 13},
		{"HMSG s 1 12 12\r\nNATS/1.1\r\n\r\n\r\n", ErrNATSHeader, 29},
		{"INFO {\r\n", ErrNATSInfo, 7},
		{strings.Repeat("x", NATSLineMax+1), ErrNATSLineTooLong, NATSLineMax},
	} {
		_, err := ReadNATS([]byte(c.in), nil)
		var ne *NATSError
		if !errors.As(err, &ne) || !errors.Is(err, c.want) || ne.At != c.at {
			t.Errorf("%.40q: %v, want %v at %d", c.in, err, c.want, c.at)
		}
		// final: the same refusal again
		if _, err2 := ReadNATS([]byte(c.in), []int{1}); err2 == nil || err2.Error() != err.Error() {
			t.Errorf("%.40q byte at a time: %v, whole %v", c.in, err2, err)
		}
	}
}

// natsSplitLine reads a stream cut at split (two pieces) and returns the
// verdict line, as NATSLine does for the whole.
func natsPiecesLine(stream []byte, pieces []int) string {
	ops, err := ReadNATS(stream, pieces)
	return natsLineOf(ops, err)
}

func TestNATSCorpusSplitEverywhere(t *testing.T) {
	corpus := NATSCorpus(1)
	oks := 0
	for i, c := range corpus {
		whole := NATSLine(c)
		if strings.HasPrefix(whole, "ok") {
			oks++
		}
		for s := 1; s < len(c); s++ {
			r := NewNATSReader()
			var ops []*NATSOp
			var err error
			for _, p := range [][]byte{c[:s], c[s:]} {
				for len(p) > 0 && err == nil {
					var n int
					var op *NATSOp
					n, op, err = r.Feed(p)
					if op != nil {
						ops = append(ops, op)
					}
					p = p[n:]
				}
			}
			if got := natsLineOf(ops, err); got != whole {
				t.Fatalf("case %d cut at %d: %q, whole %q", i, s, got, whole)
			}
		}
		if got := natsPiecesLine(c, []int{1}); got != whole {
			t.Fatalf("case %d byte at a time: %q, whole %q", i, got, whole)
		}
	}
	t.Logf("%d streams (%d accepted) cut at every byte", len(corpus), oks)
	if oks < 40 || len(corpus)-oks < 100 {
		t.Errorf("corpus lopsided: %d accepted of %d", oks, len(corpus))
	}
}

func FuzzNATSReader(f *testing.F) {
	for _, c := range NATSCorpus(2)[:120] {
		f.Add(c, uint8(3))
	}
	f.Fuzz(func(t *testing.T, stream []byte, cut uint8) {
		whole := NATSLine(stream)
		r := rand.New(rand.NewSource(int64(cut)))
		pieces := []int{1 + int(cut)%7, 1 + r.Intn(64), 1}
		if got := natsPiecesLine(stream, pieces); got != whole {
			t.Fatalf("pieces %v: %q, whole %q", pieces, got, whole)
		}
		ops, err := ReadNATS(stream, nil)
		for _, op := range ops {
			if len(op.Body) > NATSBodyKeep || len(op.Header) > NATSHeaderMax || len(op.Reason) > NATSErrMax ||
				len(op.ServerID) > NATSServerIDMax || len(op.Subject) > NATSSubjectMax || len(op.Reply) > NATSSubjectMax {
				t.Fatalf("a bound broken: %+v", op)
			}
			if op.Kind == NATSHMsg && op.HeaderLen > op.Total {
				t.Fatalf("header over total: %+v", op)
			}
		}
		if err != nil && !strings.HasPrefix(whole, "error") {
			t.Fatal(whole)
		}
	})
}

func TestNATSWriters(t *testing.T) {
	b, err := NATSConnect("node-n1", "0123abcd", "dpxe-n1")
	if err != nil {
		t.Fatal(err)
	}
	want := `CONNECT {"verbose":false,"pedantic":false,"lang":"dpxe-kernel","version":"1","protocol":1,"headers":true,"no_responders":true,"name":"dpxe-n1","user":"node-n1","pass":"0123abcd"}` + "\r\n"
	if string(b) != want {
		t.Errorf("CONNECT %q", b)
	}
	if b, _ := NATSConnect("", "", "x"); bytes.Contains(b, []byte("user")) {
		t.Errorf("no credentials: %q", b)
	}
	b, _ = NATSHPub("dpxe.bot.events.3.READY", "_INBOX.n1.3.7", "abc:7", []byte(`{"op":0}`))
	if string(b) != "HPUB dpxe.bot.events.3.READY _INBOX.n1.3.7 32 40\r\nNATS/1.0\r\nNats-Msg-Id: abc:7\r\n\r\n{\"op\":0}\r\n" {
		t.Errorf("HPUB %q", b)
	}
	b, _ = NATSHPub("s", "", "", []byte("hi"))
	if string(b) != "PUB s 2\r\nhi\r\n" {
		t.Errorf("PUB %q", b)
	}
	b, _ = NATSSub("dpxe.bot.commands.3", 9)
	if string(b) != "SUB dpxe.bot.commands.3 9\r\n" {
		t.Errorf("SUB %q", b)
	}
	for _, bad := range []func() error{
		func() error { _, err := NATSConnect("a\"", "p", "n"); return err },
		func() error { _, err := NATSConnect("a", "", "n"); return err },
		func() error { _, err := NATSSub("a b", 1); return err },
		func() error { _, err := NATSSub(strings.Repeat("s", 256), 1); return err },
		func() error { _, err := NATSHPub("s", "r\r\n", "", nil); return err },
		func() error { _, err := NATSHPub("s", "", "id\\", nil); return err },
	} {
		if err := bad(); !errors.Is(err, ErrNATSField) {
			t.Errorf("refusal: %v", err)
		}
	}
}

func TestNATSAccessValidate(t *testing.T) {
	ok := NATSAccess{URLs: []string{"nats://10.0.0.2:4222", "nats://broker-1.lan:4222"}, User: "node-n1", Password: "ab12", App: "bot"}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		mut   func(a *NATSAccess)
		field string
	}{
		{func(a *NATSAccess) { a.URLs = nil }, "nats.urls"},
		{func(a *NATSAccess) { a.URLs = make([]string, 9) }, "nats.urls"},
		{func(a *NATSAccess) { a.URLs[1] = "tcp://x:1" }, "nats.urls[1]"},
		{func(a *NATSAccess) { a.URLs[1] = "tls://x" }, "nats.urls[1]"},
		{func(a *NATSAccess) { a.URLs[0] = "nats://x" }, "nats.urls[0]"},
		{func(a *NATSAccess) { a.URLs[0] = "nats://x:0" }, "nats.urls[0]"},
		{func(a *NATSAccess) { a.URLs[0] = "nats://u:p@x:1" }, "nats.urls[0]"},
		{func(a *NATSAccess) { a.URLs[0] = "nats://[::1]:4222" }, "nats.urls[0]"},
		{func(a *NATSAccess) { a.User = "" }, "nats.user"},
		{func(a *NATSAccess) { a.Password = `a"b` }, "nats.password"},
		{func(a *NATSAccess) { a.App = "b t" }, "nats.app"},
		{func(a *NATSAccess) { a.Skip = make([]string, MaxNATSSkip+1) }, "nats.skip"},
		{func(a *NATSAccess) { a.Skip = []string{"TYPING_START", ""} }, "nats.skip[1]"},
		{func(a *NATSAccess) { a.Skip = []string{"typing_start"} }, "nats.skip[0]"},
		{func(a *NATSAccess) { a.Skip = []string{"READY", "GUILD_CREATE", "A-B"} }, "nats.skip[2]"},
		{func(a *NATSAccess) { a.Skip = []string{strings.Repeat("A", MaxNATSSkipLen+1)} }, "nats.skip[0]"},
	} {
		a := ok
		a.URLs = append([]string(nil), ok.URLs...)
		c.mut(&a)
		var fe *FieldError
		if err := a.Validate(); !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%+v: %v, want field %s", a, err, c.field)
		}
	}
	skip := ok
	skip.Skip = []string{"TYPING_START", "PRESENCE_UPDATE_2", strings.Repeat("Z", MaxNATSSkipLen), "_"}
	for len(skip.Skip) < MaxNATSSkip {
		skip.Skip = append(skip.Skip, "GUILD_CREATE")
	}
	if err := skip.Validate(); err != nil {
		t.Errorf("%d good skip names: %v", len(skip.Skip), err)
	}
	// in an answer: ParseCheckinResponse checks it
	b := []byte(`{"generation":1,"total_shards":1,"assigned":[],"range_start":0,"range_count":0,"pending":[],"lease_seconds":30,"max_concurrency":1,"next_checkin_ms":1,"nats":{"urls":["nats://x:1"],"user":"u","password":"","app":"bot"}}`)
	if _, err := ParseCheckinResponse(b); err == nil || !strings.Contains(err.Error(), "nats.password") {
		t.Errorf("answer with an empty password: %v", err)
	}
	b = []byte(`{"generation":1,"total_shards":1,"assigned":[],"range_start":0,"range_count":0,"pending":[],"lease_seconds":30,"max_concurrency":1,"next_checkin_ms":1,"nats":{"urls":["nats://x:1"],"user":"u","password":"p","app":"bot","skip":["READY","bad name"]}}`)
	if _, err := ParseCheckinResponse(b); err == nil || !strings.Contains(err.Error(), "nats.skip[1]") {
		t.Errorf("answer with a bad skip name: %v", err)
	}
}
