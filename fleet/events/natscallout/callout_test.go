package natscallout

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/discord-pxe/dpxe/fleet/events"
	"github.com/discord-pxe/dpxe/fleet/events/eventstest"
	"github.com/discord-pxe/dpxe/fleet/events/natsauth"
)

// deadline bounds every wait of these tests.
const deadline = 20 * time.Second

// errs collects a connection's asynchronous errors (permission
// violations).
type errs struct {
	mu  sync.Mutex
	got []string
}

func (e *errs) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	e.mu.Lock()
	e.got = append(e.got, err.Error())
	e.mu.Unlock()
}

// violated waits until the server reported a permissions violation on
// subject.
func (e *errs) violated(t *testing.T, subject string) {
	t.Helper()
	end := time.Now().Add(5 * time.Second)
	for {
		e.mu.Lock()
		for _, s := range e.got {
			if strings.Contains(s, "Permissions Violation") && strings.Contains(s, subject) {
				e.mu.Unlock()
				return
			}
		}
		got := slices.Clone(e.got)
		e.mu.Unlock()
		if time.Now().After(end) {
			t.Fatalf("no permissions violation on %s; errors %q", subject, got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// plan is the test's stand-in for the controller's PublishShards.
type plan struct {
	mu    sync.Mutex
	owned map[string][]uint32
}

func (p *plan) shards(id string) ([]uint32, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s, ok := p.owned[id]
	return slices.Clone(s), ok
}

func (p *plan) set(id string, shards []uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if shards == nil {
		delete(p.owned, id)
	} else {
		p.owned[id] = shards
	}
}

// TestCalloutCluster runs three nats-server processes (built from the
// module) that delegate authentication to the Service, with the
// credentials file's decision: node n1 (shards 0 and 1) publishes its own
// dispatches into an R3 stream but not shard 2's, and may not subscribe
// to shard 2's commands; a wrong password, an unknown node, a node
// without a lease and an unknown worker are refused; a worker reads the
// stream and sends a command but cannot publish an event. Then the plan
// changes: Sweep, through the system account, kicks n1 (and only n1),
// whose reconnect gets the new permissions, and kicks n2 when its lease
// lapses, after which n2 cannot connect.
func TestCalloutCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("builds nats-server and starts a three-server cluster")
	}
	keys := eventstest.NewCalloutKeys(t)
	c := eventstest.StartCallout(t, eventstest.BuildServer(t), "co", keys)
	ctx, cancel := context.WithTimeout(context.Background(), 3*deadline)
	defer cancel()

	f, err := natsauth.Open(filepath.Join(t.TempDir(), natsauth.FileName))
	if err != nil {
		t.Fatal(err)
	}
	p := &plan{owned: map[string][]uint32{"n1": {0, 1}, "n2": {2}}}
	auth, err := f.Authorizer("bot", p.shards)
	if err != nil {
		t.Fatal(err)
	}
	serve, err := nats.Connect(c.ClientURLs(), eventstest.NkeyOption(t, keys.Serve), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatalf("serve's user: %v", err)
	}
	defer serve.Close()
	sys, err := nats.Connect(c.ClientURLs(), eventstest.NkeyOption(t, keys.System), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatalf("system user: %v", err)
	}
	defer sys.Close()
	account, err := AccountOf(ctx, serve)
	if err != nil || account != eventstest.CalloutAccount {
		t.Fatalf("serve's account %q (%v), want %s", account, err, eventstest.CalloutAccount)
	}
	svc, err := New(Config{Issuer: keys.Issuer, Account: account, Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Start(serve); err != nil {
		t.Fatal(err)
	}
	defer svc.Stop()

	l := events.DefaultStreamLimits()
	l.Replicas = 3
	sjs, _ := jetstream.New(serve)
	var stream jetstream.Stream
	for end := time.Now().Add(deadline); ; {
		sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
		stream, err = events.EnsureStream(sctx, sjs, "bot", l)
		scancel()
		if err == nil {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("R3 stream: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// connect dials the first server only, so a refusal is one request
	// (nats.Connect tries every URL it is given or discovers); without
	// more options the client does not reconnect.
	connect := func(user, pass string, e *errs, more ...nats.Option) (*nats.Conn, error) {
		opts := []nats.Option{nats.UserInfo(user, pass), nats.IgnoreDiscoveredServers()}
		if len(more) == 0 {
			more = []nats.Option{nats.NoReconnect()}
		}
		opts = append(opts, more...)
		if e != nil {
			opts = append(opts, nats.ErrorHandler(e.handler))
		}
		return nats.Connect(c.URLs[0], opts...)
	}
	before := svc.Stats()
	refusals := [][2]string{
		{"node-n1", "wrong"},
		{"node-n3", f.NodePassword("n3")}, // no lease
		{"node-n1", f.NodePassword("n2")},
		{"worker-w1", "x"},
		{"someone", "x"},
	}
	for _, r := range refusals {
		nc, err := connect(r[0], r[1], nil)
		if err == nil {
			nc.Close()
			t.Errorf("user %q connected", r[0])
		} else if !errors.Is(err, nats.ErrAuthorization) && !strings.Contains(strings.ToLower(err.Error()), "authorization") {
			t.Errorf("user %q: refused with %v, want an authorization violation", r[0], err)
		}
	}
	if got := svc.Stats().Refused - before.Refused; got != uint64(len(refusals)) {
		t.Errorf("the service refused %d, want %d", got, len(refusals))
	}

	// n1 reconnects after a kick; its reconnects are counted.
	var n1errs errs
	reconnected := make(chan struct{}, 4)
	n1, err := connect("node-n1", f.NodePassword("n1"), &n1errs, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.ReconnectHandler(func(*nats.Conn) { reconnected <- struct{}{} }))
	if err != nil {
		t.Fatalf("node n1: %v", err)
	}
	defer n1.Close()
	publish := func(shard uint32, session string, seq uint64) error {
		pub, err := events.NewPublisher(n1, events.PublisherConfig{App: "bot", Node: "n1", AckTimeout: 2 * time.Second})
		if err != nil {
			return err
		}
		sp, _ := pub.Session(shard, session, 0)
		if err := sp.Publish(ctx, events.Dispatch{Seq: seq, Event: "MESSAGE_CREATE", Payload: []byte(`{"op":0,"t":"MESSAGE_CREATE","s":1,"d":{}}`), Received: time.Now()}); err != nil {
			return err
		}
		if err := sp.Flush(ctx); err != nil || sp.Acked() != seq {
			return errors.Join(err, errors.New("not acknowledged"))
		}
		return nil
	}
	if err := publish(1, "s1", 1); err != nil {
		t.Fatalf("n1's own shard 1: %v", err)
	}
	n1.Publish("dpxe.bot.events.2.MESSAGE_CREATE", []byte(`{}`))
	n1errs.violated(t, "dpxe.bot.events.2.MESSAGE_CREATE")
	if _, err := n1.SubscribeSync("dpxe.bot.commands.2"); err == nil {
		n1.Flush()
	}
	n1errs.violated(t, "dpxe.bot.commands.2")
	n2, err := connect("node-n2", f.NodePassword("n2"), nil)
	if err != nil {
		t.Fatalf("node n2: %v", err)
	}
	defer n2.Close()

	// A worker.
	token, err := f.AddWorker("w1")
	if err != nil {
		t.Fatal(err)
	}
	if nc, err := connect("worker-w1", token+"x", nil); err == nil {
		nc.Close()
		t.Error("worker w1 connected with a wrong token")
	}
	var werrs errs
	w1, err := connect("worker-w1", token, &werrs)
	if err != nil {
		t.Fatalf("worker w1: %v", err)
	}
	defer w1.Close()
	wjs, _ := jetstream.New(w1)
	name, _ := events.StreamName("bot")
	if _, err := wjs.Stream(ctx, name); err != nil {
		t.Errorf("the worker reads the stream's info: %v", err)
	}
	if err := w1.Publish("dpxe.bot.commands.0", []byte(`{}`)); err != nil {
		t.Error(err)
	}
	w1.Publish("dpxe.bot.events.0.MESSAGE_CREATE", []byte(`{}`))
	werrs.violated(t, "dpxe.bot.events.0.MESSAGE_CREATE")
	werrs.mu.Lock()
	if slices.ContainsFunc(werrs.got, func(s string) bool { return strings.Contains(s, "dpxe.bot.commands.0") }) {
		t.Errorf("the worker's command was refused: %q", werrs.got)
	}
	werrs.mu.Unlock()

	// Nothing changed: nothing is kicked.
	if users, err := svc.Sweep(ctx, sys, len(c.URLs)); err != nil || len(users) != 0 {
		t.Fatalf("unchanged plan: kicked %v (%v)", users, err)
	}
	// n1 loses shard 1: kicked, and back with shard 0 only.
	p.set("n1", []uint32{0})
	if users, err := svc.Sweep(ctx, sys, len(c.URLs)); err != nil || !slices.Equal(users, []string{"node-n1"}) {
		t.Fatalf("n1 lost shard 1: kicked %v (%v), want node-n1", users, err)
	}
	select {
	case <-reconnected:
	case <-ctx.Done():
		t.Fatal("n1 did not reconnect after the kick")
	}
	if err := publish(0, "s0", 1); err != nil {
		t.Errorf("n1's shard 0 after the kick: %v", err)
	}
	n1.Publish("dpxe.bot.events.1.MESSAGE_CREATE", []byte(`{}`))
	n1errs.violated(t, "dpxe.bot.events.1.MESSAGE_CREATE")
	if users, err := svc.Sweep(ctx, sys, len(c.URLs)); err != nil || len(users) != 0 {
		t.Errorf("after n1 reconnected: kicked %v (%v)", users, err)
	}
	// n2's lease lapses: kicked, and refused from then on.
	p.set("n2", nil)
	if users, err := svc.Sweep(ctx, sys, len(c.URLs)); err != nil || !slices.Equal(users, []string{"node-n2"}) {
		t.Fatalf("n2's lease lapsed: kicked %v (%v), want node-n2", users, err)
	}
	for end := time.Now().Add(deadline); !n2.IsClosed(); {
		if time.Now().After(end) {
			t.Fatal("n2's connection is still open")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if nc, err := connect("node-n2", f.NodePassword("n2"), nil); err == nil {
		nc.Close()
		t.Error("n2 connected after its lease lapsed")
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 2 {
		t.Errorf("the stream holds %d messages, want n1's two", info.State.Msgs)
	}
}

// TestAnswerRefusesForeignRequests feeds Answer requests it must not
// answer: for another issuer, with another audience, with a user key
// that is not one, not a JWT.
func TestAnswerRefusesForeignRequests(t *testing.T) {
	issuer, _ := nkeys.CreateAccount()
	other, _ := nkeys.CreateAccount()
	srvKey, _ := nkeys.CreateServer()
	srvPub, _ := srvKey.PublicKey()
	userKey, _ := nkeys.CreateUser()
	userPub, _ := userKey.PublicKey()
	issuerPub, _ := issuer.PublicKey()
	otherPub, _ := other.PublicKey()
	f, err := natsauth.Open(filepath.Join(t.TempDir(), natsauth.FileName))
	if err != nil {
		t.Fatal(err)
	}
	auth, _ := f.Authorizer("bot", func(string) ([]uint32, bool) { return []uint32{0}, true })
	svc, err := New(Config{Issuer: issuer, Account: "DPXE", Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	request := func(subject, audience, user string, signer nkeys.KeyPair) string {
		rc := jwt.NewAuthorizationRequestClaims(subject)
		rc.Audience = audience
		rc.UserNkey = user
		rc.Server = jwt.ServerID{Name: "s1", ID: srvPub}
		rc.ConnectOptions = jwt.ConnectOptions{Username: "node-n1", Password: f.NodePassword("n1")}
		tok, err := rc.Encode(signer)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	now := time.Now()
	for _, c := range []struct {
		name, req string
	}{
		{"user key of a server", request(issuerPub, requestAudience, srvPub, srvKey)},
		{"for another issuer", request(otherPub, requestAudience, userPub, srvKey)},
		{"another audience", request(issuerPub, "elsewhere", userPub, srvKey)},
		{"garbage", "eyJ0eXAiOiJKV1QifQ.e30.x"},
	} {
		if _, err := svc.Answer(c.req, now); !errors.Is(err, ErrRequest) {
			t.Errorf("%s: %v, want ErrRequest", c.name, err)
		}
	}
	// The one good request: a response for that user and server, signed
	// by the issuer, with a user JWT placed in DPXE that expires.
	tok, err := svc.Answer(request(issuerPub, requestAudience, userPub, srvKey), now)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := jwt.DecodeAuthorizationResponseClaims(tok)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Issuer != issuerPub || resp.Subject != userPub || resp.Audience != srvPub || resp.Error != "" {
		t.Fatalf("response %+v", resp)
	}
	uc, err := jwt.DecodeUserClaims(resp.Jwt)
	if err != nil {
		t.Fatal(err)
	}
	if uc.Issuer != issuerPub || uc.Subject != userPub || uc.Audience != "DPXE" || uc.Expires != now.Add(DefaultExpiry).Unix() {
		t.Errorf("user JWT iss %s sub %s aud %s exp %d", uc.Issuer, uc.Subject, uc.Audience, uc.Expires)
	}
	if u, tag, ok := SplitConnName(uc.Name); !ok || u != "node-n1" || tag == "" {
		t.Errorf("user JWT name %q", uc.Name)
	}
	if !slices.Equal(uc.Pub.Allow, []string{"dpxe.bot.events.0.*"}) || uc.Resp == nil {
		t.Errorf("user JWT permissions %+v", uc.Permissions)
	}
	if strings.Contains(resp.String()+uc.String(), f.NodePassword("n1")) {
		t.Error("the answer carries the password")
	}
}
