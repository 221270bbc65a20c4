// Command tlsbenchclient is the Linux guest's side of
// BenchmarkKernelTLSHandshakeAndBulk32MiB (tools/e2e/kerneltls_bench_test.go):
// the benchmark builds it statically (CGO_ENABLED=0) into a u-root
// initramfs. It reads its job from the kernel command line, so that one
// cached initramfs serves every run:
//
//	tlsbench.get=HOST:PORT[+HOST:PORT...]  servers, fetched in order
//	tlsbench.path=/PATH                    what to GET
//	tlsbench.name=NAME                     SNI and the name the leaf must carry
//	tlsbench.root=BASE64                   the trust anchor's DER (the only root)
//
// For each server it does what the kernel's tlsget= does: one TCP
// connection, a TLS 1.3 handshake offering only x25519 (as the kernel
// does) with chain validation against the root, one GET, the body hashed
// with SHA-256, and prints, timed with the monotonic clock:
//
//	tlsbench: timing addr=HOST:PORT handshake_us=N body_us=N
//	tlsbench: ok addr=HOST:PORT status=N bytes=N sha256=HEX suite=NAME
//
// then, once every server is done, one more handshake with each on a new
// connection, without a request, to show a warm process (the first
// handshake pays for Go's one-time set-ups: tables, FIPS 140 self-tests):
//
//	tlsbench: warm addr=HOST:PORT handshake_us=N
//
// or "tlsbench: failed addr=HOST:PORT err=..." on any error.
// handshake_us runs from the TCP connection's establishment to the
// handshake's end; body_us from the GET's sending to the body's end, hashed.
package main

import (
	"bufio"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

func main() {
	raw, err := os.ReadFile("/proc/cmdline")
	if v := os.Getenv("TLSBENCH_CMDLINE"); v != "" { // a trial on the host
		raw, err = []byte(v), nil
	}
	if err != nil {
		fmt.Printf("tlsbench: failed addr=- err=%v\n", err)
		os.Exit(1)
	}
	args := map[string]string{}
	for _, f := range strings.Fields(string(raw)) {
		if k, v, ok := strings.Cut(f, "="); ok && strings.HasPrefix(k, "tlsbench.") {
			args[strings.TrimPrefix(k, "tlsbench.")] = v
		}
	}
	for _, k := range []string{"get", "path", "name", "root"} {
		if args[k] == "" {
			fmt.Printf("tlsbench: failed addr=- err=tlsbench.%s missing from the command line\n", k)
			os.Exit(1)
		}
	}
	der, err := base64.StdEncoding.DecodeString(args["root"])
	if err != nil {
		fmt.Printf("tlsbench: failed addr=- err=tlsbench.root: %v\n", err)
		os.Exit(1)
	}
	root, err := x509.ParseCertificate(der)
	if err != nil {
		fmt.Printf("tlsbench: failed addr=- err=tlsbench.root: %v\n", err)
		os.Exit(1)
	}
	roots := x509.NewCertPool()
	roots.AddCert(root)
	status := 0
	addrs := strings.Split(args["get"], "+")
	for _, addr := range addrs {
		if err := fetch(addr, args["path"], args["name"], roots); err != nil {
			fmt.Printf("tlsbench: failed addr=%s err=%v\n", addr, err)
			status = 1
		}
	}
	for _, addr := range addrs {
		if status != 0 {
			break
		}
		conn, hs, err := handshake(addr, args["name"], roots)
		if err != nil {
			fmt.Printf("tlsbench: failed addr=%s err=%v\n", addr, err)
			status = 1
			break
		}
		conn.Close()
		fmt.Printf("tlsbench: warm addr=%s handshake_us=%d\n", addr, hs.Microseconds())
	}
	os.Exit(status)
}

// handshake connects to addr and completes a TLS 1.3 handshake, timed
// from the TCP connection's establishment.
func handshake(addr, name string, roots *x509.CertPool) (*tls.Conn, time.Duration, error) {
	c, err := net.DialTimeout("tcp4", addr, 30*time.Second)
	if err != nil {
		return nil, 0, err
	}
	c.SetDeadline(time.Now().Add(10 * time.Minute))
	start := time.Now()
	conn := tls.Client(c, &tls.Config{
		RootCAs:          roots,
		ServerName:       name,
		MinVersion:       tls.VersionTLS13,
		CurvePreferences: []tls.CurveID{tls.X25519}, // the kernel's one key share
	})
	if err := conn.Handshake(); err != nil {
		c.Close()
		return nil, 0, err
	}
	return conn, time.Since(start), nil
}

func fetch(addr, path, name string, roots *x509.CertPool) error {
	conn, hs, err := handshake(addr, name, roots)
	if err != nil {
		return err
	}
	defer conn.Close()
	start := time.Now()
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\nUser-Agent: dpxe-tlsbench\r\n\r\n", path, name); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReaderSize(conn, 1<<16), nil)
	if err != nil {
		return err
	}
	h := sha256.New()
	n, err := io.Copy(h, resp.Body)
	if err != nil {
		return err
	}
	body := time.Since(start)
	fmt.Printf("tlsbench: timing addr=%s handshake_us=%d body_us=%d\n", addr, hs.Microseconds(), body.Microseconds())
	fmt.Printf("tlsbench: ok addr=%s status=%d bytes=%d sha256=%x suite=%s\n", addr, resp.StatusCode, n, h.Sum(nil),
		tls.CipherSuiteName(conn.ConnectionState().CipherSuite))
	return nil
}
