package appliance

import (
	"errors"
	"net/netip"
	"strings"
)

// ErrTLSGet means a tlsget= value is not https://HOST[:PORT]/PATH[,NAME].
var ErrTLSGet = errors.New("tlsget must be https://HOST[:PORT]/PATH[,NAME] (HOST A.B.C.D with octets 0-255 or a name of 1-253 bytes of A-Za-z0-9-. in labels of 1-63, port 1-65535 without leading zeros, PATH up to 1024 bytes, NAME 1-253 bytes)")

// TLSGetPathMax and TLSGetNameMax bound a tlsget= value's PATH and NAME, as
// the kernel's TLSG_PATH_MAX and TLS_SNI_NAME_MAX.
const (
	TLSGetPathMax = 1024
	TLSGetNameMax = 253
)

// TLSGetSpec is what a tlsget= value asks the kernel for: one GET of Path
// from Server (or, when Host is set, from the address DNS gives for Host
// and Server's port) over TLS 1.3, with Name as the SNI, the Host header
// and the name the leaf certificate must carry.
type TLSGetSpec struct {
	Server netip.AddrPort // the address is invalid when Host is set
	Host   string         // a host name to look up; "" for an address
	Path   string
	Name   string
}

// ParseTLSGet checks a tlsget= value as the kernel's cfg_value_tlsget
// does: "https://", a HOST up to ':' or '/' of 1-TLSGetNameMax bytes of
// A-Z a-z 0-9 '-' '.' (a dotted quad with ParseStaticIP's octet rules when
// it has only digits and dots, else a host name in labels of 1-63 bytes),
// an optional ':' and port of 1-65535 in decimal without a leading zero
// (443 without), a PATH starting with '/' up to a ',' or the end (at most
// TLSGetPathMax bytes), and optionally ',' and a NAME of 1-TLSGetNameMax
// bytes without a ','. Without NAME the name is the host as written.
func ParseTLSGet(v string) (TLSGetSpec, error) {
	rest, ok := strings.CutPrefix(v, "https://")
	if !ok {
		return TLSGetSpec{}, ErrTLSGet
	}
	end := strings.IndexAny(rest, ":/")
	if end < 0 {
		end = len(rest)
	}
	host, after := rest[:end], rest[end:]
	if host == "" || len(host) > TLSGetNameMax {
		return TLSGetSpec{}, ErrTLSGet
	}
	quad := true
	for i := 0; i < len(host); i++ {
		c := host[i]
		switch {
		case c == '.' || c >= '0' && c <= '9':
		case c == '-' || c|0x20 >= 'a' && c|0x20 <= 'z':
			quad = false
		default:
			return TLSGetSpec{}, ErrTLSGet
		}
	}
	s := TLSGetSpec{Name: host}
	var a netip.Addr
	if quad {
		var rest string
		var err error
		if a, rest, err = parseQuad(host); err != nil || rest != "" {
			return TLSGetSpec{}, ErrTLSGet
		}
	} else {
		for _, label := range strings.Split(host, ".") {
			if label == "" || len(label) > 63 {
				return TLSGetSpec{}, ErrTLSGet
			}
		}
		s.Host = host
	}
	port := uint64(443)
	if strings.HasPrefix(after, ":") {
		after = after[1:]
		i := 0
		port = 0
		for ; i < len(after) && after[i] != '/'; i++ {
			c := after[i]
			if c < '0' || c > '9' || (i == 0 && c == '0') || i == 5 {
				return TLSGetSpec{}, ErrTLSGet
			}
			port = port*10 + uint64(c-'0')
		}
		if i == 0 || i == len(after) || port > 65535 {
			return TLSGetSpec{}, ErrTLSGet
		}
		after = after[i:]
	}
	if !strings.HasPrefix(after, "/") {
		return TLSGetSpec{}, ErrTLSGet
	}
	path, name, named := strings.Cut(after, ",")
	if len(path) > TLSGetPathMax {
		return TLSGetSpec{}, ErrTLSGet
	}
	if named {
		if name == "" || len(name) > TLSGetNameMax || strings.Contains(name, ",") {
			return TLSGetSpec{}, ErrTLSGet
		}
		s.Name = name
	}
	s.Server = netip.AddrPortFrom(a, uint16(port))
	s.Path = path
	return s, nil
}
