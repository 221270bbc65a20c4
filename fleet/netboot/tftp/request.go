// Package tftp is the read-only TFTP service of the netboot server. The
// transfer engine is pack.ag/tftp; this package owns everything in front of
// it: request parsing, path confinement to the boot roots, refusing writes
// and non-octet modes, and option negotiation limits (blksize clamped to the
// link MTU, RFC 7440 windowsize bounded, timeout range checked).
package tftp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Opcodes (RFC 1350 §5, RFC 2347 for OACK).
const (
	OpRRQ   uint16 = 1
	OpWRQ   uint16 = 2
	OpData  uint16 = 3
	OpAck   uint16 = 4
	OpError uint16 = 5
	OpOACK  uint16 = 6
)

// Error codes (RFC 1350 §5, RFC 2347 for code 8).
const (
	ErrCodeNotDefined       uint16 = 0
	ErrCodeFileNotFound     uint16 = 1
	ErrCodeAccessViolation  uint16 = 2
	ErrCodeIllegalOperation uint16 = 4
	ErrCodeOptionRefused    uint16 = 8
)

// Option names and their legal ranges.
const (
	OptBlksize    = "blksize"    // RFC 2348: 8..65464
	OptTimeout    = "timeout"    // RFC 2349: 1..255 seconds
	OptTsize      = "tsize"      // RFC 2349
	OptWindowsize = "windowsize" // RFC 7440: 1..65535

	MinBlksize = 8
	// DefaultMaxBlksize fits one DATA packet in a 1500-byte Ethernet MTU
	// without IP fragmentation: 1500 - 20 (IPv4) - 8 (UDP) - 4 (TFTP) = 1468
	// (RFC 7440 §4 uses the same figure). BIOS PXE stacks drop fragments.
	DefaultMaxBlksize = 1468
	// DefaultMaxWindowsize bounds RFC 7440 windows; gains level off near 64
	// and some clients misbehave above it.
	DefaultMaxWindowsize = 64
	MaxTimeout           = 255
)

// Errors returned by ParseRequest.
var (
	ErrShortPacket   = errors.New("tftp: packet shorter than a request")
	ErrNotRequest    = errors.New("tftp: opcode is not RRQ or WRQ")
	ErrUnterminated  = errors.New("tftp: request field is not NUL-terminated")
	ErrOddOptions    = errors.New("tftp: option without a value")
	ErrDupOption     = errors.New("tftp: option given twice")
	ErrEmptyFilename = errors.New("tftp: empty file name")
)

// Option is one name/value pair of a request, names lower-cased.
type Option struct{ Name, Value string }

// Request is a parsed RRQ or WRQ.
type Request struct {
	Op       uint16
	Filename string
	Mode     string // lower-cased: "octet", "netascii", "mail"
	Options  []Option
}

// ParseRequest parses a read or write request (RFC 1350 §5 with RFC 2347
// options). It never panics; anything malformed is an error.
func ParseRequest(p []byte) (Request, error) {
	var r Request
	if len(p) < 4 {
		return r, ErrShortPacket
	}
	r.Op = binary.BigEndian.Uint16(p)
	if r.Op != OpRRQ && r.Op != OpWRQ {
		return r, ErrNotRequest
	}
	fields := bytes.Split(p[2:], []byte{0})
	// A well-formed request ends with NUL, so the last field is empty.
	if len(fields) < 3 || len(fields[len(fields)-1]) != 0 {
		return r, ErrUnterminated
	}
	fields = fields[:len(fields)-1]
	r.Filename = string(fields[0])
	if r.Filename == "" {
		return r, ErrEmptyFilename
	}
	r.Mode = strings.ToLower(string(fields[1]))
	opts := fields[2:]
	if len(opts)%2 != 0 {
		return r, ErrOddOptions
	}
	seen := map[string]bool{}
	for i := 0; i < len(opts); i += 2 {
		name := strings.ToLower(string(opts[i]))
		if seen[name] {
			return r, fmt.Errorf("%w: %q", ErrDupOption, name)
		}
		seen[name] = true
		r.Options = append(r.Options, Option{name, string(opts[i+1])})
	}
	return r, nil
}

// Marshal renders r as a request datagram.
func (r Request) Marshal() []byte {
	var b bytes.Buffer
	b.Write([]byte{byte(r.Op >> 8), byte(r.Op)})
	b.WriteString(r.Filename)
	b.WriteByte(0)
	b.WriteString(r.Mode)
	b.WriteByte(0)
	for _, o := range r.Options {
		b.WriteString(o.Name)
		b.WriteByte(0)
		b.WriteString(o.Value)
		b.WriteByte(0)
	}
	return b.Bytes()
}

// Option returns the value of option name and whether it was given.
func (r Request) Option(name string) (string, bool) {
	for _, o := range r.Options {
		if o.Name == name {
			return o.Value, true
		}
	}
	return "", false
}

// Limits are the server's negotiation bounds.
type Limits struct {
	MaxBlksize    int // 0 means DefaultMaxBlksize
	MaxWindowsize int // 0 means DefaultMaxWindowsize
}

// Negotiate returns the options the server will honour for r: blksize and
// windowsize clamped to the limits, timeout and tsize kept when legal, every
// invalid or unknown option dropped (RFC 2347 §3: the server omits options
// it does not accept).
func (l Limits) Negotiate(r Request) []Option {
	maxBlk, maxWin := l.MaxBlksize, l.MaxWindowsize
	if maxBlk <= 0 {
		maxBlk = DefaultMaxBlksize
	}
	if maxWin <= 0 {
		maxWin = DefaultMaxWindowsize
	}
	var out []Option
	for _, o := range r.Options {
		n, err := strconv.Atoi(o.Value)
		if err != nil || n < 0 {
			continue
		}
		switch o.Name {
		case OptBlksize:
			if n < MinBlksize {
				continue
			}
			out = append(out, Option{o.Name, strconv.Itoa(min(n, maxBlk))})
		case OptWindowsize:
			if n < 1 {
				continue
			}
			out = append(out, Option{o.Name, strconv.Itoa(min(n, maxWin))})
		case OptTimeout:
			if n < 1 || n > MaxTimeout {
				continue
			}
			out = append(out, Option{o.Name, strconv.Itoa(n)})
		case OptTsize:
			out = append(out, Option{o.Name, "0"})
		}
	}
	return out
}

// errorPacket renders an ERROR datagram (RFC 1350 §5).
func errorPacket(code uint16, msg string) []byte {
	b := make([]byte, 0, 5+len(msg))
	b = binary.BigEndian.AppendUint16(b, OpError)
	b = binary.BigEndian.AppendUint16(b, code)
	b = append(b, msg...)
	return append(b, 0)
}
