package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/discord-pxe/dpxe/fleet/controller"
	"github.com/discord-pxe/dpxe/fleet/store"
)

// Authenticated forwarded-for between replicas (docs/ha.md). A follower
// forwards node requests to the leader, so the leader sees the follower's
// address; node enrollment is bound to the address the boot script went
// to, and the leader records each node's address from its check-ins. The
// follower therefore tells the leader the client's address in
// forwardedForHeader and signs it in forwardedAuthHeader: an HMAC-SHA256,
// under a key every replica reads from the database (settings), over the
// time, method, URI, client address, the route it came by
// (forwardedViaHeader) and the body's SHA-256. The leader
// takes the client address only from a request whose signature verifies
// and whose time is within forwardSkew of its own clock; otherwise it
// keeps the connection's address and drops the headers. A client that
// sets these headers itself gets nothing from them: a follower replaces
// them, and the leader cannot verify them without the key.

const (
	forwardedForHeader  = "X-Dpxe-Forwarded-For"
	forwardedAuthHeader = "X-Dpxe-Forwarded-Auth"
	// forwardedViaHeader is the route the client came to the follower by
	// (controller.Route), signed with the address: the leader lists the
	// replicas' URLs of that route in a check-in answer.
	forwardedViaHeader = "X-Dpxe-Forwarded-Via"
	// forwardKeySetting names the settings row of the replicas' shared
	// HMAC key (32 random bytes, hex), written by the first replica.
	forwardKeySetting = "replica_forward_key"
	// forwardSkew bounds how far a signature's time may be from the
	// verifying replica's wall clock (replicas' clocks may disagree a
	// little; a captured request can be replayed only this long).
	forwardSkew = time.Minute
	// maxSignedBody is the largest body a follower signs; a larger one is
	// forwarded without a client address (the leader then sees the
	// follower's), never buffered further.
	maxSignedBody = 1 << 20
)

// forwardKey reads the replicas' shared key, storing a fresh one first
// if no replica has yet.
func forwardKey(ctx context.Context, st *store.Store) ([]byte, error) {
	var k [32]byte
	if _, err := rand.Read(k[:]); err != nil {
		return nil, err
	}
	v, err := st.InitSetting(ctx, forwardKeySetting, hex.EncodeToString(k[:]))
	if err != nil {
		return nil, fmt.Errorf("replica forwarding key: %w", err)
	}
	key, err := hex.DecodeString(v)
	if err != nil || len(key) < 16 {
		return nil, fmt.Errorf("replica forwarding key: settings row %q is not 16 or more hex bytes", forwardKeySetting)
	}
	return key, nil
}

// forwardMAC is the signature of one forwarded request.
func forwardMAC(key []byte, at int64, method, uri, client string, via controller.Route, body []byte) []byte {
	sum := sha256.Sum256(body)
	m := hmac.New(sha256.New, key)
	fmt.Fprintf(m, "dpxe-forwarded-for v2\n%d\n%s\n%s\n%s\n%s\n%x", at, method, uri, client, via, sum)
	return m.Sum(nil)
}

// readSmallBody reads req's body when it is at most maxSignedBody and
// puts it back for the next reader; ok is false when it is larger (the
// body is put back whole, unread beyond what was read) or unreadable.
func readSmallBody(req *http.Request) (body []byte, ok bool) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, true
	}
	b, err := io.ReadAll(io.LimitReader(req.Body, maxSignedBody+1))
	if err != nil {
		req.Body = io.NopCloser(bytes.NewReader(b))
		return nil, false
	}
	if len(b) > maxSignedBody {
		req.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(b), req.Body), req.Body}
		return nil, false
	}
	req.Body = io.NopCloser(bytes.NewReader(b))
	return b, true
}

// signForwarded replaces any forwarded-for headers the client sent with
// this follower's signed statement of the client's address and of the
// route it came by.
func (r *replica) signForwarded(req *http.Request, via controller.Route) {
	req.Header.Del(forwardedForHeader)
	req.Header.Del(forwardedAuthHeader)
	req.Header.Del(forwardedViaHeader)
	if r.forwardKey == nil {
		return
	}
	body, ok := readSmallBody(req)
	if !ok {
		return
	}
	at := time.Now().UnixMilli()
	mac := forwardMAC(r.forwardKey, at, req.Method, req.URL.RequestURI(), req.RemoteAddr, via, body)
	req.Header.Set(forwardedForHeader, req.RemoteAddr)
	req.Header.Set(forwardedViaHeader, string(via))
	req.Header.Set(forwardedAuthHeader, "v2 "+strconv.FormatInt(at, 10)+" "+hex.EncodeToString(mac))
}

// errForwardedFor is wrapped by the reasons a forwarded-for is refused.
var errForwardedFor = errors.New("forwarded-for refused")

// verifyForwarded checks the forwarded-for headers of a request this
// leader received and, when they verify, sets req.RemoteAddr to the
// client's address and returns the route the client came by. It removes
// the headers either way. It returns "" and nil when there were none.
func (r *replica) verifyForwarded(req *http.Request) (controller.Route, error) {
	client, auth, viaText := req.Header.Get(forwardedForHeader), req.Header.Get(forwardedAuthHeader), req.Header.Get(forwardedViaHeader)
	req.Header.Del(forwardedForHeader)
	req.Header.Del(forwardedAuthHeader)
	req.Header.Del(forwardedViaHeader)
	if client == "" && auth == "" && viaText == "" {
		return "", nil
	}
	if r.forwardKey == nil {
		return "", fmt.Errorf("%w: this replica has no forwarding key", errForwardedFor)
	}
	f := strings.Fields(auth)
	if len(f) != 3 || f[0] != "v2" {
		return "", fmt.Errorf("%w: %s: want \"v2 TIME_MS MAC\"", errForwardedFor, forwardedAuthHeader)
	}
	at, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return "", fmt.Errorf("%w: %s: time %q is not an integer", errForwardedFor, forwardedAuthHeader, f[1])
	}
	if d := time.Since(time.UnixMilli(at)); d > forwardSkew || d < -forwardSkew {
		return "", fmt.Errorf("%w: %s: signed %v from this replica's clock, over %v", errForwardedFor, forwardedAuthHeader, d.Round(time.Millisecond), forwardSkew)
	}
	got, err := hex.DecodeString(f[2])
	if err != nil {
		return "", fmt.Errorf("%w: %s: MAC is not hex", errForwardedFor, forwardedAuthHeader)
	}
	if _, _, err := net.SplitHostPort(client); err != nil {
		return "", fmt.Errorf("%w: %s: %q is not HOST:PORT", errForwardedFor, forwardedForHeader, client)
	}
	via, err := controller.ParseRoute(viaText)
	if err != nil {
		return "", fmt.Errorf("%w: %s: %v", errForwardedFor, forwardedViaHeader, err)
	}
	body, ok := readSmallBody(req)
	if !ok {
		return "", fmt.Errorf("%w: body unreadable or over %d bytes", errForwardedFor, maxSignedBody)
	}
	if !hmac.Equal(got, forwardMAC(r.forwardKey, at, req.Method, req.URL.RequestURI(), client, via, body)) {
		return "", fmt.Errorf("%w: %s: MAC does not match", errForwardedFor, forwardedAuthHeader)
	}
	req.RemoteAddr = client
	return via, nil
}
