package appliance

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// The node boot configuration is a list of key=value tokens separated by
// white space. It travels on the kernel command line for netboot (iPXE,
// QEMU -kernel -append, EFI load options) and in the file DPXE.CFG on USB
// media. The kernel (kernel/core/cmdline.asm) applies exactly the rules of
// ParseBootConfig; a test boots the kernel with the cases in
// bootconfig_test.go and compares its verdicts.
//
// Rules:
//   - tokens are separated by space, tab, CR or LF;
//   - a token starting with '#' starts a comment that runs to the end of the line;
//   - the first token is skipped when it has no '=' (boot loaders put the
//     image name there: iPXE and QEMU both do);
//   - every other token is key=value with a known key and a valid value;
//   - a key may appear once;
//   - only printable ASCII (0x21..0x7e) and the separators are allowed;
//   - a NUL byte ends the text, which is then at most MaxBootConfigLen bytes.

// MaxBootConfigLen is the largest boot configuration, in bytes. DPXE.CFG on
// USB media is exactly this long, padded with NUL bytes.
const MaxBootConfigLen = 4096

// MaxShardsPerNode is the number of local shard slots in the kernel.
const MaxShardsPerNode = 128

// MaxTotalShards bounds the global shard count the fleet accepts.
const MaxTotalShards = 131072

// MaxNodeIDLen bounds a node ID (seed 004).
const MaxNodeIDLen = 64

// BootConfig is a node's parsed boot configuration. The zero value means
// "nothing configured"; fields that were not given keep their zero value and
// their Has* flag stays false.
type BootConfig struct {
	NodeID      string // node=, the node's name at the controller
	Controller  string // controller=, base URL of the controller API
	Credential  string // cred=, the node's secret for check-in and Identify
	Shards      uint32 // shards=, local shard count override (1..128)
	TotalShards uint32 // total_shards=, global shard count override
	Capacity    uint32 // capacity=, shards this node offers (1..128)
	SelfTest    bool   // selftest=1 runs the self-tests and exits QEMU
	CryptoTest  bool   // cryptotest=1 runs the cryptography self-tests and exits QEMU
	NoZlib      bool   // zlib=0: Gateway sessions without compress=zlib-stream (on by default)
	Seed        uint32 // seed=, PRNG seed of the differential self-test
	StaticIP    string // ip=, A.B.C.D/NN[,GW]: a static address instead of DHCP (see ParseStaticIP)
	TCPTest     string // tcptest=, A.B.C.D:PORT[,BYTES]: the kernel's TCP client test (see ParseTCPTestSpec)
	TLSGet      string // tlsget=, https://HOST[:PORT]/PATH[,NAME]: the kernel's HTTPS diagnostic (see ParseTLSGet)
	// ControllerPin is controller_pin=: the SHA-256 of the controller's
	// TLS SubjectPublicKeyInfo, 64 lower-case hex digits (ValidatePin).
	ControllerPin string

	HasShards, HasTotalShards, HasCapacity, HasSeed bool
}

// ConfigError says which byte or key of a boot configuration is at fault.
type ConfigError struct {
	Offset int    // byte offset of the offending token
	Key    string // the key, when the token had one
	Reason string // what is wrong, in words

	rawKey string // the whole key as written (Key may be shortened)
}

func (e *ConfigError) Error() string {
	if e.Key != "" {
		return fmt.Sprintf("boot config: byte %d: key %q: %s", e.Offset, e.Key, e.Reason)
	}
	return fmt.Sprintf("boot config: byte %d: %s", e.Offset, e.Reason)
}

// ErrConfigTooLong is returned for a configuration over MaxBootConfigLen bytes.
var ErrConfigTooLong = errors.New("boot config: longer than 4096 bytes")

// bootKey describes one configuration key: its name and how to check and
// store its value.
type bootKey struct {
	name  string
	doc   string
	parse func(c *BootConfig, v string) error
}

// bootKeys is the table of every key the kernel accepts. Its names are
// compared with the kernel's own table by a test.
var bootKeys = []bootKey{
	{"node", "node ID, 1-64 characters of A-Za-z0-9-_.", func(c *BootConfig, v string) error {
		if err := ValidateNodeID(v); err != nil {
			return err
		}
		c.NodeID = v
		return nil
	}},
	{"controller", "controller base URL, http://host[:port][/path] or https://...; up to 4 replicas separated by ','", func(c *BootConfig, v string) error {
		if err := validateControllerList(v); err != nil {
			return err
		}
		c.Controller = v
		return nil
	}},
	{"cred", "node credential, 16-128 characters of A-Za-z0-9-_", func(c *BootConfig, v string) error {
		if err := ValidateCredential(v); err != nil {
			return err
		}
		c.Credential = v
		return nil
	}},
	{"shards", "local shard count override, 1-128", func(c *BootConfig, v string) error {
		n, err := parseBounded(v, 1, MaxShardsPerNode)
		c.Shards, c.HasShards = n, err == nil
		return err
	}},
	{"total_shards", "global shard count override, 1-131072", func(c *BootConfig, v string) error {
		n, err := parseBounded(v, 1, MaxTotalShards)
		c.TotalShards, c.HasTotalShards = n, err == nil
		return err
	}},
	{"capacity", "shards this node offers the controller, 1-128", func(c *BootConfig, v string) error {
		n, err := parseBounded(v, 1, MaxShardsPerNode)
		c.Capacity, c.HasCapacity = n, err == nil
		return err
	}},
	{"selftest", "1 runs the kernel self-tests and powers off, 0 does not", func(c *BootConfig, v string) error {
		n, err := parseBounded(v, 0, 1)
		c.SelfTest = n == 1
		return err
	}},
	{"seed", "seed of the differential self-test, 0-4294967295", func(c *BootConfig, v string) error {
		n, err := parseBounded(v, 0, 1<<32-1)
		c.Seed, c.HasSeed = n, err == nil
		return err
	}},
	{"initrd", "ignored: UEFI loaders (OVMF for QEMU -kernel) add initrd=... to the load options", func(c *BootConfig, v string) error {
		return nil
	}},
	{"ip", "static address instead of DHCP: A.B.C.D/NN or A.B.C.D/NN,GATEWAY", func(c *BootConfig, v string) error {
		if _, err := ParseStaticIP(v); err != nil {
			return err
		}
		c.StaticIP = v
		return nil
	}},
	{"tcptest", "TCP client test: A.B.C.D:PORT to receive 64 KiB from on 4 connections, or A.B.C.D:PORT,BYTES on one, and close", func(c *BootConfig, v string) error {
		if _, err := ParseTCPTest(v); err != nil {
			return err
		}
		c.TCPTest = v
		return nil
	}},
	{"cryptotest", "1 runs the kernel's cryptography self-tests (vectors from the first module) and powers off, 0 does not", func(c *BootConfig, v string) error {
		n, err := parseBounded(v, 0, 1)
		c.CryptoTest = n == 1
		return err
	}},
	{"zlib", "0 makes the Gateway sessions plain JSON, without compress=zlib-stream; 1 (the default) asks for it", func(c *BootConfig, v string) error {
		n, err := parseBounded(v, 0, 1)
		c.NoZlib = err == nil && n == 0
		return err
	}},
	{"tlsget", "HTTPS diagnostic: https://HOST[:PORT]/PATH[,NAME] (HOST an address, or a name looked up with the DHCP lease's DNS server) fetched once over the kernel's TLS 1.3 client (NAME: the SNI and the name the certificate must carry), one verdict line, then power off; never checks in", func(c *BootConfig, v string) error {
		if _, err := ParseTLSGet(v); err != nil {
			return err
		}
		c.TLSGet = v
		return nil
	}},
	{"controller_pin", "SHA-256 of the controller's TLS public key (SubjectPublicKeyInfo), 64 lower-case hex digits, as `dpxe serve --print-pin` prints it: the node checks in over https:// only to a controller with that key", func(c *BootConfig, v string) error {
		if err := ValidatePin(v); err != nil {
			return err
		}
		c.ControllerPin = v
		return nil
	}},
}

// PinLen is the length of controller_pin=, in hex digits (a SHA-256).
const PinLen = 64

// ValidatePin checks a controller_pin= value: exactly 64 lower-case hex
// digits, the form `dpxe serve --print-pin` prints.
func ValidatePin(v string) error {
	if len(v) != PinLen {
		return fmt.Errorf("controller pin must be %d lower-case hex digits (a SHA-256), got %d characters", PinLen, len(v))
	}
	for i := 0; i < len(v); i++ {
		if b := v[i]; !(b >= '0' && b <= '9' || b >= 'a' && b <= 'f') {
			return fmt.Errorf("controller pin has %q at position %d; allowed are 0-9 a-f", b, i)
		}
	}
	return nil
}

// BootConfigKeys returns the accepted keys in the kernel's table order.
func BootConfigKeys() []string {
	out := make([]string, len(bootKeys))
	for i, k := range bootKeys {
		out[i] = k.name
	}
	return out
}

// BootConfigKeyDoc returns a one-line description of key, or "" if unknown.
func BootConfigKeyDoc(key string) string {
	for _, k := range bootKeys {
		if k.name == key {
			return k.doc
		}
	}
	return ""
}

func isSeparator(b byte) bool { return b == ' ' || b == '\t' || b == '\r' || b == '\n' }

// ParseBootConfig parses and validates a boot configuration. It reads up to
// the first NUL byte. The returned error is a *ConfigError naming the byte
// offset and key at fault, or ErrConfigTooLong.
func ParseBootConfig(text []byte) (BootConfig, error) {
	var c BootConfig
	for i, b := range text {
		if b == 0 {
			text = text[:i]
			break
		}
	}
	if len(text) > MaxBootConfigLen {
		return c, ErrConfigTooLong
	}
	seen := map[string]bool{}
	first := true
	i := 0
	for i < len(text) {
		b := text[i]
		if isSeparator(b) {
			i++
			continue
		}
		if b == '#' { // comment to end of line
			for i < len(text) && text[i] != '\n' {
				i++
			}
			continue
		}
		start := i
		for i < len(text) && !isSeparator(text[i]) {
			if text[i] < 0x21 || text[i] > 0x7e {
				return c, &ConfigError{Offset: i, Reason: fmt.Sprintf("byte 0x%02x is not printable ASCII", text[i])}
			}
			i++
		}
		tok := string(text[start:i])
		eq := strings.IndexByte(tok, '=')
		if eq < 0 {
			if first {
				first = false // the boot loader's image name
				continue
			}
			return c, &ConfigError{Offset: start, Reason: fmt.Sprintf("token %q is not key=value", clip(tok))}
		}
		first = false
		key, val := tok[:eq], tok[eq+1:]
		var k *bootKey
		for j := range bootKeys {
			if bootKeys[j].name == key {
				k = &bootKeys[j]
				break
			}
		}
		if k == nil {
			return c, &ConfigError{Offset: start, Key: clip(key), Reason: "unknown key", rawKey: key}
		}
		if seen[key] {
			return c, &ConfigError{Offset: start, Key: key, Reason: "given twice", rawKey: key}
		}
		seen[key] = true
		if val == "" {
			return c, &ConfigError{Offset: start, Key: key, Reason: "empty value", rawKey: key}
		}
		if err := k.parse(&c, val); err != nil {
			return c, &ConfigError{Offset: start, Key: key, Reason: err.Error(), rawKey: key}
		}
	}
	return c, nil
}

// clip shortens s for an error message.
func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// parseBounded parses a decimal number without sign or leading '+' and
// checks lo <= n <= hi.
func parseBounded(v string, lo, hi uint64) (uint32, error) {
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, fmt.Errorf("%q is not a decimal number", clip(v))
		}
	}
	if len(v) > 10 {
		return 0, fmt.Errorf("%s is out of range %d..%d", clip(v), lo, hi)
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%s is out of range %d..%d", clip(v), lo, hi)
	}
	return uint32(n), nil
}

// ValidateNodeID checks a node ID: 1-64 characters of A-Za-z0-9-_. (seed 004).
func ValidateNodeID(id string) error {
	if len(id) == 0 || len(id) > MaxNodeIDLen {
		return fmt.Errorf("node ID must be 1-%d characters, got %d", MaxNodeIDLen, len(id))
	}
	for i := 0; i < len(id); i++ {
		if !isIDChar(id[i]) {
			return fmt.Errorf("node ID has %q at position %d; allowed are A-Z a-z 0-9 - _ .", id[i], i)
		}
	}
	return nil
}

func isIDChar(b byte) bool {
	return b >= 'A' && b <= 'Z' || b >= 'a' && b <= 'z' || b >= '0' && b <= '9' || b == '-' || b == '_' || b == '.'
}

// ValidateCredential checks a node credential: 16-128 characters of
// A-Za-z0-9-_ (the base64url alphabet without padding).
func ValidateCredential(s string) error {
	if len(s) < 16 || len(s) > 128 {
		return fmt.Errorf("credential must be 16-128 characters, got %d", len(s))
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		if !(b >= 'A' && b <= 'Z' || b >= 'a' && b <= 'z' || b >= '0' && b <= '9' || b == '-' || b == '_') {
			return fmt.Errorf("credential has a character outside A-Za-z0-9-_ at position %d", i)
		}
	}
	return nil
}

// MaxControllers is how many controller replicas controller= may list.
const MaxControllers = 4

// validateControllerList accepts 1..MaxControllers controller URLs
// separated by ',' (replicas the node tries in turn), at most 200 bytes
// in all, each one validateControllerURL's.
func validateControllerList(v string) error {
	if len(v) > 200 {
		return fmt.Errorf("controller URL longer than 200 bytes")
	}
	urls := strings.Split(v, ",")
	if len(urls) > MaxControllers {
		return fmt.Errorf("controller lists %d URLs, at most %d", len(urls), MaxControllers)
	}
	for _, u := range urls {
		if err := validateControllerURL(u); err != nil {
			return err
		}
	}
	return nil
}

// ControllerSwitchDefaultMS is how long a node waits for its controller
// before trying the next replica when no answer has given it a lease yet.
const ControllerSwitchDefaultMS = 10000

// ControllerSwitchDue is the kernel's ctl_switch_due: after a failed
// check-in, a node with several controllers moves to the next one when the
// one in use has not answered for a third of the lease (of its last
// answer; ControllerSwitchDefaultMS before any), counted from its last
// answer or from when the node switched to it. A third of the lease leaves
// the node two more thirds to reach a replica before the lease lapses.
func ControllerSwitchDue(sinceMS, leaseMS uint32) bool {
	limit := leaseMS / 3
	if leaseMS == 0 {
		limit = ControllerSwitchDefaultMS
	}
	return sinceMS >= limit
}

// CheckinTermAccepted is the kernel's ctl_check_term: a check-in answer
// whose term is older than the newest term the node already applied comes
// from a deposed controller replica and is refused (a failed check-in);
// an answer without a term is taken (a controller without replicas).
func CheckinTermAccepted(term, applied uint64, hasTerm bool) bool {
	return !hasTerm || term >= applied
}

// TakeControllers is the kernel's ctl_take_controllers: the replica list
// a check-in answer names ("controllers") replaces the node's when, joined
// with ',', it passes controller='s rules; the replica in use (current)
// stays in use when it is on the new list, else the node moves to the
// list's first. It returns the node's list and the index in use, and
// false when it keeps its own list (no list, an empty one, one that breaks
// the rules, or the same list).
func TakeControllers(nodeList string, current string, controllers []string) (string, int, bool) {
	joined := strings.Join(controllers, ",")
	if len(controllers) == 0 || joined == nodeList || validateControllerList(joined) != nil {
		return nodeList, slices.Index(strings.Split(nodeList, ","), current), false
	}
	i := slices.Index(controllers, current)
	return joined, max(i, 0), true
}

// ControllerURLs is the controller= value split into its replicas.
func (c BootConfig) ControllerURLs() []string {
	if c.Controller == "" {
		return nil
	}
	return strings.Split(c.Controller, ",")
}

// validateControllerURL accepts http://HOST[:PORT][/PATH] or
// https://HOST[:PORT][/PATH] with at most 200 bytes and a conservative
// character set, so the kernel can parse it.
func validateControllerURL(u string) error {
	scheme := "http://"
	if len(u) > 200 {
		return fmt.Errorf("controller URL longer than 200 bytes")
	}
	if strings.HasPrefix(u, "https://") {
		scheme = "https://"
	} else if !strings.HasPrefix(u, scheme) {
		return fmt.Errorf("controller URL must start with http:// or https://")
	}
	rest := u[len(scheme):]
	if rest == "" || rest[0] == '/' || rest[0] == ':' {
		return fmt.Errorf("controller URL has no host")
	}
	for i := 0; i < len(rest); i++ {
		b := rest[i]
		if !(isIDChar(b) || b == ':' || b == '/' || b == '%' || b == '~') {
			return fmt.Errorf("controller URL has %q at position %d", b, len(scheme)+i)
		}
	}
	host := rest
	if j := strings.IndexByte(host, '/'); j >= 0 {
		host = host[:j]
	}
	if j := strings.IndexByte(host, ':'); j >= 0 {
		port := host[j+1:]
		if _, err := parseBounded(port, 1, 65535); err != nil || port == "" {
			return fmt.Errorf("controller URL port %q is not 1..65535", port)
		}
	}
	return nil
}

// String renders c as a boot configuration that ParseBootConfig accepts,
// keys in table order, one line. Unset fields are left out.
func (c BootConfig) String() string {
	var parts []string
	add := func(k, v string) { parts = append(parts, k+"="+v) }
	if c.NodeID != "" {
		add("node", c.NodeID)
	}
	if c.Controller != "" {
		add("controller", c.Controller)
	}
	if c.Credential != "" {
		add("cred", c.Credential)
	}
	if c.HasShards {
		add("shards", strconv.FormatUint(uint64(c.Shards), 10))
	}
	if c.HasTotalShards {
		add("total_shards", strconv.FormatUint(uint64(c.TotalShards), 10))
	}
	if c.HasCapacity {
		add("capacity", strconv.FormatUint(uint64(c.Capacity), 10))
	}
	if c.SelfTest {
		add("selftest", "1")
	}
	if c.HasSeed {
		add("seed", strconv.FormatUint(uint64(c.Seed), 10))
	}
	if c.StaticIP != "" {
		add("ip", c.StaticIP)
	}
	if c.TCPTest != "" {
		add("tcptest", c.TCPTest)
	}
	if c.CryptoTest {
		add("cryptotest", "1")
	}
	if c.NoZlib {
		add("zlib", "0")
	}
	if c.TLSGet != "" {
		add("tlsget", c.TLSGet)
	}
	if c.ControllerPin != "" {
		add("controller_pin", c.ControllerPin)
	}
	return strings.Join(parts, " ")
}

// Set applies key=value assignments to c with the same validation as the
// parser, for `dpxe config set`. An empty value removes the key.
func (c *BootConfig) Set(assignments ...string) error {
	for _, a := range assignments {
		eq := strings.IndexByte(a, '=')
		if eq <= 0 {
			return fmt.Errorf("%q is not key=value", a)
		}
		key, val := a[:eq], a[eq+1:]
		if BootConfigKeyDoc(key) == "" {
			keys := BootConfigKeys()
			sort.Strings(keys)
			return fmt.Errorf("unknown key %q (known: %s)", key, strings.Join(keys, ", "))
		}
		if val == "" {
			c.clear(key)
			continue
		}
		for _, k := range bootKeys {
			if k.name == key {
				if err := k.parse(c, val); err != nil {
					return fmt.Errorf("%s: %v", key, err)
				}
			}
		}
	}
	return nil
}

func (c *BootConfig) clear(key string) {
	switch key {
	case "node":
		c.NodeID = ""
	case "controller":
		c.Controller = ""
	case "cred":
		c.Credential = ""
	case "shards":
		c.Shards, c.HasShards = 0, false
	case "total_shards":
		c.TotalShards, c.HasTotalShards = 0, false
	case "capacity":
		c.Capacity, c.HasCapacity = 0, false
	case "selftest":
		c.SelfTest = false
	case "seed":
		c.Seed, c.HasSeed = 0, false
	case "ip":
		c.StaticIP = ""
	case "tcptest":
		c.TCPTest = ""
	case "cryptotest":
		c.CryptoTest = false
	case "zlib":
		c.NoZlib = false
	case "tlsget":
		c.TLSGet = ""
	case "controller_pin":
		c.ControllerPin = ""
	}
}
