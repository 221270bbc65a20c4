package appliance

import "encoding/binary"

// The committed case files of the TLS and X.509 self-tests (x509chain,
// tlscert, tlsauth, tlsflight) and the kernel's vector sections made from
// them share one little-endian wire: fixed-size fields, blobs (a u32
// length and the bytes) and lists of blobs (a u8 count, then each blob).
// A case that names a server starts with its time and host: u64 Unix
// seconds, u16 length and the name. caseWriter and caseReader write and
// read these pieces; each Encode/Decode pair says its case's order.

// caseWriter appends the pieces of a case file.
type caseWriter struct{ out []byte }

func (w *caseWriter) bytes(b []byte) { w.out = append(w.out, b...) }

func (w *caseWriter) byte(v byte) { w.out = append(w.out, v) }

func (w *caseWriter) blob(b []byte) {
	w.out = binary.LittleEndian.AppendUint32(w.out, uint32(len(b)))
	w.out = append(w.out, b...)
}

func (w *caseWriter) list(l [][]byte) {
	w.out = append(w.out, byte(len(l)))
	for _, b := range l {
		w.blob(b)
	}
}

func (w *caseWriter) timeHost(now int64, host string) {
	w.out = binary.LittleEndian.AppendUint64(w.out, uint64(now))
	w.out = binary.LittleEndian.AppendUint16(w.out, uint16(len(host)))
	w.out = append(w.out, host...)
}

// caseReader takes the pieces of a case file in order; a file that ends
// inside a piece is errChainCorpus. The slices it returns alias the file.
type caseReader struct{ b []byte }

func (r *caseReader) more() bool { return len(r.b) > 0 }

func (r *caseReader) take(n int) ([]byte, error) {
	if n < 0 || len(r.b) < n {
		return nil, errChainCorpus
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v, nil
}

func (r *caseReader) byte() (byte, error) {
	v, err := r.take(1)
	if err != nil {
		return 0, err
	}
	return v[0], nil
}

func (r *caseReader) blob() ([]byte, error) {
	l, err := r.take(4)
	if err != nil {
		return nil, err
	}
	return r.take(int(binary.LittleEndian.Uint32(l)))
}

func (r *caseReader) list() ([][]byte, error) {
	n, err := r.byte()
	if err != nil {
		return nil, err
	}
	var l [][]byte
	for range int(n) {
		b, err := r.blob()
		if err != nil {
			return nil, err
		}
		l = append(l, b)
	}
	return l, nil
}

func (r *caseReader) timeHost() (int64, string, error) {
	h, err := r.take(10)
	if err != nil {
		return 0, "", err
	}
	host, err := r.take(int(binary.LittleEndian.Uint16(h[8:])))
	if err != nil {
		return 0, "", err
	}
	return int64(binary.LittleEndian.Uint64(h)), string(host), nil
}
