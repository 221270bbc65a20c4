package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/discord-pxe/dpxe/tools/gatewayemu"
)

// labDNS is a small DNS server (real RFC 1035 messages over UDP, written
// with golang.org/x/net/dns/dnsmessage) on the namespace's bridge: it
// answers A queries for the names it holds, and a test can make a name
// fail (SERVFAIL) and read which queries came.
type labDNS struct {
	pc   net.PacketConn
	ttl  uint32
	mu   sync.Mutex
	addr map[string][4]byte // lower-case name without the final dot
	fail map[string]bool    // answer SERVFAIL for these
	log  []dnsQuery
	done chan struct{}
}

type dnsQuery struct {
	at       time.Time
	name     string
	id       uint16
	servfail bool
}

// startLabDNS listens on addr:53 inside the namespace.
func startLabDNS(t testing.TB, nsName, addr string, ttl uint32, names map[string][4]byte) *labDNS {
	t.Helper()
	d := &labDNS{ttl: ttl, addr: names, fail: map[string]bool{}, done: make(chan struct{})}
	if err := inNetns(nsName, func() (err error) {
		d.pc, err = net.ListenPacket("udp4", addr+":53")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	go d.serve()
	t.Cleanup(func() {
		d.pc.Close()
		<-d.done
	})
	return d
}

func (d *labDNS) serve() {
	defer close(d.done)
	buf := make([]byte, 1500)
	for {
		n, from, err := d.pc.ReadFrom(buf)
		if err != nil {
			return
		}
		if out, ok := d.answer(buf[:n]); ok {
			d.pc.WriteTo(out, from)
		}
	}
}

// answer builds the response to one query: the A record, NXDOMAIN for a
// name it does not hold, SERVFAIL for a name set to fail.
func (d *labDNS) answer(q []byte) ([]byte, bool) {
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil || h.Response {
		return nil, false
	}
	qs, err := p.AllQuestions()
	if err != nil || len(qs) != 1 {
		return nil, false
	}
	name := strings.ToLower(strings.TrimSuffix(qs[0].Name.String(), "."))
	d.mu.Lock()
	ip, known := d.addr[name]
	fail := d.fail[name]
	d.log = append(d.log, dnsQuery{at: time.Now(), name: name, id: h.ID, servfail: fail})
	d.mu.Unlock()
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	switch {
	case fail:
		rh.RCode = dnsmessage.RCodeServerFailure
	case !known:
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	if b.StartQuestions() != nil || b.Question(qs[0]) != nil || b.StartAnswers() != nil {
		return nil, false
	}
	if known && !fail && qs[0].Type == dnsmessage.TypeA {
		if b.AResource(dnsmessage.ResourceHeader{Name: qs[0].Name, Class: dnsmessage.ClassINET, TTL: d.ttl}, dnsmessage.AResource{A: ip}) != nil {
			return nil, false
		}
	}
	out, err := b.Finish()
	return out, err == nil
}

func (d *labDNS) setFail(name string, fail bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.fail[name] = fail
}

// lookups is how many queries came for name (the server answers at once,
// so the kernel never retransmits one), and when the last one came.
func (d *labDNS) lookups(name string) (int, time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	var last time.Time
	for _, q := range d.log {
		if q.name == name {
			n++
			last = q.at
		}
	}
	return n, last
}

// termProxy is what startTermProxy adds to check-in answers, and the Host
// headers of the check-ins it passed on.
type termProxy struct {
	term        atomic.Uint64
	controllers atomic.Pointer[[]string] // nil: no "controllers"
	mu          sync.Mutex
	hosts       []string
}

func (p *termProxy) checkinHosts() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.hosts...)
}

// startTermProxy puts a reverse proxy on addr in the namespace in front of
// the lab's controller that adds "term" (and, when set, "controllers") to
// every check-in answer, as a replicated controller does.
func startTermProxy(t *testing.T, l *gwLab, addr string, p *termProxy) {
	t.Helper()
	target, err := url.Parse(l.server)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	director := rp.Director
	rp.Director = func(r *http.Request) {
		host := r.Host // the node's Host header, before the proxy rewrites it
		director(r)
		r.Header.Set("X-Node-Host", host)
	}
	rp.Transport = &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
			var c net.Conn
			err := inNetns(l.ns.Name, func() (err error) {
				c, err = (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, address)
				return err
			})
			return c, err
		},
	}
	rp.ModifyResponse = func(resp *http.Response) error {
		if !strings.HasSuffix(resp.Request.URL.Path, "/v1/checkin") || resp.StatusCode != http.StatusOK {
			return nil
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		p.mu.Lock()
		p.hosts = append(p.hosts, resp.Request.Header.Get("X-Node-Host"))
		p.mu.Unlock()
		var doc map[string]json.RawMessage
		if json.Unmarshal(body, &doc) == nil {
			doc["term"] = json.RawMessage(strconv.FormatUint(p.term.Load(), 10))
			if c := p.controllers.Load(); c != nil {
				doc["controllers"], _ = json.Marshal(*c)
			}
			body, _ = json.Marshal(doc)
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		resp.ContentLength = int64(len(body))
		resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
		return nil
	}
	ln, err := listenInNetns(l.ns.Name, addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: rp}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

// TestKernelGatewayHostNames runs the Gateway by Discord's host names, one
// boot for every case: a node gets its address and DNS server from DHCP
// (dnsmasq, DHCP only) and looks up every name through a DNS server in the
// namespace: the controller (controller= lists a replica with no host
// behind it, then http://controller.test:8080: the node moves on after
// 10 s of silence), the
// Gateway URL the controller hands out (ws://gateway.discord.gg:7878, the
// emulator's public host) and READY's resume_gateway_url
// (ws://gateway-us-east1-b.discord.gg:7878). Two shards share one lookup
// of the Gateway host and reach READY with the name in their Host header
// (the emulator records wrong_host otherwise); op 7 makes shard 0 Resume on
// the resume host; the resume host answers shard 1's Resume with HTTP 503
// and the shard Resumes through the Gateway URL instead, once; the resume
// host's name then fails (SERVFAIL): shard 0's reset carries the reason to
// the console and the controller's last_error, its Resume goes through the
// Gateway URL, and the next lookup of the name waits out the doubled retry
// time. Every session survives: no Identify after the first two.
func TestKernelGatewayHostNames(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const (
		gwHost     = "gateway.discord.gg"
		resumeHost = "gateway-us-east1-b.discord.gg"
		ctlHost    = "controller.test"
		subnet     = "10.96.0"
	)
	started := time.Now()
	l := newGWLab(t, ctx, subnet, gatewayemu.Options{HeartbeatInterval: time.Second, Shards: 2, MaxConcurrency: 2,
		PublicHost: gwHost, ResumeHost: resumeHost, ResumeTimeout: 2 * time.Minute},
		"--total-shards", "2", "--lease", "15s")
	bridge := [4]byte{10, 96, 0, 1}
	dns := startLabDNS(t, l.ns.Name, subnet+".1", 5, map[string][4]byte{gwHost: bridge, resumeHost: bridge, ctlHost: bridge})
	// DHCP only (--port=0): the lease names our DNS server (option 6).
	dnsmasq := l.ns.Command(ctx, "dnsmasq", "--no-daemon", "--conf-file=/dev/null", "--port=0",
		"--interface=br0", "--bind-interfaces", "--no-ping", "--pid-file=",
		"--dhcp-leasefile="+filepath.Join(t.TempDir(), "leases"),
		"--dhcp-range="+subnet+".100,"+subnet+".150,255.255.255.0,2m",
		"--dhcp-option=3,"+subnet+".1", "--dhcp-option=6,"+subnet+".1")
	var dlog bytes.Buffer
	dnsmasq.Stdout, dnsmasq.Stderr = &dlog, &dlog
	if err := dnsmasq.Start(); err != nil {
		t.Skipf("dnsmasq: %v", err)
	}
	defer func() {
		dnsmasq.Cancel()
		dnsmasq.Wait()
		if t.Failed() {
			t.Logf("dnsmasq:\n%s", dlog.String())
		}
	}()
	l.dhcp = true
	// Two controller replicas: the first has no host behind it, so the
	// node moves to the second, by name, once the first has been silent
	// for ControllerSwitchDefaultMS (no lease yet).
	l.nodeController = "http://" + subnet + ".9:8080,http://" + ctlHost + ":8081"
	// The live replica answers through a proxy that adds a term (7).
	proxy := &termProxy{}
	proxy.term.Store(7)
	startTermProxy(t, l, subnet+".1:8081", proxy)
	n := l.boot("gw-dns", "e1000", 2)

	// 1. READY through names: the controller, then the Gateway host,
	// looked up once for both shards.
	l.awaitEmu(90*time.Second, "two READY sessions by host name", func(s gatewayemu.State) bool {
		m := readySessions(s, 1)
		return m[0] == 1 && m[1] == 1
	})
	t.Logf("both shards READY %v after the start", time.Since(started).Round(time.Millisecond))
	for _, re := range []string{
		`checkin: controller http://10\.96\.0\.9:8080 silent for \d+ ms \(a third of the lease\): trying http://controller\.test:8081`,
		`dns: controller\.test -> 10\.96\.0\.1 ttl 5s in \d+ ms`,
		`dns: gateway\.discord\.gg -> 10\.96\.0\.1 ttl 5s in \d+ ms`,
		`shard 0: STARTING: connecting to ws://gateway\.discord\.gg:7878/\?v=10&encoding=json \(10\.96\.0\.1\)`,
		`shard 1: STARTING: connecting to ws://gateway\.discord\.gg:7878/\?v=10&encoding=json \(10\.96\.0\.1\)`,
	} {
		if n.serial.waitFor(regexp.MustCompile(re), 5*time.Second) == nil {
			t.Errorf("no console line %q", re)
		}
	}
	if c, _ := dns.lookups(gwHost); c != 1 {
		t.Errorf("%d lookups of %s for two shards starting together, want 1 (one shared query)", c, gwHost)
	}
	if v := l.emu.Violations(); len(v) != 0 {
		t.Fatalf("violations before any fault (wrong_host: the Host header lacks the name): %s", violationReport(v))
	}

	inject := func(f gatewayemu.Fault) {
		t.Helper()
		if _, err := l.emu.Inject(f); err != nil {
			t.Fatalf("inject %+v: %v", f, err)
		}
	}
	shard := func(i int) *int { return &i }
	sessions := map[int]string{}
	for s := 0; s < 2; s++ {
		ses, _ := l.shardSession(s)
		sessions[s] = ses.ID
	}
	// resumed waits until shard s's session is attached again with more
	// Resumes than before.
	resumed := func(s int, before int, what string) {
		t.Helper()
		l.awaitEmu(60*time.Second, what, func(gatewayemu.State) bool {
			ses, ok := l.shardSession(s)
			return ok && ses.ID == sessions[s] && ses.Resumes > before
		})
	}
	resumesOf := func(s int) int {
		ses, _ := l.shardSession(s)
		return ses.Resumes
	}

	// 2. op 7: Resume on the resume host, by its name.
	r0 := resumesOf(0)
	inject(gatewayemu.Fault{Kind: gatewayemu.FaultReconnect, Shard: shard(0)})
	resumed(0, r0, "shard 0 resumed on the resume host")
	if n.serial.waitFor(regexp.MustCompile(`shard 0: STARTING: connecting to ws://gateway-us-east1-b\.discord\.gg:7878/\?v=10&encoding=json \(10\.96\.0\.1\) to Resume`), 5*time.Second) == nil {
		t.Error("shard 0 did not dial the resume host by name")
	}
	if c, _ := dns.lookups(resumeHost); c < 1 {
		t.Error("the resume host was never looked up")
	}
	if v := l.emu.Violations(); len(v) != 0 {
		t.Fatalf("violations after a Resume on the resume host: %s", violationReport(v))
	}

	// 3. The resume host answers 503: the Resume goes to the Gateway URL
	// instead, once, and succeeds (the emulator records that one Resume as
	// resume_wrong_url: it cannot know the resume edge was down).
	r1 := resumesOf(1)
	inject(gatewayemu.Fault{Kind: gatewayemu.FaultResumeUnavailable, Count: 1})
	inject(gatewayemu.Fault{Kind: gatewayemu.FaultReconnect, Shard: shard(1)})
	resumed(1, r1, "shard 1 resumed through the Gateway URL after a 503")
	for _, re := range []string{
		`shard 1: upgrade refused`,
		`shard 1: resume URL failed; the next Resume goes to the Gateway URL`,
		`shard 1: the resume URL failed: this Resume goes to the Gateway URL`,
		`shard 1: STARTING: connecting to ws://gateway\.discord\.gg:7878/\?v=10&encoding=json \(10\.96\.0\.1\) to Resume`,
	} {
		if n.serial.waitFor(regexp.MustCompile(re), 5*time.Second) == nil {
			t.Errorf("503 fallback: no console line %q", re)
		}
	}

	// 4. The resume host's name fails (SERVFAIL). Once its cached answer
	// (TTL 5 s) has run out, shard 0's next Resume cannot look it up: a
	// transport failure with the resolver's reason, then a Resume through
	// the Gateway URL.
	dns.setFail(resumeHost, true)
	_, last := dns.lookups(resumeHost)
	if wait := time.Until(last.Add(6 * time.Second)); wait > 0 {
		time.Sleep(wait) // the kernel's cache entry must have expired: it is a clock, not an event
	}
	before, _ := dns.lookups(resumeHost)
	r0 = resumesOf(0)
	inject(gatewayemu.Fault{Kind: gatewayemu.FaultReconnect, Shard: shard(0)})
	resumed(0, r0, "shard 0 resumed through the Gateway URL after a DNS failure")
	for _, re := range []string{
		`dns: gateway-us-east1-b\.discord\.gg: DNS: server failure \(SERVFAIL\) \(failure 1\); asked again after 1000 ms`,
		`shard 0: DNS: server failure \(SERVFAIL\): phase 8 tcp \d+ close`,
		`shard 0: resume URL failed; the next Resume goes to the Gateway URL`,
	} {
		if n.serial.waitFor(regexp.MustCompile(re), 5*time.Second) == nil {
			t.Errorf("DNS failure: no console line %q", re)
		}
	}
	// The reason reached the controller as the shard's last_error.
	deadline := time.Now().Add(20 * time.Second)
	for {
		d, err := l.nodeDetail("gw-dns")
		why := ""
		for _, s := range d.Shards {
			if s.ID == 0 {
				why = s.LastError
			}
		}
		if err == nil && why == "DNS: server failure (SERVFAIL)" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("shard 0's last_error at the controller: %q (%v), want the DNS reason", why, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
	// Retried with backoff: the next Resume asks again (the remembered
	// failure lasted 1 s) and fails a second time, remembered for 2 s.
	r0 = resumesOf(0)
	inject(gatewayemu.Fault{Kind: gatewayemu.FaultReconnect, Shard: shard(0)})
	resumed(0, r0, "shard 0 resumed again after a second DNS failure")
	if n.serial.waitFor(regexp.MustCompile(`dns: gateway-us-east1-b\.discord\.gg: DNS: server failure \(SERVFAIL\) \(failure 2\); asked again after 2000 ms`), 5*time.Second) == nil {
		t.Error("no second, doubled DNS failure line")
	}
	if after, _ := dns.lookups(resumeHost); after-before != 2 {
		t.Errorf("%d lookups of the failing name for two Resumes, want 2", after-before)
	}

	// Every session survived; the only violations are the Resumes sent
	// through the Gateway URL because the resume URL failed, one per
	// fallback the console shows.
	if ids := l.emu.Identifies(); len(ids) != 2 {
		t.Errorf("%d Identifies, want 2 (every fault was resumed)", len(ids))
	}
	for s, id := range sessions {
		if ses, ok := l.shardSession(s); !ok || ses.ID != id {
			t.Errorf("shard %d: session %q, want %q", s, ses.ID, id)
		}
	}
	fallbacks := len(regexp.MustCompile(`the resume URL failed: this Resume goes to the Gateway URL`).FindAllString(n.serial.String(), -1))
	var other []gatewayemu.Violation
	wrongURL := 0
	for _, v := range l.emu.Violations() {
		if v.Kind == gatewayemu.KindResumeWrongURL {
			wrongURL++
		} else {
			other = append(other, v)
		}
	}
	if len(other) != 0 {
		t.Errorf("violations: %s", violationReport(other))
	}
	if fallbacks != 3 || wrongURL != fallbacks {
		t.Errorf("%d fallbacks on the console, %d resume_wrong_url at the emulator, want 3 and 3", fallbacks, wrongURL)
	}
	t.Logf("host names, 503 and DNS failure cases done in %v", time.Since(started).Round(time.Millisecond))

	// 5. An answer from an older term (a deposed replica) is refused as a
	// failed check-in; the next one, from term 7 again, is applied.
	proxy.term.Store(3)
	if n.serial.waitFor(regexp.MustCompile(`checkin: the controller's answer is not a plan we can apply: its term is older than one this node already applied`), 20*time.Second) == nil {
		t.Fatal("an answer of term 3 after term 7 was not refused")
	}
	mark := len(n.serial.String())
	proxy.term.Store(7)
	deadline = time.Now().Add(30 * time.Second)
	for !strings.Contains(n.serial.String()[mark:], "checkin: controller reachable") {
		if time.Now().After(deadline) {
			t.Fatal("no check-in applied after the term went back to 7")
		}
		time.Sleep(200 * time.Millisecond)
	}

	// 6. The controller names its replicas ("controllers"): a list without
	// the one in use moves the node to the list's first, here the same
	// proxy by address, and the check-ins go there.
	list := []string{"http://" + subnet + ".1:8081"}
	proxy.controllers.Store(&list)
	if n.serial.waitFor(regexp.MustCompile(`checkin: replicas from the controller: http://10\.96\.0\.1:8081; now using http://10\.96\.0\.1:8081`), 20*time.Second) == nil {
		t.Fatal("the node did not take the controller's replica list")
	}
	deadline = time.Now().Add(20 * time.Second)
	for {
		h := proxy.checkinHosts()
		if len(h) > 0 && h[len(h)-1] == subnet+".1:8081" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no check-in to %s.1:8081 by address after the list changed: Host headers %q", subnet, h)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
