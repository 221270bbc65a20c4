package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/discord-pxe/dpxe/appliance"
	"github.com/discord-pxe/dpxe/kernel"
)

// What kernel/selftest/checkin_selftest.inc puts in the largest check-in
// body; the test checks the body field by field against it.
const (
	ckstSlots       = appliance.MaxShardsPerNode // live statuses, and as many released sessions
	ckstCloseCode   = 4999
	ckstSessionLen  = 63 // CTLREL.session holds 63 bytes and the NUL
	ckstURLHead     = "ws://255.255.255.255:65535/"
	ckstURLQuery    = "?" + appliance.GatewayQuery
	ckstBodyPrefix  = "selftest checkin-body: "
	ckstKernelMax   = "selftest checkin-body-kernel-max"
	ckstWireLine    = "selftest checkin-body"
	ckstFailPrefix  = "selftest checkin FAIL"
	ckstLongLineCut = 200 // serial lines longer than this are cut when logged
)

// TestKernelCheckinBodyWorstCase boots the kernel with selftest=1. Its
// check-in self-test fills all 128 local slots and 128 released sessions
// with the longest value each field of the check-in can take and runs
// ctl_build_body twice: with 223-byte resume URLs (the most the kernel
// holds: CTL_BODY_MAX is sized for them) and with 219-byte ones (the
// longest dial URL, appliance.MaxDialURLLen, what the controller takes),
// printing that second body. The test
// checks that neither build overflowed ctl_body or passed CTL_BODY_MAX, that
// the printed length is the body's, that the body is at most
// appliance.MaxCheckinBody, that appliance.ParseCheckinRequest (the
// controller's strict parser) accepts it, that it holds the 128 statuses
// and the 128 released sessions the self-test wrote, and that no entry is
// longer than the per-entry bounds CTL_BODY_MAX is computed from.
func TestKernelCheckinBodyWorstCase(t *testing.T) {
	res := bootSelfTest(t, "checkin-selftest", "", 90*time.Second)
	t.Cleanup(func() {
		if t.Failed() { // the body is one ~85 KB line: cut long lines
			t.Logf("serial console (lines over %d bytes cut):\n%s", ckstLongLineCut, cutLongLines(res.Serial, ckstLongLineCut))
		}
	})

	var body []byte
	var kernelMax, wire *ckstLenLine
	for _, line := range strings.Split(res.Serial, "\n") {
		line = strings.TrimRight(line, "\r")
		switch {
		case strings.HasPrefix(line, ckstFailPrefix):
			t.Errorf("%s", line)
		case strings.HasPrefix(line, ckstBodyPrefix):
			body = []byte(strings.TrimPrefix(line, ckstBodyPrefix))
		case strings.HasPrefix(line, ckstKernelMax+" "):
			kernelMax = parseCkstLenLine(t, line)
		case strings.HasPrefix(line, ckstWireLine+" "):
			wire = parseCkstLenLine(t, line)
		}
	}
	if kernelMax == nil || wire == nil || body == nil {
		t.Fatalf("the check-in self-test did not print its lines (%q: %v, %q: %v, body: %v)",
			ckstKernelMax, kernelMax != nil, ckstWireLine, wire != nil, body != nil)
	}

	src := fs.FS(kernel.Sources) // the tree the images were built from
	bodyMax := wire.max
	if kernelMax.max != bodyMax {
		t.Errorf("the two length lines disagree on CTL_BODY_MAX: %d and %d", kernelMax.max, bodyMax)
	}
	if kernelMax.url != checkinCTLRELURLMax(t, src) {
		t.Errorf("kernel-max build used %d-byte resume URLs, CTLREL.resume_url holds %d", kernelMax.url, checkinCTLRELURLMax(t, src))
	}
	if wire.url != appliance.MaxDialURLLen {
		t.Errorf("printed build used %d-byte resume URLs, want appliance.MaxDialURLLen (%d)", wire.url, appliance.MaxDialURLLen)
	}
	if kernelMax.len > bodyMax {
		t.Errorf("largest body the kernel can build: %d bytes, over CTL_BODY_MAX (%d)", kernelMax.len, bodyMax)
	}
	if want := wire.len + 2*ckstSlots*(kernelMax.url-wire.url); kernelMax.len != want {
		t.Errorf("kernel-max body is %d bytes, want %d (the printed one plus %d bytes per resume URL, in every status and released entry)", kernelMax.len, want, kernelMax.url-wire.url)
	}
	if len(body) != wire.len {
		t.Errorf("printed body is %d bytes, the kernel says len=%d", len(body), wire.len)
	}
	if len(body) > appliance.MaxCheckinBody || kernelMax.len > appliance.MaxCheckinBody {
		t.Errorf("bodies of %d and %d bytes, appliance.MaxCheckinBody is %d", len(body), kernelMax.len, appliance.MaxCheckinBody)
	}
	t.Logf("largest check-in body: %d bytes with %d-byte resume URLs (what the kernel holds), %d bytes with %d-byte ones (what the controller takes); CTL_BODY_MAX %d, appliance.MaxCheckinBody %d",
		kernelMax.len, kernelMax.url, len(body), wire.url, bodyMax, appliance.MaxCheckinBody)

	req, perr := appliance.ParseCheckinRequest(body)
	if perr != nil {
		t.Errorf("appliance.ParseCheckinRequest refuses the kernel's largest check-in body: %v", perr)
		// Go on with a strict decode without the validation, so the rest
		// of the checks still say what else is wrong.
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			t.Fatalf("strict JSON decode: %v (near %q)", err, near(body, dec.InputOffset()))
		}
	}
	checkCkstHead(t, req)
	checkCkstShards(t, req, src)
	checkCkstEntryBounds(t, body, src, kernelMax.url-wire.url)
}

type ckstLenLine struct{ len, url, max int }

// parseCkstLenLine reads "<prefix> len=N resume_url=U max=M".
func parseCkstLenLine(t *testing.T, line string) *ckstLenLine {
	t.Helper()
	m := regexp.MustCompile(` len=(\d+) resume_url=(\d+) max=(\d+)$`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("malformed line %q", line)
	}
	v := make([]int, 3)
	for i := range v {
		v[i], _ = strconv.Atoi(m[i+1])
	}
	return &ckstLenLine{len: v[0], url: v[1], max: v[2]}
}

func checkCkstHead(t *testing.T, r appliance.CheckinRequest) {
	t.Helper()
	if len(r.NodeID) != appliance.MaxNodeIDLen || appliance.ValidateNodeID(r.NodeID) != nil {
		t.Errorf("node_id %q: want %d valid bytes", r.NodeID, appliance.MaxNodeIDLen)
	}
	if r.Capacity != appliance.MaxShardsPerNode || r.Generation != math.MaxUint64 {
		t.Errorf("capacity %d, generation %d: want %d and %d", r.Capacity, r.Generation, appliance.MaxShardsPerNode, uint64(math.MaxUint64))
	}
	if r.StartingShards != ckstSlots || r.ReadyShards != 0 || r.BackoffShards != 0 || r.FatalShards != 0 {
		t.Errorf("counts ready %d starting %d backoff %d fatal %d: want 0 %d 0 0", r.ReadyShards, r.StartingShards, r.BackoffShards, r.FatalShards, ckstSlots)
	}
	// The broker connection at its longest (nn_checkin_json).
	if want := (appliance.BrokerStatus{State: appliance.BrokerDown, Connects: math.MaxUint64, Drops: math.MaxUint64, Refused: math.MaxUint64}); r.NATS == nil || *r.NATS != want {
		t.Errorf("nats %+v: want %+v", r.NATS, want)
	}
}

func checkCkstShards(t *testing.T, r appliance.CheckinRequest, src fs.FS) {
	t.Helper()
	if len(r.Shards) != 2*ckstSlots {
		t.Fatalf("%d shard entries, want %d (%d live, %d released)", len(r.Shards), 2*ckstSlots, ckstSlots, ckstSlots)
	}
	why := longestResetReason(t, src)
	problems := 0
	report := func(format string, args ...any) { // the first 5 of each run
		if problems++; problems <= 5 {
			t.Errorf(format, args...)
		}
	}
	seen := map[uint32]int{}
	for i, s := range r.Shards {
		if j, dup := seen[s.ID]; dup {
			report("shards[%d].id %d already in shards[%d]", i, s.ID, j)
		}
		seen[s.ID] = i
		// Each entry alone must pass the controller's validation (this
		// also says what is wrong when the whole body is refused).
		one := appliance.CheckinRequest{NodeID: r.NodeID, Capacity: r.Capacity, Shards: []appliance.ShardStatus{s}}
		if err := one.Validate(); err != nil {
			report("shards[%d] alone: %v", i, err)
		}
		want := appliance.ShardStatus{ID: uint32(appliance.MaxTotalShards - 1 - i)}
		if i < ckstSlots {
			// Every slot also carries its resumable session (the crash
			// hand-off, ctl_session_json): released entry i's.
			want.State, want.SeqValid = appliance.ShardStarting, true
			want.SessionID, want.Seq, want.ResumeURL = ckstSessionID(i), math.MaxUint32, ckstResumeURL(i, appliance.MaxDialURLLen)
			want.HeartbeatAcks, want.HeartbeatMisses, want.Reconnects = math.MaxUint32, math.MaxUint32, math.MaxUint32
			want.CloseCode, want.LastError = ckstCloseCode, why
			want.PingMS, want.PingAvgMS, want.PingMaxMS, want.AckSlow = appliance.MaxPingMS, appliance.MaxPingMS, appliance.MaxPingMS, true
		} else {
			j := i - ckstSlots
			want.State, want.SeqValid = appliance.ShardAssigned, true
			want.SessionID, want.Seq, want.ResumeURL = ckstSessionID(j), math.MaxUint32, ckstResumeURL(j, appliance.MaxDialURLLen)
		}
		if s != want {
			report("shards[%d] = %+v\nwant %+v", i, s, want)
		}
	}
	if problems > 5 {
		t.Errorf("%d problems with the shard entries in all (the first 5 above)", problems)
	}
}

// ckstSessionID is released entry j's session ID: 63 bytes, byte k the
// ((j+k) mod 92)th of the visible ASCII bytes other than '"' and '\'.
func ckstSessionID(j int) string {
	b := make([]byte, ckstSessionLen)
	for k := range b {
		c := 0x21 + (j+k)%92
		if c >= '"' {
			c++
		}
		if c >= '\\' {
			c++
		}
		b[k] = byte(c)
	}
	return string(b)
}

// ckstResumeURL is released entry j's resume URL of n bytes: the head,
// letters 'a' + (j+k) mod 26, the query.
func ckstResumeURL(j, n int) string {
	b := []byte(ckstURLHead)
	for k := 0; k < n-len(ckstURLHead)-len(ckstURLQuery); k++ {
		b = append(b, byte('a'+(j+k)%26))
	}
	return string(b) + ckstURLQuery
}

// checkCkstEntryBounds splits the body into its head and entries and
// checks each against the bound CTL_BODY_MAX is the sum of (node/checkin.inc:
// CTL_BODY_HEAD_MAX + 128 * (CTL_STATUS_MAX + CTL_RELEASED_MAX)), a
// released entry with its resume URL grown by urlGrow bytes to what the
// kernel can hold, each entry with its comma.
func checkCkstEntryBounds(t *testing.T, body []byte, src fs.FS, urlGrow int) {
	t.Helper()
	headMax := checkinEqu(t, src, "CTL_BODY_HEAD_MAX")
	statusMax := checkinEqu(t, src, "CTL_STATUS_MAX")
	releasedMax := checkinEqu(t, src, "CTL_RELEASED_MAX")
	var raw struct {
		Shards []json.RawMessage `json:"shards"`
	}
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatalf("shards as raw JSON: %v", err)
	}
	if len(raw.Shards) != 2*ckstSlots {
		return // reported by checkCkstShards
	}
	head := len(body)
	longest, over := [2]int{}, [2]int{}
	for i, e := range raw.Shards {
		n, limit, kind := len(e)+1+urlGrow, statusMax, 0
		if i >= ckstSlots {
			limit, kind = releasedMax, 1
		}
		longest[kind] = max(longest[kind], n)
		if n > limit {
			if over[kind]++; over[kind] == 1 {
				t.Errorf("shards[%d] takes %d bytes with its comma, over its bound %d: %s", i, n, limit, e)
			}
		}
		head -= len(e) + 1
	}
	if over[0]+over[1] > 0 {
		t.Errorf("%d statuses over CTL_STATUS_MAX (%d), %d released entries over CTL_RELEASED_MAX (%d)", over[0], statusMax, over[1], releasedMax)
	}
	head++ // the last entry has no comma
	if head > headMax {
		t.Errorf("the body without its entries is %d bytes, over CTL_BODY_HEAD_MAX (%d)", head, headMax)
	}
	t.Logf("head %d bytes (bound %d), status %d (bound %d), released %d with a %d-byte resume URL (bound %d)",
		head, headMax, longest[0], statusMax, longest[1], appliance.MaxDialURLLen+urlGrow, releasedMax)
}

// checkinEqu reads "NAME equ NUMBER" from node/checkin.inc.
func checkinEqu(t *testing.T, src fs.FS, name string) int {
	t.Helper()
	b, err := fs.ReadFile(src, "node/checkin.inc")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + name + `\s+equ\s+(\d+)\b`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("node/checkin.inc has no %q equ NUMBER", name)
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// checkinCTLRELURLMax is the longest resume URL CTLREL.resume_url holds
// (its size less the NUL), from node/checkin.inc.
func checkinCTLRELURLMax(t *testing.T, src fs.FS) int {
	t.Helper()
	b, err := fs.ReadFile(src, "node/checkin.inc")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)struc CTLREL\b.*?\.resume_url\s+resb\s+(\d+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("node/checkin.inc: no CTLREL.resume_url resb NUMBER")
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n - 1
}

// longestResetReason is gw_why_zombie's text, after checking that no other
// gw_why_* string of gateway/gateway.inc or dns_why_* string of
// net/dns.inc (what a status's last_error can be: a failed lookup is a
// shard's reset reason) is longer: otherwise the self-test is not the
// worst case.
func longestResetReason(t *testing.T, src fs.FS) string {
	t.Helper()
	reasons := map[string]string{}
	for _, f := range []string{"gateway/gateway.inc", "net/dns.inc"} {
		b, err := fs.ReadFile(src, f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile(`(?m)^((?:gw|dns)_why_\w+):\s+db\s+"([^"]*)",\s*0\s*$`).FindAllSubmatch(b, -1) {
			reasons[string(m[1])] = string(m[2])
		}
	}
	zombie, ok := reasons["gw_why_zombie"]
	if !ok {
		t.Fatalf("gateway/gateway.inc: no gw_why_zombie string (found %d gw_why_*)", len(reasons))
	}
	for name, s := range reasons {
		if len(s) > len(zombie) {
			t.Errorf("%s (%d bytes) is longer than gw_why_zombie (%d): the check-in self-test must use it", name, len(s), len(zombie))
		}
		if len(s) > appliance.MaxLastErrorLen {
			t.Errorf("%s is %d bytes, over appliance.MaxLastErrorLen (%d)", name, len(s), appliance.MaxLastErrorLen)
		}
	}
	return zombie
}

// near is up to 40 bytes of b either side of offset off.
func near(b []byte, off int64) string {
	lo, hi := max(int(off)-40, 0), min(int(off)+40, len(b))
	if lo > hi {
		return ""
	}
	return string(b[lo:hi])
}

// cutLongLines shortens every line of s longer than n bytes.
func cutLongLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if len(l) > n {
			lines[i] = fmt.Sprintf("%s... (%d bytes)", l[:n], len(l))
		}
	}
	return strings.Join(lines, "\n")
}
