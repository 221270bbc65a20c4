package tftp

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/discord-pxe/dpxe/fleet/netboot/bootfiles"
	"github.com/discord-pxe/dpxe/fleet/netboot/stats"
	packtftp "pack.ag/tftp"
)

// Transfer describes one finished (or failed) read transfer.
type Transfer struct {
	Client   netip.AddrPort
	File     string // as requested
	Bytes    int64  // bytes handed to the engine
	Duration time.Duration
	Err      error // nil when every byte was handed over
	// Probe is set when the client ended the transfer itself before any
	// data: UEFI PXE asks for tsize first and aborts (RFC 2349 use).
	Probe bool
}

// Server is the read-only TFTP service. Set the fields, then call Serve.
// The zero Limits are the defaults (blksize <= 1468, windowsize <= 64).
type Server struct {
	Roots  *bootfiles.Roots
	Limits Limits
	// MaxTransfers bounds concurrent transfers; 0 means 256. A request over
	// the bound gets an error, so a flood cannot exhaust sockets.
	MaxTransfers int
	// OnTransfer, when set, is called after each transfer's data has been
	// handed over (the last ACK may still be outstanding).
	OnTransfer func(Transfer)
	Log        *slog.Logger
	// Stats, when set, counts requests, transfers and their bytes, and
	// refusals by reason (a retransmitted request counts once).
	Stats *stats.Counters

	// NoFrontend serves straight from pack.ag on the public socket, without
	// the request front-end. Options are then not clamped; paths are still
	// confined. Serve falls back to this when raw sockets are unavailable.
	NoFrontend bool

	sem chan struct{}
	// recent remembers requests handed to the engine whose transfer has
	// not ended, so a client's retransmitted RRQ (sent before our OACK
	// reached it) does not start a second transfer. A transfer's end
	// forgets its request: the same client port may then ask again at once.
	recentMu sync.Mutex
	recent   map[netip.AddrPort]handedOver
}

// handedOver is a request handed to the engine.
type handedOver struct {
	pkt string
	at  time.Time
}

// rrqDedupWindow is the longest an identical request from the same client
// port counts as a retransmission, for a transfer that never reported its
// end (the engine refused it before the read handler ran).
const rrqDedupWindow = 2 * time.Second

// duplicate reports whether pkt from client repeats a request whose
// transfer is still running (and was handed over within rrqDedupWindow),
// and remembers it otherwise.
func (s *Server) duplicate(client netip.AddrPort, pkt []byte, now time.Time) bool {
	s.recentMu.Lock()
	defer s.recentMu.Unlock()
	if s.recent == nil {
		s.recent = map[netip.AddrPort]handedOver{}
	}
	if h, ok := s.recent[client]; ok && h.pkt == string(pkt) && now.Sub(h.at) < rrqDedupWindow {
		return true
	}
	if len(s.recent) >= 4096 {
		for k, h := range s.recent {
			if now.Sub(h.at) >= rrqDedupWindow {
				delete(s.recent, k)
			}
		}
	}
	s.recent[client] = handedOver{pkt: string(pkt), at: now}
	return false
}

// transferEnded forgets client's request: its transfer is over.
func (s *Server) transferEnded(client netip.AddrPort) {
	s.recentMu.Lock()
	delete(s.recent, client)
	s.recentMu.Unlock()
}

func (s *Server) log() *slog.Logger {
	if s.Log != nil {
		return s.Log
	}
	return slog.Default()
}

// Serve answers requests arriving on conn (normally UDP port 69) until ctx
// ends or conn fails.
//
// pack.ag/tftp negotiates whatever blksize and windowsize a client asks and
// offers no hook to limit them, so Serve puts a front-end on conn: it parses
// each request, refuses writes, non-octet modes and bad paths itself, clamps
// the options, and hands the rewritten request to the engine, which listens
// on a private loopback socket. The hand-over is a raw IPv4 datagram that
// carries the client's own address as its source, so the engine answers the
// client directly from a fresh port, as RFC 1350 transfers do; nothing is
// relayed. This needs CAP_NET_RAW, which a server on port 69 has anyway;
// without it Serve logs a warning and serves without the front-end.
func (s *Server) Serve(ctx context.Context, conn *net.UDPConn) error {
	n := s.MaxTransfers
	if n <= 0 {
		n = 256
	}
	s.sem = make(chan struct{}, n)
	engine, err := packtftp.NewServer("", packtftp.ServerNet("udp4"), packtftp.ServerRetransmit(6))
	if err != nil {
		return err
	}
	engine.ReadHandler(packtftp.ReadHandlerFunc(s.serveRead))

	raw := -1
	if !s.NoFrontend {
		raw, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
		if err != nil {
			s.log().Warn("tftp: no raw socket; serving without the request front-end (options not clamped)", "err", err)
		}
	}
	if raw < 0 {
		stop := context.AfterFunc(ctx, func() { conn.Close() })
		defer stop()
		err := engine.Serve(conn)
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	defer unix.Close(raw)

	inner, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return fmt.Errorf("tftp: engine socket: %w", err)
	}
	engineErr := make(chan error, 1)
	go func() { engineErr <- engine.Serve(inner) }()
	defer engine.Close()
	innerPort := inner.LocalAddr().(*net.UDPAddr).Port

	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	buf := make([]byte, 2048)
	for {
		n, from, err := conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("tftp: read: %w", err)
		}
		select {
		case err := <-engineErr:
			return fmt.Errorf("tftp: engine stopped: %w", err)
		default:
		}
		pkt, code, msg, why := s.frontend(buf[:n], from)
		if pkt == nil {
			if msg != "" {
				s.Stats.Request(stats.TFTP)
				s.Stats.Refuse(stats.TFTP, why)
				conn.WriteToUDPAddrPort(errorPacket(code, msg), from)
			}
			continue
		}
		if s.duplicate(from, pkt, time.Now()) {
			continue
		}
		if err := inject(raw, from, innerPort, pkt); err != nil {
			s.log().Error("tftp: hand-over to engine failed", "client", from, "err", err)
			conn.WriteToUDPAddrPort(errorPacket(ErrCodeNotDefined, "server error"), from)
		}
	}
}

// frontend decides what to do with one datagram on the public port: either
// a rewritten request for the engine, or an error to send back (code, msg)
// for a refusal (why: a stats reason), or nothing at all (msg == "") for
// stray packets.
func (s *Server) frontend(p []byte, from netip.AddrPort) (req []byte, code uint16, msg, why string) {
	if !from.Addr().Unmap().Is4() {
		return nil, 0, "", ""
	}
	r, err := ParseRequest(p)
	switch {
	case errors.Is(err, ErrNotRequest) || errors.Is(err, ErrShortPacket):
		// ACKs or ERRORs sent to port 69 after a transfer: ignore.
		return nil, 0, "", ""
	case err != nil:
		s.log().Debug("tftp: malformed request", "client", from, "err", err)
		return nil, ErrCodeIllegalOperation, "malformed request", stats.Malformed
	case r.Op == OpWRQ:
		s.log().Info("tftp: write refused", "client", from, "file", r.Filename)
		return nil, ErrCodeAccessViolation, "read-only server", stats.Write
	case r.Mode != "octet":
		return nil, ErrCodeIllegalOperation, "only octet mode is served", stats.Malformed
	}
	if _, err := bootfiles.CleanPath(r.Filename); err != nil {
		s.log().Info("tftp: path refused", "client", from, "file", r.Filename, "err", err)
		return nil, ErrCodeAccessViolation, "access violation", stats.Forbidden
	}
	r.Options = s.Limits.Negotiate(r)
	s.fitWindow(r)
	return r.Marshal(), 0, "", ""
}

// fitWindow lowers a negotiated windowsize to the number of blocks the file
// has: a larger window gains nothing, and the engine allocates buffers in
// proportion to it for every transfer.
func (s *Server) fitWindow(r Request) {
	w, hasW := r.Option(OptWindowsize)
	win, _ := strconv.Atoi(w)
	if !hasW || win <= 1 {
		return
	}
	blk := 512
	if v, ok := r.Option(OptBlksize); ok {
		blk, _ = strconv.Atoi(v)
	}
	f, size, err := s.Roots.Open(r.Filename)
	if err != nil {
		return // the engine answers with the error
	}
	f.Close()
	if blocks := int(size/int64(blk)) + 1; blocks < win {
		for i := range r.Options {
			if r.Options[i].Name == OptWindowsize {
				r.Options[i].Value = strconv.Itoa(blocks)
			}
		}
	}
}

// serveRead is the engine's read handler.
func (s *Server) serveRead(w packtftp.ReadRequest) {
	start := time.Now()
	client := w.Addr().AddrPort()
	tr := Transfer{Client: netip.AddrPortFrom(client.Addr().Unmap(), client.Port()), File: w.Name()}
	s.Stats.Request(stats.TFTP)
	defer func() {
		s.transferEnded(tr.Client)
		tr.Duration = time.Since(start)
		if s.OnTransfer != nil {
			s.OnTransfer(tr)
		}
	}()
	select {
	case s.sem <- struct{}{}:
		defer func() { <-s.sem }()
	default:
		tr.Err = errors.New("too many transfers")
		s.Stats.Refuse(stats.TFTP, stats.Busy)
		w.WriteError(packtftp.ErrCodeNotDefined, "server busy, retry")
		return
	}
	if w.TransferMode() != packtftp.ModeOctet {
		tr.Err = errors.New("not octet mode")
		s.Stats.Refuse(stats.TFTP, stats.Malformed)
		w.WriteError(packtftp.ErrCodeIllegalOperation, "only octet mode is served")
		return
	}
	f, size, err := s.Roots.Open(w.Name())
	if err != nil {
		tr.Err = err
		if errors.Is(err, bootfiles.ErrNotFound) {
			s.Stats.Refuse(stats.TFTP, stats.NotFound)
			w.WriteError(packtftp.ErrCodeFileNotFound, "file not found")
		} else {
			s.Stats.Refuse(stats.TFTP, stats.Forbidden)
			w.WriteError(packtftp.ErrCodeAccessViolation, "access violation")
		}
		s.log().Info("tftp: refused", "client", tr.Client, "file", tr.File, "err", err)
		return
	}
	defer f.Close()
	w.WriteSize(size)
	n, err := io.Copy(w, f)
	tr.Bytes, tr.Err = n, err
	if err != nil && n == 0 && packtftp.IsRemoteError(err) {
		tr.Probe, tr.Err = true, nil // a size probe, answered
		s.Stats.Answer(stats.TFTP, 0)
		return
	}
	if err != nil {
		s.Stats.Error(stats.TFTP, n)
		s.log().Info("tftp: transfer failed", "client", tr.Client, "file", tr.File, "bytes", n, "err", err)
		return
	}
	s.Stats.Answer(stats.TFTP, n)
}

// IPv4 and UDP header constants for the hand-over datagram (RFC 791, RFC 768).
const (
	ipv4HeaderLen = 20
	udpHeaderLen  = 8
	ipVersionIHL  = 0x45 // version 4, 5 words of header
	ipDefaultTTL  = 64
	ipProtoUDP    = 17
)

var injectMu sync.Mutex

// inject sends payload to 127.0.0.1:port as if it came from src. The kernel
// fills in the IPv4 total length, identification and header checksum for
// IPPROTO_RAW sockets; the UDP checksum is optional in IPv4 and left zero.
func inject(fd int, src netip.AddrPort, port int, payload []byte) error {
	pkt := make([]byte, ipv4HeaderLen+udpHeaderLen+len(payload))
	pkt[0] = ipVersionIHL
	binary.BigEndian.PutUint16(pkt[2:], uint16(len(pkt)))
	pkt[8] = ipDefaultTTL
	pkt[9] = ipProtoUDP
	s4 := src.Addr().Unmap().As4()
	copy(pkt[12:16], s4[:])
	copy(pkt[16:20], []byte{127, 0, 0, 1})
	u := pkt[ipv4HeaderLen:]
	binary.BigEndian.PutUint16(u[0:], src.Port())
	binary.BigEndian.PutUint16(u[2:], uint16(port))
	binary.BigEndian.PutUint16(u[4:], uint16(udpHeaderLen+len(payload)))
	copy(u[udpHeaderLen:], payload)
	injectMu.Lock()
	defer injectMu.Unlock()
	return unix.Sendto(fd, pkt, 0, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}})
}
