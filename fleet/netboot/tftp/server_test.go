package tftp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	packtftp "pack.ag/tftp"

	"github.com/discord-pxe/dpxe/fleet/netboot/bootfiles"
)

// startServer serves a temporary boot root on 127.0.0.1 and returns its
// address, the root directory and the recorded transfers.
func startServer(t *testing.T, frontend bool) (string, string, func() []Transfer) {
	t.Helper()
	if frontend && os.Geteuid() != 0 {
		t.Skip("the TFTP front-end needs CAP_NET_RAW (run as root)")
	}
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	os.Mkdir(root, 0o755)
	os.WriteFile(filepath.Join(dir, "secret"), []byte("secret"), 0o644)
	os.Symlink("../secret", filepath.Join(root, "escape"))
	os.Mkdir(filepath.Join(root, "sub"), 0o755)
	os.WriteFile(filepath.Join(root, "sub", "inner"), []byte("inner"), 0o644)
	os.Symlink("sub/inner", filepath.Join(root, "inside-link"))
	roots, err := bootfiles.OpenRoots(root)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []Transfer
	s := &Server{Roots: roots, NoFrontend: !frontend, OnTransfer: func(tr Transfer) {
		mu.Lock()
		got = append(got, tr)
		mu.Unlock()
	}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, conn) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Serve did not return after cancel")
		}
		roots.Close()
	})
	return conn.LocalAddr().String(), root, func() []Transfer {
		mu.Lock()
		defer mu.Unlock()
		return append([]Transfer(nil), got...)
	}
}

// exchange sends one request and returns the first reply datagram.
func exchange(t *testing.T, addr string, req []byte) []byte {
	t.Helper()
	c, err := net.Dial("udp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Reply comes from a new port, so listen unconnected on our port.
	local := c.LocalAddr().(*net.UDPAddr)
	c.Close()
	l, err := net.ListenUDP("udp4", local)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dst, _ := net.ResolveUDPAddr("udp4", addr)
	if _, err := l.WriteToUDP(req, dst); err != nil {
		t.Fatal(err)
	}
	l.SetReadDeadline(time.Now().Add(3 * time.Second))
	buf := make([]byte, 65536)
	n, from, err := l.ReadFromUDP(buf)
	if err != nil {
		t.Fatalf("no reply: %v", err)
	}
	// Abort a started transfer politely.
	l.WriteToUDP(errorPacket(ErrCodeNotDefined, "test done"), from)
	return buf[:n]
}

func rrq(name, mode string, opts ...string) []byte {
	r := Request{Op: OpRRQ, Filename: name, Mode: mode}
	for i := 0; i+1 < len(opts); i += 2 {
		r.Options = append(r.Options, Option{opts[i], opts[i+1]})
	}
	return r.Marshal()
}

func TestRefusals(t *testing.T) {
	addr, _, _ := startServer(t, true)
	cases := []struct {
		name string
		req  []byte
		code uint16
	}{
		{"dotdot", rrq("../secret", "octet"), ErrCodeAccessViolation},
		{"dotdot inside", rrq("sub/../../secret", "octet"), ErrCodeAccessViolation},
		{"absolute", rrq("/etc/passwd", "octet"), ErrCodeAccessViolation},
		{"backslash", rrq("..\\secret", "octet"), ErrCodeAccessViolation},
		{"symlink out of root", rrq("escape", "octet"), ErrCodeAccessViolation},
		{"directory", rrq("sub", "octet"), ErrCodeAccessViolation},
		{"missing", rrq("nothere", "octet"), ErrCodeFileNotFound},
		{"netascii", rrq("sub/inner", "netascii"), ErrCodeIllegalOperation},
		{"write", Request{Op: OpWRQ, Filename: "new", Mode: "octet"}.Marshal(), ErrCodeAccessViolation},
		{"unterminated", []byte("\x00\x01kernel.bin\x00octet"), ErrCodeIllegalOperation},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := exchange(t, addr, c.req)
			if len(p) < 4 || binary.BigEndian.Uint16(p) != OpError {
				t.Fatalf("reply %q is not an ERROR", p)
			}
			if code := binary.BigEndian.Uint16(p[2:]); code != c.code {
				t.Fatalf("error code %d (%q), want %d", code, p[4:], c.code)
			}
		})
	}
}

func TestOptionClamping(t *testing.T) {
	addr, root, _ := startServer(t, true)
	data := make([]byte, 100_000)
	rand.Read(data)
	os.WriteFile(filepath.Join(root, "kernel.bin"), data, 0o644)
	cases := []struct {
		opts []string
		want map[string]string
	}{
		{[]string{"blksize", "9000", "windowsize", "500", "tsize", "0"},
			map[string]string{"blksize": "1468", "windowsize": "64", "tsize": "100000"}},
		{[]string{"blksize", "1024", "windowsize", "16", "timeout", "3"},
			map[string]string{"blksize": "1024", "windowsize": "16", "timeout": "3"}},
		{[]string{"blksize", "4", "timeout", "0", "bogus", "1", "tsize", "0"},
			map[string]string{"tsize": "100000"}},
	}
	for i, c := range cases {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			p := exchange(t, addr, rrq("kernel.bin", "octet", c.opts...))
			if binary.BigEndian.Uint16(p) != OpOACK {
				t.Fatalf("reply %q is not an OACK", p)
			}
			got := map[string]string{}
			f := bytes.Split(p[2:len(p)-1], []byte{0})
			for j := 0; j+1 < len(f); j += 2 {
				got[string(f[j])] = string(f[j+1])
			}
			if len(got) != len(c.want) {
				t.Fatalf("OACK options %v, want %v", got, c.want)
			}
			for k, v := range c.want {
				if got[k] != v {
					t.Fatalf("OACK options %v, want %v", got, c.want)
				}
			}
		})
	}
}

func TestWindowFitsFile(t *testing.T) {
	addr, root, _ := startServer(t, true)
	os.WriteFile(filepath.Join(root, "small.bin"), make([]byte, 10*1468+1), 0o644)
	p := exchange(t, addr, rrq("small.bin", "octet", "blksize", "1468", "windowsize", "64"))
	if binary.BigEndian.Uint16(p) != OpOACK || !bytes.Contains(p, []byte("windowsize\x0011\x00")) {
		t.Fatalf("OACK %q: want windowsize 11 for an 11-block file", p)
	}
}

func TestRetransmittedRequestStartsOneTransfer(t *testing.T) {
	addr, root, _ := startServer(t, true)
	os.WriteFile(filepath.Join(root, "kernel.bin"), make([]byte, 5000), 0o644)
	l, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dst, _ := net.ResolveUDPAddr("udp4", addr)
	req := rrq("kernel.bin", "octet", "blksize", "1468", "tsize", "0")
	l.WriteToUDP(req, dst)
	l.WriteToUDP(req, dst) // the client's retransmission
	buf := make([]byte, 2048)
	sources := map[string]bool{}
	for {
		l.SetReadDeadline(time.Now().Add(1500 * time.Millisecond))
		n, from, err := l.ReadFromUDP(buf)
		if err != nil {
			break
		}
		if binary.BigEndian.Uint16(buf[:n]) == OpOACK {
			sources[from.String()] = true
		}
	}
	if len(sources) != 1 {
		t.Fatalf("OACKs from %d transfer ports, want 1: %v", len(sources), sources)
	}
}

// fetchOn downloads with req from the fixed socket l (lock-step, no
// windowsize) and returns the bytes received.
func fetchOn(t *testing.T, l *net.UDPConn, dst *net.UDPAddr, req []byte) int {
	t.Helper()
	if _, err := l.WriteToUDP(req, dst); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2048)
	total := 0
	for {
		l.SetReadDeadline(time.Now().Add(3 * time.Second))
		n, from, err := l.ReadFromUDP(buf)
		if err != nil {
			t.Fatalf("after %d bytes: %v", total, err)
		}
		switch binary.BigEndian.Uint16(buf[:n]) {
		case OpOACK:
			l.WriteToUDP([]byte{0, 4, 0, 0}, from)
		case OpData:
			total += n - 4
			l.WriteToUDP([]byte{0, 4, buf[2], buf[3]}, from)
			if n-4 < 512 {
				return total
			}
		default:
			t.Fatalf("after %d bytes: reply %q", total, buf[:n])
		}
	}
}

// A client may reuse its port for the next transfer at once (firmware with
// a fixed port, or an ephemeral port the OS hands out again): a request
// identical to one whose transfer has finished is a new transfer, not a
// retransmission.
func TestSamePortNextTransfer(t *testing.T) {
	addr, root, _ := startServer(t, true)
	os.WriteFile(filepath.Join(root, "kernel.bin"), make([]byte, 3000), 0o644)
	l, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dst, _ := net.ResolveUDPAddr("udp4", addr)
	req := rrq("kernel.bin", "octet")
	for i := 0; i < 3; i++ {
		if n := fetchOn(t, l, dst, req); n != 3000 {
			t.Fatalf("transfer %d: %d bytes, want 3000", i+1, n)
		}
	}
}

func TestDownloads(t *testing.T) {
	for _, frontend := range []bool{true, false} {
		t.Run("frontend="+strconv.FormatBool(frontend), func(t *testing.T) {
			addr, root, transfers := startServer(t, frontend)
			data := make([]byte, 3*1468*64+17)
			rand.Read(data)
			os.WriteFile(filepath.Join(root, "kernel.bin"), data, 0o644)
			for _, o := range []struct{ blk, win int }{{512, 1}, {1468, 16}, {1468, 64}} {
				c, err := packtftp.NewClient(packtftp.ClientBlocksize(o.blk), packtftp.ClientWindowsize(o.win), packtftp.ClientTransferSize(true))
				if err != nil {
					t.Fatal(err)
				}
				resp, err := c.Get("tftp://" + addr + "/kernel.bin")
				if err != nil {
					t.Fatalf("blksize %d windowsize %d: %v", o.blk, o.win, err)
				}
				got, err := io.ReadAll(resp)
				if err != nil || !bytes.Equal(got, data) {
					t.Fatalf("blksize %d windowsize %d: %d bytes, err %v; content differs", o.blk, o.win, len(got), err)
				}
				if sz, err := resp.Size(); err != nil || sz != int64(len(data)) {
					t.Fatalf("tsize %d %v", sz, err)
				}
			}
			// The symlink that stays inside the root is served.
			c, _ := packtftp.NewClient()
			resp, err := c.Get("tftp://" + addr + "/inside-link")
			if err != nil {
				t.Fatal(err)
			}
			if b, _ := io.ReadAll(resp); string(b) != "inner" {
				t.Fatalf("inside-link = %q", b)
			}
			deadline := time.Now().Add(3 * time.Second)
			for len(transfers()) < 4 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			tr := transfers()
			if len(tr) < 4 || tr[0].Bytes != int64(len(data)) || tr[0].Err != nil || tr[0].File != "kernel.bin" {
				t.Fatalf("transfers = %+v", tr)
			}
		})
	}
}
