package appliance

import "encoding/binary"

// The "tls13-post" digest: post-handshake handshake records, well formed
// and not (KeyUpdate with each request value, bodies too short or too
// long, a message after a KeyUpdate, tickets, messages that never come
// after the handshake, random bytes), fed one by one to TLSPostHandshake
// and to the kernel's tls_post_handshake on one connection whose keys
// chain through every accepted KeyUpdate. Both must name the same
// verdict, send the same bytes and end with the same traffic secrets.

// tlsPostShared is the connection's (ECDHE) shared secret: 0, 1, ... 31.
func tlsPostShared() []byte {
	b := make([]byte, tlsHashLen)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}

// TLSPostCases is the corpus: fixed cases, then 48 of random bytes (a
// splitmix64 stream): r = next(); length r & 15; the first byte 24
// (KeyUpdate) when r>>8 & 3 is 0, 4 (NewSessionTicket) when 1, else
// random; the rest from the stream.
func TLSPostCases() [][]byte {
	ku := func(v byte) []byte { return []byte{tlsHSKeyUpdate, 0, 0, 1, v} }
	cases := [][]byte{
		{},
		{tlsHSNewSessionTicket, 0, 0, 0},
		ku(0),
		ku(1),
		{tlsHSKeyUpdate, 0, 0, 0},
		{tlsHSKeyUpdate, 0, 0, 2, 0, 0},
		ku(2),
		ku(255),
		append(ku(0), tlsHSNewSessionTicket, 0, 0, 0),
		append([]byte{tlsHSNewSessionTicket, 0, 0, 0}, ku(1)...),
		{tlsHSKeyUpdate, 0, 0},
		{tlsHSKeyUpdate, 0, 0, 5, 1},
		{tlsHSKeyUpdate, 0xff, 0xff, 0xff, 1},
		append([]byte{tlsHandshakeFinished, 0, 0, 32}, make([]byte, 32)...),
		{TLSHSClientHello, 0, 0, 1, 0},
		{tlsHSNewSessionTicket, 0, 0, 3, 1, 2, 3, tlsHSNewSessionTicket, 0, 0, 0},
		{tlsHSNewSessionTicket, 0, 0, 3, 1, 2},
		ku(1),
		ku(0),
	}
	rng := &splitmix64{state: 0x706f7374}
	for i := 0; i < 48; i++ {
		r := rng.next()
		c := make([]byte, r&15)
		fillRandom(rng, c)
		if len(c) > 0 {
			switch r >> 8 & 3 {
			case 0:
				c[0] = tlsHSKeyUpdate
			case 1:
				c[0] = tlsHSNewSessionTicket
			}
		}
		cases = append(cases, c)
	}
	return cases
}

// TLSPostSection is the kernel's 'TLSPOST ' vector section: per case a
// u32 length (little-endian) and the bytes.
func TLSPostSection() []byte {
	var out []byte
	for _, c := range TLSPostCases() {
		out = binary.LittleEndian.AppendUint32(out, uint32(len(c)))
		out = append(out, c...)
	}
	return out
}

// TLSPostDigest is the "tls13-post" digest: a ChaCha20-Poly1305 client
// connection (empty transcript, tlsPostShared, application keys active);
// per case the verdict's name ("ok" when accepted; each byte, then its
// length), the bytes to send (digestBytes), the KeyUpdates taken, and the
// read and write traffic secrets (digestBytes).
func TLSPostDigest() uint64 {
	c, err := NewTLS13(TLSSuiteChaCha20Poly1305SHA256, TLSClient)
	if err != nil {
		panic(err)
	}
	c.HandshakeSecrets(tlsPostShared())
	c.ApplicationSecrets()
	c.ActivateRead()
	c.ActivateWrite()
	d := newDigest()
	for _, content := range TLSPostCases() {
		reply, err := TLSPostHandshake(c, content)
		name := "ok"
		if err != nil {
			name = err.Error()
		}
		for i := 0; i < len(name); i++ {
			d.add(uint64(name[i]))
		}
		d.add(uint64(len(name)))
		digestBytes(&d, reply)
		d.add(uint64(c.KeyUpdates))
		digestBytes(&d, c.Read.Secret)
		digestBytes(&d, c.Write.Secret)
	}
	return uint64(d)
}
