package appliance

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand"
	"strings"
)

// NATSCorpus makes the NATS reader's test streams from a seed: what a
// server sends a node (INFO as nats-server 2.x writes it, PING, +OK,
// -ERR, MSG and HMSG of commands, PubAcks, duplicates, error acks and 503
// no-responders replies, several operations in one stream), the edges of
// every refusal, and mutations of them (cut short, a byte changed, a byte
// inserted), so that refusals at every place are exercised.
func NATSCorpus(seed int64) [][]byte {
	r := rand.New(rand.NewSource(seed))
	var base [][]byte
	add := func(s string) { base = append(base, []byte(s)) }
	info := `INFO {"server_id":"NCXJ4EXAMPLE7Q","server_name":"dpxe","version":"2.10.22","proto":1,"go":"go1.23","host":"127.0.0.1","port":4222,"headers":true,"auth_required":true,"max_payload":8388608,"jetstream":true,"client_id":5,"client_ip":"10.0.2.15","connect_urls":["10.0.2.2:4222"],"xkey":"XA"}` + "\r\n"
	ack := func(seq int, dup bool) string {
		body := fmt.Sprintf(`{"stream":"DPXE_EVENTS_bot","seq":%d`, seq)
		if dup {
			body += `,"duplicate":true`
		}
		body += "}"
		return fmt.Sprintf("MSG _INBOX.n1.%d 2 %d\r\n%s\r\n", seq, len(body), body)
	}
	hmsg := func(subj, reply, hdr, body string) string {
		if reply != "" {
			reply = " " + reply
		}
		return fmt.Sprintf("HMSG %s 1%s %d %d\r\n%s%s\r\n", subj, reply, len(hdr), len(hdr)+len(body), hdr, body)
	}
	cmd := `{"op":3,"d":{"since":null,"activities":[],"status":"idle","afk":false}}`
	add(info)
	add(info + "PING\r\n")
	add(info + "+OK\r\nPONG\r\n" + ack(1, false) + ack(2, false) + ack(2, true))
	add("ping\r\npOnG\r\n+ok\r\n")
	add("-ERR 'Authorization Violation'\r\n")
	add("-ERR 'Permissions Violation for Publish to \"dpxe.bot.events.2.X\"'\r\n")
	add("-ERR\r\n")
	add("-ERR '" + strings.Repeat("r", 200) + "'\r\n")
	add("-ERR   'Stale Connection'  \r\n")
	add(ack(7, false))
	add("MSG _INBOX.x 2 98\r\n" + `{"error":{"code":503,"err_code":10077,"description":"nats: store failed"},"stream":"DPXE_EVENTS_bot"}` + "\r\n")
	add("MSG a 1 14\r\n" + `{"seq":3,"x":1}` + "\r\n")
	add("MSG a 1 15\r\n" + `{"stream":"S\"x"}` + "\r\n")
	add("MSG a 1 0\r\n\r\n")
	add("MSG\ta\t1\t\t5\r\nhello\r\n")
	add("msg dpxe.bot.commands.3 9 _INBOX.w.7 " + fmt.Sprint(len(cmd)) + "\r\n" + cmd + "\r\n")
	add(hmsg("dpxe.bot.commands.3", "_INBOX.w.8", "NATS/1.0\r\nNats-Msg-Id: a:1\r\nX-Trace: 1 2 3\r\n\r\n", cmd))
	add(hmsg("_INBOX.n1.9", "", "NATS/1.0 503\r\n\r\n", ""))
	add(hmsg("_INBOX.n1.9", "", "NATS/1.0 503 No Responders\r\n\r\n", ""))
	add(hmsg("_INBOX.n1.9", "", "NATS/1.0 408 Request Timeout\r\nNats-Pending-Messages: 1\r\n\r\n", ""))
	add(hmsg("s", "", "NATS/1.0\r\n\r\n", "x"))
	add(hmsg("s", "", "NATS/1.0 50\r\n\r\n", ""))
	add(hmsg("s", "", "NATS/1.0 5033\r\n\r\n", ""))
	add(hmsg("s", "", "NATS/1.1\r\n\r\n", ""))
	add(hmsg("s", "", "NATS/1.0\r\nNo-Colon\r\n\r\n", ""))
	add(hmsg("s", "", "NATS/1.0\r\n: empty\r\n\r\n", ""))
	add(hmsg("s", "", "NATS/1.0\r\nA B: c\r\n\r\n", ""))
	add(hmsg("s", "", "NATS/1.0\r\nA:\n\r\n\r\n", ""))
	add(hmsg("s", "", "NATS/1.0\r\nA: b\r\n\r\nX\r\n", ""))
	add(hmsg("s", "", "NATS/1.0\r\n"+strings.Repeat("K: v\r\n", 200)+"\r\n", ""))
	add("HMSG s 1 9 9\r\nNATS/1.0\r\r\n")
	add("HMSG s 1 13 12\r\nNATS/1.0\r\n\r\n\r\n")
	add("HMSG s 1 12\r\n")
	add("HMSG s 1 x 12\r\n")
	add("MSG s 1 1048577\r\n")
	add("MSG s 1 1048576\r\n")
	add(info + "MSG s 1 8388609\r\n")
	add(`INFO {"max_payload":10}` + "\r\nMSG s 1 11\r\n")
	add(`INFO {"max_payload":10}` + "\r\nMSG s 1 10\r\n0123456789\r\n")
	add(`INFO {"max_payload":0,"headers":false}` + "\r\n")
	add(`INFO {"headers":true,"tls_required":true,"max_payload":1048576}` + "\r\n")
	add(`INFO {"tls_required":"true","a":{"tls_required":true}}` + "\r\n")
	add(`INFO {"max_payload":"10","headers":"true","server_id":7}` + "\r\n")
	add(`INFO {"a":{"max_payload":5},"b":[1,{"headers":true}],"server_id":"` + strings.Repeat("i", 64) + `"}` + "\r\n")
	add(`INFO {"server_id":"` + strings.Repeat("i", 65) + `","max_payload":99999999999999999999}` + "\r\n")
	add(`INFO {"server_id":"a\"b","max_payload":12}` + "\r\n")
	add("INFO {}\r\n")
	add("INFO\r\n")
	add("INFO {\"a\":1\r\n")
	add("INFO {\"a\":1}}\r\n")
	add("INFO {\"a\":1} x\r\n")
	add("INFO [1]\r\n")
	add("MSG s 1 4294967295\r\n")
	add("MSG s 4294967296 1\r\nx\r\n")
	add("MSG s 01 1\r\nx\r\n")
	add("MSG s -1 1\r\nx\r\n")
	add("MSG s 1 r 1 extra\r\nx\r\n")
	add("MSG s 1\r\n")
	add("MSG " + strings.Repeat("s", 255) + " 1 " + strings.Repeat("r", 255) + " 1\r\nx\r\n")
	add("MSG " + strings.Repeat("s", 256) + " 1 1\r\nx\r\n")
	add("MSG s 1 2\r\nabc\r\n")
	add("MSG s 1 2\r\na\r\n")
	add("MSG s 1 2\r\nab\n")
	add("MSG s 1 2\r\nab\rx")
	add("PING x\r\n")
	add("PINGS\r\n")
	add("PUB s 1\r\n")
	add("\r\n")
	add("PING\n")
	add("PING\rx")
	add("PING\r\r\n")
	add(strings.Repeat("x", NATSLineMax) + "\r\n")
	add("-ERR " + strings.Repeat("x", NATSLineMax) + "\r\n")
	add("MSG s 1 5000\r\n" + strings.Repeat("b", 5000) + "\r\n")
	// long streams: many operations in one
	for i := 0; i < 4; i++ {
		var b strings.Builder
		b.WriteString(info)
		for j := 0; j < 20+r.Intn(40); j++ {
			switch r.Intn(5) {
			case 0:
				b.WriteString("PING\r\n")
			case 1:
				b.WriteString(ack(1+r.Intn(1000), r.Intn(4) == 0))
			case 2:
				b.WriteString(hmsg("_INBOX.n1.x", "", "NATS/1.0 503\r\n\r\n", ""))
			default:
				b.WriteString(hmsg(fmt.Sprintf("dpxe.bot.commands.%d", r.Intn(16)), fmt.Sprintf("_INBOX.w.%d", r.Intn(1e6)), "NATS/1.0\r\nA: b\r\n\r\n", cmd))
			}
		}
		add(b.String())
	}
	out := append([][]byte(nil), base...)
	const mut = " \t\r\n:01'\"{}x-+HMSGPINFO"
	for _, m := range base {
		for k := 0; k < 3; k++ {
			c := append([]byte(nil), m...)
			i := r.Intn(len(c))
			switch k {
			case 0:
				c = c[:i]
			case 1:
				c[i] = mut[r.Intn(len(mut))]
			case 2:
				c = append(c[:i:i], append([]byte{mut[r.Intn(len(mut))]}, c[i:]...)...)
			}
			out = append(out, c)
		}
	}
	return out
}

// NATSModuleTag tags the NATS reader's cases in the self-test module.
const NATSModuleTag = "NATSRD01"

// NATSSection is the module payload: u32 count, then u32 length and the
// stream per case.
func NATSSection(corpus [][]byte) []byte {
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(corpus)))
	for _, c := range corpus {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(c)))
		b = append(b, c...)
	}
	return b
}

// ParseNATSLines reads the kernel's "nats case N LINE" lines, in order from
// 0, and the "nats FAIL what" lines.
func ParseNATSLines(serial string) (cases []string, fails []string, err error) {
	for _, line := range strings.Split(serial, "\n") {
		line = strings.TrimRight(line, "\r")
		rest, ok := strings.CutPrefix(line, "nats ")
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
		if num != fmt.Sprint(len(cases)) {
			return nil, nil, fmt.Errorf("nats: case line %q out of order", line)
		}
		cases = append(cases, tail)
	}
	return cases, fails, nil
}

// NATSWriterCase is one call of a writer for the kernel's self-test:
// Kind 1 NATSConnect(User, Pass, Name), 2 NATSSub(Subject, SID),
// 3 NATSHPub(Subject, Reply, MsgID, Body).
type NATSWriterCase struct {
	Kind                                    byte
	User, Pass, Name, Subject, Reply, MsgID string
	SID                                     uint32
	Body                                    []byte
}

// NATSWriterLine is the self-test's line for a writer case (after "natsw
// case N "): "ok len=L rec=H" (FNV-1a 64 of the bytes written) or
// "error FIELD".
func NATSWriterLine(c NATSWriterCase) string {
	var b []byte
	var err error
	switch c.Kind {
	case 1:
		b, err = NATSConnect(c.User, c.Pass, c.Name)
	case 2:
		b, err = NATSSub(c.Subject, c.SID)
	default:
		b, err = NATSHPub(c.Subject, c.Reply, c.MsgID, c.Body)
	}
	if err != nil {
		var fe *NATSFieldError
		errors.As(err, &fe)
		return "error " + fe.Field
	}
	h := uint64(fnvOffset64)
	for _, x := range b {
		h ^= uint64(x)
		h *= fnvPrime64
	}
	return fmt.Sprintf("ok len=%d rec=%016x", len(b), h)
}

// NATSWriterCorpus makes writer cases from a seed: what a node sends
// (CONNECT with and without credentials, SUB of command subjects, HPUB of
// dispatches with Msg-Ids and inbox replies, PUB of replies) and every
// refusal (empty, too long, a space, a quote, a backslash, a control
// byte, a byte over 0x7e in each field).
func NATSWriterCorpus(seed int64) []NATSWriterCase {
	r := rand.New(rand.NewSource(seed))
	pw := func() string {
		return fmt.Sprintf("%016x%016x%016x%016x", r.Uint64(), r.Uint64(), r.Uint64(), r.Uint64())
	}
	out := []NATSWriterCase{
		{Kind: 1, Name: "dpxe-n1"},
		{Kind: 1, User: "node-compaq-01", Pass: pw(), Name: "dpxe-compaq-01"},
		{Kind: 1, User: "node-x", Pass: "", Name: "n"},
		{Kind: 1, User: "", Pass: "p", Name: "n"},
		{Kind: 1, User: "u", Pass: "p", Name: ""},
		{Kind: 1, User: "u", Pass: "p", Name: strings.Repeat("n", 64)},
		{Kind: 1, User: "u", Pass: "p", Name: strings.Repeat("n", 65)},
		{Kind: 1, User: strings.Repeat("u", 128), Pass: strings.Repeat("p", 128), Name: "n"},
		{Kind: 1, User: strings.Repeat("u", 129), Pass: "p", Name: "n"},
		{Kind: 1, User: "u", Pass: strings.Repeat("p", 129), Name: "n"},
		{Kind: 2, Subject: "dpxe.bot.commands.0", SID: 1},
		{Kind: 2, Subject: "_INBOX.n1.>", SID: 4294967295},
		{Kind: 2, Subject: strings.Repeat("s", 255), SID: 0},
		{Kind: 2, Subject: strings.Repeat("s", 256), SID: 0},
		{Kind: 2, Subject: "", SID: 0},
		{Kind: 3, Subject: "dpxe.bot.events.3.READY", Reply: "_INBOX.n1.3.7", MsgID: "abc:7", Body: []byte(`{"op":0}`)},
		{Kind: 3, Subject: "_INBOX.w.1", Body: []byte(`{"status":"ok","shard":3,"node":"n1"}`)},
		{Kind: 3, Subject: "s", Reply: "r", Body: nil},
		{Kind: 3, Subject: "s", MsgID: "m", Body: nil},
		{Kind: 3, Subject: "s", MsgID: strings.Repeat("m", 200), Body: []byte("x")},
		{Kind: 3, Subject: "s", MsgID: strings.Repeat("m", 201), Body: []byte("x")},
		{Kind: 3, Subject: "s", Reply: strings.Repeat("r", 256), Body: []byte("x")},
		{Kind: 3, Subject: "s", Body: []byte(strings.Repeat("b\r\n", 1500))},
	}
	bad := []string{" ", "\"", "\\", "\x00", "\x7f", "\xff", "\t"}
	for _, c := range bad {
		mk := func() string { return "ab" + c + "cd" }
		out = append(out,
			NATSWriterCase{Kind: 1, User: mk(), Pass: "p", Name: "n"},
			NATSWriterCase{Kind: 1, User: "u", Pass: mk(), Name: "n"},
			NATSWriterCase{Kind: 1, User: "u", Pass: "p", Name: mk()},
			NATSWriterCase{Kind: 2, Subject: mk(), SID: 3},
			NATSWriterCase{Kind: 3, Subject: mk(), Body: []byte("x")},
			NATSWriterCase{Kind: 3, Subject: "s", Reply: mk(), Body: []byte("x")},
			NATSWriterCase{Kind: 3, Subject: "s", MsgID: mk(), Body: []byte("x")})
	}
	for i := 0; i < 60; i++ {
		body := make([]byte, r.Intn(5000))
		r.Read(body)
		c := NATSWriterCase{Kind: 3, Subject: fmt.Sprintf("dpxe.bot.events.%d.MESSAGE_CREATE", r.Uint32()), Body: body}
		if r.Intn(3) > 0 {
			c.Reply = fmt.Sprintf("_INBOX.n%d.%d", r.Intn(100), r.Uint32())
		}
		if r.Intn(4) > 0 {
			c.MsgID = fmt.Sprintf("%x:%d", r.Uint64(), r.Uint32())
		}
		out = append(out, c, NATSWriterCase{Kind: 2, Subject: fmt.Sprintf("dpxe.bot.commands.%d", r.Uint32()), SID: r.Uint32()},
			NATSWriterCase{Kind: 1, User: fmt.Sprintf("node-n%d", r.Intn(1000)), Pass: pw(), Name: fmt.Sprintf("dpxe-%d", r.Intn(1000))})
	}
	return out
}

// NATSWriterModuleTag tags the writer cases in the self-test module.
const NATSWriterModuleTag = "NATSWR01"

// NATSWriterSection is the module payload: u32 count, then per case the
// kind byte, six u32-length-prefixed texts (user, pass, name, subject,
// reply, msg_id), the u32 sid and the u32-length-prefixed body.
func NATSWriterSection(cases []NATSWriterCase) []byte {
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(cases)))
	str := func(s []byte) {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	for _, c := range cases {
		b = append(b, c.Kind)
		for _, s := range []string{c.User, c.Pass, c.Name, c.Subject, c.Reply, c.MsgID} {
			str([]byte(s))
		}
		b = binary.LittleEndian.AppendUint32(b, c.SID)
		str(c.Body)
	}
	return b
}
