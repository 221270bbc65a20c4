package metrics_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
	packtftp "pack.ag/tftp"

	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/metrics"
	"github.com/discord-pxe/dpxe/fleet/netboot"
	"github.com/discord-pxe/dpxe/fleet/netboot/dhcp"
	"github.com/discord-pxe/dpxe/fleet/netboot/stats"
	"github.com/discord-pxe/dpxe/internal/freeport"
)

// TestNetbootCounters drives real exchanges with the netboot services over
// loopback, all counting into one stats.Counters, and reads the counts
// from a scrape: a PXE client's DHCP request answered on port 4011's code
// path (dhcp.Handler.Serve on a UDP socket) and a BOOTREPLY it refuses as
// invalid; a TFTP download and a refused TFTP write; and HTTP boot
// requests (an iPXE script, the kernel, a missing file, another host).
func TestNetbootCounters(t *testing.T) {
	f := newFleet(t, controller.Config{TotalShards: 4})
	m := metrics.New(f.c, metrics.Options{})
	counters := stats.New()
	m.SetNetboot(counters)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lo := netip.MustParseAddr("127.0.0.1")

	// DHCP: the handler's Serve on a loopback socket, as if on port 4011
	// (where the reply goes back to the sender).
	h, err := dhcp.New(ctx, dhcp.Config{Mode: dhcp.Proxy, ServerIP: lo, Stats: counters}, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	dconn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	dhcpDone := make(chan error, 1)
	go func() { dhcpDone <- h.Serve(ctx, dconn, dhcp.PXEServerPort) }()
	client, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	req, err := dhcpv4.New(dhcpv4.WithHwAddr(net.HardwareAddr{0x52, 0x54, 0, 0, 0, 1}),
		dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest),
		dhcpv4.WithOption(dhcpv4.OptClassIdentifier("PXEClient:Arch:00000:UNDI:002001")),
		dhcpv4.WithOption(dhcpv4.OptClientArch(iana.INTEL_X86PC)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.WriteTo(req.ToBytes(), dconn.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	client.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 1500)
	replyLen, _, err := client.ReadFrom(buf)
	if err != nil {
		t.Fatalf("no DHCP reply: %v", err)
	}
	if r, err := dhcpv4.FromBytes(buf[:replyLen]); err != nil || r.MessageType() != dhcpv4.MessageTypeAck || r.BootFileName != "undionly.kpxe" {
		t.Fatalf("DHCP reply %v: %v", r, err)
	}
	bad := *req
	bad.OpCode = dhcpv4.OpcodeBootReply
	if _, err := client.WriteTo(bad.ToBytes(), dconn.LocalAddr()); err != nil {
		t.Fatal(err)
	}

	// TFTP and HTTP: the netboot server.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "kernel.bin"), []byte("KERNEL"), 0o644); err != nil {
		t.Fatal(err)
	}
	inv := f.st.Netboot()
	tftpAddr, httpAddr := freeport.Addr(t), freeport.Addr(t)
	s, err := netboot.New(ctx, netboot.Config{ServerIP: lo, TFTPAddr: tftpAddr, HTTPAddr: httpAddr, BootDir: dir,
		IPXEDir: t.TempDir(), Controller: "http://127.0.0.1:9", Stats: counters}, inv, inv)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	base := "http://" + httpAddr
	get := func(path, host string) (int, int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			r, _ := http.NewRequest("GET", base+path, nil)
			if host != "" {
				r.Host = host
			}
			resp, err := http.DefaultClient.Do(r)
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				return resp.StatusCode, len(b)
			}
			if time.Now().After(deadline) {
				t.Fatalf("GET %s: %v", path, err)
			}
		}
	}
	code, scriptLen := get("/boot/52-54-00-00-00-01.ipxe", "")
	if code != 200 || scriptLen == 0 {
		t.Fatalf("script: %d, %d bytes", code, scriptLen)
	}
	if code, n := get("/boot/kernel.bin", ""); code != 200 || n != 6 {
		t.Fatalf("kernel: %d, %d bytes", code, n)
	}
	if code, _ := get("/boot/missing.bin", ""); code != 404 {
		t.Fatalf("missing file: %d", code)
	}
	if code, _ := get("/boot/kernel.bin", "elsewhere.example"); code != http.StatusMisdirectedRequest {
		t.Fatalf("another host: %d", code)
	}
	tc, _ := packtftp.NewClient()
	resp, err := tc.Get("tftp://" + tftpAddr + "/kernel.bin")
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(resp); string(b) != "KERNEL" {
		t.Fatalf("tftp got %q", b)
	}
	want := []string{
		`dpxe_netboot_requests_total{service="dhcp"} 2`,
		`dpxe_netboot_answers_total{service="dhcp"} 1`,
		`dpxe_netboot_served_bytes_total{service="dhcp"} ` + strconv.Itoa(replyLen),
		`dpxe_netboot_refusals_total{reason="invalid",service="dhcp"} 1`,
		`dpxe_netboot_refusals_total{reason="unanswered",service="dhcp"} 0`,
		`dpxe_netboot_requests_total{service="http"} 4`,
		`dpxe_netboot_answers_total{service="http"} 2`,
		`dpxe_netboot_served_bytes_total{service="http"} ` + strconv.Itoa(scriptLen+6),
		`dpxe_netboot_refusals_total{reason="not_found",service="http"} 1`,
		`dpxe_netboot_refusals_total{reason="misdirected",service="http"} 1`,
		`dpxe_netboot_errors_total{service="http"} 0`,
		`dpxe_netboot_answers_total{service="tftp"} 1`,
		`dpxe_netboot_served_bytes_total{service="tftp"} 6`,
	}
	if os.Geteuid() == 0 { // the TFTP front-end (raw socket) refuses writes itself
		if err := tc.Put("tftp://"+tftpAddr+"/kernel.bin", bytes.NewReader([]byte("x")), 1); err == nil {
			t.Fatal("TFTP write accepted")
		}
		want = append(want, `dpxe_netboot_requests_total{service="tftp"} 2`, `dpxe_netboot_refusals_total{reason="write",service="tftp"} 1`)
	} else {
		t.Log("not root: TFTP runs without its front-end; the refused write is not checked")
		want = append(want, `dpxe_netboot_requests_total{service="tftp"} 1`)
	}
	// The TFTP transfer is counted when the server's side of it ends,
	// which may be just after the client has its bytes: poll the scrape.
	var missing []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		text := string(scrape(t, m))
		missing = missing[:0]
		for _, w := range want {
			if !strings.Contains(text, w+"\n") {
				missing = append(missing, w)
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("scrape lacks %q:\n%s", missing, grepLines(text, "dpxe_netboot_"))
		}
	}
	// The names and help pass Prometheus' own linter.
	promtool(t, bytes.NewReader(scrape(t, m)), "check", "metrics")
	cancel()
	for _, ch := range []chan error{dhcpDone, served} {
		select {
		case err := <-ch:
			if err != nil {
				t.Errorf("service after cancel: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a service did not stop")
		}
	}
}

func grepLines(text, prefix string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
