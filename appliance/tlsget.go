package appliance

import (
	"errors"
	"net/netip"
	"strings"
)

// ErrTLSGet means a tlsget= value is not https://A.B.C.D[:PORT]/PATH[,NAME].
var ErrTLSGet = errors.New("tlsget must be https://A.B.C.D[:PORT]/PATH[,NAME] (octets 0-255, port 1-65535 without leading zeros, PATH up to 1024 bytes, NAME 1-253 bytes)")

// TLSGetPathMax and TLSGetNameMax bound a tlsget= value's PATH and NAME, as
// the kernel's TLSG_PATH_MAX and TLS_SNI_NAME_MAX.
const (
	TLSGetPathMax = 1024
	TLSGetNameMax = 253
)

// TLSGetSpec is what a tlsget= value asks the kernel for: one GET of Path
// from Server over TLS 1.3, with Name as the SNI, the Host header and the
// name the leaf certificate must carry.
type TLSGetSpec struct {
	Server netip.AddrPort
	Path   string
	Name   string
}

// ParseTLSGet checks a tlsget= value as the kernel's cfg_value_tlsget
// does: "https://", a dotted quad (ParseStaticIP's octet rules), an
// optional ':' and port of 1-65535 in decimal without a leading zero
// (443 without), a PATH starting with '/' up to a ',' or the end (at most
// TLSGetPathMax bytes), and optionally ',' and a NAME of 1-TLSGetNameMax
// bytes without a ','. Without NAME the name is the address as written.
func ParseTLSGet(v string) (TLSGetSpec, error) {
	rest, ok := strings.CutPrefix(v, "https://")
	if !ok {
		return TLSGetSpec{}, ErrTLSGet
	}
	a, after, err := parseQuad(rest)
	if err != nil {
		return TLSGetSpec{}, ErrTLSGet
	}
	s := TLSGetSpec{Name: rest[:len(rest)-len(after)]}
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
